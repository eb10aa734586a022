"""Failure diagnosis on log lines in the real message formats of SGLang 0.5.19 and the upstream
reports (field reports B01, B06, B17, B18, B22, B29, B30, B31; sgl-project/sglang issues named in each row)."""

from __future__ import annotations

import pytest

from escha_deploy.launch.diagnose import Facts, diagnose

TS = "[2026-11-29 16:20:01 TP1] "

# B01 (sglang#38156): sglang/srt/mem_cache/pool_host/base.py HostKVCache.__init__ raises this
# ValueError on a late TP rank.
B01 = [
    TS + "Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/mem_cache/pool_host/base.py", line 178, in __init__',
    "ValueError: Not enough host memory available. Requesting 2.58 GB but only have 1.12 GB free. "
    "Please reduce the size of the hierarchical cache.",
]
# B22 (sglang#16771) and B06 (sglang#40232): torch's message for cudaErrorIllegalAddress.
ILLEGAL = [
    TS + "Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/cache_controller.py", line 512, in backup_thread_func',
    "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
]
# B17 (sglang#4259): NCCL's shared-memory warning, then torch's DistBackendError.
B17 = [
    "a1b2c3:123:456 [1] include/shm.h:28 NCCL WARN Error while creating shared memory segment "
    "/dev/shm/nccl-8Dq6Ie (size 9637888)",
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
    "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
]
# B18 (microsoft/WSL#12467): TP2 on WSL2.
B18 = [
    "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, "
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1",
    "ncclUnhandledCudaError: Call to CUDA function failed.",
    "Last error:",
    "Cuda failure 'peer access is not supported between these two devices'",
]
# B30 (sglang#9814, #16855): http_server.py _execute_server_warmup through a proxy.
B30 = [
    "[2026-01-10 13:23:27] Initialization failed. warmup error: Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/entrypoints/http_server.py", line 2211, in _execute_server_warmup',
    '    assert res.status_code == 200, f"{res=}, {res.text=}"',
    "AssertionError: res=<Response [502]>, res.text=''",
]
# B31 (vllm#9763, sglang#9396): uvicorn's bind error.
B31 = [
    "[2026-11-29 16:20:05] ERROR:    [Errno 98] error while attempting to bind on address "
    "('0.0.0.0', 30000): address already in use",
]


def ids(lines, **facts):
    return [m.id for m in diagnose(lines, Facts(exit_code=1, **facts)).matches]


def test_b01_host_memory_check():
    d = diagnose(B01, Facts(exit_code=1, hicache_enabled=True))
    assert [m.id for m in d.matches] == ["host-memory-check"]
    assert "asked for 2.58 GB and saw 1.12 GB free" in d.matches[0].explanation
    assert "sglang#38156" in d.matches[0].explanation


def test_b22_illegal_access_with_hicache_says_retry_without():
    d = diagnose(ILLEGAL, Facts(exit_code=1, hicache_enabled=True, platform="linux"))
    assert [m.id for m in d.matches] == ["illegal-memory-access"]
    assert "retry without HiCache" in d.matches[0].fix


def test_b06_illegal_access_with_hicache_on_wsl2_names_registered_memory():
    d = diagnose(ILLEGAL, Facts(exit_code=1, hicache_enabled=True, platform="wsl2"))
    m = d.matches[0]
    assert m.id == "illegal-memory-access" and "sglang#40232" in m.explanation
    assert "ESCHA_HICACHE_HOST_ALLOCATOR=pinned" in m.fix


def test_illegal_access_without_hicache_does_not_blame_it():
    d = diagnose(ILLEGAL, Facts(exit_code=1, hicache_enabled=False))
    assert "HiCache is off" in d.matches[0].explanation


def test_b17_nccl_shared_memory():
    assert ids(B17) == ["nccl-shared-memory"]
    assert "ipc=host" in diagnose(B17).matches[0].fix


def test_b18_nccl_p2p_on_wsl2():
    d = diagnose(B18, Facts(exit_code=1, platform="wsl2"))
    assert [m.id for m in d.matches] == ["peer-access"]
    assert "NCCL_P2P_DISABLE=1" in d.matches[0].fix and "NCCL_SHM_DISABLE=1" in d.matches[0].fix


def test_b30_warmup_through_proxy():
    d = diagnose(B30, Facts(exit_code=1))
    assert [m.id for m in d.matches] == ["warmup-through-proxy"]
    assert "NO_PROXY" in d.matches[0].fix


def test_b31_address_in_use():
    assert ids(B31) == ["address-in-use"]


def test_b29_health_without_generate_only_on_timeout():
    facts = Facts(timed_out=True, health_ok=True, generate_ok=False)
    d = diagnose(["[2026-11-29 16:20:05] The server is fired up and ready to roll!"], facts)
    assert [m.id for m in d.matches] == ["health-without-generate"]
    assert "sglang#22779" in d.matches[0].source
    assert diagnose([], Facts(timed_out=True, health_ok=False)).matches == []


def test_cuda_oom():
    lines = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
             "capacity of 11.50 GiB of which 1.02 GiB is free."]
    assert ids(lines) == ["cuda-out-of-memory"]


def test_repeating_traceback_is_a_crash_loop():
    tb = ["Traceback (most recent call last):", '  File "x.py", line 1, in f',
          "RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu."]
    lines = [f"[2026-11-29 16:20:0{i} TP{i % 2}] boot" for i in range(3)]
    lines = [ln for i in range(3) for ln in (lines[i], *tb)]
    got = ids(lines)
    assert "repeating-traceback" in got and "no-gpu" in got
    assert "repeating-traceback" not in ids(tb * 2)


def test_missing_module_names_it():
    d = diagnose(["ModuleNotFoundError: No module named 'torch'"], Facts(exit_code=1))
    assert d.matches[0].id == "runtime-module-missing" and "'torch'" in d.matches[0].explanation


def test_unknown_failure_prints_tail_and_says_so():
    d = diagnose([f"line {i}" for i in range(100)], Facts(exit_code=7))
    text = "\n".join(d.lines())
    assert d.matches == [] and "no known signature" in text
    assert "line 99" in text and "line 59" not in text and "exited with code 7" in text


@pytest.mark.parametrize("lines", [B01, ILLEGAL, B17, B18, B30, B31])
def test_each_report_matches_exactly_one_signature(lines):
    assert len(ids(lines, hicache_enabled=True)) == 1


# --- facts a log read on its own does not know -----------------------------------------------------

# SGLang 0.5.19 logs its resolved arguments at startup: sglang/srt/entrypoints/engine.py:265
# logger.info(f"server_args={server_args.resolved_dict()}") (a dict); older releases print
# server_args=ServerArgs(...).
ARGS_DICT = TS + "server_args={'model_path': '/models/q', 'tp_size': 2, 'enable_hierarchical_cache': %s, " \
    "'hicache_ratio': 2.0}"
ARGS_REPR = "[2026-01-10 13:23:27] server_args=ServerArgs(model_path='/models/q', enable_hierarchical_cache=%s, x=1)"


def test_illegal_access_with_hicache_unknown_is_inconclusive_and_says_what_settles_it():
    d = diagnose(ILLEGAL, Facts(hicache_enabled=None, platform=None))
    [m] = d.matches
    assert not d.conclusive and not m.conclusive
    assert "HiCache is off, so not the host pool" not in m.explanation.split("hicache_enabled=False:")[0]
    assert "depends on hicache_enabled, platform" in m.explanation
    assert "--hicache or --no-hicache" in m.fix and "server_args=" in m.fix
    assert any("hicache_enabled unknown" in e for e in m.evidence)


@pytest.mark.parametrize("fmt", [ARGS_DICT, ARGS_REPR])
def test_hicache_is_read_from_the_server_args_line(fmt):
    on = diagnose([fmt % "True", *ILLEGAL], Facts(hicache_enabled=None, platform="linux"))
    assert [m.id for m in on.matches] == ["illegal-memory-access"] and on.conclusive
    assert "retry without HiCache" in on.matches[0].fix
    off = diagnose([fmt % "False", *ILLEGAL], Facts(hicache_enabled=None, platform="linux"))
    assert off.conclusive and "HiCache is off" in off.matches[0].explanation
    # what the caller says wins over the log
    given = diagnose([fmt % "False", *ILLEGAL], Facts(hicache_enabled=True, platform="linux"))
    assert "retry without HiCache" in given.matches[0].fix


def test_hicache_on_but_platform_unknown_lists_both_variants():
    d = diagnose([ARGS_DICT % "True", *ILLEGAL], Facts(platform=None))
    [m] = d.matches
    assert not m.conclusive and "if platform=wsl2:" in m.explanation and "otherwise:" in m.explanation
    assert "--wsl2 or --no-wsl2" in m.fix and "hicache_enabled" not in m.explanation


def test_lines_without_exit_code_or_tail_say_nothing_false():
    killed = diagnose(["./entrypoint.sh: line 48: 28 Killed python3 -m sglang.launch_server"])
    text = "\n".join(killed.lines(tail=False))
    assert "exit status None" not in text and "signal None" not in text
    assert text.count("unproven") == 1
    empty = "\n".join(diagnose(["hello"]).lines(tail=False))
    assert "no known signature in the log" in empty and "lines above" not in empty
