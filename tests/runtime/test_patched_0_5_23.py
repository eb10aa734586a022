"""The functions our 0.5.23 series patches, run on a CPU from 0.5.23's real code.

Each patched file is made here as ``runtime apply`` makes it (``runtime_patches/0.5.23/`` applied
to the real 0.5.23 wheel's files, ``.cache/wheels``); the functions are taken from it by name
(``ast``) and run with the modules they call: 0.5.23's own ``mem_cache/host_memory.py`` and our
hook files as the series installs them, loaded from the patched bytes. SGLang's package
``__init__`` is not imported (it needs the GPU stack). Stand-ins, named as such, replace only
what needs a CUDA device: 0.5.23's ``alloc_with_host_register`` / pin-memory allocators (they
call cudaHostRegister or torch's pinned allocator). Marked ``wheel``."""

from __future__ import annotations

import __future__
import ast
import logging
import math
import sys
import types
from collections import defaultdict
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Optional

import pytest

from escha_deploy.runtime import inventory as inv
from escha_deploy.runtime.patching import series_dir
from escha_deploy.runtime.series import apply_series, read_series

REPO = Path(__file__).resolve().parents[2]
RELEASE = "0.5.23"
GiB = 2**30
pytestmark = pytest.mark.wheel


@pytest.fixture(scope="module")
def patched() -> dict[str, bytes]:
    found = sorted((REPO / ".cache" / "wheels").glob(f"sglang-{RELEASE}-cp311-*.whl"))
    if not found:
        pytest.skip(f"no sglang {RELEASE} cp311 wheel under .cache/wheels")
    wheel = found[0]
    out = apply_series(read_series(series_dir(RELEASE)), lambda rel: inv.read_wheel_file(wheel, rel))
    out["srt/mem_cache/host_memory.py"] = inv.read_wheel_file(wheel, "srt/mem_cache/host_memory.py")
    return out


def _module(name: str, source: bytes) -> types.ModuleType:
    """A module made from a file's bytes (as the series installs it), outside any package."""
    mod = types.ModuleType(name)
    mod.__file__ = f"<patched sglang: {name}>"
    sys.modules[name] = mod  # dataclasses look their module up
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    return mod


def _take(source: bytes, names: set[str], namespace: dict, where: str) -> dict:
    """Run the top-level functions and assignments called ``names`` of a file in ``namespace``
    (with ``from __future__ import annotations``, as the file has it). Fails naming a missing one."""
    tree = ast.parse(source)
    found = set()
    for node in tree.body:
        target = None
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            target = node.name
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            target = node.target.id
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            target = node.targets[0].id
        if target in names:
            found.add(target)
            code = compile(ast.Module([node], []), where, "exec",
                           flags=__future__.annotations.compiler_flag, dont_inherit=True)
            exec(code, namespace)
    assert found == names, f"{where}: not found: {sorted(names - found)}"
    return namespace


@pytest.fixture
def base23(patched, monkeypatch):
    """``pool_host/base.py``'s patched host-memory functions with 0.5.23's reader and our hook."""
    torch = pytest.importorskip("torch")
    hook = _module("escha_host_reserve", patched["srt/mem_cache/pool_host/escha_host_reserve.py"])
    hm = _module("sglang_host_memory_0_5_23", patched["srt/mem_cache/host_memory.py"])

    def make(reserve: Optional[str] = None) -> dict:
        if reserve is None:
            monkeypatch.delenv("ESCHA_HICACHE_HOST_RESERVE_BYTES", raising=False)
        else:
            monkeypatch.setenv("ESCHA_HICACHE_HOST_RESERVE_BYTES", reserve)
        hook.reset()
        ns = {"torch": torch, "ContextVar": ContextVar, "contextmanager": contextmanager,
              "Optional": Optional, "_escha_host_reserve": hook,
              "available_host_memory_bytes": hm.available_host_memory_bytes}
        return _take(patched["srt/mem_cache/pool_host/base.py"],
                     {"HICACHE_HOST_MEMORY_RESERVE_BYTES", "_host_memory_budget", "host_memory_budget_scope",
                      "ranks_per_host", "host_memory_sync_group", "host_memory_budget_bytes"},
                     ns, "sglang/srt/mem_cache/pool_host/base.py (0.5.23, patched)")

    yield make, hook, hm
    hook.reset()


def test_the_reserve_comes_from_the_environment(base23):
    make, _, _ = base23
    assert make()["HICACHE_HOST_MEMORY_RESERVE_BYTES"] == 10 * GiB  # 0.5.23's stock value
    assert make(str(3 * GiB))["HICACHE_HOST_MEMORY_RESERVE_BYTES"] == 3 * GiB


def test_host_memory_is_read_once_and_accepted_pools_are_subtracted(base23):
    """One process, no torch.distributed world: ranks_per_host is 1 and no group is read."""
    make, hook, hm = base23
    ns = make("0")
    assert ns["ranks_per_host"]() == 1 and ns["host_memory_sync_group"]() is None
    first = ns["host_memory_budget_bytes"](GiB)
    a0 = hook.snapshot_available(lambda: 0)  # the snapshot taken by that call
    assert first == a0  # reserve 0, one rank, nothing accepted
    # 0.5.23's reader (cgroup-bounded) is the one read: within 1 GiB of reading it now
    assert abs(a0 - hm.available_host_memory_bytes(allow_cgroup_fallback=True)) < GiB
    hook.record_accepted(2 * GiB)  # what _allocate_host_buffer records for an accepted pool
    assert ns["host_memory_budget_bytes"](GiB) == a0 - 2 * GiB  # not read again


def test_the_auto_size_scope_keeps_0_5_23_booking(base23):
    make, hook, _ = base23
    ns = make("0")
    with ns["host_memory_budget_scope"](8 * GiB):
        assert ns["host_memory_budget_bytes"](3 * GiB) == 8 * GiB
        assert ns["host_memory_budget_bytes"](3 * GiB) == 5 * GiB
        assert ns["host_memory_budget_bytes"](9 * GiB) == 2 * GiB  # does not fit: not booked
    assert "a0" not in hook._state  # the scope never took our snapshot


def test_the_reserve_and_rank_split_apply_outside_the_scope(base23, monkeypatch):
    make, hook, _ = base23
    ns = make(str(GiB))
    monkeypatch.setitem(ns, "ranks_per_host", lambda: 2)  # stand-in: 2 ranks on this host need a launched world
    budget = ns["host_memory_budget_bytes"]()
    assert budget == (hook.snapshot_available(lambda: 0) - GiB) // 2


class _Recorder:
    """Stand-in for 0.5.23's CUDA/xpu/npu allocation functions (they need a device): records
    its calls and returns a CPU tensor of the requested shape."""

    def __init__(self, name: str):
        self.name, self.calls = name, []

    def __call__(self, dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
        import torch

        self.calls.append((tuple(dims), dtype, device, pin_memory, allocator, registration_granularity_bytes))
        return torch.empty(dims, dtype=dtype)


@pytest.fixture
def common23(patched, monkeypatch):
    torch = pytest.importorskip("torch")
    hook = _module("escha_host_alloc", patched["srt/mem_cache/pool_host/escha_host_alloc.py"])
    stand_ins = {n: _Recorder(n) for n in ("alloc_with_host_register", "alloc_with_pin_memory",
                                           "alloc_with_pin_memory_xpu")}
    ns = {"torch": torch, "math": math, "defaultdict": defaultdict, "_escha_host_alloc": hook,
          "logger": logging.getLogger("test"), "HostTensorAllocator": object, **stand_ins}
    _take(patched["srt/mem_cache/pool_host/common.py"], {"alloc_with_escha_choice", "ALLOC_MEMORY_FUNCS"},
          ns, "sglang/srt/mem_cache/pool_host/common.py (0.5.23, patched)")
    return ns, stand_ins, hook


def test_cuda_pools_go_through_the_choice_and_other_devices_keep_theirs(common23):
    ns, s, _ = common23
    funcs = ns["ALLOC_MEMORY_FUNCS"]
    assert funcs["cuda"] is ns["alloc_with_escha_choice"]
    assert (funcs["npu"], funcs["musa"], funcs["xpu"]) == (
        s["alloc_with_pin_memory"], s["alloc_with_pin_memory"], s["alloc_with_pin_memory_xpu"])


def test_register_is_0_5_23_own_path_with_its_arguments(common23, monkeypatch):
    import torch

    ns, s, _ = common23
    monkeypatch.setenv("ESCHA_HICACHE_HOST_ALLOCATOR", "register")
    ns["alloc_with_escha_choice"]((4, 8), torch.bfloat16, "cpu", True, "alloc", 2 * 2**20)
    assert s["alloc_with_host_register"].calls == [((4, 8), torch.bfloat16, "cpu", True, "alloc", 2 * 2**20)]
    monkeypatch.setenv("ESCHA_HICACHE_HOST_ALLOCATOR", "pinned")
    ns["alloc_with_escha_choice"]((4, 8), torch.bfloat16, "cpu", False, "alloc")  # not pinned: stock
    assert len(s["alloc_with_host_register"].calls) == 2


def test_a_pinned_buffer_over_4_gib_is_refused_before_anything_is_allocated(common23, monkeypatch):
    import torch

    ns, s, hook = common23
    monkeypatch.setenv("ESCHA_HICACHE_HOST_ALLOCATOR", "pinned")
    with pytest.raises(hook.PinnedAllocationTooLarge, match=str(5 * GiB)):
        ns["alloc_with_escha_choice"]((5, GiB // 2), torch.bfloat16, "cpu", True, "alloc")
    assert all(not r.calls for r in s.values())


def test_the_geometry_check_runs_on_the_built_pool_before_its_wrapper(patched):
    """Placement in 0.5.23's ``build_kv_host_pool`` (read, not run: it needs a device pool):
    the check comes after the constructor call and before the page-interleave wrapper."""
    src = patched["srt/mem_cache/hybrid_cache/hybrid_pool_assembler.py"].decode()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "build_kv_host_pool")
    body = ast.get_source_segment(src, fn)
    built = body.index("host_pool = kv_host_pool_cls(")
    check = body.index("_escha_transfer_geometry.check_host_pool(host_pool, kv_pool, pool_label)")
    wrap = body.index("PageInterleaveHostPool(host_pool")
    assert built < check < wrap
