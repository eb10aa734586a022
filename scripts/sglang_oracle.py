#!/usr/bin/env python3
"""Run SGLang 0.5.19's own code on the CPU for a list of cases: its argument resolution on our
rendered argv, its memory defaults, and its host-pool classes. The judge side of the oracle.

Input (``--cases FILE``): a JSON list of cases written by ``escha_deploy``'s side
(``tests/oracle/cases.py``); each has ``id``, ``argv`` (the rendered flags after
``python -m sglang.launch_server``), ``config`` (a config.json mapping), ``gpu`` (``vram_bytes``,
``name``, ``capability``) and, for the host pools, ``pools`` (device pool geometry and the
``--hicache-ratio``/``--hicache-size`` to build them at). Output (stdout): one JSON object per
case with what SGLang answered (``resolve``: accepted or the refusal with its exception type and
message, and the resolved values the planner also computes; ``defaults``: the same argv without
``--mem-fraction-static``, so SGLang picks its default and its reserve; ``device``: the device
pool's tokens, the mamba slots and the running-request cap its ``KVCacheConfigurator`` computes,
or its refusal; ``pools``: host pool sizes in tokens/slots and bytes).

Runs with the Python of the flag-catalog venv (``.ci/check-flag-catalog.sh``): sglang 0.5.19
``--no-deps``, CPU torch 2.13.0 and the import chain of ``scripts/gen_flag_catalog.py
--print-requirements``. Only the standard library, torch and sglang are imported; escha_deploy
is not.

What answers for the GPU (stand-ins, named as such; nothing else of SGLang is replaced):

- a test-only SGLang platform plugin (entry-point group ``sglang.srt.platforms``, discovered by
  ``srt/platforms/__init__.py: _resolve_platform`` exactly as an out-of-tree platform is): it
  reports the case's card (total memory, name, compute capability) and nothing else;
- ``sglang.srt.runtime_context.override_platform(is_cuda=True, ...)``: SGLang's own switch for
  the platform facts its argument hooks read (``get_platform().is_cuda``, ``is_sm120``, ...),
  set to the target card's, so the CUDA branches the GPU box takes are the ones checked;
- ``torchvision``: a permissive stand-in package (the PyPI build is CUDA-only and does not
  import against the CPU torch); nothing in the checked code calls it;
- host pools: built over a plain namespace standing in for the device pool (the fields the
  host-pool constructors read), with ``pin_memory=False`` and ``device="cpu"`` so no CUDA
  call is made; the pool's own size arithmetic and host-memory check run unchanged, and its
  buffer is allocated lazily (untouched pages of an anonymous mapping).

Exit codes: 0 every case ran (refusals are results, not failures); 1 a harness failure (a
TypeError or AttributeError raised by a call the harness made or by one of its stand-ins: the
harness does not fit the release, named with the case); 2 bad usage or the installed sglang has
no adapter, or a malformed one (``load_adapter``: the release's ``oracle-adapter.json``; 0.5.19
and 0.5.23 everything; 0.5.23's device-pool sizing goes through the pre-flight's function for its
configurator shape, its host pools through its buffer-info constructors, ``host_pools``; a part an
adapter cannot run is named in each case's ``cannot``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.abc
import importlib.machinery
import io
import json
import logging
import math
import os
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path
from typing import Any

#: The per-release adapter, data in each release's folder
#: (``escha_deploy/catalog/releases/VERSION/oracle-adapter.json``), so a release is added
#: without a change here: how the release's code is reached on the CPU. Each key and what it
#: takes: ``gpu_mem``, how ``memory_hook.handle_gpu_memory_settings`` gets the card's memory
#: (``argument``: the caller passes it; ``get_device_memory_capacity``: it asks that function
#: itself); ``device``/``pools``: true when the device-pool sizing and the host-pool
#: constructors run here, else a string saying why not (the case's result then says so under
#: ``cannot``, and no field of that part is compared); ``source``: the wheel's files and
#: functions the adapter was read from. A new way to reach a release's code is a new key (or
#: value) here and the code that uses it.
ADAPTER_KEYS: dict[str, tuple[Any, ...]] = {
    "gpu_mem": ("argument", "get_device_memory_capacity"),
    "device": (True, str),
    "pools": (True, str),
    "source": (str,),
}
ADAPTER_FILE = "oracle-adapter.json"
#: Where the release folders are: ``$ESCHA_RELEASES_DIR``, else beside this script in the checkout.
RELEASES_DIR_ENV = "ESCHA_RELEASES_DIR"


def releases_dir() -> Path:
    """The folder of one folder per release (``RELEASES_DIR_ENV``, else the checkout's
    ``escha_deploy/catalog/releases``; read when called)."""
    return Path(os.environ.get(RELEASES_DIR_ENV) or Path(__file__).resolve().parent.parent
                / "escha_deploy" / "catalog" / "releases")


def adapted_releases() -> list[str]:
    """The releases with an adapter file, sorted."""
    return sorted(p.parent.name for p in releases_dir().glob(f"*/{ADAPTER_FILE}"))


def _takes(value: Any, allowed: Any) -> bool:
    """Whether ``value`` is ``allowed``: an instance of it (a type; ``bool`` is not a ``str``),
    else the same value (``True`` only as ``True``, not 1)."""
    if isinstance(allowed, type):
        return isinstance(value, allowed)
    return type(value) is type(allowed) and value == allowed


def load_adapter(version: str) -> dict[str, Any]:
    """The adapter of ``version`` (``ADAPTER_KEYS`` says what each key takes). Raises
    ``ValueError`` with one line naming the file: none, not a JSON object, a key missing or
    unknown, a value it does not take."""
    path = releases_dir() / version / ADAPTER_FILE
    if not path.is_file():
        raise ValueError(f"installed sglang is {version}: no {path} (adapted: {', '.join(adapted_releases()) or 'none'})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    problems = [f"{key}: missing" for key in ADAPTER_KEYS if key not in data]
    problems += [f"{key}: unknown key (known: {', '.join(ADAPTER_KEYS)})" for key in data if key not in ADAPTER_KEYS]
    for key, value in data.items():
        takes = ADAPTER_KEYS.get(key, ())
        if takes and not any(_takes(value, t) for t in takes):
            problems.append(f"{key}: {value!r} is not one of {[t.__name__ if isinstance(t, type) else t for t in takes]}")
    if problems:
        raise ValueError(f"{path}: {'; '.join(problems)}")
    return data


class HarnessFailure(Exception):
    """A TypeError or AttributeError raised by a call the harness made (or by one of its stand-ins
    called with another signature): the harness does not fit this release, which says nothing of
    SGLang's answer. ``main`` exits 1 naming the case."""


def _harness_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is the harness's own fault: a TypeError/AttributeError raised in this file
    or the platform plugin, or naming one of this file's functions or stand-ins."""
    if not isinstance(exc, (TypeError, AttributeError)):
        return False
    last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    if last is not None and (Path(last.filename).resolve() == Path(__file__).resolve()
                             or Path(last.filename).name == "escha_oracle_platform.py"):
        return True
    names = {m.group(1) for m in __import__("re").finditer(r"(\w+)\.<locals>\.", str(exc))}
    return bool(names & set(globals())) or "TargetCardPlatform" in str(exc)


def _refusal_or_fault(exc: BaseException, case: dict, part: str) -> None:
    if _harness_fault(exc):
        frames = traceback.extract_tb(exc.__traceback__)
        at = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} {frames[-1].name})" if frames else ""
        raise HarnessFailure(f"case {case['id']}: {part}: {type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:300]}{at}") from exc
PLUGIN_NAME = "escha_target_card"
_HERE = Path(__file__).resolve().parent

# --------------------------------------------------------------------------- stand-ins


class _Placeholder:
    """An attribute of the torchvision stand-in: hashable, comparable, fails when called."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> "_Placeholder":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *_a: Any, **_k: Any) -> Any:
        raise RuntimeError(f"torchvision stand-in: {self._name} was called")

    def __repr__(self) -> str:
        return f"<torchvision stand-in {self._name}>"


class _StandInModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = _Placeholder(f"{self.__name__}.{attr}")
        setattr(self, attr, value)
        return value


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``torchvision`` and every ``torchvision.*`` as permissive empty packages."""

    def find_spec(self, name, path, target=None):  # noqa: D102
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):  # noqa: D102
        mod = _StandInModule(spec.name)
        mod.__path__ = []  # type: ignore[attr-defined]
        mod.__version__ = "0.28.0"  # the release that pairs with torch 2.13
        mod.__file__ = "<escha torchvision stand-in>"
        return mod

    def exec_module(self, module):  # noqa: D102
        pass


def install_torchvision_stand_in() -> None:
    """Put the stand-in first on ``sys.meta_path`` (a real torchvision here could not import)."""
    sys.meta_path.insert(0, _TorchvisionStandIn())


PLUGIN_SOURCE = '''\
"""Test-only SGLang platform plugin: describes the target card of the current oracle case."""
import torch
from sglang.srt.platforms.device_mixin import DeviceCapability, PlatformEnum
from sglang.srt.platforms.interface import SRTPlatform

CARD = {"vram_bytes": 0, "name": "", "capability": (0, 0)}


class TargetCardPlatform(SRTPlatform):
    _enum = PlatformEnum.OOT
    device_name = "cuda"
    device_type = "cuda"

    def get_device_total_memory(self, device_id: int = 0) -> int:
        return int(CARD["vram_bytes"])

    def get_device_name(self, device_id: int = 0) -> str:
        return CARD["name"]

    def get_device_capability(self, device_id: int = 0):
        return DeviceCapability(*CARD["capability"])

    def get_device(self, local_rank: int = 0):
        return "cuda"

    def get_default_attention_backend(self) -> str:
        return "triton"

    def supports_fp8(self) -> bool:
        return True

    def support_cuda_graph(self) -> bool:
        return True

    def support_mamba_cache_extra_buffer(self) -> bool:
        # 0.5.23 (arg_groups/mamba_hook.py: _platform_supports_mamba_cache_extra_buffer) asks an
        # out-of-tree platform; on CUDA it is True (get_platform().is_cuda). 0.5.19 never asks.
        return True

    def supports_speculative_algorithm(self, algorithm: str) -> bool:
        # 0.5.23 (arg_groups/speculative_hook.py: _check_oot_speculative_algorithm) asks only an
        # out-of-tree platform; CUDA is in-tree, so there every algorithm passes. 0.5.19 never asks.
        return True


def activate():
    return "escha_oracle_platform.TargetCardPlatform"
'''


def install_platform_plugin(where: Path) -> None:
    """Write the plugin module and a dist-info with its entry point under ``where`` (a temp
    directory put on ``sys.path``), so ``importlib.metadata.entry_points`` finds it."""
    (where / "escha_oracle_platform.py").write_text(PLUGIN_SOURCE)
    dist = where / "escha_oracle_platform-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: escha-oracle-platform\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(
        f"[sglang.srt.platforms]\n{PLUGIN_NAME} = escha_oracle_platform:activate\n")
    sys.path.insert(0, str(where))


def answer_prefill_graph_backend() -> None:
    """``model_executor/cuda_graph_config.py: default_prefill_backend`` returns ``breakable``
    when ``utils.is_cuda()`` (``torch.cuda.is_available()``) holds, else ``tc_piecewise``;
    on the GPU box it is ``breakable``. This CPU has no CUDA, so the test answers that one
    query with the CUDA result (answering ``torch.cuda.is_available()`` itself would make the
    import chain load CUDA-only kernels such as flashinfer, which cannot install here)."""
    from sglang.srt.model_executor import cuda_graph_config as cgc

    cgc.default_prefill_backend = lambda: cgc.Backend.BREAKABLE


#: The card of the case being run (``_card`` sets it; the plugin and the CUDA answers read it).
CARD: dict[str, Any] = {"vram_bytes": 0, "name": "", "capability": (0, 0), "count": 1}


def clean_environment(tmp: str) -> None:
    """No operator ``SGLANG_*`` variable reaches SGLang; caches go to a temp dir; no network."""
    for key in [k for k in os.environ if k.startswith("SGLANG_")]:
        del os.environ[key]
    os.environ["SGLANG_CACHE_DIR"] = os.path.join(tmp, "sglang-cache")
    os.environ["HOME"] = tmp
    os.environ["SGLANG_PLATFORM"] = PLUGIN_NAME
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


# --------------------------------------------------------------------------- resolution


def _card(case: dict) -> None:
    import escha_oracle_platform as plugin  # the test-only plugin written above
    from sglang.srt.utils import common

    gpu = case["gpu"]
    CARD.update(vram_bytes=gpu["vram_bytes"], name=gpu["name"], count=gpu.get("count", 1),
                capability=tuple(int(x) for x in gpu["capability"].split(".")))
    plugin.CARD.update(CARD)
    for value in list(vars(common).values()):  # probes are lru_cache-d: forget the previous card
        if isinstance(value, functools._lru_cache_wrapper):
            value.cache_clear()


def _platform_facts(case: dict) -> dict[str, Any]:
    major, minor = (int(x) for x in case["gpu"]["capability"].split("."))
    sm = major * 10 + minor
    return dict(is_cuda=True, is_hip=False, is_npu=False, is_xpu=False, is_musa=False,
                is_sm90=sm == 90, is_sm100=sm == 100, is_sm100_or_sm110=sm in (100, 110),
                is_sm120=major == 12, is_blackwell=major in (10, 11, 12), is_hopper_with_cuda_12_3=sm == 90,
                has_amx=False, has_flashinfer=False, device_sm=sm, device_capability=(major, minor))


def _model_dir(root: Path, case: dict) -> Path:
    d = root / f"model-{case['id']}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(case["config"]))
    return d


def _with_model(argv: list[str], path: Path) -> list[str]:
    out = list(argv)
    i = out.index("--model-path")
    out[i + 1] = str(path)
    return out


def _with_draft(argv: list[str], root: Path, case: dict) -> list[str]:
    """The argv with ``--speculative-draft-model-path`` at a folder holding the case's draft
    config.json (``draft_config``), as the model's is written; unchanged without one."""
    if "--speculative-draft-model-path" not in argv or not (case.get("draft_config") or case.get("draft_own")):
        return argv
    out = list(argv)
    if case.get("draft_own"):  # NEXTN on the model's own MTP layers: the draft path is the model's folder
        out[out.index("--speculative-draft-model-path") + 1] = out[out.index("--model-path") + 1]
        return out
    d = root / f"draft-{case['id']}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(case["draft_config"]))
    out[out.index("--speculative-draft-model-path") + 1] = str(d)
    return out


def _drop(argv: list[str], flag: str) -> list[str]:
    out = list(argv)
    if flag in out:
        i = out.index(flag)
        del out[i:i + 2]
    return out


def resolve(argv: list[str], case: dict, spy: dict, keep: list | None = None) -> dict[str, Any]:
    """``prepare_server_args(argv)`` then ``resolve_once()``, as ``launch_server.run_server``
    does; the refusal (exception type and first line) or the resolved values."""
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.server_args import prepare_server_args

    _card(case)
    spy.clear()
    try:
        with override_platform(**_platform_facts(case)), contextlib.redirect_stderr(io.StringIO()):
            sa = prepare_server_args(argv)
            sa.resolve_once()
            if keep is not None:
                keep.append(sa)
    except SystemExit as exc:  # argparse
        return {"ok": False, "type": "SystemExit", "error": f"argparse exit {exc.code}"}
    except ImportError:  # the oracle's venv lacks a package: a harness fault, never SGLang's answer
        raise
    except Exception as exc:  # a refusal: its type and message are the result
        _refusal_or_fault(exc, case, "resolve")
        msg = " ".join(str(exc).split()) or type(exc).__name__
        where = traceback.extract_tb(exc.__traceback__)[-1]
        site = f"{Path(where.filename).as_posix().split('site-packages/')[-1]}:{where.name}"
        return {"ok": False, "type": type(exc).__name__, "error": msg[:400], "site": site}
    from sglang.srt.arg_groups.overrides import resolution_result

    def r(name: str) -> Any:
        return resolution_result(sa, name)

    cg = r("cuda_graph_config")
    return {
        "ok": True,
        "mem_fraction_static": r("mem_fraction_static"),
        "reserved_mib": spy.get("reserved_mib"),
        "chunked_prefill_size": r("chunked_prefill_size"),
        "decode_max_bs": cg.decode.max_bs,
        "prefill_graph_sizes": len(cg.prefill.bs or []) if str(cg.prefill.backend).lower().find("disabled") < 0 else 0,
        "prefill_backend": str(cg.prefill.backend),
        "page_size": r("page_size"),
        "mamba_radix_cache_strategy": r("mamba_radix_cache_strategy"),
        "max_running_requests": r("max_running_requests"),
        "hicache_ratio": r("hicache_ratio"),
        "disable_overlap_schedule": r("disable_overlap_schedule"),
    }


def install_reserve_spy(spy: dict, gpu_mem_from: str = "argument") -> None:
    """Record the unrounded fraction ``handle_gpu_memory_settings`` computes, so its reserve
    in MiB is known exactly: it calls ``round((gpu_mem - reserved_mem) / gpu_mem, 3)``; a
    module-level ``round`` that records its input and returns the builtin's result changes
    nothing SGLang computes."""
    import builtins

    from sglang.srt.arg_groups import memory_hook

    def recording_round(x, nd=None):
        spy["unrounded"] = x
        return builtins.round(x, nd)

    memory_hook.round = recording_round  # type: ignore[attr-defined]
    original = memory_hook.handle_gpu_memory_settings

    if gpu_mem_from == "get_device_memory_capacity":  # 0.5.23: the hook reads the card itself
        capacity = memory_hook.get_device_memory_capacity

        def recording_capacity(*a, **k):
            spy["gpu_mem"] = capacity(*a, **k)
            return spy["gpu_mem"]

        memory_hook.get_device_memory_capacity = recording_capacity

        def wrapped(server_args):
            spy.pop("unrounded", None)
            spy.pop("gpu_mem", None)
            out = original(server_args)
            gpu_mem = spy.get("gpu_mem")
            if "unrounded" in spy and gpu_mem:
                spy["reserved_mib"] = gpu_mem * (1 - spy["unrounded"])
            return out

        memory_hook.handle_gpu_memory_settings = wrapped
        import sglang.srt.arg_groups.pipeline  # noqa: F401
        return

    def wrapped(server_args, gpu_mem):
        spy.pop("unrounded", None)
        out = original(server_args, gpu_mem)
        if "unrounded" in spy and gpu_mem:
            spy["reserved_mib"] = gpu_mem * (1 - spy["unrounded"])
        return out

    memory_hook.handle_gpu_memory_settings = wrapped
    import sglang.srt.arg_groups.pipeline  # noqa: F401  (imports the hook lazily, by name)


# --------------------------------------------------------------------------- device pools


def _preflight() -> Any:
    """escha-deploy's SGLang pre-flight (escha_deploy/launch/sglang_preflight.py), loaded by path:
    its SGLang side imports only the standard library, torch and sglang, and its KV cache
    configurator stage is the device-pool sizing below (one copy of that harness)."""
    if "escha_sglang_preflight" not in sys.modules:
        import importlib.util

        path = Path(__file__).resolve().parents[1] / "escha_deploy" / "launch" / "sglang_preflight.py"
        spec = importlib.util.spec_from_file_location("escha_sglang_preflight", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["escha_sglang_preflight"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["escha_sglang_preflight"]


def device_pools(sa: Any, case: dict) -> dict[str, Any]:
    """SGLang's own sizing of the device pools: ``KVCacheConfigurator._profile_available_bytes``
    (with ``_handle_max_mamba_cache`` for hybrid models), ``config_from_budget`` (the pool
    configurator's ``calculate_pool_sizes`` and the ``--max-total-tokens`` cap) and
    ``resolve_max_num_reqs``, on the resolved and published arguments.

    Answered by the test: the free GPU memory before and after the weights load (the plan's
    inputs: VRAM less the CUDA context and WSL2's hidden part, less the weights), the world
    group (one process) and the parallel widths ``initialize_model_parallel`` would stamp
    (attention TP = ``--tp-size``, no DP/DCP; on 0.5.23 those ``runtime_context.publish``
    derives). On 0.5.19 the configurator object is made without its constructor (which takes
    the loaded model), with the fields these methods read; on 0.5.23 through its own
    constructor with what ``ModelRunner`` hands it (the pre-flight's ``_kv_configurator``
    picks by the configurator's fields); no pool is allocated. Returns ``kv_tokens``, ``mamba_slots``, ``max_running_requests``, or the
    refusal."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.runtime_context import override_platform

    _card(case)
    dev = case["device"]
    try:
        with override_platform(**_platform_facts(case)), contextlib.redirect_stderr(io.StringIO()):
            mc = ModelConfig.from_server_args(sa)
            kvc, kv = _preflight()._kv_configurator(sa, mc, {"free_before_weights": dev["free_before_weights"],
                                                             "weights": dev["weights"]})
            draft = _draft_geometry(sa) if case.get("pools") else None
    except ImportError:  # the oracle's venv lacks a package: a harness fault, never SGLang's answer
        raise
    except Exception as exc:  # a refusal: its type and message are the result
        _refusal_or_fault(exc, case, "device pools")
        where = traceback.extract_tb(exc.__traceback__)[-1]
        site = f"{Path(where.filename).as_posix().split('site-packages/')[-1]}:{where.name}"
        return {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}", "site": site}
    return {"kv_tokens": kv["max_total_num_tokens"], "mamba_slots": kv["mamba_slots"],
            "max_running_requests": kv["max_running_requests"], "kv_bytes_per_token": kv["kv_bytes_per_token"],
            **({"draft": draft} if draft else {})}


def _draft_geometry(sa: Any) -> dict[str, Any] | None:
    """How SGLang mirrors the speculative draft's KV in host memory, by the pre-flight's
    ``_draft_host_plan`` (SGLang's own ``base_spec_worker._can_pack_hicache_mtp`` over the draft's
    ``ModelConfig``): ``mode`` (``packed``/``sidecar``), ``runners`` and, for a sidecar, the draft
    pool's layers, KV heads per rank and head_dim; None without a draft runner."""
    plan = _preflight()._draft_host_plan(sa)
    if not plan.mode:
        return None
    dm = plan.model_config
    return {"mode": plan.mode, "runners": plan.runners, "layers": _preflight()._draft_kv_layers(dm),
            "kv_heads": dm.get_num_kv_heads(sa.tp_size), "head_dim": dm.head_dim}


# --------------------------------------------------------------------------- host pools


def stub_host_allocation() -> None:
    """Stub only the host pools' allocation and their host-memory reading: the allocation
    function (``pool_host/common.py: ALLOC_MEMORY_FUNCS``) returns a zero-stride view of the
    pool's shape instead of mapping (and pre-faulting) it, the write-back
    staging buffers are skipped (device-side, empty on the CPU) and
    ``host_memory_budget_bytes`` answers "room for anything" (the plan checks host memory
    itself, against the described host). The size arithmetic runs unchanged."""
    import torch
    from sglang.srt.mem_cache.pool_host import base, common, mamba, mha

    def no_allocation(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
        # a zero-stride view with the pool's shape: indexable, nothing of its size allocated
        return torch.empty(1, dtype=dtype).expand(*dims)

    common.ALLOC_MEMORY_FUNCS.default_factory = lambda: no_allocation
    common.ALLOC_MEMORY_FUNCS.clear()
    for cls in (mha.MHATokenToKVPoolHost, mamba.MambaPoolHost):  # 0.5.23's MHA one takes the buffer info
        cls._init_write_back_staging_buffers = lambda self, *_a, **_k: None
    for mod in (base, mha, mamba):  # 0.5.23's takes the requested bytes
        mod.host_memory_budget_bytes = lambda *_a, **_k: 1 << 62


def host_pools(case: dict, draft: dict | None = None) -> dict[str, Any]:
    """Construct ``MHATokenToKVPoolHost`` (and ``MambaPoolHost`` for hybrid models) over CPU
    stand-ins for the device pools, pinning off, and read their sizes in tokens/slots and
    bytes (``size * size_per_token``, what the pool requests). ``draft`` (``_draft_geometry``): a
    speculative draft's KV as SGLang mirrors it, packed into the KV host pool (one 1-layer pool per
    draft runner) or as a sidecar host pool over the draft's device pool at the KV host pool's
    tokens, with what ``hybrid_pool_assembler.py: build_full_draft_pools`` passes to its
    ``_build_mha_mla_host_pool`` (0.5.19: ``host_to_device_ratio = host size / draft pool size``,
    that function's MHA call mirrored; 0.5.23: that and ``host_token_capacity = the host pool's
    logical_size``, through the function itself).

    The constructors' shape is read from the installed release's own signature
    (``_takes_buffer_info``): 0.5.19's take the device pool; 0.5.23's an ``MHABufferInfo`` /
    ``MambaStateBufferInfo`` (``mem_cache/device_pool_info.py``) with the keyword-only
    ``device_capacity_tokens``, ``start_layer``, ``end_layer`` (``pool_host/mha.py``) or
    ``device_capacity`` (``pool_host/mamba.py``), reached through SGLang's own
    ``_mha_host_inputs`` as ``build_kv_host_pool`` does."""
    import torch
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _split_hicache_size

    p = case["pools"]
    dtype = {"bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[p["kv_dtype"]]
    store = torch.uint8 if p["kv_dtype"].startswith("fp8") else dtype
    by_info = _takes_buffer_info()
    device_kv = _device_kv_pool(p, p["full_layers"], p["kv_heads"], p["head_dim"], store, dtype, by_info)
    ratio, size_gb = p.get("ratio") or 0.0, p.get("size_gb") or 0
    out: dict[str, Any] = {}
    kv_size = mamba_size = size_gb
    device_mamba = _mamba_device_pool(p) if p.get("mamba_slots") else None
    if size_gb and device_mamba is not None:
        kv_size, mamba_size = _split_hicache_size(size_gb, (device_kv, device_mamba))
    drafts: tuple[Any, ...] = ()
    if draft and draft["mode"] == "packed":
        drafts = tuple(_device_kv_pool(p, 1, p["kv_heads"], p["head_dim"], store, dtype, by_info)
                       for _ in range(draft["runners"]))
    common = dict(pin_memory=False, device="cpu")
    if by_info:  # 0.5.23: build_kv_host_pool's call, through SGLang's _mha_host_inputs
        from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _mha_host_inputs

        cls, info, kwargs = _mha_host_inputs(device_kv, drafts)
        kv = cls(info, ratio, kv_size, p["page_size"], p["layout"], **common, **kwargs)
    else:  # 0.5.19: the device pool itself, packed drafts as mtp_draft_device_pools
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

        kv = MHATokenToKVPoolHost(device_kv, ratio, kv_size, p["page_size"], p["layout"], **common,
                                  **({"mtp_draft_device_pools": drafts} if drafts else {}))
    out.update(kv_tokens=int(kv.size), kv_bytes=int(kv.size * kv.size_per_token))
    if draft and draft["mode"] == "sidecar":
        side = _sidecar_host_pool(p, draft, kv, store, dtype, by_info)
        out.update(draft_kv_tokens=int(side.size), draft_kv_bytes=int(side.size * side.size_per_token))
    if device_mamba is not None:
        from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost

        if by_info:  # 0.5.23: build_mamba_host_pool's call
            from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo

            info = MambaStateBufferInfo(temporal=device_mamba.mamba_cache.temporal,
                                        conv=tuple(device_mamba.mamba_cache.conv))
            m = MambaPoolHost(info, ratio, mamba_size, device_capacity=device_mamba.size, layout=p["layout"], **common)
        else:
            m = MambaPoolHost(device_mamba, ratio, mamba_size, layout=p["layout"], **common)
        out.update(mamba_slots=int(m.size), mamba_bytes=int(m.size * m.size_per_token))
    return out


def _takes_buffer_info() -> bool:
    """Whether the installed release's ``MHATokenToKVPoolHost`` is built from an ``MHABufferInfo``
    (its first parameter ``buffer_info``: 0.5.23) rather than the device pool (``device_pool``:
    0.5.19)."""
    import inspect

    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    return "buffer_info" in inspect.signature(MHATokenToKVPoolHost.__init__).parameters


def _device_kv_pool(p: dict, layers: int, heads: int, head_dim: int, store: Any, dtype: Any, by_info: bool) -> Any:
    """A CPU stand-in for the device ``MHATokenToKVPool`` of ``layers`` layers at the case's
    tokens: 0.5.19's host pools read its fields (a plain namespace); 0.5.23's reach it through
    SGLang's own ``_mha_host_inputs`` / ``_build_mha_mla_host_pool``, which check
    ``isinstance(pool, MHATokenToKVPool)`` and call ``get_device_pool_infos()``, so there it is an
    ``MHATokenToKVPool`` made without its constructor (which allocates on the GPU) whose
    ``get_device_pool_infos`` answers an ``MHABufferInfo`` over one-row K and V tensors per layer
    (the host pool sizes from ``device_capacity_tokens``, never from the buffers' length).
    ``get_kv_size_bytes``: the case's device KV bytes (what ``_split_hicache_size`` reads)."""
    import torch

    kv_bytes = p["kv_dev_bytes"]
    fields = dict(store_dtype=store, dtype=dtype, size=p["kv_tokens"], start_layer=0, end_layer=layers,
                  layer_num=layers, head_num=heads, head_dim=head_dim, v_head_dim=head_dim, page_size=p["page_size"],
                  # the attention row of one token per layer (memory_pool.py: MHATokenToKVPool.row_dim, head_num
                  # x head_dim), which some releases' host pools divide by head_dim (pool_host/mha.py:
                  # MHATokenToKVPoolHost.get_size_per_token and __init__ in 0.5.21)
                  row_dim=heads * head_dim, v_row_dim=heads * head_dim,
                  device="cpu", get_kv_size_bytes=lambda: (kv_bytes // 2, kv_bytes - kv_bytes // 2))
    if not by_info:
        bufs = [torch.empty(1, dtype=store).expand(p["kv_tokens"] + p["page_size"], heads, head_dim)
                for _ in range(layers)]
        return types.SimpleNamespace(**fields, k_buffer=bufs, v_buffer=bufs,
                                     k_data_ptrs=torch.zeros(layers, dtype=torch.uint64),
                                     v_data_ptrs=torch.zeros(layers, dtype=torch.uint64))
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    k = tuple(torch.empty(1, heads, head_dim, dtype=store) for _ in range(layers))
    v = tuple(torch.empty(1, heads, head_dim, dtype=store) for _ in range(layers))
    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=torch.zeros(layers, dtype=torch.uint64),
                          v_data_ptrs=torch.zeros(layers, dtype=torch.uint64), layout=KVBufferLayout.NHD),
        page_size=p["page_size"], head_num=heads, head_dim=head_dim, v_head_dim=head_dim, dtype=store,
        device=torch.device("cpu"))
    pool = object.__new__(MHATokenToKVPool)
    for name, value in fields.items():
        setattr(pool, name, value)
    pool.get_device_pool_infos = lambda: (types.SimpleNamespace(buffer_info=info),)
    return pool


def _sidecar_host_pool(p: dict, draft: dict, kv: Any, store: Any, dtype: Any, by_info: bool) -> Any:
    """The draft's sidecar host pool as ``build_full_draft_pools`` builds it: SGLang's own
    ``_build_mha_mla_host_pool`` over the draft's device pool (the target's tokens) at
    ``host_to_device_ratio = kv.logical_size / draft tokens``, and on 0.5.23 ``host_token_capacity
    = kv.logical_size`` (the pool sized from the shared plan: no padding page of its own)."""
    import inspect

    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as hpa

    d_dev = _device_kv_pool(p, draft["layers"], draft["kv_heads"], draft["head_dim"], store, dtype, by_info)
    logical = int(getattr(kv, "logical_size", kv.size))
    kwargs: dict[str, Any] = dict(pool=d_dev, host_to_device_ratio=logical / d_dev.size, page_size=p["page_size"],
                                  layout=p["layout"], allocator_type="default", pool_label="draft")
    if "host_token_capacity" in inspect.signature(hpa._build_mha_mla_host_pool).parameters:
        kwargs["host_token_capacity"] = logical
    if by_info:
        return hpa._build_mha_mla_host_pool(**kwargs)
    # 0.5.19: _build_mha_mla_host_pool's MHA branch needs an MHATokenToKVPool; the namespace
    # stand-in takes its call as is (get_mha_host_pool_cls(pool)(pool, **kwargs), pinning off)
    from sglang.srt.mem_cache.pool_host.mha import get_mha_host_pool_cls

    kwargs.pop("pool")
    return get_mha_host_pool_cls(d_dev)(d_dev, host_size=0, pin_memory=False, device="cpu", **kwargs)


def _mamba_device_pool(p: dict) -> Any:
    """A CPU stand-in for ``MambaPool``: SGLang's own state shapes for the model
    (``Mamba2StateShape.create`` through the model's config class), as zero-stride views so
    nothing of the pool's size is allocated; ``mem_usage_bytes`` as ``MambaPool`` counts it."""
    import torch
    from sglang.srt.configs.mamba_utils import Mamba2StateShape

    a = p["mamba_arch"]
    tp = p["tp"]
    shape = Mamba2StateShape.create(
        tp_world_size=tp, intermediate_size=a["linear_value_head_dim"] * a["linear_num_value_heads"],
        n_groups=a["linear_num_key_heads"], num_heads=a["linear_num_value_heads"],
        head_dim=a["linear_value_head_dim"], state_size=a["linear_key_head_dim"], conv_kernel=a["linear_conv_kernel_dim"])
    layers = sum(1 for i in range(a["num_hidden_layers"]) if (i + 1) % a["full_attention_interval"] != 0)
    slots = p["mamba_slots"] + 1
    conv_dtype = torch.bfloat16
    ssm_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[a["mamba_ssm_dtype"]]
    conv = [torch.empty(1, dtype=conv_dtype).expand(layers, slots, *shape.conv[0])]
    temporal = torch.empty(1, dtype=ssm_dtype).expand(layers, slots, *shape.temporal)
    per_slot = layers * (math.prod(shape.conv[0]) * conv.__getitem__(0).element_size()
                         + math.prod(shape.temporal) * temporal.element_size())
    return types.SimpleNamespace(
        size=p["mamba_slots"], num_mamba_layers=layers, device="cpu",
        mamba_cache=types.SimpleNamespace(conv=conv, temporal=temporal),
        get_kv_size_bytes=lambda: slots * per_slot, mem_usage_bytes=lambda: slots * per_slot)


# --------------------------------------------------------------------------- main


def run(cases: list[dict]) -> dict[str, Any]:
    import importlib.metadata

    installed = importlib.metadata.version("sglang")
    try:
        adapter = load_adapter(installed)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    t0 = time.perf_counter()
    import sglang.srt.server_args  # noqa: F401

    logging.disable(logging.WARNING)
    answer_prefill_graph_backend()
    if adapter["pools"] is True:
        stub_host_allocation()
    spy: dict = {}
    install_reserve_spy(spy, adapter["gpu_mem"])
    t1 = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="escha-oracle-models-") as models:
        root = Path(models)
        for case in cases:
            # the variables the server's environment sets that SGLang reads while it resolves
            # and sizes (the case's "env", e.g. SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN), for this
            # case only; and what SGLang's argument resolution writes there (--mamba-ssm-dtype is
            # SGLANG_MAMBA_SSM_DTYPE, which configs/mamba_utils.py: mamba2_state_dtype reads while
            # sizing) goes with the case, or a case without the flag sizes with the previous one's
            before = dict(os.environ)
            os.environ.update(case.get("env") or {})
            try:
                results.append(_one_case(root, case, adapter, spy))
            finally:
                os.environ.clear()
                os.environ.update(before)
    t2 = time.perf_counter()
    return {"sglang": installed, "import_s": round(t1 - t0, 2), "cases_s": round(t2 - t1, 2), "results": results}


def _one_case(root: Path, case: dict, adapter: dict, spy: dict) -> dict[str, Any]:
    """SGLang's answers for one case (``run``)."""
    path = _model_dir(root, case)
    argv = _with_draft(_with_model(case["argv"], path), root, case)
    kept: list = []
    res: dict[str, Any] = {"id": case["id"], "resolve": resolve(argv, case, spy, kept), "cannot": {}}
    for part in ("device", "pools"):
        if adapter[part] is not True and case.get(part):
            res["cannot"][part] = adapter[part]
    if case.get("device") and kept and adapter["device"] is True:
        dropped = [f for f in case["device"].get("sglang_sizes", []) if f in argv]
        if dropped:  # the profile left these to SGLang: let it size them itself
            kept.clear()
            auto = argv
            for flag in dropped:
                auto = _drop(auto, flag)
            resolve(auto, case, {}, kept)
        res["device"] = device_pools(kept[0], case) if kept else {"error": "auto-sized argv refused", "site": "sglang/"}
    res["defaults"] = resolve(_drop(argv, "--mem-fraction-static"), case, spy)
    if case.get("pools") and adapter["pools"] is True:
        try:
            res["pools"] = host_pools(case, (res.get("device") or {}).get("draft"))
        except ImportError:  # a harness fault, as in resolve()
            raise
        except Exception as exc:
            _refusal_or_fault(exc, case, "host pools")
            res["pools"] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=Path, required=True, help="JSON list of cases")
    ap.add_argument("--out", type=Path, help="write the results here (default: stdout)")
    args = ap.parse_args(argv)
    cases = json.loads(args.cases.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="escha-oracle-") as tmp:
        clean_environment(tmp)
        install_torchvision_stand_in()
        install_platform_plugin(Path(tmp))
        try:
            out = run(cases)
        except HarnessFailure as exc:
            print(f"error: harness failure, not SGLang's answer: {exc}", file=sys.stderr)
            return 1
    text = json.dumps(out, indent=1, sort_keys=True)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
