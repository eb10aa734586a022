"""The launch spec: everything needed to start the server, derived from a ``Plan``.

One ``LaunchSpec`` feeds ``up`` (docker-py), ``up --dry-run``, ``serve`` (native child process)
and the rendered ``compose.yaml``, so what a user previews is what runs.
This module is pure: no docker, no subprocess, no environment reads. ``flags.py`` is the only
module that spells SGLang flag names; ``build_launch_spec`` asks it for the argv.

Secrets never appear in ``argv``, ``env`` or ``labels``: they travel as names in
``secret_env`` (values come from an env file or a read-only mounted file at run time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from .planner.result import Plan
    from .profile import Profile


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
        default_factory=lambda: {"Name": "on-failure", "MaximumRetryCount": 3}
    )
    entrypoint: list[str] = Field(default_factory=lambda: ["escha-deploy", "serve"])
    command: list[str] = Field(default_factory=list)
    # Added for the launcher (issue 4); additive, with defaults.
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


class LaunchSpec(BaseModel):
    """What to run: the SGLang argv and environment, plus the container settings.

    ``argv`` is the full server command (``python -m sglang.launch_server ...``) as a list;
    ``env`` the variables to set (no secrets); ``secret_env`` the names of secret variables
    (``SGLANG_API_KEY``-style) whose values are supplied at run time and redacted in output.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    profile: str
    plan_digest: str = Field(description="sha256 of the plan's JSON, for the container label")
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


#: Container paths of mounted secrets and the HF cache.
SECRET_API_KEY_PATH = "/run/secrets/escha_api_key"
SECRET_HF_TOKEN_PATH = "/run/secrets/escha_hf_token"
CONTAINER_HF_CACHE = "/root/.cache/huggingface"
#: SGLang's cache (P2P access check results, triton cache) survives restarts in a volume-like
#: host folder only when the user mounts one; see docs/launch.md.


def plan_digest(plan: Plan) -> str:
    """sha256 of the plan's canonical JSON (sorted keys), for the ``io.escha.plan-digest`` label."""
    import hashlib
    import json

    data = json.dumps(plan.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()


def container_name(profile_name: str) -> str:
    """``escha-<profile>``: one container per profile."""
    return f"escha-{profile_name}"


def build_launch_spec(plan: Plan, profile: Profile, *, overrides: Sequence[str] = (),
                      native: bool = False, profile_file: str | None = None) -> LaunchSpec:
    """Derive the ``LaunchSpec`` for ``plan`` of ``profile`` (pure).

    ``native``: the server runs on this host (``serve`` outside a container): it binds
    127.0.0.1 (or 0.0.0.0 when the profile exposes it) and paths are host paths. Otherwise it
    binds 0.0.0.0 inside the container and Docker publishes the port on 127.0.0.1 unless the
    profile exposes it. ``overrides`` (``--set`` items) travel to the container's ``serve``.
    Raises nothing; the caller refuses unsafe plans first.
    """
    from . import flags
    from .capabilities import LABEL_PREFIX

    c = profile.container
    hc = profile.hicache
    bind = ("0.0.0.0" if c.expose else "127.0.0.1") if native else "0.0.0.0"
    l3_dir = (hc.storage_dir if native else flags.CONTAINER_L3_DIR) if hc.storage_dir else None
    argv = ["python3", "-m", "sglang.launch_server", *flags.server_args(plan, profile, host=bind)]
    env = flags.server_env(plan, profile, l3_dir=l3_dir)

    mounts: list[Mount] = []
    model_dir = c.model_dir or profile.model.host_dir
    if model_dir:
        mounts.append(Mount(source=model_dir, target=profile.model.path, read_only=True))
    if c.hf_cache_dir:
        mounts.append(Mount(source=c.hf_cache_dir, target=CONTAINER_HF_CACHE))
    if hc.enabled and hc.storage_dir:
        mounts.append(Mount(source=hc.storage_dir, target=flags.CONTAINER_L3_DIR))
    secret_files: dict[str, str] = {}
    if c.api_key_file:
        secret_files[SECRET_API_KEY_PATH] = c.api_key_file
    if c.hf_token_file:
        secret_files[SECRET_HF_TOKEN_PATH] = c.hf_token_file
    cenv = {"NO_PROXY": flags.NO_PROXY, "no_proxy": flags.NO_PROXY}
    gpus: str | list[str] = "all"
    if isinstance(c.gpus, list):
        if plan.platform == "wsl2":
            # Under WSL2 only "all" works (NVIDIA CDI spec, research/wsl2-facts.md 4.2).
            cenv["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in c.gpus)
        else:
            gpus = [str(i) for i in c.gpus]
    digest = plan_digest(plan)
    command = ["--profile", profile.name if profile_file is None else "/etc/escha/profile.yaml"]
    for o in overrides:
        command += ["--set", o]
    container = ContainerSpec(
        image=c.image, name=container_name(profile.name), gpus=gpus,
        port_host_ip="0.0.0.0" if c.expose else "127.0.0.1", port_host=c.port, port_container=c.port,
        mounts=mounts,
        labels={f"{LABEL_PREFIX}profile": profile.name, f"{LABEL_PREFIX}plan-digest": digest,
                f"{LABEL_PREFIX}managed-by": "escha-deploy"},
        cap_drop=[] if c.keep_capabilities else ["ALL"],
        # pinned host pools are locked memory (mlock/cudaHostRegister): keep IPC_LOCK
        cap_add=[] if c.keep_capabilities else ["IPC_LOCK"],
        stop_timeout_s=c.stop_timeout_s, command=command,
        platform=plan.platform, gpu_count=profile.runtime.tp_size if gpus == "all" and plan.platform != "wsl2" else None,
        environment=cenv, secret_files=secret_files, profile_file=profile_file,
    )
    key_path = (c.api_key_file if native else SECRET_API_KEY_PATH) if c.api_key_file else None
    tok_path = (c.hf_token_file if native else SECRET_HF_TOKEN_PATH) if c.hf_token_file else None
    return LaunchSpec(
        profile=profile.name, plan_digest=digest, argv=argv, env=env, secret_env=[],
        container=container, hicache_enabled=plan.hicache.enabled,
        api_key_file=key_path, hf_token_file=tok_path,
    )
