"""The profile's own rules: every check that needs the profile alone, in one list (``RULES``).

Each rule returns ``Problem``s (key path, message, the other keys it depends on); its ``kind``
says what loading does with them: ``error`` is bad input (exit 2, ``BadInput``), ``refusal``
is a configuration SGLang 0.5.19 accepts while parsing its arguments and refuses once it runs
(exit 3, ``Refused``; docs/late-checks.md lists every such check), ``warning`` is a key that
loads but does nothing. ``load_profile`` runs them all and places each problem at the line
that set one of its keys; ``profiles validate`` prints them the same way. Rules that need host
facts, the model's architecture or the runtime's capabilities are the planner's
(planner/validate.py).

Pure: no I/O beyond reading the committed flag catalog.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from .models import FLAT_L3_KEYS, Profile, key_metadata, normalize_kv_dtype

Key = tuple[str, ...]


@dataclass(frozen=True)
class Problem:
    """One problem of one rule: ``loc`` is the key path it is reported at, ``deps`` the other
    keys it depends on (the problem is placed where the user set one of them)."""

    loc: Key
    message: str
    deps: tuple[Key, ...] = ()


@dataclass(frozen=True)
class Rule:
    """A check over a validated profile; ``kind``: what a problem is (module docstring)."""

    name: str
    kind: Literal["error", "refusal", "warning"]
    check: Callable[[Profile], list[Problem]]


def _container_gpus(profile: Profile) -> list[Problem]:
    """The GPUs the container gets must hold ``runtime.tp_size`` ranks (SGLang places one TP
    rank per visible GPU: ``srt/entrypoints/engine.py`` ``_launch_scheduler_processes`` gives
    rank ``i`` GPU ``base_gpu_id + i * gpu_id_step``), without repeats, and the box must have
    those ids."""
    out: list[Problem] = []
    tp = profile.runtime.tp_size
    gpus = profile.container.gpus
    if gpus != "all" and gpus:  # []: no GPU requested (a stand-in server that needs none)
        if len(set(gpus)) != len(gpus):
            out.append(Problem(("container", "gpus"), f"device ids repeat: {gpus}"))
        elif len(gpus) < tp:
            out.append(Problem(("container", "gpus"), f"{len(gpus)} GPU(s) {gpus} cannot hold runtime.tp_size {tp} ranks",
                               (("runtime", "tp_size"),)))
        if any(g >= profile.hardware.gpu_count for g in gpus):
            out.append(Problem(("container", "gpus"),
                               f"device id {max(gpus)} but hardware.gpu_count is {profile.hardware.gpu_count}",
                               (("hardware", "gpu_count"),)))
    return out


def _tp_fits(profile: Profile) -> list[Problem]:
    """``runtime.tp_size`` ranks need that many GPUs in the box."""
    rt, hw = profile.runtime, profile.hardware
    if rt.tp_size > hw.gpu_count:
        return [Problem(("runtime", "tp_size"), f"tp_size {rt.tp_size} is larger than hardware.gpu_count {hw.gpu_count}",
                        (("hardware", "gpu_count"),))]
    return []


def _explicit_ratio(profile: Profile) -> list[Problem]:
    """An explicit ``hicache.hicache_ratio`` below ``hicache.min_ratio`` is refused, as auto
    turns HiCache off below it: a host pool smaller than the device pool is what SGLang itself
    warns about (``sglang/srt/mem_cache/pool_host/base.py:165``: "HiCache %s host pool (%d
    tokens) is smaller than the device pool (%d tokens); L2 cache effectiveness is reduced."),
    and a ratio of 5e-324 would plan a host pool of one token."""
    hc = profile.hicache
    if hc.enabled and not hc.hicache_size and hc.hicache_ratio != "auto" and hc.hicache_ratio < hc.min_ratio:
        return [Problem(("hicache", "hicache_ratio"),
                        f"{hc.hicache_ratio:g} is below hicache.min_ratio {hc.min_ratio:g}: the host pool would be "
                        "smaller than the device pool; raise the ratio, set hicache.min_ratio lower, or leave it auto",
                        (("hicache", "min_ratio"),))]
    return []


def _ratio_bounds(profile: Profile) -> list[Problem]:
    """``hicache.min_ratio`` may not be above ``hicache.max_ratio``: the recommended ratio is
    searched between them (``planner.search``), so with the floor above the cap no ratio is ever
    recommended and auto turns HiCache off for a reason that is not the box's memory."""
    hc = profile.hicache
    if hc.min_ratio > hc.max_ratio:
        return [Problem(("hicache", "min_ratio"),
                        f"{hc.min_ratio:g} is above hicache.max_ratio {hc.max_ratio:g}: no ratio can be "
                        "recommended between them; lower hicache.min_ratio or raise hicache.max_ratio",
                        (("hicache", "max_ratio"),))]
    return []


def _model_path(profile: Profile) -> list[Problem]:
    """``model.path`` is what SGLang loads (``--model-path``): an empty or blank one renders
    ``--model-path ''``, which SGLang's transformers call reports as a missing repository."""
    out: list[Problem] = []
    draft = profile.model.draft
    for loc, path in ((("model", "path"), profile.model.path), (("model", "draft", "path"), draft and draft.path)):
        if path is not None and (not path.strip() or path != path.strip() or any(not c.isprintable() for c in path)):
            out.append(Problem(loc, f"{path!r} is not a model path: give the folder the server loads "
                               "(no blanks at its ends, no control characters)"))
    return out


def extra_arg(args: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``runtime.extra_args`` (``--flag V`` or ``--flag=V``; the last
    one wins, as argparse's), ``"true"`` for a bare switch, ``None`` when absent."""
    found = None
    for i, a in enumerate(args):
        if a == flag:
            nxt = args[i + 1] if i + 1 < len(args) else None
            found = nxt if nxt is not None and not nxt.startswith("--") else "true"
        elif a.startswith(flag + "="):
            found = a.split("=", 1)[1]
    return found


def speculative_algorithm(profile: Profile) -> str | None:
    """``runtime.speculative.algorithm`` (``--speculative-algorithm``) as SGLang reads it (upper
    case, ``arg_groups/speculative_hook.py: handle_speculative_decoding``); None: no speculation.
    The flag in ``runtime.extra_args`` is refused as the key's (``extra-args-not-a-key-flag``)."""
    spec = profile.runtime.speculative
    return spec.algorithm.upper() if spec is not None else None


def _weights(profile: Profile) -> list[Problem]:
    """One weights estimate: ``model.weights_total`` (divided by ``runtime.tp_size``) or
    ``model.weights_per_rank``, never both, never neither."""
    m = profile.model
    if m.weights_total is not None and m.weights_per_rank is not None:
        return [Problem(("model", "weights_per_rank"), "give model.weights_total or model.weights_per_rank, not both",
                        (("model", "weights_total"),))]
    if m.weights_total is None and m.weights_per_rank is None:
        return [Problem(("model", "weights_total"), "missing: the device bytes of the weights of all TP ranks "
                        "(e.g. 16.2GB; each rank holds weights_total / runtime.tp_size)")]
    return []


def key_flags() -> dict[str, tuple[str, ...]]:
    """Dotted key -> the SGLang flags its ``SGLangFlag`` metadata names, for every leaf key of
    the profile models that names one (``models.key_metadata``; ``model.architecture.*``
    describe the model and name none)."""
    return {key: (meta.flag,) for key, meta in key_metadata().items() if meta.flag}


def extra_args_duplicating_keys(profile: Profile) -> list[tuple[tuple[str, ...], str]]:
    """Flags in ``runtime.extra_args`` that a profile key renders, as ``(key path, message)``.

    A flag passed raw would skip every rule on its key (``--enable-mixed-chunk`` in extra_args
    escaped the refusal of ``runtime.enable_mixed_chunk``), so the key must be used instead.
    The key-to-flag mapping is each key's ``SGLangFlag`` metadata (``key_flags``), taken when
    the SGLang 0.5.19 flag catalog has that flag; matching is by argparse destination, so an
    alias or ``--flag=value`` is caught too."""
    return [(p.loc, p.message) for p in _extra_args_keys(profile)]


def _extra_args_keys(profile: Profile) -> list[Problem]:
    if not profile.runtime.extra_args:  # nothing to match: skip building the catalog and key map
        return []
    from ..sglang import capabilities as caps
    from ..sglang.flagcheck import _parser_for

    # the catalog with every capability's declared flags (int2-kv's --kv-cache-quant-group-size)
    catalog = _parser_for(frozenset(caps.CAPABILITIES))
    key_of: dict[str, str] = {}
    for key, flags in key_flags().items():
        for flag in filter(lambda f: f in catalog.by_option, flags):
            key_of.setdefault(catalog.by_option[flag].dest, key)
    out: list[Problem] = []
    for i, item in enumerate(profile.runtime.extra_args):
        opt = item.split("=", 1)[0]
        spec = catalog.by_option.get(opt) if opt.startswith("--") else None
        if spec is not None and spec.dest in key_of:
            key = key_of[spec.dest]
            out.append(Problem(("runtime", "extra_args"),
                               f"item {i}: {opt} is the flag of the profile key {key}; set {key} instead, so the rules "
                               "on that key apply"))
    return out


#: KV dtypes whose scale tensors SGLang 0.5.19's HiCache host pools never copy.
_SCALED_KV_DTYPES = ("mxfp8", "nvfp4", "fp4_mx_block16")


def _hicache_combinations(profile: Profile) -> list[Problem]:
    """HiCache settings that cannot work together (with HiCache on)."""
    out: list[Problem] = []
    rt, hc = profile.runtime, profile.hicache
    if not hc.enabled:
        return out
    on = (("hicache", "enabled"),)
    dtype = normalize_kv_dtype(rt.kv_cache.dtype)
    # HiCache with disable_radix_cache or enable_int8_mamba_checkpoint: SGLang refuses both while
    # resolving its arguments; the planner reports them (planner/validate.py), so the argument
    # oracle can hold them against SGLang's own check.
    if dtype in _SCALED_KV_DTYPES:
        out.append(Problem(("runtime", "kv_cache", "dtype"),
                           f"HiCache host pools never copy {dtype}'s scale tensors and size tokens at the wrong width: "
                           "restored prefixes would be corrupt; use fp8_e4m3 or bf16", on))
    sb = hc.hicache_storage_backend
    backend = ("hicache", "l3", "kind")
    if hc.hicache_host_memory_mode == "buffer_only" and not sb:
        out.append(Problem(("hicache", "hicache_host_memory_mode"), "buffer_only needs an L3 storage backend",
                           (backend,) + on))
    if sb and dtype == "int2":
        out.append(Problem(backend,
                           "L3 storage with INT2 KV: the flat data page carries the packed codes without their "
                           "scales/zeros (the INT2 host pool keeps them in separate tensors); remove the storage backend",
                           (("runtime", "kv_cache", "dtype"),) + on))
    if sb == "file" and not hc.storage_dir:
        out.append(Problem(("hicache", "l3", "dir"),
                           "the file backend needs a host directory (it must outlive the container): set hicache.l3.dir",
                           (backend,) + on))
    if sb == "file" and hc.storage_max_size == 0:
        # SGLang reads "0" as no cap at all (lru_file_evictor.py: _parse_size_to_bytes)
        out.append(Problem(("hicache", "l3", "max_size"),
                           "0 turns SGLang's cap off (the store then grows until the disk is full): give a size, "
                           "e.g. 512GB, or leave the key out", (backend,) + on))
    return out


def profile_only_warnings(profile: Profile) -> list[tuple[tuple[str, ...], str]]:
    """Keys that load but do nothing, and flat L3 keys, as ``(key path, message)``: warnings,
    not errors, printed by ``profiles validate`` (with file:line) and with every plan
    (planner/validate.py).

    ``storage_dir`` and ``storage_max_size`` configure the file L3 backend only: they become
    ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR`` / ``_MAX_SIZE``, which SGLang's ``HiCacheFile``
    reads (``srt/mem_cache/hicache_storage.py``). Given without that backend they are dropped
    (``models.l3_from_flat``), and a user who set them likely expected an L3 tier. The flat keys
    themselves (``hicache_storage_backend``, ``storage_dir``, ``storage_max_size``) are read
    into ``hicache.l3``; one warning names the key to write instead."""
    hc = profile.hicache
    out: list[tuple[tuple[str, ...], str]] = []
    if profile.model.draft is not None and speculative_algorithm(profile) is None:
        # SGLang builds a draft worker only for a speculative algorithm (managers/scheduler.py:
        # Scheduler.maybe_init_draft_worker returns at once when spec_algorithm.is_none())
        out.append((("model", "draft"), "no runtime.speculative.algorithm (--speculative-algorithm): SGLang loads "
                    "no draft model, and the plan counts none; set e.g. runtime.speculative: {algorithm: EAGLE3}"))
    read = [k for k in hc._flat_keys if k not in hc._ignored_keys]
    if read:
        shape = ("{kind: file, dir: DIR, max_size: SIZE}" if hc.hicache_storage_backend == "file"
                 else f"{{kind: {hc.hicache_storage_backend}}}" if hc.hicache_storage_backend else "null")
        named = " and ".join(f"{k} as l3.{FLAT_L3_KEYS[k]}" for k in read)
        out.append((("hicache", read[0]), f"read {named}: write `l3: {shape}` instead"))
    keys = list(hc._ignored_keys)
    if not hc.enabled or not keys:
        return out
    named = " and ".join(keys)
    verb = "is" if len(keys) == 1 else "are"
    if hc.hicache_storage_backend is None:
        msg = (f"no hicache_storage_backend, so L3 is off and {named} {verb} ignored; "
               "write `l3: {kind: file, dir: DIR}` to use them as the L3 file store")
    else:
        msg = (f"{named} {verb} ignored: {'it configures' if len(keys) == 1 else 'they configure'} the file "
               f"L3 backend only, and hicache_storage_backend is {hc.hicache_storage_backend}")
    return out + [(("hicache", keys[0]), msg)]


# --------------------------------------------------------------------------- SGLang's late refusals
# Rules that need the profile alone, for configurations SGLang 0.5.19 accepts while parsing and
# resolving its arguments and refuses later, once the server runs (docs/late-checks.md lists
# every such check). They are not pydantic errors: the input is well formed, SGLang refuses it,
# so loading raises ``Refused`` (exit 3) and ``plan``/``up``/``serve``/``profiles validate`` all
# report it as ``file:line: key: message``. Rules that need the architecture or host facts are
# the planner's (planner/validate.py).


def sglang_late_refusals(profile: Profile) -> list[tuple[tuple[str, ...], str]]:
    """``(key path, message)`` for each configuration SGLang 0.5.19 refuses after startup."""
    out: list[tuple[tuple[str, ...], str]] = []
    hc = profile.hicache
    if hc.enabled and hc.hicache_io_backend == "kernel_ascend":
        # pool_host/mha.py: load_to_device_per_layer takes kernel_ascend only with
        # page_first_direct through Ascend NPU kernels; pool_host/mamba.py: _copy_tensor raises
        # "Unsupported io_backend" for anything but kernel and direct.
        out.append((("hicache", "hicache_io_backend"),
                    "kernel_ascend moves HiCache pages with Ascend NPU kernels: on a CUDA GPU SGLang fails at the "
                    "first host transfer (pool_host/mha.py, pool_host/mamba.py: Unsupported io_backend); use kernel or direct"))
    if hc.enabled and hc.hicache_io_backend == "direct" and hc.hicache_mem_layout == "page_head":
        # pool_host/mha.py: load_to_device_per_layer / backup_from_device_all_layer raise
        # "Unsupported layout" for io_backend direct unless the layout is layer_first or
        # page_first_direct (arg_groups/hicache_hook.py rewrites only page_first + direct).
        out.append((("hicache", "hicache_mem_layout"),
                    "page_head with hicache_io_backend direct fails at the first host transfer "
                    "(pool_host/mha.py: Unsupported layout); use page_first_direct or layer_first with direct, "
                    "or page_head with kernel"))
    return out


def _late(profile: Profile) -> list[Problem]:
    return [Problem(loc, msg) for loc, msg in sglang_late_refusals(profile)]


def _inert_keys(profile: Profile) -> list[Problem]:
    return [Problem(loc, msg) for loc, msg in profile_only_warnings(profile)]


#: Every rule over the profile alone, in the order their problems are reported within a line.
RULES: tuple[Rule, ...] = (
    Rule("container-gpus", "error", _container_gpus),
    Rule("tp-fits-the-box", "error", _tp_fits),
    Rule("min-ratio-at-most-max", "error", _ratio_bounds),
    Rule("explicit-ratio-at-least-min", "error", _explicit_ratio),
    Rule("model-path-given", "error", _model_path),
    Rule("one-weights-estimate", "error", _weights),
    Rule("extra-args-not-a-key-flag", "error", _extra_args_keys),
    Rule("hicache-combinations", "error", _hicache_combinations),
    Rule("sglang-late-refusals", "refusal", _late),
    Rule("inert-keys", "warning", _inert_keys),
)


def _of(profile: Profile, kind: str, skip: tuple[str, ...] = ()) -> list[tuple[Key, str]]:
    return [(p.loc, p.message) for r in RULES if r.kind == kind and r.name not in skip for p in r.check(profile)]


def cross_field_problems(profile: Profile) -> list[tuple[tuple[str, ...], str]]:
    """Every bad-input problem of ``RULES`` (kind ``error``), as ``(key path, message)``."""
    return _of(profile, "error")


def profile_only_problems(profile: Profile) -> list[tuple[tuple[str, ...], str]]:
    """The bad-input problems of ``RULES`` other than the container's GPU ids, as
    ``(key path, message)``."""
    return _of(profile, "error", skip=("container-gpus",))


def warnings_of(profile: Profile) -> list[tuple[tuple[str, ...], str]]:
    """The warnings of ``RULES`` (keys that load but do nothing), as ``(key path, message)``."""
    return _of(profile, "warning")
