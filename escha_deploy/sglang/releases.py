"""The SGLang releases escha-deploy plans for, read from their data folders.

One folder per release under ``paths.catalog_dir()/releases/`` (its ``README.md`` lists the
files); ``index.yaml`` there names the supported releases and the default. This module is the
one loader: no other module spells a release string.

- ``default_release()``: the release a plan targets when nothing names one.
- ``supported_releases()``: every release with a folder, in ``index.yaml``'s order.
- ``load_release(version)`` -> ``Release``: the hand-written facts (``facts.yaml``): pins,
  official image, host guard kind and constants, default memory tiers, the
  ``--cuda-graph-config`` keys.
- ``release_file(version, name)``: the path of one of the folder's files (``flags.json``, ...).
- ``image_tag(kind, version)``: the tag ``escha-deploy build`` gives the image it builds for a
  release (``index.yaml``'s ``image_tags``), the image a profile of that release runs by default;
  ``official_image(version)``: the release's SGLang image, the default base (``facts.yaml``).
- ``series_releases()``: the releases our patch series exists for (``runtime_patches/``).

Pure apart from reading the committed files (each once per process). A version that is not
supported is ``BadInput`` (exit 2) naming the supported ones; a malformed data file is a
packaging bug (``ValueError``), not the user's.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from escha_deploy.utils import paths
from escha_deploy.utils.errors import BadInput

INDEX = "index.yaml"
FACTS = "facts.yaml"
_VERSION = r"^\d+\.\d+\.\d+$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Pin(_Model):
    """One requirement of the release's wheel (``value``) and the METADATA line it is read from."""

    value: str
    source: str


class Pins(_Model):
    python: Pin
    torch: Pin
    transformers: Pin


class AutoSize(_Model):
    """0.5.21+'s HiCache auto-size (``--hicache-host-memory-fraction``), used only when neither
    ``--hicache-ratio`` nor ``--hicache-size`` is set. ``fraction_default``: the flag's default;
    ``allocation_slack``: the share of the budget kept for page rounding and staging;
    ``default_ratio``/``default_ratio_buffer_only``: the ratio it starts from and caps at."""

    fraction_default: Annotated[float, Field(gt=0, le=1)]
    allocation_slack: Annotated[float, Field(ge=0, lt=1)]
    default_ratio: float
    default_ratio_buffer_only: float
    source: str


class HostGuard(_Model):
    """SGLang's own host-memory check for the HiCache host pools.

    ``kind``: ``per-pool-available`` (0.5.19, 0.5.20: psutil's available memory less
    ``reserve_bytes``, divided by the ranks on the host, read again for every pool and rank),
    ``cgroup-bounded-cache-charged`` (0.5.21: min(MemAvailable, cgroup limit - the cgroup's
    usage taken whole, its page cache not credited), else the same) or ``cgroup-bounded``
    (0.5.23: the same with the cgroup's page cache credited). ``reserve_bytes``: bytes (int). ``source``: the wheel's file and
    names it is read from. ``auto_size``: the release's HiCache auto-size, if it has one.
    """

    kind: Literal["per-pool-available", "cgroup-bounded", "cgroup-bounded-cache-charged"]
    reserve_bytes: Annotated[int, Field(ge=0)]
    source: str
    auto_size: AutoSize | None = None


class MemoryTier(_Model):
    """One card-size tier of SGLang's default memory settings: cards below ``below_mib`` MiB
    (None: every larger card) get ``chunked_prefill`` tokens and a decode CUDA-graph max batch
    size of ``decode_max_bs`` (TP < 4) or ``decode_max_bs_tp4`` (TP >= 4)."""

    below_mib: int | None
    chunked_prefill: int
    decode_max_bs: int
    decode_max_bs_tp4: int


class MemoryDefaults(_Model):
    source: str
    tiers: tuple[MemoryTier, ...]
    unknown_gpu_mem_fraction_static: float
    decode_max_bs_capped_by_max_running_requests: bool

    def tier(self, gpu_mem_mib: int) -> MemoryTier:
        """The tier a card of ``gpu_mem_mib`` MiB falls in."""
        return next(t for t in self.tiers if t.below_mib is None or gpu_mem_mib < t.below_mib)


class CudaGraphConfigKeys(_Model):
    """The keys ``--cuda-graph-config`` accepts per phase (``cuda_graph_config.py:
    ALLOWED_KEYS_PER_PHASE``)."""

    decode: tuple[str, ...]
    prefill: tuple[str, ...]
    source: str


class DraftKvCell(_Model):
    """How the release rounds the target's KV bytes per token scaled by an EAGLE-style draft's
    layers (``srt/model_executor/pool_configurator.py: DefaultPoolConfigurator.__init__``):
    ``whole``: ``int(cell * (1 + draft_layers / kv_layers))``; ``draft_share``: the draft's share
    rounded on its own, ``cell + int(cell * draft_layers / kv_layers)``."""

    rounding: Literal["whole", "draft_share"]
    source: str


class DraftHostPool(_Model):
    """How the release sizes a speculative draft's sidecar host KV pool
    (``srt/mem_cache/hybrid_cache/hybrid_pool_assembler.py: build_full_draft_pools``):
    ``ratio``: an independent pool at ``host_to_device_ratio = target host tokens / draft device
    tokens``, ``int(tokens * ratio)`` floored to the page plus one padding page
    (``pool_host/base.py: HostKVCache.__init__``); ``shared``: ``host_token_capacity`` = the target
    host pool's ``logical_size``, taken as it is, with no padding page of its own."""

    capacity: Literal["ratio", "shared"]
    source: str


class FlagNotPlanned(_Model):
    """A flag of ``runtime.extra_args`` that reaches a pool class the plan does not size
    (``pool``), refused naming it; ``why`` says what SGLang builds that the plan does not."""

    flag: Annotated[str, Field(pattern=r"^--[a-z0-9][a-z0-9-]*$")]
    pool: str
    why: str
    source: str


class Nvfp4Prefill(_Model):
    """How the release resolves an NVFP4 KV cache's attention backends
    (``srt/arg_groups/kv_cache_hook.py: handle_nvfp4_prefill_kv_dequant_dtype``, 0.5.23):
    ``--prefill-kv-cache-dequant-dtype`` (``auto`` unless given) picks the prefill backend
    (``backend_of_dtype``: dequant dtype -> backend); an explicit backend outside it is refused,
    native ``nvfp4`` needs compute capability ``native_needs_capability``, and an explicit
    decode backend other than ``decode_backend`` is refused."""

    backend_of_dtype: dict[str, str]
    native_needs_capability: str
    decode_backend: str
    source: str


class QuantizationNotLoadable(_Model):
    """``--quantization`` choices the release's parser accepts and its model config refuses on
    CUDA ("Unknown quantization method": ``srt/configs/model_config.py: _verify_quantization``
    checks ``layers/quantization/__init__.py: QUANTIZATION_METHODS``, which lacks them)."""

    methods: tuple[str, ...]
    source: str


class QuantizationMethods(_Model):
    """Every quantization method name the release registers anywhere
    (``srt/layers/quantization/__init__.py``: ``BASE_QUANTIZATION_METHODS``, the ``update`` of each
    platform's branch, ``CPU_QUANTIZATION_METHODS``). A model whose config.json names a
    ``quantization_config.quant_method`` outside it is refused by SGLang's model config
    (``srt/configs/model_config.py: _verify_quantization``: "Unknown quantization method") on any
    platform; a name inside it may still be remapped on CUDA (``override_quantization_method``),
    so only names outside it are refused by ``plan``."""

    known: tuple[str, ...]
    source: str


class HybridLoadBack(_Model):
    """A hybrid configuration whose host-tier hits a real server of this release was seen to load
    back (a measurement, named in ``source``): the resolved ``mamba_radix_cache_strategy``, the
    page size (tokens) and ``hicache_write_policy``. The plan's inert-host-hit warning is silent
    on it (``planner.hybrid_host_hits_inert``)."""

    strategy: str
    page_size: Annotated[int, Field(ge=1)]
    write_policy: str
    source: str


class AttentionRegistry(_Model):
    """What the release's model runner refuses when it builds the attention backend
    (``srt/layers/attention/attention_registry.py``), by the card's compute capability major:
    ``fa3_majors``: the majors ``create_flashattention_v3_backend`` accepts for a non-MLA model
    (its assert: ``major == 8 and not use_mla_backend or major == 9``); ``hybrid_gdn_backends``:
    per Blackwell major (``is_blackwell()``: 10, 11, 12), the full-attention backends
    ``attn_backend_wrapper`` accepts for prefill and decode on a hybrid GDN model (12:
    ``get_platform().is_sm120``; 10 and 11 the other branch)."""

    fa3_majors: tuple[int, ...]
    hybrid_gdn_backends: dict[int, tuple[str, ...]]
    source: str


class TrtllmMhaPages(_Model):
    """The page sizes the release's trtllm_mha attention backend takes. While SGLang resolves its
    arguments, a page size outside ``snap_pages`` becomes ``snap_to`` when any phase uses
    trtllm_mha (``srt/arg_groups/overrides.py: _mla_backend_page_constraints``); when the model
    runner builds the backend, after the weights load, a page of ``gen_min_page`` or more on a
    card whose major is not in ``xqa_majors`` (``is_xqa_impl``: ``is_sm90`` or ``is_sm120``)
    needs trtllm-gen's dynamic tokens-per-page kernels: more query heads than KV heads per
    attention-TP rank, equal QK and V head dims and a power-of-2 page, else ValueError
    (``srt/layers/attention/trtllm_mha_backend.py: TRTLLMHAAttnBackend.__init__``)."""

    snap_pages: tuple[int, ...]
    snap_to: int
    gen_min_page: int
    xqa_majors: tuple[int, ...]
    source: str


class MixedChunkPrefillGraph(_Model):
    """The prefill CUDA graph backends the release's prefill graph runner takes with
    ``--enable-mixed-chunk`` (``srt/model_executor/runner/prefill_cuda_graph_runner.py:
    PrefillCudaGraphRunner.__init__`` asserts the resolved ``cuda_graph_config.prefill.backend``
    is one of ``backends`` when it captures the prefill graph, after the weights load;
    ``disabled`` builds no such runner: ``cuda_graph_setup.py: capture_prefill_graph``)."""

    backends: tuple[str, ...]
    source: str


class FileStoreOwners(_Model):
    """Which TP ranks keep their own files in the file L3 store (``HiCacheFile``), each under
    its own ``LRUFileEvictor`` and so its own ``SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE`` cap.
    A model whose KV is not rank-replicated: every TP rank (keys suffixed
    ``_{tp_rank}_{tp_size}``), in every release here. A rank-replicated (MLA) model: ``mla``
    says: ``rank0`` (TP rank 0 alone owns and evicts the shared files; the others write none
    while a cap is set) or ``rank0-and-tp-sharded`` (rank 0 owns the shared KV files and every
    rank its own TP-sharded state, a hybrid model's mamba state, under its own cap)."""

    mla: Literal["rank0", "rank0-and-tp-sharded"]
    source: str


class Release(_Model):
    """The hand-written facts of one SGLang release (``releases/X.Y.Z/facts.yaml``).
    ``nvfp4_prefill``: the release's NVFP4 backend resolution, None where it has none.
    ``attention_registry``: the model runner's attention-backend checks (``AttentionRegistry``).
    ``hybrid_host_hits_loaded_back``: the hybrid configuration a real server of this release
    loaded host-tier hits back in (``HybridLoadBack``), None where none was tried.
    ``trtllm_mha_pages``: trtllm_mha's page sizes (``TrtllmMhaPages``).
    ``mixed_chunk_prefill_graph``: the prefill graph backends mixed chunk takes
    (``MixedChunkPrefillGraph``). ``draft_host_pool``: how a speculative draft's sidecar host KV
    pool is sized (``DraftHostPool``). ``file_store_owners``: which ranks keep their own
    file L3 files, each under its own cap (``FileStoreOwners``). ``flags_not_planned``: flags refused because
    they reach pool classes the plan does not size (``FlagNotPlanned``).
    ``multimodal_architectures_added``: the architectures this release's ``configs/model_config.py``
    multimodal list has beyond the list in ``sglang/multimodal.py`` (``MULTIMODAL_ARCHITECTURES``)."""

    version: Annotated[str, Field(pattern=_VERSION)]
    source: str
    image: str
    pins: Pins
    host_guard: HostGuard
    memory_defaults: MemoryDefaults
    cuda_graph_config_keys: CudaGraphConfigKeys
    draft_kv_cell: DraftKvCell
    draft_host_pool: DraftHostPool
    nvfp4_prefill: Nvfp4Prefill | None = None
    quantization_not_loadable: QuantizationNotLoadable | None = None
    quantization_methods: QuantizationMethods | None = None
    attention_registry: AttentionRegistry | None = None
    hybrid_host_hits_loaded_back: HybridLoadBack | None = None
    trtllm_mha_pages: TrtllmMhaPages | None = None
    mixed_chunk_prefill_graph: MixedChunkPrefillGraph | None = None
    flags_not_planned: tuple[FlagNotPlanned, ...] = ()
    file_store_owners: FileStoreOwners
    multimodal_architectures_added: tuple[str, ...] = ()


class ImageTags(_Model):
    """The tags ``escha-deploy build`` gives the images it builds, ``{release}`` standing for the
    release (``X.Y.Z``): ``hicache`` (``Dockerfile.hicache``: our series) and ``stock``
    (``docker/Dockerfile``)."""

    hicache: Annotated[str, Field(pattern=r"\{release\}")]
    stock: Annotated[str, Field(pattern=r"\{release\}")]


class _Index(_Model):
    default: Annotated[str, Field(pattern=_VERSION)]
    supported: tuple[Annotated[str, Field(pattern=_VERSION)], ...]
    series_made_for: Annotated[str, Field(pattern=_VERSION)]
    image_tags: ImageTags


def releases_dir() -> Path:
    """The folder holding one folder per release (inside the package)."""
    return paths.catalog_dir() / "releases"


def _load_yaml(path: Path) -> object:
    """A catalog YAML file of this package, read by libyaml's safe loader where PyYAML has it
    (``yaml.CSafeLoader``; the same values as ``yaml.safe_load``, about 10x less CPU: 1.8 ms
    against 19.5 ms for 0.5.19's facts.yaml, measured on the 2-core development machine), else
    by PyYAML's own safe loader."""
    import yaml

    return yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@functools.lru_cache(maxsize=1)
def _index() -> _Index:
    path = releases_dir() / INDEX
    index = _Index.model_validate(_load_yaml(path))
    if index.default not in index.supported:
        raise ValueError(f"{path}: default {index.default} is not in supported {list(index.supported)}")
    return index


def default_release() -> str:
    """The release a plan targets when no image, flag or profile names one (``index.yaml``)."""
    return _index().default


def supported_releases() -> tuple[str, ...]:
    """Every supported release, in ``index.yaml``'s order."""
    return _index().supported


def release_key(version: str) -> tuple[int, ...]:
    """A release ``"0.5.19"`` as ``(0, 5, 19)``, to order and compare releases (``"0.5.9"`` is
    older than ``"0.5.19"``, which string order gets wrong). Raises ``ValueError`` for a part
    that is not a number; catalog versions match ``_VERSION``."""
    return tuple(int(x) for x in version.split("."))


def series_release() -> str:
    """The release our patch series (``runtime_patches/``) is made against (``index.yaml``)."""
    return _index().series_made_for


def series_releases() -> tuple[str, ...]:
    """The supported releases our patch series exists for, in ``index.yaml``'s order: the one it
    is made for (``series_release``) and each with a series of its own under
    ``runtime_patches/<release>/series`` (written by ``runtime rebase --onto``)."""
    root = paths.runtime_patches_dir()
    return tuple(v for v in supported_releases()
                 if v == series_release() or (root / v / "series").is_file())


def image_tag(kind: Literal["hicache", "stock"], version: str | None = None, *, built: str | None = None) -> str:
    """The tag of the ``kind`` image built for ``version`` (default: ``default_release()``):
    ``index.yaml``'s ``image_tags`` with the release put in (``escha-sglang:X.Y.Z-hicache``); for an
    SGLang ``built`` from a commit, its version put in instead, ``+`` as ``-`` (a Docker tag holds
    ``[A-Za-z0-9_.-]``). ``BadInput`` for a release that is not supported."""
    release = check_supported(version or default_release(), "release")
    return getattr(_index().image_tags, kind).replace("{release}", built.replace("+", "-") if built else release)


def official_image(version: str | None = None) -> str:
    """The SGLang image of ``version`` (default: ``default_release()``), ``facts.yaml``'s
    ``image``: the base ``Dockerfile.hicache`` builds on unless told another."""
    return load_release(version).image


_TAG = re.compile(r":v?(\d+\.\d+\.\d+)(?![\d.])")


def image_tag_release(ref: str) -> str | None:
    """The ``X.Y.Z`` an image reference's tag starts with (``lmsysorg/sglang:v0.5.19``,
    ``escha-sglang:0.5.19-hicache``), or None; a digest (``@sha256:``) is not a tag."""
    m = _TAG.search(ref.split("@", 1)[0].rsplit("/", 1)[-1])
    return m.group(1) if m else None


def release_findings(needs: Sequence[str], series_caps: Sequence[str], images: Sequence[tuple[str, str]],
                     release: str, source: str, unset: Sequence[str] = ()) -> list[tuple[str, str, str]]:
    """``(severity, field, message)`` for a profile planned for ``release`` (from ``source``):
    an error for each needed capability of our patch series when the series does not exist for
    ``release`` (``series_releases``); a warning for each image reference (``(field, ref)``) whose
    tag names another release. A field in ``unset`` holds its default (the default release's
    image: the profile names no release), and its warning says how to get ``release``'s."""
    out: list[tuple[str, str, str]] = []
    series = [c for c in needs if c in series_caps]
    if series and release not in series_releases():
        out.append(("error", "runtime.needs",
                    f"{', '.join(series)} come from our patch series, which exists for SGLang {', '.join(series_releases())}; the plan is "
                    f"for SGLang {release} ({source}), which has none of them: clear runtime.needs for a stock "
                    f"{release} image, or see what applies with `escha-deploy runtime rebase --check {release}`"))
    for field, ref in images:
        tagged = image_tag_release(ref)
        if tagged and tagged != release and field in unset:
            out.append(("warning", field, f"{ref}, the default while the profile names no release, is tagged for "
                        f"SGLang {tagged}, but the plan is for SGLang {release} ({source}); set "
                        f"runtime.sglang_version: {release} to run and build on that release's images"))
        elif tagged and tagged != release:
            out.append(("warning", field, f"{ref} is tagged for SGLang {tagged}, but the plan is for SGLang {release} "
                        f"({source}); `up` refuses an image whose runtime says another release"))
    return out


def check_supported(version: str, where: str) -> str:
    """``version`` if it is a supported release; else ``BadInput`` naming ``where`` it came from
    and the supported releases."""
    if version not in supported_releases():
        raise BadInput(f"{where}: SGLang {version} is not a supported release "
                       f"(supported: {', '.join(supported_releases())})")
    return version


def release_dir(version: str | None = None) -> Path:
    """The data folder of ``version`` (default: ``default_release()``)."""
    return releases_dir() / check_supported(version or default_release(), "release")


def release_file(version: str | None, name: str) -> Path:
    """The path of ``name`` (``flags.json``, ``late-checks.yaml``, ...) in ``version``'s folder;
    it may not exist (a generator has not written it for that release)."""
    return release_dir(version) / name


@functools.lru_cache(maxsize=8)
def late_check_review(version: str | None = None) -> str | None:
    """What a plan of ``version`` says when its late checks are partly reviewed: the release's
    ``late-checks-review.json`` (written by ``scripts/gen_late_checks.py`` while its
    ``late-checks.yaml`` says ``review: incomplete``) in words, the unreviewed rows by startup
    area; None when every row is reviewed (no such file)."""
    import json

    path = release_file(version, "late-checks-review.json")
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    areas = ", ".join(f"{area} {n}" for area, n in data["areas"].items())
    return (f"SGLang {data['release']}'s late checks are partly reviewed: {data['unreviewed']} of the startup "
            f"refusals that read configuration have no review yet ({areas}), so a refusal there is not known to "
            f"be mirrored by a plan rule or SGLang's pre-flight; late-checks.md in its release folder lists them")


@functools.lru_cache(maxsize=8)
def load_release(version: str | None = None) -> Release:
    """The facts of ``version`` (default: ``default_release()``), read once per process."""
    path = release_file(version, FACTS)
    release = Release.model_validate(_load_yaml(path))
    if release.version != path.parent.name:
        raise ValueError(f"{path}: version {release.version} in the folder of {path.parent.name}")
    return release


#: A PEP 440 version as setuptools-scm writes an SGLang built from git (``X.Y.Z`` with an
#: optional pre-release, ``.postN``, ``.devN`` and ``+local`` part: packaging.python.org,
#: "Version specifiers"; setuptools-scm's ``guess-next-dev`` and ``post-release`` schemes).
_BUILT = re.compile(r"^v?(?P<release>\d+\.\d+\.\d+)(?P<pre>(?:a|b|rc)\d+)?(?P<post>\.post\d+)?"
                    r"(?P<dev>\.dev\d+)?(?:\+(?P<local>[a-z0-9]+(?:\.[a-z0-9]+)*))?$", re.I)
#: Where docs/runtime.md states the rule ``nearest_release`` follows.
BUILT_DOC = 'docs/runtime.md, "A commit-built base"'


def built_commit(version: str) -> str | None:
    """The commit a setuptools-scm version names in its local part (``+g1a2b3c4`` ->
    ``1a2b3c4``; ``+g1a2b3c4.d20261207``: the same, built from a dirty tree), else None."""
    m = _BUILT.match(version.strip())
    local = (m.group("local") or "") if m else ""
    head = local.split(".", 1)[0]
    return head[1:] if re.fullmatch(r"g[0-9a-f]{7,40}", head) else None


def nearest_release(version: str, where: str) -> str:
    """The supported release whose rules apply to SGLang ``version`` built from a commit (read
    from ``where``), by the rule docs/runtime.md states ("A commit-built base"): the version's
    release prefix (PEP 440: ``0.5.19.post1.dev7+g1a2b3c4`` -> ``0.5.19``, a commit after the tag
    ``v0.5.19``), which must be a supported release. A release itself is its own nearest release.

    Cannot be told, one line each: a version that is no PEP 440 version (``BadInput``, exit 2); a
    pre-release or a ``.devN`` with no ``.postN`` (``0.5.20.dev3``: setuptools-scm's default
    scheme for a commit *before* 0.5.20, after an unknown tag) and a prefix that is not a
    supported release (``Refused``, exit 3). The rebase check and the late-check trace against
    that release are ``runtime lock``'s (``runtime.lock.nearest_findings``)."""
    from escha_deploy.utils.errors import Refused

    m = _BUILT.match(version.strip())
    if m is None:
        raise BadInput(f"{where}: SGLang {version!r} is not a PEP 440 version (X.Y.Z[.postN][.devN][+gCOMMIT]); "
                       f"its nearest release cannot be told ({BUILT_DOC})")
    release = m.group("release")
    if m.group("pre") or (m.group("dev") and not m.group("post")):
        raise Refused(f"{where}: SGLang {version} is a commit before the release {release}, after a tag the "
                      f"version does not name; its nearest release cannot be told ({BUILT_DOC})",
                      hint="build it with setuptools-scm's post-release scheme (X.Y.Z.postN.devM), or from a "
                      "release tag")
    if release not in supported_releases():
        raise Refused(f"{where}: SGLang {version} is built after {release}, not a supported release "
                      f"(supported: {', '.join(supported_releases())}); its nearest release cannot be told "
                      f"({BUILT_DOC})")
    return release


def is_built_version(version: str) -> bool:
    """True when ``version`` is a PEP 440 version with more than its release part
    (``0.5.19.post1.dev7+g1a2b3c4``: built from a commit), False for a plain ``X.Y.Z`` or text
    that is no such version."""
    m = _BUILT.match(version.strip())
    return m is not None and m.group("release") != version.strip()


class ReleaseChoice(_Model):
    """The release a plan targets and where that came from (``source``: ``the image X``,
    ``--sglang-version``, ``runtime.sglang_version``, or ``the default release``). ``built``:
    the SGLang version when the runtime is built from a commit, not a release (``version`` is
    then its nearest release, ``nearest_release``), else None."""

    version: str
    source: str
    built: str | None = None


def choose_release(*, image: tuple[str | None, str] | None = None, flag: str | None = None,
                   profile: str | None = None, profile_where: str = "runtime.sglang_version") -> ReleaseChoice:
    """The release that will run: the image's (``(version, where)``: its runtime description
    or labels; ``version`` None when the image does not say), else ``flag``
    (``--sglang-version``), else ``profile`` (``runtime.sglang_version``), else the default.

    Raises ``BadInput`` (exit 2) for a flag or profile release that is not supported,
    ``Refused`` (exit 3) for an image whose release is not supported, and ``Refused`` naming
    both when two sources name different releases.
    """
    from escha_deploy.utils.errors import Refused

    named: list[tuple[str, str]] = []
    built: str | None = None
    if image is not None and image[0]:
        version = image[0]
        if version not in supported_releases() and is_built_version(version):  # built from a commit
            built, version = version, nearest_release(version, image[1])  # planned with its nearest release
        elif version not in supported_releases():
            raise Refused(f"{image[1]} runs SGLang {version}, not a supported release "
                          f"(supported: {', '.join(supported_releases())})")
        named.append((version, image[1]))
    if flag:
        if is_built_version(flag):
            built = built or flag
            named.append((nearest_release(flag, "--sglang-version"), "--sglang-version"))
        else:
            named.append((check_supported(flag, "--sglang-version"), "--sglang-version"))
    if profile:
        named.append((check_supported(profile, profile_where), profile_where))
    for version, where in named[1:]:
        if version != named[0][0]:
            raise Refused(f"SGLang release: {named[0][1]} says {named[0][0]}, {where} says {version}",
                          hint="name one release, or plan for the image that runs it")
    if named and built:
        return ReleaseChoice(version=named[0][0], built=built, source=(
            f"{named[0][1]}: SGLang {built}, built from a commit, planned with the rules of SGLang "
            f"{named[0][0]}, its nearest release ({BUILT_DOC})"))
    if named:
        return ReleaseChoice(version=named[0][0], source=named[0][1])
    return ReleaseChoice(version=default_release(), source="the default release, escha_deploy/catalog/releases/index.yaml")


def main() -> int:
    """``python -m escha_deploy.sglang.releases``: print the supported releases, one a line, the
    default first (``.ci/test`` loops over them)."""
    rest = [v for v in supported_releases() if v != default_release()]
    print("\n".join([default_release(), *rest]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
