"""diagnose orders by the log: the first proven cause first, its consequences after; fixes name
profile keys, not raw flags."""

from __future__ import annotations

import re

from escha_deploy.launch.diagnose import SIGNATURES, Facts, diagnose

#: A CUDA-graph OOM at startup, then the launcher's child-died line and the shell's Killed: the
#: lines as SGLang 0.5.19 prints them (srt/model_executor/cuda_graph_runner.py "Capture cuda
#: graph failed", srt/entrypoints/engine.py "Received sigquit from a child process").
GRAPH_OOM = [
    "[2026-11-30 10:00:00 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=1.20 GB",
    "[2026-11-30 10:00:01 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=1.10 GB",
    "[2026-11-30 10:00:05 TP0] Scheduler hit an exception: Traceback (most recent call last):",
    "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total "
    "capacity of 15.93 GiB of which 301.00 MiB is free.",
    "[2026-11-30 10:00:05] Received sigquit from a child process. It usually means the child failed.",
    "./entrypoint.sh: line 48:    28 Killed                  python3 -m sglang.launch_server --model-path /m",
]


def test_first_proven_cause_first_consequences_after():
    ids = [m.id for m in diagnose(GRAPH_OOM).matches]
    assert ids == ["cuda-graph-capture", "cuda-out-of-memory", "child-failed", "killed-line"], ids


def test_a_cause_proven_by_facts_comes_after_the_logs_and_before_the_unproven():
    ids = [m.id for m in diagnose(GRAPH_OOM, Facts(exit_code=137, oom_kill=True)).matches]
    assert ids.index("cuda-graph-capture") < ids.index("oom-killer") < ids.index("child-failed"), ids


def test_later_lines_come_later():
    log = ["NCCL WARN Cuda failure 'peer access is not supported between these two devices'",
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"]
    assert [m.id for m in diagnose(log).matches][:1] == ["peer-access"]
    assert [m.id for m in diagnose(log[::-1]).matches][:1] == ["cuda-out-of-memory"]


def test_fixes_name_profile_keys_not_raw_server_flags():
    raw = re.compile(r"(?<![\w(])--(?:disable-custom-all-reduce|cuda-graph-max-bs|mem-fraction-static|context-length)\b")
    bare = [s.id for s in SIGNATURES if raw.search(re.sub(r"\([^)]*\)", "", s.fix))]
    assert bare == []
    assert "runtime.cuda_graph_max_bs" in next(s.fix for s in SIGNATURES if s.id == "cuda-out-of-memory")
