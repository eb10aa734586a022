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
   ``resolve_max_num_reqs``), with no pool allocated: the free GPU memory before and after the
   weights are the plan's figures (``device`` in the request: ``free_before_weights`` and
   ``weights``, bytes per rank), the world group one process, the parallel widths what
   ``initialize_model_parallel`` stamps (attention TP = ``--tp-size``). Answers the device pool's
   tokens (``max_total_num_tokens``), the mamba slots, the running-request cap and the pools'
   bytes (tokens x the pool configurator's bytes per token; (slots + 1) x the mamba state per
   request);
5. **host pools** (HiCache on): ``srt/mem_cache/pool_host/mha.py: MHATokenToKVPoolHost`` (and
   ``pool_host/mamba.py: MambaPoolHost``) built over CPU views of the device pools stage 4 sized,
   their allocation answered by a zero-stride view (nothing of their size is mapped) and their
   host-memory check run unchanged against this host's free memory (psutil), split over the
   ranks of the box (``ranks_per_host``, which reads the world group, answered ``tp x pp /
   nnodes``), or against ``device["host_budget"]`` bytes when the request gives the described
   host's figure (the tests and a GPU machine that is not the target box).

Stages 4 and 5 run only when the request carries ``device`` (`up`'s check and native ``serve``
take it from the plan; ``serve --spec`` from the figures the plan recorded in the launch spec,
``LaunchSpec.preflight``, host budget included; a spec written before they were recorded runs
stages 1-3 and says the other two are skipped). No weights, no NCCL, no CUDA allocation.

Two halves in one file: ``main()`` is the SGLang side (it imports only the standard library and
``sglang``, since SGLang's interpreter has no escha_deploy); ``run()`` is the escha-deploy side,
which starts it and reads its one JSON answer. A refusal carries SGLang's message, its
``file:function``, the stage, and the argv flags it names or, when its message names none, the
flags the failing function reads.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STAGES = ("argument resolution", "model config", "attention backend", "KV cache configurator", "host pools")

#: ``0`` skips SGLang's own pre-flight before the server starts (``serve``, and `up`'s check
#: ``sglang pre-flight``), ``1`` runs it even where the GPU test switch (``ESCHA_SKIP_GPU_PREFLIGHT=1``) is set: SGLang's
#: stages read the real GPU's platform, which a machine without one (that switch) lacks.
PREFLIGHT_ENV = "ESCHA_SGLANG_PREFLIGHT"
#: The request, when not on stdin (`up`'s throw-away container: ``launch.image_preflight``).
REQUEST_ENV = "ESCHA_PREFLIGHT_REQUEST"

#: How long the pre-flight may take (importing SGLang takes 8-15 s on a 2-core machine).
TIMEOUT_S = 240.0

# --------------------------------------------------------------------------- SGLang's side


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
    if current in STAGES[3:]:
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


def sizing_unsupported(sa: Any) -> str | None:
    """Why the sizing stages cannot stand in for SGLang's own on ``sa`` (the resolved
    ``ServerArgs``), or None. They build SGLang 0.5.19's ``KVCacheConfigurator`` without its
    constructor (``_kv_configurator``), so they need that release's shape of it: the
    ``ps`` field and ``ParallelContext.stamp_derived_widths`` (0.5.23 derives the widths in
    ``publish`` and gives the configurator other fields); and one pipeline stage, since the
    stand-in has no pipeline-parallel group (``_apply_token_constraints`` reads it when
    ``--pp-size`` > 1). A stage that cannot run is said and skipped, never reported as SGLang's
    refusal."""
    import dataclasses

    from sglang.srt.mem_cache import kv_cache_configurator as kcc
    from sglang.srt.runtime_context import get_parallel

    if int(getattr(sa, "pp_size", 1) or 1) > 1:
        return f"--pp-size {sa.pp_size}: the stand-in configurator has no pipeline-parallel group"
    names = {f.name for f in dataclasses.fields(kcc.KVCacheConfigurator)} if dataclasses.is_dataclass(
        kcc.KVCacheConfigurator) else set(getattr(kcc.KVCacheConfigurator, "__annotations__", {}))
    if "ps" not in names or not hasattr(get_parallel(), "stamp_derived_widths"):
        return "this SGLang's KVCacheConfigurator is not the shape the stand-in builds (SGLang 0.5.19's)"
    return None


def _kv_configurator(sa: Any, mc: Any, device: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Stage 4 (module docstring): SGLang's ``KVCacheConfigurator`` sizing on the resolved and
    published ``sa`` and the model config ``mc``, with ``device``'s figures (bytes per rank) as
    the free GPU memory before and after the weights. The configurator is made without its
    constructor (which takes the loaded model), with the fields these methods read; its
    module's two readings of the live process (free GPU memory, the world group) answer the
    plan's figure and one process for the call, and are put back. Returns the configurator and
    the answers."""
    import types

    import torch  # noqa: F401  (SGLang's pool code expects torch imported first)
    from sglang.srt.mem_cache import kv_cache_configurator as kcc
    from sglang.srt.mem_cache.kv_cache_dtype import configure_kv_cache_dtype
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator
    from sglang.srt.runtime_context import get_parallel, get_schedule, publish
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    publish(sa, role="scheduler")  # what the scheduler process does with the resolved arguments
    get_parallel().stamp_derived_widths(attn_tp_size=sa.tp_size, attn_dp_size=1, attn_dcp_size=1,
                                        dcp_enabled=False, moe_tp_size=sa.tp_size)
    kv_str, kv_dtype = configure_kv_cache_dtype(
        server_args_kv_cache_dtype=sa.kv_cache_dtype, model=None, model_dtype=mc.dtype, is_draft_worker=False,
        is_dflash=False, speculative_draft_attention_backend=None)
    kvc = object.__new__(kcc.KVCacheConfigurator)
    fields = dict(
        device="cuda", gpu_id=0, model_config=mc, ps=types.SimpleNamespace(pp_size=1, attn_dp_size=1),
        spec_algorithm=SpeculativeAlgorithm.from_string(None), is_draft_worker=False, draft_model_idx=None,
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
    tokens = int(config.max_total_num_tokens)
    cell = int(getattr(create_memory_pool_configurator(kvc), "_cell_size", 0) or 0)
    per_req = int(kvc.mambaish_config.mamba2_cache_params.mamba_cache_per_req) if slots else 0
    return kvc, {"kv_budget_bytes": int(budget), "max_total_num_tokens": tokens, "max_running_requests": int(reqs),
                 "kv_bytes_per_token": cell, "kv_pool_bytes": tokens * cell, "mamba_slots": slots,
                 "mamba_pool_bytes": (slots + 1) * per_req if slots else 0}


def _host_pools(sa: Any, kvc: Any, kv: dict[str, Any], device: dict[str, Any]) -> dict[str, Any]:
    """Stage 5 (module docstring): SGLang's host pool classes over CPU views of the device pools
    stage 4 sized; their allocation a zero-stride view, their host-memory check SGLang's own."""
    import torch
    from sglang.srt.mem_cache.pool_host import base, common, mamba, mha

    def no_allocation(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
        return torch.empty(1, dtype=dtype).expand(*dims)  # indexable, nothing of its size mapped

    ranks = max(int(sa.tp_size) * int(getattr(sa, "pp_size", 1) or 1) // max(int(getattr(sa, "nnodes", 1) or 1), 1), 1)
    # What this stage replaces in SGLang's modules, put back when it ends (as stage 4 puts back
    # its two readings), so a later argv in the same process (run_many) sees SGLang's own.
    stand_ins: list[tuple[Any, str, Any]] = [
        (base, "ranks_per_host", lambda: ranks),  # the world group it reads: tp x pp ranks over nnodes
        *((cls, "_init_write_back_staging_buffers", lambda self: None)  # device-side staging: not sizing
          for cls in (mha.MHATokenToKVPoolHost, mamba.MambaPoolHost)),
        (common.ALLOC_MEMORY_FUNCS, "default_factory", lambda: no_allocation)]
    if device.get("host_budget") is not None:
        budget = int(device["host_budget"])
        stand_ins += [(mod, "host_memory_budget_bytes", lambda: budget // ranks)
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


def _host_pools_sized(sa: Any, kvc: Any, kv: dict[str, Any], *, modules: tuple[Any, Any]) -> dict[str, Any]:
    """Stage 5's sizing, with ``_host_pools``'s stand-ins in place: SGLang's host pool classes
    (``modules``: its ``pool_host.mha`` and ``pool_host.mamba``) over CPU views of the pools stage 4 sized."""
    import types

    import torch

    mha, mamba = modules
    mc = kvc.model_config
    dtype = kvc.kv_cache_dtype
    store = torch.uint8 if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else dtype
    m = kvc.mambaish_config
    layers = len(m.full_attention_layer_ids) if m is not None else mc.num_hidden_layers
    heads, head_dim = mc.get_num_kv_heads(sa.tp_size), mc.head_dim
    page = int(sa.page_size or 1)
    kv_dev = kv["kv_pool_bytes"]
    device_kv = types.SimpleNamespace(
        store_dtype=store, dtype=dtype, size=kv["max_total_num_tokens"], start_layer=0, end_layer=layers,
        layer_num=layers, head_num=heads, head_dim=head_dim, v_head_dim=head_dim, page_size=page, device="cpu",
        get_kv_size_bytes=lambda: (kv_dev // 2, kv_dev - kv_dev // 2))
    ratio, size_gb = float(sa.hicache_ratio or 0), int(sa.hicache_size or 0)
    layout = sa.hicache_mem_layout
    kv_size = mamba_size = size_gb
    device_mamba = None
    if m is not None and kv["mamba_slots"]:
        p = m.mamba2_cache_params
        slots = kv["mamba_slots"] + 1
        conv = [torch.empty(1, dtype=p.dtype.conv).expand(len(p.layers), slots, *c) for c in p.shape.conv]
        temporal = torch.empty(1, dtype=p.dtype.temporal).expand(len(p.layers), slots, *p.shape.temporal)
        mamba_dev = kv["mamba_pool_bytes"]
        device_mamba = types.SimpleNamespace(
            size=kv["mamba_slots"], num_mamba_layers=len(p.layers), device="cpu",
            mamba_cache=types.SimpleNamespace(conv=conv, temporal=temporal),
            get_kv_size_bytes=lambda: mamba_dev, mem_usage_bytes=lambda: mamba_dev)
        if size_gb:
            from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _split_hicache_size

            kv_size, mamba_size = _split_hicache_size(size_gb, (device_kv, device_mamba))
    host = mha.MHATokenToKVPoolHost(device_kv, ratio, kv_size, page, layout, pin_memory=False, device="cpu")
    out = {"host_kv_tokens": int(host.size), "host_kv_bytes": int(host.size * host.size_per_token)}
    if device_mamba is not None:
        hm = mamba.MambaPoolHost(device_mamba, ratio, mamba_size, pin_memory=False, device="cpu", layout=layout)
        out.update(host_mamba_slots=int(hm.size), host_mamba_bytes=int(hm.size * hm.size_per_token))
    return out


def sglang_side(argv: list[str], device: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the stages on ``argv`` (the flags after ``-m sglang.launch_server``) in this process;
    the sizing stages when ``device`` gives the plan's figures (module docstring). Returns the
    answer: ``ok``, ``stage`` reached, ``answers`` (what SGLang resolved and sized) or the
    refusal (``type``, ``message``, ``site``, ``flags``), ``seconds`` per part."""
    import argparse
    import contextlib
    import io

    t0 = time.monotonic()
    try:
        from sglang.srt.server_args import ServerArgs, prepare_server_args
    except ImportError as exc:  # an SGLang without its dependencies (a build-only image)
        return {"ok": None, "not_run": f"sglang.srt.server_args does not import ({exc})"}

    seconds: dict[str, float] = {"import": round(time.monotonic() - t0, 3)}
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    dest_flag = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}  # noqa: SLF001
    stage = STAGES[0]
    out: dict[str, Any] = {"ok": True, "stage": stage}
    t1 = time.monotonic()
    err = io.StringIO()
    try:
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
        if skipped:
            out["skipped"] = f"{' and '.join(STAGES[3:])}: {skipped}"
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
        out["stage"] = stage
        out["answers"] = {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
                          for k, v in answers.items()}
    except SystemExit as exc:  # argparse: its message is on stderr
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        out.update(ok=False, stage=stage, type="SystemExit",
                   message=(lines[-1] if lines else f"argparse exit {exc.code}"), site="srt/server_args.py:prepare_server_args",
                   flags=[f for f in re.findall(r"--[a-z0-9][a-z0-9-]*", lines[-1] if lines else "")])
    except Exception as exc:  # SGLang refused: its type and message are the answer
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
    per argv on stdout, a line each. Exit 0 with any answer; 1 when the request is unreadable; 4
    when ``sglang`` cannot be imported (the answer says so)."""
    try:
        request = json.loads(os.environ.get(REQUEST_ENV) or sys.stdin.read())
        argvs = [request["argv"]] if "argv" in request else list(request["argvs"])
        argvs = [[str(a) for a in argv] for argv in argvs]
        devices = ([request.get("device")] if "argv" in request else list(request.get("devices") or [None] * len(argvs)))
        if len(devices) != len(argvs):
            raise ValueError(f"{len(devices)} devices for {len(argvs)} argvs")
    except (ValueError, KeyError, TypeError) as exc:
        print(f"sglang pre-flight: bad request: {exc}", file=sys.stderr)
        return 1
    try:
        import sglang  # noqa: F401
    except ImportError as exc:
        print(json.dumps({"ok": None, "not_run": f"sglang does not import ({exc})"}))
        return 4
    for argv, device in zip(argvs, devices):
        print(json.dumps(sglang_side(argv, device)), flush=True)
    return 0


# --------------------------------------------------------------------------- escha-deploy's side


@dataclass(frozen=True)
class PreflightResult:
    """SGLang's answer. ``ok``: True passed, False refused, None not run (``not_run`` says why).
    ``seconds``: SGLang's import, each stage and the total, as measured inside its process;
    ``wall_s``: the whole pre-flight process as ``serve`` waited for it."""

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


def server_flags_of(argv: list[str]) -> list[str]:
    """The flags after ``-m sglang.launch_server`` in a launch argv (the whole list when it is
    flags only): the part ``flagcheck.server_flags`` gives the parser catalog. Raises
    ``ValueError`` for a command that is no SGLang server's (what that check names)."""
    from escha_deploy.flagcheck import server_flags

    flags, problem = server_flags(list(argv))
    if problem is not None:
        raise ValueError(f"{problem.flag}: {problem.message}")
    return flags


def run(python: str, argv: list[str], env: dict[str, str] | None = None, *,
        timeout_s: float = TIMEOUT_S, device: dict[str, int] | None = None) -> PreflightResult:
    """Run the pre-flight for ``argv`` (the server's flags) with ``python`` (SGLang's interpreter)
    and ``env`` (the server's environment); ``device`` (``device_figures``) adds the sizing
    stages. Never raises for SGLang's answer; a pre-flight that could not run (no such
    interpreter, no sglang, a timeout, an unreadable answer) is ``ok=None`` with the reason."""
    return run_many(python, [argv], env, timeout_s=timeout_s, devices=[device])[0]


def device_figures(plan: Any, host_budget: int | None = None) -> dict[str, int]:
    """The sizing stages' input from an escha-deploy ``Plan``: ``free_before_weights`` (bytes per
    rank: VRAM less the CUDA context and WSL2's hidden part, ``plan.device``) and ``weights``
    (bytes per rank, ``plan.per_rank``); ``host_budget`` (bytes for the whole box) only when the
    host-pool check should be against a described host rather than this one's free memory."""
    out = {"free_before_weights": int(plan.device.free_before_weights_bytes),
           "weights": int(plan.per_rank.weights_bytes)}
    if host_budget is not None:
        out["host_budget"] = int(host_budget)
    return out


def spec_device(figures: Any) -> dict[str, int] | None:
    """The sizing stages' input from a launch spec's ``preflight`` (``launch_spec.PreflightFigures``,
    bytes; the plan's figures as ``device_figures`` gives them, with the recorded host budget);
    None for a spec that records none (those stages are then skipped)."""
    if figures is None:
        return None
    out = {"free_before_weights": int(figures.free_before_weights_bytes), "weights": int(figures.weights_bytes)}
    if figures.host_budget_bytes is not None:
        out["host_budget"] = int(figures.host_budget_bytes)
    return out


def run_many(python: str, argvs: list[list[str]], env: dict[str, str] | None = None, *,
             timeout_s: float = TIMEOUT_S, devices: list[dict[str, int] | None] | None = None) -> list[PreflightResult]:
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
    fewer lines came (``who`` gave K of N answers, exit ``code``, ``stderr``'s last line)."""
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
    if len(answers) != n:
        tail = " ".join(stderr.strip().splitlines()[-1:])[:300]
        return [PreflightResult(ok=None, wall_s=wall, not_run=f"{who} {len(answers)} of {n} answers (exit {code}"
                                f"{': ' + tail if tail else ''})")] * n
    return [PreflightResult(
        ok=bool(d["ok"]), stage=str(d.get("stage", "")), message=str(d.get("message", "")),
        type=str(d.get("type", "")), site=str(d.get("site", "")), flags=list(d.get("flags") or []),
        answers=dict(d.get("answers") or {}), seconds=dict(d.get("seconds") or {}), wall_s=wall,
        skipped=str(d.get("skipped") or "")) for d in answers]


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
    from escha_deploy.profile import Profile, sglang_flag

    by_flag: dict[str, str] = {}

    def walk(model: type, prefix: str) -> None:
        for name, info in model.model_fields.items():
            meta = sglang_flag(info)
            if meta is not None and meta.flag:
                by_flag.setdefault(meta.flag, prefix + name)
            ann = info.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann, f"{prefix}{name}.")

    walk(Profile, "")
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
    """One line for a refusal: stage, SGLang's message, where it raised, what set the input."""
    where = f" ({result.site})" if result.site else ""
    set_by = f"; set by {', '.join(keys)}" if keys else ""
    return f"SGLang's pre-flight refused at {result.stage}: {result.type}: {result.message}{where}{set_by}"


if __name__ == "__main__":
    sys.exit(main())
