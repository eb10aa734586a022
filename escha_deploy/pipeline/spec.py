"""The launch spec: everything needed to start the server, derived from a ``Plan``.

One ``LaunchSpec`` feeds ``up`` (docker-py), ``up --dry-run``, ``serve`` (native child process)
and the rendered ``compose.yaml``, so what a user previews is what runs. ``up`` writes it as a
versioned JSON document (``LAUNCH_SPEC_SCHEMA_VERSION``), mounts it read-only at
``SPEC_TARGET`` and the container runs ``serve --spec SPEC_TARGET``, which re-plans nothing.

The digest (``launch_digest``, the ``io.escha.plan-digest`` label) covers the profile after
``--set``, the fact values the plan assumed (``LaunchFacts``), the argv, the environment and
the pre-flight's figures (``PreflightFigures``);
not where a fact came from or when (``sources``), so the same facts give the same digest on
the host and in a compose container.
This module is pure: no docker, no subprocess, no environment reads. ``flags.py`` is the only
module that spells SGLang flag names; ``build_launch_spec`` asks it for the argv.

Secrets never appear in ``argv``, ``env`` or ``labels``: they travel as names in
``secret_env`` (values come from an env file or a read-only mounted file at run time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from escha_deploy.facts.provenance import FactSource  # re-exported: the launch spec carries them (`sources`)
from escha_deploy.facts.gpus import GpuRecord

if TYPE_CHECKING:
    from escha_deploy.planner.result import Plan
    from escha_deploy.profile import Profile

#: The launch-spec document schema this escha-deploy writes and reads (``serve --spec``
#: refuses another one, naming both). 2: ``needs`` carries the file L3 store
#: (``l3_dir``, ``l3_max_bytes``), which version 1 left in ``env`` alone. 3: and the ranks that keep
#: their own files under that cap, the watermark and the file suffixes (``l3_owner_ranks``, ...).
LAUNCH_SPEC_SCHEMA_VERSION = 3
#: Where ``up`` mounts the spec document (read-only) in the container.
SPEC_TARGET = "/etc/escha/launch-spec.json"


def _on_failure(retries: int) -> dict[str, int | str]:
    """Docker's ``on-failure`` restart policy with at most ``retries`` restarts."""
    return {"Name": "on-failure", "MaximumRetryCount": retries}


class Mount(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    source: str = Field(description="host path (bind) or volume name")
    target: str = Field(description="path inside the container")
    read_only: bool = False
    kind: str = Field(default="bind", description="bind or volume")


class ContainerSpec(BaseModel):
    """Docker-side settings (field names follow docker-py's ``containers.create`` where they can)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    image: str
    name: str
    gpus: str | list[str] = Field(
        default="all", description="'all', or device ids on Linux (WSL2 supports only 'all')"
    )
    ipc_mode: str | None = "host"
    shm_size_bytes: int | None = None
    ulimits: dict[str, tuple[int, int]] = Field(
        default_factory=lambda: {"memlock": (-1, -1), "stack": (67108864, 67108864)},
        description="soft/hard; memlock -1 and stack 64 MiB as SGLang's own compose file",
    )
    port_host_ip: str = "127.0.0.1"
    port_host: int = 30000
    port_container: int = 30000
    mounts: list[Mount] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    init: bool = True
    security_opt: list[str] = Field(default_factory=lambda: ["no-new-privileges"])
    cap_drop: list[str] = Field(default_factory=lambda: ["ALL"])
    cap_add: list[str] = Field(default_factory=list)
    stop_timeout_s: int = 60
    restart_after_ready: dict[str, int | str] = Field(
        default_factory=lambda: _on_failure(3)
    )
    entrypoint: list[str] = Field(default_factory=lambda: ["escha-deploy", "serve"])
    command: list[str] = Field(default_factory=list)
    # Launcher settings; additive, with defaults.
    platform: str = Field(default="linux", description="linux or wsl2: how GPUs are requested")
    gpu_count: int | None = Field(
        default=None, description="GPUs to request on Linux when gpus is 'all' (the TP size)"
    )
    environment: dict[str, str] = Field(
        default_factory=dict, description="container environment (no secret values, only paths)"
    )
    secret_files: dict[str, str] = Field(
        default_factory=dict,
        description="container path -> host file, mounted read-only (API key, HF token)",
    )
    profile_file: str | None = Field(
        default=None, description="host profile file mounted read-only when not a shipped profile"
    )


class LaunchFacts(BaseModel):
    """The fact values the plan assumed (digested). Bytes are ``int``.

    ``memory_base_bytes`` is the memory the server can have (MemTotal less huge pages, or the
    cgroup limit when lower; ``HostFacts.memory_base``): ``serve --spec`` refuses a container
    that can have less. ``capabilities`` are those the plan assumed the runtime has."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    platform: str
    mem_total_bytes: int | None = None
    hugetlb_bytes: int = 0
    cgroup_limit_bytes: int | None = None
    memory_base_bytes: int
    pinned_ceiling_bytes: int | None = None
    pinned_ceiling_reached: bool = False
    host_allocator: str | None = None
    capabilities: list[str] = Field(default_factory=list)
    gpus: list[GpuRecord] = Field(default_factory=list, description="per-GPU records (facts file / NVML)")
    model_safetensors_bytes: int | None = Field(default=None, description="sum of *.safetensors in the model folder")
    model_arch: dict[str, Any] | None = Field(default=None, description="the architecture read from config.json")
    sglang_release: str | None = Field(default=None, description="the SGLang release the plan was made for: "
                                       "serve --spec refuses a runtime of another")
    draft_weights_bytes: int | None = Field(default=None, description="the speculative draft's weight bytes read "
                                            "from model.draft's folder (all ranks; its MTP tensors in the model's own)")
    draft_num_layers: int | None = Field(default=None, description="the draft's layers as SGLang reads them for KV")


#: ``LaunchFacts`` fields added after specs were digested: left out of the digest while ``None``,
#: so a launch without a draft keeps the digest it had and a running server does not read as stale
#: after an upgrade (``launch_digest``; the profile's such keys: ``profile.models.OmitWhenUnset``).
_DIGEST_OMITTED_WHEN_UNSET = ("draft_weights_bytes", "draft_num_layers")


class LaunchNeeds(BaseModel):
    """What the container must provide for this plan, checked by ``serve --spec``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    gpus: int = Field(description="GPUs the server uses (runtime.tp_size); 0 when the profile asks for none")
    pinned_bytes_per_rank: int = Field(description="pinned host pools per rank (bytes): RLIMIT_MEMLOCK must allow it")
    model_path: str | None = Field(default=None, description="the mounted model folder, as the server sees it")
    l3_dir: str | None = Field(default=None, description="the file L3 store's directory as the server sees it "
                               "(flags.CONTAINER_L3_DIR in a container, hicache.l3.dir natively): present and "
                               "writable; None: the plan has no file L3")
    l3_max_bytes: int | None = Field(default=None, ge=0, description="the file L3 store's cap per owning rank "
                                     "(hicache.l3.max_size, bytes); None: no cap or no file L3")
    l3_owner_ranks: int = Field(default=1, ge=1, description="ranks that keep their own L3 files, each under the "
                                "cap (plan.l3_disk.owner_ranks): free space plus the store's own files must hold "
                                "l3_max_bytes x l3_owner_ranks + l3_min_free_bytes")
    l3_min_free_bytes: int = Field(default=0, ge=0, description="hicache.l3.min_free_space (bytes)")
    l3_tp_size: int = Field(default=1, ge=1, description="runtime.tp_size: the ranks' file suffixes "
                            "(_{tp_rank}_{tp_size}) say which files are the store's own")
    l3_rank_replicated: bool = Field(default=False, description="the model's KV is rank-replicated (MLA): every "
                                     ".bin file there is the store's own")
    draft_path: str | None = Field(default=None, description="the speculative draft's folder as the server sees it "
                                   "(model.draft.path in a container, model.draft.host_dir natively): config.json "
                                   "and weights there; None: no draft folder is mounted")


class PreflightFigures(BaseModel):
    """The plan's figures SGLang's pre-flight sizing stages take (``launch.sglang_preflight``:
    KV cache configurator, host pools) and the card the model-runner stage judges, so ``serve --spec``
    runs all six stages. Digested.

    ``free_before_weights_bytes``: GPU memory free per rank before the weights load (VRAM less
    the CUDA context and WSL2's hidden part; ``plan.device``); ``weights_bytes``: weights per
    rank (``plan.per_rank``: the target's and a counted speculative draft's, both loaded before
    the pools are sized); ``compute_capability``: the card's (``"12.0"``; ``plan.device``), which
    the model-runner stage judges the attention backend against; ``host_budget_bytes``: the host memory, for the whole box, that
    SGLang's host-pool check (``srt/mem_cache/pool_host/base.py: host_memory_budget_bytes``, split
    over the box's ranks) has at pool-building time as the plan models it (available less the
    reserve of the check that applies, ``plan.runtime_check``); None when HiCache is off."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    free_before_weights_bytes: int
    weights_bytes: int
    host_budget_bytes: int | None = None
    compute_capability: str | None = None


class LaunchSpec(BaseModel):
    """What to run: the SGLang argv and environment, plus the container settings.

    ``argv`` is the full server command (``python -m sglang.launch_server ...``) as a list;
    ``env`` the variables to set (no secrets); ``secret_env`` the names of secret variables
    (``SGLANG_API_KEY``-style) whose values are supplied at run time and redacted in output.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    schema_version: int = LAUNCH_SPEC_SCHEMA_VERSION
    escha_version: str = Field(description="the escha-deploy that planned it")
    profile: str
    profile_data: dict[str, Any] = Field(description="the profile after --set (profile.profile_to_data)")
    plan_digest: str = Field(description="launch_digest of profile_data, facts, argv, env and preflight")
    facts: LaunchFacts
    needs: LaunchNeeds
    sources: list[FactSource] = Field(default_factory=list, description="where each fact came from")
    verdict: str = Field(default="ok", description="the plan's verdict (ok or hicache_off)")
    warnings: list[str] = Field(default_factory=list, description="the plan's warnings")
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    secret_env: list[str] = Field(default_factory=list)
    container: ContainerSpec
    hicache_enabled: bool = True
    api_key_file: str | None = Field(
        default=None, description="file holding the API key, as the server sees it; `serve` "
        "reads it and passes --api-key to the child only (never in a command line shown)"
    )
    hf_token_file: str | None = Field(default=None, description="file holding the HF token")
    preflight: PreflightFigures | None = Field(
        default=None, description="the plan's figures for SGLang's pre-flight sizing stages (in the digest); "
        "None in a spec written before they were recorded: `serve --spec` then skips those two stages")


#: Container paths of mounted secrets and the HF cache.
SECRET_API_KEY_PATH = "/run/secrets/escha_api_key"
SECRET_HF_TOKEN_PATH = "/run/secrets/escha_hf_token"
CONTAINER_HF_CACHE = "/root/.cache/huggingface"
#: Where the container's just-in-time caches live: a named volume (``jit_cache_volume``), so the
#: kernels FlashInfer, Triton, torch extensions (SGLang's HiCache hash extension,
#: ``mem_cache/cpp_utils/native_hash.py``) and SGLang itself compile on first use land in a
#: writable folder and survive restarts, whatever the image's home folder allows (a read-only
#: ``~/.cache/flashinfer`` stopped servers in ai-dynamo/dynamo PR #11154 and
#: Center-for-AI-Innovation/LLMFlux#124). Dockerfile.hicache creates it world-writable, so a
#: new volume copies that mode.
CONTAINER_JIT_CACHE = "/var/cache/escha-jit"
#: The variables that point each library's cache into it: FlashInfer's base folder (its cache is
#: ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer``, ``flashinfer/jit/env.py``), Triton's
#: (``triton/runtime/cache.py``), torch's extension builds (``torch/utils/cpp_extension.py:
#: _get_build_directory``) and SGLang's (``srt/environ.py: SGLANG_CACHE_DIR``, default
#: ``~/.cache/sglang``: the P2P check results, compiled-kernel caches).
JIT_CACHE_ENV = {
    "FLASHINFER_WORKSPACE_BASE": CONTAINER_JIT_CACHE,
    "TRITON_CACHE_DIR": f"{CONTAINER_JIT_CACHE}/triton",
    "TORCH_EXTENSIONS_DIR": f"{CONTAINER_JIT_CACHE}/torch_extensions",
    "SGLANG_CACHE_DIR": f"{CONTAINER_JIT_CACHE}/sglang",
}


def jit_cache_volume(profile_name: str) -> str:
    """``escha-<profile>-jit``: the named volume ``up`` and ``compose`` mount at
    ``CONTAINER_JIT_CACHE`` (one per profile, as the container)."""
    return f"{container_name(profile_name)}-jit"


def launch_digest(profile_data: dict[str, Any], facts: LaunchFacts, argv: Sequence[str], env: dict[str, str],
                  preflight: PreflightFigures | None = None) -> str:
    """sha256 of the canonical JSON (sorted keys) of the profile after ``--set``, the fact
    values, the argv, the environment and, when the spec records them, the pre-flight's figures
    (a spec without them keeps the digest it was written with): the ``io.escha.plan-digest``
    label. The profile's
    ``watch`` section (``status``'s alert thresholds) is left out: it changes nothing the server
    runs, so changing a threshold does not make a running server stale. Facts added since
    (``_DIGEST_OMITTED_WHEN_UNSET``) are left out while unset."""
    import hashlib
    import json

    served = {k: v for k, v in profile_data.items() if k != "watch"}
    fact_values = {k: v for k, v in facts.model_dump(mode="json").items()
                   if not (k in _DIGEST_OMITTED_WHEN_UNSET and v is None)}
    doc: dict[str, Any] = {"profile": served, "facts": fact_values, "argv": list(argv), "env": dict(env)}
    if preflight is not None:
        doc["preflight"] = preflight.model_dump(mode="json")
    data = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()


def facts_from_plan(plan: Plan) -> LaunchFacts:
    """The ``LaunchFacts`` a plan alone can tell (its platform, memory base, pinned ceiling and
    capabilities); ``launch.prepare`` adds the host, GPU and model-folder values it gathered."""
    b = plan.budget
    return LaunchFacts(platform=plan.platform, memory_base_bytes=b.memory_base_bytes,
                       pinned_ceiling_bytes=b.pinned_ceiling_bytes, capabilities=sorted(plan.capabilities))


def preflight_from_plan(plan: Plan) -> PreflightFigures:
    """The pre-flight figures ``plan`` decided (``PreflightFigures``): the device's free memory
    before the weights, the weights per rank and, with HiCache on, the host budget the runtime's
    own check reads as the planner modelled it (``RuntimeCheck.available_bytes`` less the
    reserve of the check that ``applies``: stock 10 GiB or the patched series' configured one)."""
    rc = plan.runtime_check
    host = None
    if plan.hicache.enabled and rc is not None:
        reserve = rc.patched_reserve_bytes if rc.applies == "patched" else rc.stock_reserve_bytes
        host = max(int(rc.available_bytes) - int(reserve), 0)
    # a counted draft's weights are loaded before the pools are sized too (planner.draft)
    return PreflightFigures(free_before_weights_bytes=int(plan.device.free_before_weights_bytes),
                            weights_bytes=int(plan.per_rank.weights_bytes + plan.per_rank.draft_weights_bytes),
                            host_budget_bytes=host, compute_capability=plan.device.compute_capability)


def spec_json(spec: LaunchSpec) -> str:
    """The document ``up`` mounts: the spec as indented JSON (no secret values in it)."""
    return spec.model_dump_json(indent=2) + "\n"


def container_name(profile_name: str) -> str:
    """``escha-<profile>``: one container per profile."""
    return f"escha-{profile_name}"


def host_address(profile: Profile) -> str:
    """The address on this host where the server's API listens: ``0.0.0.0`` with
    ``container.expose``, else ``127.0.0.1``. Docker publishes the container's port there, and
    a native server binds it (``build_launch_spec``)."""
    return "0.0.0.0" if profile.container.expose else "127.0.0.1"


def _folder_mounts(host_dir: str, target: str) -> list[Mount]:
    """A model (or draft) folder, read-only at ``target``; a Hugging Face cache snapshot
    (``.../models--ORG--NAME/snapshots/REV``, its files links to ``../../blobs/HASH``) also has
    its repository's ``blobs/`` read-only where those links point from ``target``
    (``folders.hf_blobs_mount``), so the server reads real files, not dangling links."""
    from escha_deploy.facts.folders import hf_blobs_mount

    mounts = [Mount(source=host_dir, target=target, read_only=True)]
    blobs = hf_blobs_mount(host_dir, target)
    if blobs is not None:
        mounts.append(Mount(source=blobs[0], target=blobs[1], read_only=True))
    return mounts


def container_spec(profile: Profile, *, platform: str, digest: str | None = None, overrides: Sequence[str] = (),
                   profile_file: str | None = None, spec_file: str | None = None,
                   facts_file: str | None = None) -> ContainerSpec:
    """The container half of a launch of ``profile`` (pure): image, name, GPUs, the published
    port, mounts, labels, capabilities and the command ``serve`` runs with. It reads no plan:
    only the ``platform`` (under WSL2 Docker takes the GPUs as ``all``, the device ids go in
    ``CUDA_VISIBLE_DEVICES``) and the launch's ``digest`` for the ``io.escha.plan-digest``
    label (None: no label, as in a compose file, whose container plans for itself).
    ``spec_file``, ``overrides``, ``profile_file``, ``facts_file``: as ``build_launch_spec``."""
    from escha_deploy import __version__
    from escha_deploy.pipeline import argv as flags
    from escha_deploy.sglang.capabilities import LABEL_PREFIX
    from escha_deploy.utils.paths import CONTAINER_FACTS_PATH, FACTS_ENV

    c = profile.container
    hc = profile.hicache
    mounts: list[Mount] = []
    model_dir = c.model_dir or profile.model.host_dir
    if model_dir:
        mounts += _folder_mounts(model_dir, profile.model.path)
    draft = profile.model.draft
    if draft is not None and draft.host_dir and not (model_dir and draft.path == profile.model.path):
        # the draft folder, read-only at the path the server is given (--speculative-draft-model-path);
        # a draft in the model's own folder (NEXTN/MTP) is already mounted there
        mounts += [m for m in _folder_mounts(draft.host_dir, draft.path) if m not in mounts]
    if c.hf_cache_dir:
        mounts.append(Mount(source=c.hf_cache_dir, target=CONTAINER_HF_CACHE))
    if hc.enabled and hc.storage_dir:
        mounts.append(Mount(source=hc.storage_dir, target=flags.CONTAINER_L3_DIR))
    mounts.append(Mount(source=jit_cache_volume(profile.name), target=CONTAINER_JIT_CACHE, kind="volume"))
    secret_files: dict[str, str] = {}
    if c.api_key_file:
        secret_files[SECRET_API_KEY_PATH] = c.api_key_file
    if c.hf_token_file:
        secret_files[SECRET_HF_TOKEN_PATH] = c.hf_token_file
    cenv = {"NO_PROXY": flags.NO_PROXY, "no_proxy": flags.NO_PROXY, **JIT_CACHE_ENV}
    gpus: str | list[str] = "all"
    if isinstance(c.gpus, list):
        if platform == "wsl2":
            # Under WSL2 only "all" works (the NVIDIA Container Toolkit's CDI spec under WSL2 names one device, all).
            cenv["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in c.gpus)
        else:
            gpus = [str(i) for i in c.gpus]
    if spec_file is not None:
        command = ["--spec", SPEC_TARGET]
        mounts.append(Mount(source=spec_file, target=SPEC_TARGET, read_only=True))
        profile_file = None
    else:
        command = ["--profile", profile.name if profile_file is None else "/etc/escha/profile.yaml"]
        for o in overrides:
            command += ["--set", o]
        if facts_file is not None:
            mounts.append(Mount(source=facts_file, target=CONTAINER_FACTS_PATH, read_only=True))
            cenv[FACTS_ENV] = CONTAINER_FACTS_PATH
    container = ContainerSpec(
        image=c.image, name=container_name(profile.name), gpus=gpus,
        port_host_ip=host_address(profile), port_host=c.port, port_container=c.port,
        mounts=mounts,
        labels={f"{LABEL_PREFIX}profile": profile.name,
                **({f"{LABEL_PREFIX}plan-digest": digest} if digest is not None else {}),
                f"{LABEL_PREFIX}managed-by": "escha-deploy", f"{LABEL_PREFIX}escha-version": __version__},
        cap_drop=[] if c.keep_capabilities else ["ALL"],
        # pinned host pools are locked memory (mlock/cudaHostRegister): keep IPC_LOCK
        cap_add=[] if c.keep_capabilities else ["IPC_LOCK"],
        stop_timeout_s=c.stop_timeout_s, command=command,
        platform=platform, gpu_count=profile.runtime.tp_size if gpus == "all" and platform != "wsl2" else None,
        environment=cenv, secret_files=secret_files, profile_file=profile_file,
    )
    return container


def build_launch_spec(plan: Plan, profile: Profile, *, overrides: Sequence[str] = (),
                      native: bool = False, profile_file: str | None = None,
                      facts: LaunchFacts | None = None, sources: Sequence[FactSource] = (),
                      spec_file: str | None = None, facts_file: str | None = None) -> LaunchSpec:
    """Derive the ``LaunchSpec`` for ``plan`` of ``profile`` (pure).

    ``native``: the server runs on this host (``serve`` outside a container): it binds
    127.0.0.1 (or 0.0.0.0 when the profile exposes it) and paths are host paths. Otherwise it
    binds 0.0.0.0 inside the container and Docker publishes the port on 127.0.0.1 unless the
    profile exposes it. ``overrides`` (``--set`` items) travel to the container's ``serve``.
    ``facts``: what the plan assumed (default: what the plan alone tells, ``facts_from_plan``);
    ``sources``: where each came from. ``spec_file``: the host file ``up`` writes this spec to;
    the container then mounts it read-only and runs ``serve --spec`` instead of planning.
    ``facts_file``: a host facts file the container plans from (compose: mounted, named by
    ``ESCHA_FACTS``). Raises nothing; the caller refuses unsafe plans first.
    """
    from escha_deploy import __version__
    from escha_deploy.pipeline import argv as flags
    from escha_deploy.profile import profile_to_data

    c = profile.container
    hc = profile.hicache
    bind = host_address(profile) if native else "0.0.0.0"
    l3_dir = (hc.storage_dir if native else flags.CONTAINER_L3_DIR) if hc.storage_dir else None
    # natively the server loads the host folder (model.host_dir, the folder the plan read; no
    # container mounts it at model.path): the argv and the model-folder check name that folder
    native_model = profile.model.host_dir if native else None
    draft = profile.model.draft
    native_draft = draft.host_dir if native and draft else None
    argv = ["python3", "-m", "sglang.launch_server",
            *flags.server_args(plan, profile, host=bind, model_path=native_model, draft_path=native_draft)]
    env = flags.server_env(plan, profile, l3_dir=l3_dir)

    facts = facts or facts_from_plan(plan)
    profile_data = profile_to_data(profile)
    preflight = preflight_from_plan(plan)
    digest = launch_digest(profile_data, facts, argv, env, preflight)
    container = container_spec(profile, platform=plan.platform, digest=digest, overrides=overrides,
                               profile_file=profile_file, spec_file=spec_file, facts_file=facts_file)
    model_dir = c.model_dir or profile.model.host_dir
    key_path = (c.api_key_file if native else SECRET_API_KEY_PATH) if c.api_key_file else None
    tok_path = (c.hf_token_file if native else SECRET_HF_TOKEN_PATH) if c.hf_token_file else None
    # a container asked for no GPUs (container.gpus: []) gets none to check; natively SGLang needs them
    # the folder and cap the env renders (flags.file_l3_store), as typed values serve --spec checks
    store = flags.file_l3_store(plan, profile, l3_dir=l3_dir)
    needs = LaunchNeeds(gpus=0 if c.gpus == [] and not native else profile.runtime.tp_size,
                        pinned_bytes_per_rank=plan.per_rank.pinned_bytes if plan.hicache.enabled else 0,
                        model_path=native_model if native else profile.model.path if model_dir else None,
                        l3_dir=store[0] if store else None, l3_max_bytes=store[1] if store else None,
                        l3_owner_ranks=plan.l3_disk.owner_ranks if store and plan.l3_disk else 1,
                        l3_min_free_bytes=plan.l3_disk.min_free_bytes if store and plan.l3_disk else 0,
                        l3_rank_replicated=bool(store and plan.l3_disk and plan.l3_disk.rank_replicated),
                        l3_tp_size=profile.runtime.tp_size,
                        draft_path=(native_draft if native else draft.path) if draft and draft.host_dir else None)
    return LaunchSpec(
        escha_version=__version__, profile=profile.name, profile_data=profile_data, plan_digest=digest,
        facts=facts, needs=needs, sources=list(sources), verdict=plan.verdict, warnings=list(plan.warnings),
        argv=argv, env=env, secret_env=[],
        container=container, hicache_enabled=plan.hicache.enabled,
        api_key_file=key_path, hf_token_file=tok_path, preflight=preflight,
    )
