"""SGLang's own pre-flight: before the server starts, SGLang's code answers for the argv it will run.

``serve`` (``--spec`` in the image, and native ``--profile``) runs this file as a script in SGLang's
own interpreter, with the environment the server gets, before the first weight loads. It runs
the stages SGLang's ``launch_server`` runs first, and stops at the first refusal:

1. **argument resolution**: ``srt/server_args.py: prepare_server_args(argv)`` then
   ``ServerArgs.resolve_once()`` (``launch_server.run_server`` does the same; the hooks under
   ``srt/arg_groups/`` run here, on this machine's platform);
2. **model config**: ``srt/configs/model_config.py: ModelConfig.from_server_args`` reads the model
   folder's config.json (the context-length refusal, the architecture's registry entry);
3. **attention backend**: what resolution chose for the model class on this GPU
   (``arg_groups/overrides.py``: ``attention_backend``, prefill and decode backends), reported;
4. **KV cache configurator**: ``srt/mem_cache/kv_cache_configurator.py: KVCacheConfigurator``'s
   sizing as ``ModelRunner`` runs it after the weights load (``_profile_available_bytes``, with
   ``_handle_max_mamba_cache`` for hybrid models, ``config_from_budget``,
   ``resolve_max_num_reqs``; on 0.5.23 also the pool configurator's
   ``finalize_with_max_running_requests``, as its ``_resolve_memory_pool_config`` does), with no
   pool allocated: the free GPU memory before and after the weights are the plan's figures
   (``device`` in the request: ``free_before_weights`` and ``weights``, bytes per rank), the
   world group one process, the parallel widths what SGLang itself stamps or derives (attention
   TP = ``--tp-size`` on 0.5.19, ``initialize_model_parallel``'s stamp; on 0.5.23 what
   ``runtime_context.publish`` derives from the resolved arguments). One function per shape of
   the configurator (``_configurator_shape``, read off its fields): 0.5.19's is built without
   its constructor, with the fields its methods read; 0.5.23's through its own constructor,
   with what ``ModelRunner.init_kv_cache_configurator`` hands it, each from SGLang's function
   for it. Answers the device pool's tokens (``max_total_num_tokens``), the mamba slots, the
   running-request cap and the pools' bytes (tokens x the pool configurator's bytes per token;
   (slots + 1) x the mamba state per request);
5. **host pools** (HiCache on): ``srt/mem_cache/pool_host/mha.py: MHATokenToKVPoolHost`` (and
   ``pool_host/mamba.py: MambaPoolHost``) built over CPU views of the device pools stage 4 sized
   (0.5.19: the pools themselves, as namespaces; 0.5.23: their buffer descriptions,
   ``device_pool_info.MHABufferInfo`` and ``MambaStateBufferInfo``, over ``meta``-device
   tensors), with ``--hicache-size`` split over the device pools' bytes as
   ``hybrid_pool_assembler._split_hicache_size`` splits it; their allocation answered by a
   zero-stride view (nothing of their size is mapped) and their host-memory check run unchanged
   against this host's free memory (psutil; 0.5.23 bounds it by the cgroup too), split over the
   ranks of the box (``ranks_per_host``, which reads the world group, answered ``tp x pp /
   nnodes``), or against ``device["host_budget"]`` bytes when the request gives the described
   host's figure (the tests and a GPU machine that is not the target box).

6. **model runner**: the checks SGLang's ``ModelRunner`` makes when it builds the attention
   backend after the weights load (``_model_runner``): ``model_runner_components/
   attention_backend_setup.py``'s resolution and build, each phase's factory in
   ``layers/attention/attention_registry.py`` and ``attn_backend_wrapper`` (the hybrid
   linear-attention wrapper), on the model config of stage 2 and the card's compute capability
   (``device["capability"]``, the plan's; else this machine's reading), the backend classes
   stood in (their constructors take the device pools); of their constructors' own checks, the
   ones ``CONSTRUCTOR_CHECKS`` names run, as SGLang's statements compiled from its file
   (trtllm_mha's page size off XQA cards).

Stages 4 and 5 run only when the request carries ``device`` (`up`'s check and native ``serve``
take it from the plan; ``serve --spec`` from the figures the plan recorded in the launch spec,
``LaunchSpec.preflight``, host budget included; a spec written before they were recorded runs
stages 1-3 and says the other two are skipped), and only where they can stand in for SGLang's
own (``sizing_unsupported``: a configurator shape neither function builds, or ``--pp-size`` > 1,
is said and skipped). What they replace in SGLang's modules for the call (the free-memory and
world-group readings, the host pools' allocation and host-memory reading) is put back, and so
is the process environment SGLang's argument resolution writes (``sglang_side``), so several
argvs in one process (``run_many``) each see SGLang's own. No weights, no NCCL, no CUDA
allocation.

Two halves in one file: ``main()`` is the SGLang side (it imports only the standard library and
``sglang``, since SGLang's interpreter has no escha_deploy); ``run()`` is the escha-deploy side,
which starts it and reads its one JSON answer. A refusal carries SGLang's message, its
``file:function``, the stage, and the argv flags it names or, when its message names none, the
flags the failing function reads.

Whose fault an exception at a stage is, is decided by where it was raised (``raised_by_sglang``):
in SGLang's code (a function of the ``sglang`` package, or a library it called) it is SGLang's
refusal; in this file's own code (the stand-ins, the configurator's fields, the host pools'
inputs, a name this SGLang lacks) it is a fault of the harness, answered as ``fault: "harness"``
with its traceback, which ``serve`` and `up` report as an internal error (exit 1, "please
report"), never as a refusal set by a profile key.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STAGES = ("argument resolution", "model config", "attention backend", "KV cache configurator", "host pools",
          "model runner")
#: The sizing stages (4 and 5): run only with the plan's device figures.
SIZING = STAGES[3:5]

#: ``0`` skips SGLang's own pre-flight before the server starts (``serve``, and `up`'s check
#: ``sglang pre-flight``), ``1`` runs it even where the GPU test switch (``ESCHA_SKIP_GPU_PREFLIGHT=1``) is set: SGLang's
#: stages read the real GPU's platform, which a machine without one (that switch) lacks.
PREFLIGHT_ENV = "ESCHA_SGLANG_PREFLIGHT"
#: The request, when not on stdin (`up`'s throw-away container: ``launch.image_preflight``).
REQUEST_ENV = "ESCHA_PREFLIGHT_REQUEST"

#: How long the pre-flight may take (importing SGLang takes 8-15 s on a 2-core machine).
TIMEOUT_S = 240.0
#: Seconds the pre-flight may take instead of ``TIMEOUT_S`` (``timeout_from_env``): a box that
#: imports torch and SGLang slowly (WSL2 reading a Windows drive, a loaded machine) waits longer
#: rather than starting without SGLang's answer.
TIMEOUT_ENV = "ESCHA_SGLANG_PREFLIGHT_TIMEOUT"


def timeout_from_env(environ: dict[str, str] | None = None) -> float:
    """The pre-flight's deadline in seconds: ``ESCHA_SGLANG_PREFLIGHT_TIMEOUT`` when set (a plain
    decimal number of seconds, more than 0 and at most 3600, read by ``units.parse_number``), else
    ``TIMEOUT_S``. Raises ``escha_deploy.utils.errors.BadInput`` (exit 2) naming the variable."""
    from escha_deploy.utils.units import seconds_from_env

    return seconds_from_env(os.environ if environ is None else environ, TIMEOUT_ENV, TIMEOUT_S)

# --------------------------------------------------------------------------- SGLang's side

#: This file's name as its own code sees it: its path, or ``<string>`` when its source is given to
#: ``python -c`` (`up`'s throw-away container, ``launch.image_preflight``).
_HERE = (lambda: None).__code__.co_filename
#: How this file is named in a harness fault's ``site`` (wherever it runs from).
HARNESS_FILE = "launch/sglang_preflight.py"


def _sglang_roots() -> tuple[str, ...]:
    """The folders of the imported ``sglang`` package (``sglang.__path__``), each ending in a
    separator; empty when it is not imported."""
    mod = sys.modules.get("sglang")
    paths = list(getattr(mod, "__path__", None) or [])
    return tuple(os.path.join(os.path.abspath(p), "") for p in paths)


def raised_by_sglang(exc: BaseException) -> bool:
    """Whether SGLang's code raised ``exc`` (SGLang's refusal) rather than this harness (a fault
    of ours). Decided by the traceback's frames from the stage's call down to the raise: the
    innermost frame that is either in the ``sglang`` package or in this file decides. SGLang's:
    SGLang raised it, or a library SGLang called (torch, transformers, argparse). This file's, or
    neither at all: the harness raised it, a library the harness called directly did, or a
    stand-in of this file that SGLang called did (the free-memory reading, the zero-stride
    allocation); an ``import`` of a name this SGLang lacks is raised in this file's frame."""
    roots = _sglang_roots()
    owner = "harness"
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name == _HERE:
            owner = "harness"
        elif roots and not name.startswith("<") and os.path.abspath(name).startswith(roots):
            owner = "sglang"
        tb = tb.tb_next
    return owner == "sglang"


def _harness_site(exc: BaseException) -> str:
    """``launch/sglang_preflight.py:FUNCTION`` of the innermost frame of this file in ``exc``'s
    traceback (the harness function at fault)."""
    func = "?"
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _HERE:
            func = tb.tb_frame.f_code.co_name
        tb = tb.tb_next
    return f"{HARNESS_FILE}:{func}"


def harness_fault(exc: BaseException, stage: str) -> dict[str, Any]:
    """The answer for a fault of this harness at ``stage``: ``ok`` False, ``fault`` ``"harness"``,
    the exception's ``type`` and ``message``, ``site`` (``_harness_site``) and the formatted
    ``traceback`` (its last 20,000 characters). No profile flags: it is not SGLang's refusal."""
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    message = " ".join(str(exc).split()) or type(exc).__name__
    return {"ok": False, "fault": "harness", "stage": stage, "type": type(exc).__name__, "message": message[:1000],
            "site": _harness_site(exc), "flags": [], "traceback": text[-20000:]}


def _site(exc: BaseException) -> tuple[str, str]:
    """``(file under sglang/, function)`` of the innermost frame inside SGLang's server code
    (``sglang/srt/``), wherever the package is installed."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/sglang/srt/" in f.filename.replace("\\", "/")]
    if not frames:
        frames = traceback.extract_tb(exc.__traceback__)[-1:]
    if not frames:
        return "?", "?"
    f = frames[-1]
    path = f.filename.replace("\\", "/")
    # the last /sglang/: an image keeps SGLang in /opt/sglang/venv/.../site-packages/sglang/
    path = path.rsplit("/sglang/", 1)[-1] if "/sglang/" in path else Path(path).name
    return path, f.name


def _stage_of(path: str, current: str) -> str:
    """The stage a refusal belongs to, from the SGLang file that raised it (the sizing stages are
    the stage they ran in, whatever file raised)."""
    if current in STAGES[3:]:  # the sizing stages and the model runner's: the stage they ran in
        return current
    if path.startswith(("srt/configs/", "srt/utils/hf_transformers")):
        return "model config"
    if "attention" in path:
        return "attention backend"
    return current


#: The flags the sizing stages' functions read (through ``runtime_context``'s views and the pools'
#: own attributes, which a source scan cannot follow): a refusal there whose message names none
#: names these.
STAGE_FLAGS = {
    "KV cache configurator": ("--mem-fraction-static", "--max-total-tokens", "--max-mamba-cache-size",
                              "--mamba-full-memory-ratio", "--max-running-requests", "--context-length"),
    "host pools": ("--hicache-size", "--hicache-ratio", "--hicache-mem-layout"),
    # the model runner's attention-backend checks read the runner's resolved backend names
    # (runner.prefill_attention_backend_str ...), which these flags set
    "model runner": ("--attention-backend", "--prefill-attention-backend", "--decode-attention-backend"),
}


def _flags_read(exc: BaseException, message: str, dest_flag: dict[str, str], argv: list[str],
                stage: str = "") -> list[str]:
    """The argv flags a refusal is about: those its message names (``--flag`` or the dest), else
    at the sizing stages the ones the stage reads (``STAGE_FLAGS``), else the ones the failing
    function's source reads (``x.dest``), keeping only flags in ``argv``."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    named = [f for f in re.findall(r"--[a-z0-9][a-z0-9-]*", message) if f in given]
    # a dest with an underscore (mem_fraction_static): a plain word ("host") is English, not a flag
    named += [dest_flag[d] for d in re.findall(r"[a-z_][a-z0-9_]+", message) if "_" in d and d in dest_flag
              and dest_flag[d] in given]
    if not named and stage in STAGE_FLAGS:  # pool classes read their own attributes (self.page_size), not the args
        named = [f for f in STAGE_FLAGS[stage] if f in given]
    if not named:
        import inspect

        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        try:
            src = inspect.getsource(tb.tb_frame.f_code) if tb is not None else ""
        except (OSError, TypeError):
            src = ""
        named = [dest_flag[d] for d in re.findall(r"\.([a-z_][a-z0-9_]+)", src) if d in dest_flag
                 and dest_flag[d] in given]
    return list(dict.fromkeys(named))


def _configurator_shape() -> str | None:
    """Which shape of ``srt/mem_cache/kv_cache_configurator.py: KVCacheConfigurator`` this
    SGLang has, read off the dataclass's fields (and the parallel context's methods), not its
    version string: ``"ps"`` (SGLang 0.5.19: a ``ps`` field holding the parallel widths, which
    ``ParallelContext.stamp_derived_widths`` stamps), ``"fields"`` (SGLang 0.5.23: ``pp_size``,
    ``attn_dp_size``, ``pp_group``, ``server_args``, ``spec_aux_config`` ... as fields, the
    widths derived by ``runtime_context.publish``), or None for a shape no stage-4 function
    here builds."""
    import dataclasses

    from sglang.srt.mem_cache import kv_cache_configurator as kcc
    from sglang.srt.runtime_context import get_parallel

    cls = kcc.KVCacheConfigurator
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set(
        getattr(cls, "__annotations__", {}))
    if "ps" in names and hasattr(get_parallel(), "stamp_derived_widths"):
        return "ps"
    if {"pp_size", "attn_dp_size", "pp_group", "server_args", "spec_aux_config", "layer_info"} <= names:
        return "fields"
    return None


def sizing_unsupported(sa: Any) -> str | None:
    """Why the sizing stages cannot stand in for SGLang's own on ``sa`` (the resolved
    ``ServerArgs``), or None. They build SGLang's ``KVCacheConfigurator`` for the model without
    loading it, one function per release shape (``_configurator_shape``: 0.5.19's, with its
    ``ps`` field, and 0.5.23's, with the widths as fields and derived in ``publish``); another
    shape is not run. And one pipeline stage: the stand-ins have no pipeline-parallel group,
    and with ``--pp-size`` > 1 SGLang's sizing needs one (``_apply_token_constraints``
    all-reduces the token count over it; 0.5.23's ``_handle_max_mamba_cache`` charges the
    largest stage's share of the mamba layers, and the host pools' ``sync_fixed_hicache_size``
    takes the MIN over the PP group). A stage that cannot run is said and skipped, never
    reported as SGLang's refusal."""
    if int(getattr(sa, "pp_size", 1) or 1) > 1:
        return f"--pp-size {sa.pp_size}: the stand-in configurator has no pipeline-parallel group"
    if _configurator_shape() is None:
        return ("this SGLang's KVCacheConfigurator is not a shape the stand-in builds "
                "(SGLang 0.5.19's or 0.5.23's)")
    return None


def _kv_configurator(sa: Any, mc: Any, device: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Stage 4 (module docstring): SGLang's ``KVCacheConfigurator`` sizing on the resolved and
    published ``sa`` and the model config ``mc``, with ``device``'s figures (bytes per rank) as
    the free GPU memory before and after the weights; the function for this SGLang's shape
    (``_configurator_shape``). Returns the configurator and the answers (``_sized``).

    Before it, ``gc.freeze()``: SGLang's ``_profile_available_bytes`` runs ``gc.collect()`` so
    dead tensors release their GPU memory before it reads the free figure; here that figure is
    the plan's, so what a collection frees cannot change an answer, and a full collection walks
    every object the torch and SGLang imports made: 0.46 s a call, 29 s of the oracle's 71 s of
    CPU over 63 cases (cProfile, SGLang 0.5.19, 2026-12-02). Frozen objects (those alive now)
    are skipped by every later collection; objects made later are still collected, and the
    process ends after its argvs."""
    import gc

    gc.freeze()
    if _configurator_shape() == "fields":
        return _kv_configurator_fields(sa, mc, device)
    return _kv_configurator_ps(sa, mc, device)


def _sized(kvc: Any, budget: int, tokens: int, reqs: int, slots: int) -> dict[str, Any]:
    """Stage 4's answers from SGLang's sizing: the KV budget (bytes), the device pool's tokens,
    the running-request cap, the pool configurator's bytes per token
    (``pool_configurator.create_memory_pool_configurator(kvc)._cell_size``), the KV pool's bytes
    (tokens x that), the mamba slots and their pool's bytes ((slots + 1) x the model's
    ``mamba_cache_per_req``, the pool's padding slot included)."""
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator

    cell = int(getattr(create_memory_pool_configurator(kvc), "_cell_size", 0) or 0)
    per_req = int(kvc.mambaish_config.mamba2_cache_params.mamba_cache_per_req) if slots else 0
    return {"kv_budget_bytes": int(budget), "max_total_num_tokens": int(tokens), "max_running_requests": int(reqs),
            "kv_bytes_per_token": cell, "kv_pool_bytes": int(tokens) * cell, "mamba_slots": int(slots),
            "mamba_pool_bytes": (slots + 1) * per_req if slots else 0}


def _kv_configurator_ps(sa: Any, mc: Any, device: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Stage 4 on the ``ps`` shape (SGLang 0.5.19): the configurator is made without its constructor
    (which takes the loaded model), with the fields these methods read (``ps``: the widths);
    the widths ``initialize_model_parallel`` stamps are stamped
    (``ParallelContext.stamp_derived_widths``); its module's two readings of the live process
    (``get_available_gpu_memory``, ``get_world_group``) answer the plan's figure and one
    process for the call, and are put back."""
    import types

    import torch  # noqa: F401  (SGLang's pool code expects torch imported first)
    from sglang.srt.mem_cache import kv_cache_configurator as kcc
    from sglang.srt.mem_cache.kv_cache_dtype import configure_kv_cache_dtype
    from sglang.srt.runtime_context import get_parallel, get_schedule, publish

    publish(sa, role="scheduler")  # what the scheduler process does with the resolved arguments
    get_parallel().stamp_derived_widths(attn_tp_size=sa.tp_size, attn_dp_size=1, attn_dcp_size=1,
                                        dcp_enabled=False, moe_tp_size=sa.tp_size)
    kv_str, kv_dtype = configure_kv_cache_dtype(
        server_args_kv_cache_dtype=sa.kv_cache_dtype, model=None, model_dtype=mc.dtype, is_draft_worker=False,
        is_dflash=False, speculative_draft_attention_backend=None)
    kvc = object.__new__(kcc.KVCacheConfigurator)
    fields = dict(
        device="cuda", gpu_id=0, model_config=mc, ps=types.SimpleNamespace(pp_size=1, attn_dp_size=1),
        **_speculative_fields(sa, mc), is_draft_worker=False, draft_model_idx=None,
        is_hybrid_swa=False, is_hybrid_swa_compress=False, use_mla_backend=False, kv_cache_dtype=kv_dtype,
        kv_cache_dtype_str=kv_str, post_capture_kv_active=False,
        layer_info=types.SimpleNamespace(start_layer=0, end_layer=mc.num_hidden_layers,
                                         num_effective_layers=mc.num_hidden_layers))
    for name, value in fields.items():
        object.__setattr__(kvc, name, value)
    kvc.__post_init__()
    pre = int(device["free_before_weights"])
    after = pre - int(device["weights"])
    saved = kcc.get_available_gpu_memory, kcc.get_world_group
    kcc.get_available_gpu_memory = lambda *a, **k: after / (1 << 30)
    kcc.get_world_group = lambda: types.SimpleNamespace(world_size=1, cpu_group=None)
    try:
        budget = kvc._profile_available_bytes(pre / (1 << 30))  # noqa: SLF001
        config = kvc.config_from_budget(budget)
        slots = int(get_schedule().max_mamba_cache_size or 0) if kvc.mambaish_config is not None else 0
        reqs = kvc.resolve_max_num_reqs(config.max_total_num_tokens)
    finally:
        kcc.get_available_gpu_memory, kcc.get_world_group = saved
    return kvc, _sized(kvc, budget, config.max_total_num_tokens, reqs, slots)


def _speculative_fields(sa: Any, mc: Any) -> dict[str, Any]:
    """The configurator's speculative fields as ``ModelRunner`` sets them from the resolved
    arguments (0.5.19's ``ps`` shape; 0.5.23's constructor takes the same from
    ``_kv_configurator_fields``): ``spec_algorithm`` by SGLang's own
    ``SpeculativeAlgorithm.from_string(--speculative-algorithm)`` (NEXTN resolved to EAGLE by then)
    and, where the configurator has the field, ``spec_aux_config`` by
    ``spec_aux_hidden_state.py: resolve_spec_aux_hidden_state_config`` (which reads the draft's
    config.json at ``--speculative-draft-model-path`` for the draft layers the KV cell is scaled
    by). With them ``_handle_max_mamba_cache`` reserves the intermediate states per draft token
    (``get_spec().speculative_num_draft_tokens``, ``get_schedule().max_running_requests``, both
    published from the resolved arguments) and the pool configurator scales the cell, as at start."""
    import dataclasses

    from sglang.srt.mem_cache import kv_cache_configurator as kcc
    from sglang.srt.runtime_context import get_spec
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    spec = SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)  # published, resolved
    out: dict[str, Any] = {"spec_algorithm": spec}
    names = {f.name for f in dataclasses.fields(kcc.KVCacheConfigurator)}
    if "spec_aux_config" in names:
        from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
            resolve_spec_aux_hidden_state_config,
        )

        out["spec_aux_config"] = resolve_spec_aux_hidden_state_config(
            server_args=sa, model_config=mc, spec_algorithm=spec, is_draft_worker=False)
    return out


def _kv_configurator_fields(sa: Any, mc: Any, device: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Stage 4 on the ``fields`` shape (SGLang 0.5.23). The configurator is built with its own constructor
    (a keyword dataclass; ``__post_init__`` runs) from what ``ModelRunner`` hands it
    (``model_runner.py: ModelRunner.init_kv_cache_configurator``), each from SGLang's own
    function where one exists: ``layer_setup.resolve_layer_indices``,
    ``kv_cache_dtype.configure_kv_cache_dtype`` (as ``ModelRunner.configure_kv_cache_dtype``
    calls it), ``load_model_utils.resolve_sliding_window_size``,
    ``spec_aux_hidden_state.resolve_spec_aux_hidden_state_config``,
    ``kv_pool_runtime.is_post_capture_kv_active``; the model itself None (the sizing reads it
    only where those functions fall back to the config), the pools it would reuse None (a
    target worker's first sizing). The parallel widths are what ``publish`` derives from the
    resolved arguments (``runtime_context.parallel_widths_of``), the PP width one.

    Then ``_resolve_memory_pool_config``'s steps (``_profile_available_bytes``,
    ``config_from_budget``, ``resolve_max_num_reqs``, the pool configurator's
    ``finalize_with_max_running_requests``), with the live process's two readings stood in for
    the call: the module's ``get_available_gpu_memory`` answers the plan's free memory after
    the weights, and the WORLD group (``get_parallel().world_group``, whose CPU group the
    free-memory reading would MIN-reduce over) a scoped ``ParallelContext.override`` of one
    process; both are put back."""
    import types

    import torch  # noqa: F401  (SGLang's pool code expects torch imported first)
    from sglang.srt.mem_cache import kv_cache_configurator as kcc
    from sglang.srt.mem_cache import kv_cache_dtype
    from sglang.srt.model_executor.model_runner_components.kv_pool_runtime import is_post_capture_kv_active
    from sglang.srt.model_executor.model_runner_components.layer_setup import resolve_layer_indices
    from sglang.srt.model_executor.model_runner_components.load_model_utils import resolve_sliding_window_size
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
        resolve_spec_aux_hidden_state_config,
    )
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.runtime_context import get_model, get_parallel, get_schedule, get_spec, publish
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    publish(sa, role="scheduler")  # what the scheduler process does with the resolved arguments
    spec = SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)
    kv_str, kv_dtype = kv_cache_dtype.configure_kv_cache_dtype(
        server_args_kv_cache_dtype=get_model().kv_cache_dtype, model=None, model_dtype=mc.dtype,
        is_draft_worker=False, is_dflash=spec.is_dflash_family(), speculative_draft_attention_backend=None,
        speculative_draft_kv_cache_dtype=get_spec().speculative_draft_kv_cache_dtype)
    kvc = kcc.KVCacheConfigurator(
        device="cuda", gpu_id=0, attn_dp_size=get_parallel().attn_dp_size, pp_size=1, pp_group=None, model=None,
        model_config=mc, server_args=sa, kv_cache_dtype=kv_dtype,
        kv_cache_dtype_str=kv_str if kv_str is not None else get_model().kv_cache_dtype, model_dtype=mc.dtype,
        page_size=get_schedule().page_size, sliding_window_size=resolve_sliding_window_size(None, mc),
        spec_algorithm=spec, is_draft_worker=False,
        post_capture_kv_active=_with_its_keywords(is_post_capture_kv_active, server_args=sa, is_draft_worker=False,
                                                  spec_algorithm=spec, token_to_kv_pool_allocator=None),
        spec_aux_config=resolve_spec_aux_hidden_state_config(server_args=sa, model_config=mc, spec_algorithm=spec,
                                                             is_draft_worker=False),
        is_hybrid_swa=mc.is_hybrid_swa, is_hybrid_swa_compress=mc.is_hybrid_swa_compress,
        use_mla_backend=mc.attention_arch == AttentionArch.MLA,
        layer_info=resolve_layer_indices(model=None, model_config=mc, is_draft_worker=False, draft_model_idx=None),
        forward_stream=None, req_to_token_pool=None, token_to_kv_pool_allocator=None, memory_pool_config=None,
        draft_model_idx=None)
    pre = int(device["free_before_weights"])
    after = pre - int(device["weights"])
    saved = kcc.get_available_gpu_memory
    kcc.get_available_gpu_memory = lambda *a, **k: after / (1 << 30)
    try:
        with get_parallel().override(world_group=types.SimpleNamespace(world_size=1, cpu_group=None)):
            budget = kvc._profile_available_bytes(pre / (1 << 30))  # noqa: SLF001
            config = kvc.config_from_budget(budget)
            config.max_running_requests = kvc.resolve_max_num_reqs(config.max_total_num_tokens)
            config = create_memory_pool_configurator(kvc).finalize_with_max_running_requests(config)
            slots = int(get_schedule().max_mamba_cache_size or 0) if kvc.mambaish_config is not None else 0
    finally:
        kcc.get_available_gpu_memory = saved
    return kvc, _sized(kvc, budget, config.max_total_num_tokens, config.max_running_requests, slots)


def _with_its_keywords(fn: Any, **kwargs: Any) -> Any:
    """``fn(**kwargs)`` with only the keywords ``fn``'s signature names: a function the releases
    of one configurator shape take with fewer arguments (``kv_pool_runtime.py:
    is_post_capture_kv_active``: 0.5.21 takes ``server_args`` and ``is_draft_worker``, 0.5.23
    also ``spec_algorithm`` and ``token_to_kv_pool_allocator``). A keyword it requires and is
    not given still raises TypeError."""
    import inspect

    params = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def _host_pools(sa: Any, kvc: Any, kv: dict[str, Any], device: dict[str, Any]) -> dict[str, Any]:
    """Stage 5 (module docstring): SGLang's host pool classes over CPU views of the device pools
    stage 4 sized; their allocation a zero-stride view, their host-memory check SGLang's own.
    The pools' constructors differ by release (0.5.19: over the device pool; 0.5.23: over its
    buffer description, ``device_pool_info.MHABufferInfo``), told apart by the constructor's
    parameters (``_host_pools_sized``)."""
    import torch
    from sglang.srt.mem_cache.pool_host import base, common, mamba, mha

    def no_allocation(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
        return torch.empty(1, dtype=dtype).expand(*dims)  # indexable, nothing of its size mapped

    ranks = max(int(sa.tp_size) * int(getattr(sa, "pp_size", 1) or 1) // max(int(getattr(sa, "nnodes", 1) or 1), 1), 1)
    # What this stage replaces in SGLang's modules, put back when it ends (as stage 4 puts back
    # its readings), so a later argv in the same process (run_many) sees SGLang's own.
    stand_ins: list[tuple[Any, str, Any]] = [
        (base, "ranks_per_host", lambda: ranks),  # the world group it reads: tp x pp ranks over nnodes
        *((cls, "_init_write_back_staging_buffers", lambda self, *a, **k: None)  # device-side staging: not sizing
          for cls in (mha.MHATokenToKVPoolHost, mamba.MambaPoolHost)),
        (common.ALLOC_MEMORY_FUNCS, "default_factory", lambda: no_allocation)]
    if device.get("host_budget") is not None:
        budget = int(device["host_budget"])
        # 0.5.23 passes the bytes it requests (booked only inside an auto-size scope); unscoped,
        # each pool reads the box's figure again, as 0.5.19 does
        stand_ins += [(mod, "host_memory_budget_bytes", lambda *a, **k: budget // ranks)
                      for mod in (base, mha, mamba) if hasattr(mod, "host_memory_budget_bytes")]
    saved = [(obj, name, obj.__dict__.get(name, _ABSENT) if isinstance(obj, type) else getattr(obj, name))
             for obj, name, _ in stand_ins]
    for obj, name, value in stand_ins:
        setattr(obj, name, value)
    common.ALLOC_MEMORY_FUNCS.clear()
    try:
        return _host_pools_sized(sa, kvc, kv, modules=(mha, mamba))
    finally:
        for obj, name, value in reversed(saved):
            if value is _ABSENT:
                delattr(obj, name)
            else:
                setattr(obj, name, value)
        common.ALLOC_MEMORY_FUNCS.clear()


#: A class attribute the host-pool stage added (``_host_pools``: deleted again, not set).
_ABSENT = object()


def _host_pool_inputs(sa: Any, kvc: Any) -> Any:
    """What both host-pool builders read from the resolved arguments and stage 4's configurator:
    ``store`` (the device pool's storage dtype: fp8 KV is stored as uint8,
    ``memory_pool.py: MHATokenToKVPool``), ``mambaish`` (the configurator's mamba config, None
    for a dense model), ``layers`` (full-attention layers), ``page`` (tokens), ``ratio``,
    ``size_gb`` (``--hicache-ratio``/``--hicache-size``) and ``layout``
    (``--hicache-mem-layout``)."""
    import types

    import torch

    dtype = kvc.kv_cache_dtype
    m = kvc.mambaish_config
    return types.SimpleNamespace(
        store=torch.uint8 if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else dtype, mambaish=m,
        layers=len(m.full_attention_layer_ids) if m is not None else kvc.model_config.num_hidden_layers,
        page=int(sa.page_size or 1), ratio=float(sa.hicache_ratio or 0), size_gb=int(sa.hicache_size or 0),
        layout=sa.hicache_mem_layout)


def _host_pools_sized(sa: Any, kvc: Any, kv: dict[str, Any], *, modules: tuple[Any, Any]) -> dict[str, Any]:
    """Stage 5's sizing, with ``_host_pools``'s stand-ins in place: SGLang's host pool classes
    (``modules``: its ``pool_host.mha`` and ``pool_host.mamba``) over CPU views of the pools
    stage 4 sized; 0.5.23's constructors (a ``buffer_info`` parameter) go to
    ``_host_pools_sized_buffer_info``."""
    import inspect
    import types

    import torch

    mha, mamba = modules
    if "buffer_info" in inspect.signature(mha.MHATokenToKVPoolHost.__init__).parameters:
        return _host_pools_sized_buffer_info(sa, kvc, kv, modules=modules)
    mc = kvc.model_config
    dtype = kvc.kv_cache_dtype
    inp = _host_pool_inputs(sa, kvc)
    store, m, layers, page = inp.store, inp.mambaish, inp.layers, inp.page
    heads, head_dim = mc.get_num_kv_heads(sa.tp_size), mc.head_dim
    # the device pool's bytes as its get_kv_size_bytes counts them: size + page_size rows
    # (memory_pool.py: MHATokenToKVPool._kv_buffer_shapes), what --hicache-size is split by
    kv_dev = (kv["max_total_num_tokens"] + page) * kv["kv_bytes_per_token"]
    device_kv = types.SimpleNamespace(
        store_dtype=store, dtype=dtype, size=kv["max_total_num_tokens"], start_layer=0, end_layer=layers,
        layer_num=layers, head_num=heads, head_dim=head_dim, v_head_dim=head_dim, page_size=page, device="cpu",
        # the attention row of one token per layer (memory_pool.py: MHATokenToKVPool.row_dim, head_num x
        # head_dim), which some releases' host pools divide by head_dim (pool_host/mha.py: get_size_per_token)
        row_dim=heads * head_dim, v_row_dim=heads * head_dim,
        get_kv_size_bytes=lambda: (kv_dev // 2, kv_dev - kv_dev // 2))
    ratio, size_gb, layout = inp.ratio, inp.size_gb, inp.layout
    kv_size = mamba_size = size_gb
    device_mamba = None
    if m is not None and kv["mamba_slots"]:
        mamba_dev = kv["mamba_pool_bytes"]
        device_mamba = types.SimpleNamespace(
            size=kv["mamba_slots"], num_mamba_layers=len(m.mamba2_cache_params.layers), device="cpu",
            mamba_cache=_mamba_pool_states(m, kv["mamba_slots"]),
            get_kv_size_bytes=lambda: mamba_dev, mem_usage_bytes=lambda: mamba_dev)
        if size_gb:
            from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _split_hicache_size

            kv_size, mamba_size = _split_hicache_size(size_gb, (device_kv, device_mamba))
    draft = _draft_host_plan(sa)
    packed: dict[str, Any] = {}
    if draft.mode == "packed":  # the draft's pools ride in the target's (mha.py: MHATokenToKVPoolHost.__init__)
        def device_view(n: int) -> dict[str, Any]:
            bufs = [torch.empty(1, dtype=store).expand(kv["max_total_num_tokens"] + page, heads, head_dim)
                    for _ in range(n)]
            return dict(k_buffer=bufs, v_buffer=bufs, k_data_ptrs=torch.zeros(n, dtype=torch.uint64),
                        v_data_ptrs=torch.zeros(n, dtype=torch.uint64))
        for name, value in device_view(layers).items():
            setattr(device_kv, name, value)
        packed["mtp_draft_device_pools"] = tuple(
            types.SimpleNamespace(layer_num=1, head_num=heads, head_dim=head_dim, row_dim=heads * head_dim,
                                  **device_view(1))
            for _ in range(draft.runners))
    host = mha.MHATokenToKVPoolHost(device_kv, ratio, kv_size, page, layout, pin_memory=False, device="cpu", **packed)
    out = {"host_kv_tokens": int(host.size), "host_kv_bytes": int(host.size * host.size_per_token),
           "host_kv_bytes_per_token": int(host.size_per_token), "host_draft_mode": draft.mode or "none"}
    if draft.mode == "sidecar":  # hybrid_pool_assembler.py: build_full_draft_pools, at the target host's tokens
        dm = draft.model_config
        d_layers = _draft_kv_layers(dm)
        d_heads = dm.get_num_kv_heads(sa.tp_size)
        d_dev = types.SimpleNamespace(
            store_dtype=store, dtype=dtype, size=kv["max_total_num_tokens"], start_layer=0, end_layer=d_layers,
            layer_num=d_layers, head_num=d_heads, head_dim=dm.head_dim, v_head_dim=dm.head_dim, page_size=page,
            row_dim=d_heads * dm.head_dim, v_row_dim=d_heads * dm.head_dim, device="cpu")
        side = mha.MHATokenToKVPoolHost(d_dev, host.size / d_dev.size, 0, page, layout, pin_memory=False,
                                        device="cpu", pool_label="draft")
        out.update(host_draft_kv_tokens=int(side.size), host_draft_kv_bytes=int(side.size * side.size_per_token))
    if device_mamba is not None:
        hm = mamba.MambaPoolHost(device_mamba, ratio, mamba_size, pin_memory=False, device="cpu", layout=layout)
        out.update(host_mamba_slots=int(hm.size), host_mamba_bytes=int(hm.size * hm.size_per_token))
    return out


def _draft_host_plan(sa: Any) -> Any:
    """How SGLang mirrors the speculative draft's KV into host memory with HiCache on
    (``speculative/base_spec_worker.py: BaseSpecWorker._build_hicache_draft_plan``), decided by
    SGLang's own ``_can_pack_hicache_mtp`` over stand-ins for the draft runners: each runner's
    ``model_config`` is the draft's, built by SGLang's ``ModelConfig.from_server_args(...,
    model_path=--speculative-draft-model-path, is_draft_model=True)`` as ``tp_worker.py:
    _init_model_config`` builds it (no draft path: the model's own, ``_config_draft_model``
    giving a Qwen3.5 model one MTP layer); one runner, one per step with
    ``--enable-multi-layer-eagle``. Returns ``mode`` (``packed``, ``sidecar`` or ``""``: no draft
    runner, NGRAM, or DFLASH/DSPARK, whose draft pools these stand-ins do not build), ``runners``,
    ``model_config`` (the draft's)."""
    import types

    from sglang.srt.runtime_context import get_spec
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    none = types.SimpleNamespace(mode="", runners=0, model_config=None)
    sp = get_spec()  # the resolved arguments as stage 4 published them (NEXTN is EAGLE there)
    spec = SpeculativeAlgorithm.from_string(sp.speculative_algorithm)
    if (spec.is_none() or spec.is_ngram() or spec.is_frozen_kv_mtp() or spec.is_dflash_family()
            or getattr(spec, "is_uno", lambda: False)()):
        return none
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.speculative.base_spec_worker import _can_pack_hicache_mtp

    dm = ModelConfig.from_server_args(sa, model_path=sp.speculative_draft_model_path,
                                      model_revision=getattr(sp, "speculative_draft_model_revision", None),
                                      is_draft_model=True)
    multi = getattr(sa, "enable_multi_layer_eagle", False)
    runners = int(sp.speculative_num_steps or 1) if multi else 1
    stand_ins = tuple(types.SimpleNamespace(model_config=dm) for _ in range(runners))
    mode = "packed" if _can_pack_hicache_mtp(spec, stand_ins) else "sidecar"
    return types.SimpleNamespace(mode=mode, runners=runners, model_config=dm)


def _draft_kv_layers(dm: Any) -> int:
    """The KV layers of a sidecar draft's device pool. A hybrid (mamba-ish) draft's pool is a
    ``HybridLinearKVPool`` whose full-attention part ``build_full_draft_pools`` mirrors
    (``HybridLinearKVPool.full_kv_pool``), and a draft worker builds that part over one layer
    whatever its config says (``kv_cache_configurator.py: _build_hybrid_linear_kv_pool``:
    ``full_attention_layer_ids = [0] if self.is_draft_worker``, 0.5.19 and 0.5.23): 1. Whether the
    draft is hybrid is SGLang's own ``configs/hybrid_arch.py: mambaish_config``, as the
    configurator decides it. Else its attention layers."""
    from sglang.srt.configs.hybrid_arch import mambaish_config

    if mambaish_config(dm) is not None:
        return 1
    return int(getattr(dm, "num_attention_layers", None) or dm.num_hidden_layers)


def _host_pools_sized_buffer_info(sa: Any, kvc: Any, kv: dict[str, Any], *, modules: tuple[Any, Any]) -> dict[str, Any]:
    """Stage 5 on host pools built over buffer descriptions (SGLang 0.5.23), built as
    ``hybrid_cache/hybrid_pool_assembler.py`` builds them (``build_kv_host_pool``,
    ``build_mamba_host_pool``, the ``--hicache-size`` split of ``build_hybrid_mamba_stack``:
    ``_split_hicache_size`` over the device pools' ``get_kv_size_bytes``) from the device
    pools' buffer descriptions (``device_pool_info.MHABufferInfo``,
    ``MambaStateBufferInfo``). The device buffers are tensors on the ``meta`` device with the
    shapes the device pools allocate (``memory_pool.py``: ``MHATokenToKVPool._kv_buffer_shapes``,
    ``(size + page_size, heads, head_dim)`` per full-attention layer; ``MambaPool``'s
    ``(layers, slots + 1, ...)`` state): their shape and dtype, no storage; their bytes are
    counted by SGLang's own ``MHATokenToKVPool.get_kv_size_bytes`` and
    ``MambaPool.State.mem_usage_bytes``. The hybrid mamba layout rule (``page_first_kv_split``
    -> ``page_first_direct``) is ``build_hybrid_mamba_stack``'s; a speculative draft's sidecar
    pool gets ``host_token_capacity`` as ``build_full_draft_pools`` passes it."""
    import inspect
    import types

    import torch
    from sglang.srt.mem_cache import memory_pool
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MambaStateBufferInfo, MHABufferInfo
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _split_hicache_size
    from sglang.srt.runtime_context import get_parallel

    mha, mamba = modules
    meta = torch.device("meta")
    mc = kvc.model_config
    inp = _host_pool_inputs(sa, kvc)
    store, m, layers, page = inp.store, inp.mambaish, inp.layers, inp.page
    heads = mc.get_num_kv_heads(get_parallel().attn_tp_size)
    head_dim = mc.head_dim
    tokens = int(kv["max_total_num_tokens"])
    k = tuple(torch.empty((tokens + page, heads, head_dim), dtype=store, device=meta) for _ in range(layers))
    v = tuple(torch.empty((tokens + page, heads, head_dim), dtype=store, device=meta) for _ in range(layers))
    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=torch.zeros(layers, dtype=torch.uint64, device=meta),
                          v_data_ptrs=torch.zeros(layers, dtype=torch.uint64, device=meta), layout=KVBufferLayout.NHD),
        page_size=page, head_num=heads, head_dim=head_dim, v_head_dim=head_dim, dtype=store, device=meta)
    device_kv = types.SimpleNamespace(k_buffer=list(k), v_buffer=list(v), host_capacity_bytes=None)
    device_kv.get_kv_size_bytes = lambda: memory_pool.MHATokenToKVPool.get_kv_size_bytes(device_kv)
    ratio, size_gb, layout = inp.ratio, inp.size_gb, inp.layout
    kv_size: float = size_gb
    mamba_size: float = 0
    mamba_info = None
    if m is not None and kv["mamba_slots"]:
        p = m.mamba2_cache_params
        slots = kv["mamba_slots"] + 1
        state = memory_pool.MambaPool.State(
            conv=[torch.empty((len(p.layers), slots, *c), dtype=p.dtype.conv, device=meta) for c in p.shape.conv],
            temporal=torch.empty((len(p.layers), slots, *p.shape.temporal), dtype=p.dtype.temporal, device=meta))
        mamba_info = MambaStateBufferInfo(temporal=state.temporal, conv=tuple(state.conv))
        if size_gb:
            device_mamba = types.SimpleNamespace(host_capacity_bytes=None, get_kv_size_bytes=state.mem_usage_bytes)
            kv_size, mamba_size = _split_hicache_size(size_gb, (device_kv, device_mamba))
    def buffer_info(n: int, n_heads: int, dim: int) -> Any:
        kb = tuple(torch.empty((tokens + page, n_heads, dim), dtype=store, device=meta) for _ in range(n))
        vb = tuple(torch.empty((tokens + page, n_heads, dim), dtype=store, device=meta) for _ in range(n))
        return MHABufferInfo(
            buffers=KVBuffers(k=kb, v=vb, k_data_ptrs=torch.zeros(n, dtype=torch.uint64, device=meta),
                              v_data_ptrs=torch.zeros(n, dtype=torch.uint64, device=meta), layout=KVBufferLayout.NHD),
            page_size=page, head_num=n_heads, head_dim=dim, v_head_dim=dim, dtype=store, device=meta)

    draft = _draft_host_plan(sa)
    drafts = tuple(buffer_info(1, heads, head_dim) for _ in range(draft.runners)) if draft.mode == "packed" else ()
    host = mha.get_mha_host_pool_cls(info)(
        info, ratio, kv_size, page, layout, pin_memory=False, device="cpu", device_capacity_tokens=tokens,
        start_layer=0, end_layer=layers, draft_buffer_infos=drafts)
    out = {"host_kv_tokens": int(host.size), "host_kv_bytes": int(host.size * host.size_per_token),
           "host_kv_bytes_per_token": int(host.size_per_token), "host_draft_mode": draft.mode or "none"}
    if draft.mode == "sidecar":  # hybrid_pool_assembler.py: build_full_draft_pools, at the target host's tokens
        dm = draft.model_config
        d_layers = _draft_kv_layers(dm)
        d_info = buffer_info(d_layers, dm.get_num_kv_heads(get_parallel().attn_tp_size), dm.head_dim)
        # build_full_draft_pools: ratio = the target host's logical_size / the draft pool's tokens,
        # and, where _build_mha_mla_host_pool takes it (0.5.23), host_token_capacity = that
        # logical_size: a pool sized from the shared plan, no padding page (pool_host/base.py)
        from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as hpa

        logical = int(getattr(host, "logical_size", host.size))
        shared = ({"host_token_capacity": logical}
                  if "host_token_capacity" in inspect.signature(hpa._build_mha_mla_host_pool).parameters else {})
        side = mha.get_mha_host_pool_cls(d_info)(
            d_info, logical / tokens, 0, page, layout, pin_memory=False, device="cpu", device_capacity_tokens=tokens,
            start_layer=0, end_layer=d_layers, pool_label="draft", **shared)
        out.update(host_draft_kv_tokens=int(side.size), host_draft_kv_bytes=int(side.size * side.size_per_token))
    if mamba_info is not None:
        hm = mamba.MambaPoolHost(mamba_info, ratio, mamba_size, device_capacity=int(kv["mamba_slots"]),
                                 pin_memory=False, device="cpu",
                                 layout="page_first_direct" if layout == "page_first_kv_split" else layout)
        out.update(host_mamba_slots=int(hm.size), host_mamba_bytes=int(hm.size * hm.size_per_token))
    return out


class _BuiltBackend:
    """Stage 6's stand-in for an attention backend class of SGLang: constructing it records the
    class and what it was built over (nothing allocated, no kernel loaded); ``str`` shows the tree
    SGLang would build (``HybridLinearAttnBackend(TritonAttnBackend, GDNAttnBackend, 16 full-attention
    layers)``)."""

    def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.name = name
        self.parts = [a for a in (*args, *kwargs.values()) if isinstance(a, _BuiltBackend)]
        layers = [a for a in args if isinstance(a, list)]
        self.layers = len(layers[0]) if layers else None

    def __str__(self) -> str:
        inner = [str(p) for p in self.parts] + ([f"{self.layers} full-attention layers"] if self.layers else [])
        return f"{self.name}({', '.join(inner)})" if inner else self.name


def _backend_classes(functions: list[Any]) -> list[tuple[str, str]]:
    """``(module, class)`` for each attention backend class ``functions`` import where they run
    (``from sglang.srt.layers.attention.X import YBackend`` inside the function, as SGLang's
    registry does), read from their source: what stage 6 stands in."""
    out: list[tuple[str, str]] = []
    for fn in functions:
        out += _backends_imported_by(fn)
    return list(dict.fromkeys(out))


@functools.cache
def _backends_imported_by(fn: Any) -> tuple[tuple[str, str], ...]:
    """``_backend_classes`` of one function, its source read and parsed once per process."""
    import ast
    import inspect
    import textwrap

    out: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn)))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang.srt.layers.attention"):
            out += [(node.module or "", a.name) for a in node.names if a.name.endswith("Backend")]
    return tuple(out)


#: The backend constructors whose checks stage 6 runs although the constructor itself cannot run
#: here (it takes the device pools): per class, the statements of its ``__init__`` that make the
#: check, picked by their source (``_constructor_check``). ``TRTLLMHAAttnBackend``: ``is_xqa_impl``
#: (sm_90 or sm_120) and the page-size check off XQA (page >= 128 needs GQA, equal QK/V head dims
#: and a power-of-2 page: ``layers/attention/trtllm_mha_backend.py``).
CONSTRUCTOR_CHECKS: dict[str, tuple[str, ...]] = {
    "TRTLLMHAAttnBackend": ("self.is_xqa_impl =", "if self.page_size >= "),
}


def _constructor_check(cls: Any, starts: tuple[str, ...]) -> Any:
    """SGLang's own statements of ``cls.__init__`` whose source starts with one of ``starts``,
    compiled from ``cls``'s file (its name and line numbers kept, so what they raise is SGLang's,
    at its own line) as ``cls.__init__(self, model_runner, config)`` over the globals of ``cls``'s
    module as they are at this call (what they read: ``get_platform()``, ``get_parallel()``),
    ``config`` being the model config the constructor reads (``model_runner.model_config``).
    None when the class has no such statements (another release): then nothing is checked.
    The file is read and compiled once per class and ``starts`` (``_constructor_code``)."""
    code = _constructor_code(cls, starts)
    if code is None:
        return None
    namespace = dict(vars(sys.modules[cls.__module__]))
    exec(code, namespace)
    return namespace[cls.__name__].__init__


@functools.cache
def _constructor_code(cls: Any, starts: tuple[str, ...]) -> Any:
    """The code object ``_constructor_check`` runs (a class of one ``__init__`` holding the
    statements), or None."""
    import ast
    import inspect

    path = inspect.getsourcefile(cls)
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        source = f.read()
    tree = ast.parse(source, path)
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__), None)
    init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None) if node else None
    lines = _source_lines(source)
    body = [s for s in init.body if (_source_segment(lines, s) or "").startswith(starts)] if init else []
    if init is None or node is None or len(body) < len(starts):
        return None
    shell = ast.parse(f"class {cls.__name__}:\n    def __init__(self, model_runner, config):\n        pass\n")
    klass = shell.body[0]
    assert isinstance(klass, ast.ClassDef) and isinstance(klass.body[0], ast.FunctionDef)
    klass.body[0].body = body
    ast.copy_location(klass, node)
    ast.copy_location(klass.body[0], init)
    return compile(ast.fix_missing_locations(shell), path, "exec")


def _source_lines(source: str) -> list[str]:
    """``source``'s lines with their ends, split at ``\\r\\n``, ``\\r`` and ``\\n`` only, as
    ``ast.get_source_segment`` splits them (a form feed is no line end there)."""
    return re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z", source)


def _source_segment(lines: list[str], node: Any) -> str | None:
    """``ast.get_source_segment(source, node)`` from ``source``'s lines split once
    (``_source_lines``): that function splits the whole file again for each node, which for
    SGLang's backend files was seconds per class."""
    end_lineno, end_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
    if end_lineno is None or end_col is None:
        return None
    first, last, col = node.lineno - 1, end_lineno - 1, node.col_offset
    if first == last:
        return lines[first].encode()[col:end_col].decode()
    return "".join([lines[first].encode()[col:].decode(), *lines[first + 1:last], lines[last].encode()[:end_col].decode()])


class _StandInOnImport:
    """A ``sys.meta_path`` finder for stage 6: a module of ``targets`` that SGLang's call imports is
    loaded by the ordinary finders, then ``after(module)`` stands in its backend classes (so only
    what SGLang's own call imports is imported)."""

    def __init__(self, targets: dict[str, list[str]], after: Any) -> None:
        self.targets, self.after = targets, after

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.targets:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader, after = spec.loader, self.after

        class _Then:  # the module's own loader, then the stand-ins
            def create_module(self, s: Any) -> Any:
                return loader.create_module(s)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                after(module)

        spec.loader = _Then()  # type: ignore[assignment]
        return spec


#: Stands in for the CUDA stream SGLang's ``create_flashinfer_backend`` would make for the model
#: runner under EAGLE/NEXTN (``runner.plan_stream_for_flashinfer``): no device is touched here.
_DEVICE_STREAM = types.SimpleNamespace(stand_in="torch.cuda.Stream")


def _mamba_pool_states(mambaish: Any, slots: int) -> Any:
    """The device mamba pool's ``mamba_cache`` as ``memory_pool.py: MambaPool`` allocates it, as
    shapes and dtypes without memory (expanded one-element CPU tensors): ``conv`` (one tensor per
    conv state shape) and ``temporal``, each ``[mamba layers, slots + 1, *state shape]``, in the
    dtypes of ``mambaish.mamba2_cache_params`` (the ``--mamba-ssm-dtype`` SGLang resolved);
    ``slots``: the configurator's ``max_mamba_cache_size`` (0 when not sized here)."""
    import types

    import torch

    p = mambaish.mamba2_cache_params
    rows = slots + 1
    conv = [torch.empty(1, dtype=p.dtype.conv).expand(len(p.layers), rows, *c) for c in p.shape.conv]
    temporal = torch.empty(1, dtype=p.dtype.temporal).expand(len(p.layers), rows, *p.shape.temporal)
    return types.SimpleNamespace(conv=conv, temporal=temporal)


def _model_runner(sa: Any, mc: Any, capability: str | None, kv_cache_dtype: Any = None,
                  mambaish: Any = None, mamba_slots: int = 0) -> dict[str, Any]:
    """Stage 6: the checks SGLang's model runner makes when it builds the attention backend after
    the weights load (``model_executor/model_runner.py: ModelRunner.init_attention_backends``),
    run without weights on the model config ``mc`` and the card's compute capability
    ``capability`` (``"12.0"``; None: SGLang's platform reading of this machine). SGLang's own
    functions, in its order: ``attention_backend_setup.py: resolve_attention_backend_strs`` (the prefill and decode
    backends), then ``_build_resolved_backend`` (the path without two-batch overlap or PD
    multiplexing): each phase's factory in ``layers/attention/attention_registry.py``
    (``create_flashattention_v3_backend``'s SM check, the MLA/non-MLA checks, ...) and
    ``attn_backend_wrapper`` (the hybrid linear-attention wrapper: which full-attention
    backends a hybrid GDN model may use on Blackwell, sm_120 apart; the linear-attention kernel
    choice, ``linear/utils.py: resolve_linear_attn_backends``).

    What is stood in for the call, and put back: the model runner (a namespace with the fields
    these functions read: ``model_config``, ``server_args``, ``use_mla_backend`` as
    ``ModelRunner.__init__`` derives it, not a draft worker, the CUDA stream
    ``create_flashinfer_backend`` makes under EAGLE/NEXTN: ``_DEVICE_STREAM``, and for a hybrid
    model the device mamba pool's state tensors, whose dtype ``linear/gdn_backend.py:
    flashinfer_gdn_prefill_default`` reads on sm_90 and sm_100 (``req_to_token_pool.mamba_pool.
    mamba_cache``: ``_mamba_pool_states``, from ``mambaish``, the configurator's mamba config, or
    SGLang's ``configs/hybrid_arch.py: mambaish_config``, with ``mamba_slots`` slots)); the attention backend classes the
    factories and the wrapper construct (``_backend_classes``: their constructors take the
    device pools, which need the device, so their own checks are not run here, but for the
    statements ``CONSTRUCTOR_CHECKS`` names, which ``_constructor_check`` compiles out of SGLang's
    file and runs on the resolved page size and the model config); the readings of
    the card, answered from ``capability`` or else SGLang's own ``get_platform().device_capability``
    so that every reader agrees: ``utils.get_device_capability`` as the registry imported it, ``utils.is_blackwell``: major 10, 11 or 12, the image's CUDA being
    >= 12.8, ``runtime_context.override_platform``'s ``is_sm90``/``is_sm100``/``is_sm120``/
    ``is_blackwell``/``device_capability``, and for a hybrid GDN model the GDN prefill default's
    own reading (``gdn_backend.is_cuda`` and ``torch.cuda.get_device_capability``). Returns ``model_runner_backend`` (the backend tree
    SGLang would build) and the two backend names."""
    import types

    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.layers.attention import attention_registry as registry
    from sglang.srt.model_executor.model_runner_components import attention_backend_setup as setup
    from sglang.srt.runtime_context import publish

    publish(sa, role="scheduler")  # what the scheduler process does with the resolved arguments
    runner = types.SimpleNamespace(
        model_config=mc, server_args=sa, use_mla_backend=mc.attention_arch == AttentionArch.MLA, is_draft_worker=False,
        draft_attention_backend=None, device="cuda", gpu_id=0, init_new_workspace=False, kv_cache_dtype=kv_cache_dtype,
        spec_algorithm=None,
        # the CUDA stream create_flashinfer_backend makes under EAGLE/NEXTN (``torch.cuda.Stream()``,
        # attention_registry.py): a device object, stood in as the backend classes are
        plan_stream_for_flashinfer=_DEVICE_STREAM)
    if mambaish is None:
        from sglang.srt.configs.hybrid_arch import mambaish_config

        mambaish = mambaish_config(mc)
    if mambaish is not None:
        runner.req_to_token_pool = types.SimpleNamespace(
            mamba_pool=types.SimpleNamespace(mamba_cache=_mamba_pool_states(mambaish, mamba_slots)))
    resolved = setup.resolve_attention_backend_strs(model_runner=runner)
    runner.prefill_attention_backend_str, runner.decode_attention_backend_str = resolved.prefill, resolved.decode
    factories = [registry.ATTENTION_BACKENDS[b] for b in dict.fromkeys((resolved.prefill, resolved.decode))
                 if b in registry.ATTENTION_BACKENDS]
    targets: dict[str, list[str]] = {}
    for module, name in _backend_classes([*factories, registry.attn_backend_wrapper, setup._build_resolved_backend]):  # noqa: SLF001
        targets.setdefault(module, []).append(name)
    stand_ins: list[tuple[Any, str, Any]] = []
    swapped: list[tuple[Any, str, Any]] = []  # (module, class name, SGLang's class): put back at the end

    def built(name: str, real: Any, *a: Any, **k: Any) -> _BuiltBackend:
        check = _constructor_check(real, CONSTRUCTOR_CHECKS[name]) \
            if name in CONSTRUCTOR_CHECKS and isinstance(real, type) else None
        if check is not None:  # the constructor's own check, on the resolved page size and the model config
            check(types.SimpleNamespace(page_size=sa.page_size), runner, mc)
        return _BuiltBackend(name, *a, **k)

    def stand_in(mod: Any) -> None:
        for name in targets.get(mod.__name__, ()):
            real = mod.__dict__.get(name, _ABSENT)
            swapped.append((mod, name, real))
            setattr(mod, name, lambda *a, _n=name, _r=real, **k: built(_n, _r, *a, **k))

    gdn_backend = None
    if mambaish is not None:  # imported here, so that the backend classes it imports are stood in below
        from sglang.srt.layers.attention.linear import gdn_backend
    for module in targets:  # already imported: stood in now; the rest when SGLang's call imports them
        if module in sys.modules:
            stand_in(sys.modules[module])
    finder = _StandInOnImport(targets, stand_in)
    restore_platform = None
    from sglang.srt.runtime_context import get_platform

    card = tuple(int(x) for x in capability.split(".")[:2]) if capability else get_platform().device_capability
    if card and card[0] is not None:
        from sglang.srt import utils as sglang_utils
        from sglang.srt.runtime_context import override_platform

        major, minor = int(card[0]), int(card[1] or 0)
        stand_ins += [(registry, "get_device_capability", lambda *a, **k: (major, minor)),
                      (sglang_utils, "is_blackwell", lambda: major in (10, 11, 12))]
        if gdn_backend is not None:  # the GDN prefill default reads the card through torch itself
            import torch

            stand_ins += [(gdn_backend, "is_cuda", lambda: True),
                          (torch.cuda, "get_device_capability", lambda *a, **k: (major, minor))]
        restore_platform = override_platform(is_cuda=True, is_sm90=major == 9, is_sm100=major == 10,
                                             is_sm120=major == 12, is_blackwell=major in (10, 11, 12),
                                             device_capability=(major, minor))
    saved = [(obj, name, getattr(obj, name, _ABSENT)) for obj, name, _ in stand_ins]
    for obj, name, value in stand_ins:
        setattr(obj, name, value)
    if restore_platform is not None:
        restore_platform.install()
    sys.meta_path.insert(0, finder)
    try:
        built = setup._build_resolved_backend(model_runner=runner, resolved=resolved,  # noqa: SLF001
                                              init_new_workspace=False)
    finally:
        sys.meta_path.remove(finder)
        if restore_platform is not None:
            restore_platform.restore()
        for obj, name, value in reversed(saved + swapped):
            if value is _ABSENT:
                delattr(obj, name)
            else:
                setattr(obj, name, value)
    return {"model_runner_backend": str(built), "model_runner_prefill_backend": resolved.prefill,
            "model_runner_decode_backend": resolved.decode}


def sglang_side(argv: list[str], device: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the stages on ``argv`` (the flags after ``-m sglang.launch_server``) in this process;
    the sizing stages when ``device`` gives the plan's figures (module docstring). Returns the
    answer: ``ok``, ``stage`` reached, ``answers`` (what SGLang resolved and sized) or the
    refusal (``type``, ``message``, ``site``, ``flags``), ``seconds`` per part.

    The process environment is put back as it was when the stages end: SGLang's argument
    resolution writes it (``srt/arg_groups/serving_hook.py: handle_environment_variables``
    sets ``SGLANG_MAMBA_SSM_DTYPE`` from ``--mamba-ssm-dtype``, ...), and the sizing reads it
    (``srt/configs/mamba_utils.py: mamba2_state_dtype``: that variable before config.json),
    so a later argv in the same process (``run_many``) would otherwise size its mamba state in
    an earlier argv's dtype. One server is one argv, as in ``serve``."""
    environ = dict(os.environ)
    try:
        return _sglang_side(argv, device)
    finally:
        for name in set(os.environ) - set(environ):
            del os.environ[name]
        for name, value in environ.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


def _sglang_side(argv: list[str], device: dict[str, Any] | None) -> dict[str, Any]:
    """``sglang_side``'s stages, in the environment it puts back."""
    import argparse
    import contextlib
    import io

    t0 = time.monotonic()
    try:
        from sglang.srt.server_args import ServerArgs, prepare_server_args
    except ImportError as exc:  # an SGLang without its dependencies (a build-only image)
        return {"ok": None, "not_run": f"sglang.srt.server_args does not import ({exc})"}

    seconds: dict[str, float] = {"import": round(time.monotonic() - t0, 3)}
    dest_flag: dict[str, str] = {}
    stage = STAGES[0]
    out: dict[str, Any] = {"ok": True, "stage": stage}
    t1 = time.monotonic()
    err = io.StringIO()
    try:
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        dest_flag.update({a.dest: a.option_strings[0] for a in parser._actions if a.option_strings})  # noqa: SLF001
        with contextlib.redirect_stderr(err):
            sa = prepare_server_args(list(argv))
            sa.resolve_once()
        seconds["argument resolution"] = round(time.monotonic() - t1, 3)
        stage = "model config"
        t2 = time.monotonic()
        from sglang.srt.configs.model_config import ModelConfig

        mc = ModelConfig.from_server_args(sa)
        seconds["model config"] = round(time.monotonic() - t2, 3)
        stage = "attention backend"
        from sglang.srt.arg_groups.overrides import resolution_result

        answers = {name: resolution_result(sa, name) for name in (
            "attention_backend", "prefill_attention_backend", "decode_attention_backend", "mem_fraction_static",
            "page_size", "max_running_requests", "chunked_prefill_size", "mamba_radix_cache_strategy")}
        answers["context_length"] = getattr(mc, "context_len", None)
        answers["architecture"] = (getattr(mc.hf_config, "architectures", None) or [None])[0]
        skipped = sizing_unsupported(sa) if device else None
        kvc = None
        if skipped:
            out["skipped"] = f"{' and '.join(SIZING)}: {skipped}"
        elif device:
            stage = "KV cache configurator"
            t3 = time.monotonic()
            with contextlib.redirect_stderr(err):
                kvc, kv = _kv_configurator(sa, mc, device)
            answers.update(kv)
            seconds["KV cache configurator"] = round(time.monotonic() - t3, 3)
            if sa.enable_hierarchical_cache:
                stage = "host pools"
                t4 = time.monotonic()
                with contextlib.redirect_stderr(err):
                    answers.update(_host_pools(sa, kvc, kv, device))
                seconds["host pools"] = round(time.monotonic() - t4, 3)
        stage = "model runner"
        t5 = time.monotonic()
        with contextlib.redirect_stderr(err):
            answers.update(_model_runner(sa, mc, (device or {}).get("capability"),
                                         getattr(kvc, "kv_cache_dtype", None) if kvc is not None else None,
                                         getattr(kvc, "mambaish_config", None) if kvc is not None else None,
                                         int(answers.get("mamba_slots") or 0)))
        seconds["model runner"] = round(time.monotonic() - t5, 3)
        out["stage"] = stage
        out["answers"] = {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
                          for k, v in answers.items()}
    except SystemExit as exc:  # argparse: its message is on stderr
        if not raised_by_sglang(exc):
            out = harness_fault(exc, stage)
        else:
            lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
            out.update(ok=False, stage=stage, type="SystemExit",
                       message=(lines[-1] if lines else f"argparse exit {exc.code}"),
                       site="srt/server_args.py:prepare_server_args",
                       flags=[f for f in re.findall(r"--[a-z0-9][a-z0-9-]*", lines[-1] if lines else "")])
    except Exception as exc:  # SGLang refused (its type and message are the answer), or the harness broke
        if not raised_by_sglang(exc):
            out = harness_fault(exc, stage)
        else:
            message = " ".join(str(exc).split()) or type(exc).__name__
            path, func = _site(exc)
            stage = _stage_of(path, stage)
            out.update(ok=False, stage=stage, type=type(exc).__name__, message=message[:1000],
                       site=f"{path}:{func}", flags=_flags_read(exc, message, dest_flag, list(argv), stage))
    seconds["total"] = round(time.monotonic() - t0, 3)
    out["seconds"] = seconds
    return out


def main() -> int:
    """Script entry (SGLang's interpreter, or its source given to ``python -c``): one JSON request
    in ``$ESCHA_PREFLIGHT_REQUEST`` or on stdin (``{"argv": [...]}``, or
    ``{"argvs": [[...], ...]}`` for several in one process, as the tests run them; ``device`` /
    ``devices``: the plan's figures for the sizing stages, or null), one JSON answer
    per argv on stdout, a line each. Exit 0 with any answer; 1 when the request is unreadable (one
    harness-fault answer: escha-deploy wrote it); 4 when ``sglang`` cannot be imported (the answer
    says so). A fault of the harness outside the stages (``sglang_side`` raising) is that argv's
    answer, ``harness_fault``, and the next argv still runs."""
    try:
        request = json.loads(os.environ.get(REQUEST_ENV) or sys.stdin.read())
        argvs = [request["argv"]] if "argv" in request else list(request["argvs"])
        argvs = [[str(a) for a in argv] for argv in argvs]
        devices = ([request.get("device")] if "argv" in request else list(request.get("devices") or [None] * len(argvs)))
        if len(devices) != len(argvs):
            raise ValueError(f"{len(devices)} devices for {len(argvs)} argvs")
    except (ValueError, KeyError, TypeError) as exc:
        print(f"sglang pre-flight: bad request: {exc}", file=sys.stderr)
        print(json.dumps(harness_fault(exc, "request")), flush=True)
        return 1
    try:
        import sglang  # noqa: F401
    except ImportError as exc:
        print(json.dumps({"ok": None, "not_run": f"sglang does not import ({exc})"}))
        return 4
    for argv, device in zip(argvs, devices):
        try:
            answer = sglang_side(argv, device)
        except Exception as exc:  # noqa: BLE001  outside the stages' own try: the harness's, whoever raised
            answer = harness_fault(exc, "harness")
        print(json.dumps(answer), flush=True)
    return 0


# --------------------------------------------------------------------------- escha-deploy's side


@dataclass(frozen=True)
class PreflightResult:
    """SGLang's answer. ``ok``: True passed, False refused, None not run (``not_run`` says why).
    ``seconds``: SGLang's import, each stage and the total, as measured inside its process;
    ``wall_s``: the whole pre-flight process as ``serve`` waited for it. ``fault``:
    ``"harness"`` when the pre-flight's own code failed (``ok`` False, ``internal`` True; ``site``
    is this file's function, ``traceback`` the formatted traceback): not SGLang's refusal."""

    ok: bool | None
    stage: str = ""
    message: str = ""
    type: str = ""
    site: str = ""
    flags: list[str] = field(default_factory=list)
    answers: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    not_run: str = ""
    skipped: str = ""  # the sizing stages not run, and why (``sizing_unsupported``)
    fault: str = ""  # "harness": the pre-flight's own code failed (``harness_fault``)
    traceback: str = ""  # that failure's traceback, as formatted in SGLang's process

    @property
    def internal(self) -> bool:
        """Whether the answer is a fault of the pre-flight's own code, not SGLang's refusal."""
        return self.fault == "harness"


def server_flags_of(argv: list[str]) -> list[str]:
    """The flags after ``-m sglang.launch_server`` in a launch argv (the whole list when it is
    flags only): the part ``flagcheck.server_flags`` gives the parser catalog. Raises
    ``ValueError`` for a command that is no SGLang server's (what that check names)."""
    from escha_deploy.sglang.flagcheck import server_flags

    flags, problem = server_flags(list(argv))
    if problem is not None:
        raise ValueError(f"{problem.flag}: {problem.message}")
    return flags


def run(python: str, argv: list[str], env: dict[str, str] | None = None, *,
        timeout_s: float = TIMEOUT_S, device: dict[str, Any] | None = None) -> PreflightResult:
    """Run the pre-flight for ``argv`` (the server's flags) with ``python`` (SGLang's interpreter)
    and ``env`` (the server's environment); ``device`` (``device_figures``) adds the sizing
    stages. Never raises for SGLang's answer; a pre-flight that could not run (no such
    interpreter, no sglang, a timeout, an unreadable answer) is ``ok=None`` with the reason."""
    return run_many(python, [argv], env, timeout_s=timeout_s, devices=[device])[0]


def device_figures(plan: Any, host_budget: int | None = None) -> dict[str, Any]:
    """The sizing stages' input from an escha-deploy ``Plan``: ``free_before_weights`` (bytes per
    rank: VRAM less the CUDA context and WSL2's hidden part, ``plan.device``) and ``weights``
    (bytes per rank loaded before the pools are sized: the target's and a counted draft's,
    ``plan.per_rank``), both as the launch spec records them (``launch_spec.preflight_from_plan``,
    one place for the figures); ``capability``: the card's compute capability the plan judged
    (``"12.0"``, absent when unknown), which the model-runner stage answers for the card's
    readings; ``host_budget`` (bytes for the whole box) only when the host-pool check should be
    against a described host rather than this one's free memory."""
    from escha_deploy.pipeline.spec import preflight_from_plan

    figures = preflight_from_plan(plan)
    out: dict[str, Any] = {"free_before_weights": int(figures.free_before_weights_bytes),
                           "weights": int(figures.weights_bytes)}
    if figures.compute_capability:
        out["capability"] = figures.compute_capability
    if host_budget is not None:
        out["host_budget"] = int(host_budget)
    return out


def spec_device(figures: Any) -> dict[str, Any] | None:
    """The sizing stages' input from a launch spec's ``preflight`` (``launch_spec.PreflightFigures``,
    bytes; the plan's figures as ``device_figures`` gives them, with the recorded host budget);
    None for a spec that records none (those stages are then skipped)."""
    if figures is None:
        return None
    out: dict[str, Any] = {"free_before_weights": int(figures.free_before_weights_bytes),
                           "weights": int(figures.weights_bytes)}
    if figures.compute_capability:
        out["capability"] = figures.compute_capability
    if figures.host_budget_bytes is not None:
        out["host_budget"] = int(figures.host_budget_bytes)
    return out


def run_many(python: str, argvs: list[list[str]], env: dict[str, str] | None = None, *,
             timeout_s: float = TIMEOUT_S, devices: list[dict[str, Any] | None] | None = None) -> list[PreflightResult]:
    """``run`` for several argvs in one SGLang process (SGLang imported once): one result each;
    ``devices``: the sizing stages' figures per argv (None: those stages are not run)."""
    t0 = time.monotonic()

    def not_run(why: str) -> list[PreflightResult]:
        return [PreflightResult(ok=None, not_run=why, wall_s=time.monotonic() - t0)] * len(argvs)

    env = {k: v for k, v in (os.environ if env is None else env).items() if k != REQUEST_ENV}  # stdin it is
    try:
        proc = subprocess.run([python, str(Path(__file__).resolve())], input=json.dumps({"argvs": argvs, "devices": devices or [None] * len(argvs)}),
                              capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return not_run(f"no interpreter {python}")
    except subprocess.TimeoutExpired:
        return not_run(f"it did not answer within {timeout_s:.0f} s")
    return parse_answers(proc.stdout, len(argvs), t0, f"{python} gave", proc.returncode, proc.stderr)


def parse_answers(stdout: str, n: int, t0: float, who: str, code: int, stderr: str) -> list[PreflightResult]:
    """The ``n`` results in ``stdout`` (one JSON line per argv, ``main``'s answer), ``wall_s``
    counted from ``t0`` (``time.monotonic``); all ``ok=None`` when SGLang did not import or
    fewer lines came (``who`` gave K of N answers, exit ``code``, ``stderr``'s last line); the
    harness's fault for all when it is the one answer (a request ``main`` could not read)."""
    answers = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                answers.append(json.loads(line))
            except ValueError:
                pass
    wall = time.monotonic() - t0
    if answers and answers[0].get("ok") is None:
        return [PreflightResult(ok=None, not_run=str(answers[0].get("not_run", "not run")), wall_s=wall)] * n
    if len(answers) == 1 and answers[0].get("fault") == "harness" and n != 1:
        answers *= n
    if len(answers) != n:
        tail = " ".join(stderr.strip().splitlines()[-1:])[:300]
        return [PreflightResult(ok=None, wall_s=wall, not_run=f"{who} {len(answers)} of {n} answers (exit {code}"
                                f"{': ' + tail if tail else ''})")] * n
    return [PreflightResult(
        ok=bool(d["ok"]), stage=str(d.get("stage", "")), message=str(d.get("message", "")),
        type=str(d.get("type", "")), site=str(d.get("site", "")), flags=list(d.get("flags") or []),
        answers=dict(d.get("answers") or {}), seconds=dict(d.get("seconds") or {}), wall_s=wall,
        skipped=str(d.get("skipped") or ""), fault=str(d.get("fault") or ""),
        traceback=str(d.get("traceback") or "")) for d in answers]


def host_note() -> str | None:
    """What a host ``plan`` says of the pre-flight where SGLang does not import (this interpreter
    has no ``sglang``): that it runs at `up`; None where SGLang imports."""
    import importlib.util

    if importlib.util.find_spec("sglang") is not None:
        return None
    return (f"plan: SGLang's own pre-flight ({', '.join(STAGES)}) runs at `up` (and `serve`), in SGLang's "
            "interpreter before the first weight loads; SGLang does not import here")


def profile_keys_for(flags: list[str], extra_args: list[str]) -> list[str]:
    """Where each flag came from: ``runtime.extra_args item '--flag'`` when the profile's
    ``extra_args`` carries it, else the profile key whose ``SGLangFlag`` metadata names it, else
    ``the plan (--flag)`` for a value the planner computes (``--max-total-tokens`` ...)."""
    from escha_deploy.profile import key_flags

    by_flag: dict[str, str] = {}
    for key, (flag,) in key_flags().items():
        by_flag.setdefault(flag, key)
    given = {a.split("=", 1)[0] for a in extra_args if a.startswith("--")}
    out = []
    for f in flags:
        if f in given:
            out.append(f"runtime.extra_args item '{f}'")
        elif f in by_flag:
            out.append(by_flag[f])
        else:
            out.append(f"the plan ({f})")
    return list(dict.fromkeys(out))


def refusal_line(result: PreflightResult, keys: list[str]) -> str:
    """One line for a refusal: stage, SGLang's message, where it raised, what set the input
    (a harness fault is no refusal: ``internal_line``)."""
    where = f" ({result.site})" if result.site else ""
    set_by = f"; set by {', '.join(keys)}" if keys else ""
    return f"SGLang's pre-flight refused at {result.stage}: {result.type}: {result.message}{where}{set_by}"


#: The words every internal error of the pre-flight starts with (``internal_line``).
INTERNAL = "internal error in the pre-flight (please report)"


def internal_line(result: PreflightResult, log: str | None) -> str:
    """One line for a fault of the pre-flight's own code (``result.internal``): its exception,
    the harness function and the stage it ran, and where its traceback is (``log``: a file, or
    None when it went to the log stream above). Names no profile key: the profile did not cause it."""
    where = f"the traceback is in {log}" if log else "the traceback is above"
    return (f"{INTERNAL}: {result.type}: {result.message} in {result.site} "
            f"(stage {result.stage}); {where}")


if __name__ == "__main__":
    sys.exit(main())
