"""The drift check on a real SGLang 0.5.19 server's log (an H200, 2026-12-01; how it was made:
``fixtures/h200-2026-12-01/README.md``), against the plan of the profile that run used.

The plan is made for the machine it ran on as the user would describe it (``--host-ram 128GiB``,
Linux; the run's ``--set 'runtime.needs=[]'``). Every figure must agree: device KV tokens (the
scheduler line and the KV pool line), device mamba slots, max running requests, context length,
host KV tokens exactly, host KV and mamba bytes at the log's ``%.2f`` GB; and changing any one
number in the log must fail the check naming that figure.
"""

from __future__ import annotations

import ast
import copy
import os
import zipfile
from pathlib import Path

import pytest

from escha_deploy.facts.machine import described_host
from escha_deploy.launch.drift import check
from escha_deploy.launch.prepare import planned_sizes
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile

RUN = Path(__file__).with_name("fixtures") / "h200-2026-12-01"
LOG = (RUN / "native-serve.log").read_text().splitlines()
GiB = 2**30


def planned(profile: str):
    p = load_profile(str(RUN / profile), ["runtime.needs=[]"])
    return planned_sizes(plan(p, described_host(128 * GiB, "linux"), capabilities=frozenset()), p.runtime)


def server_info_of(lines: list[str]) -> dict:
    """The object SGLang 0.5.19's ``/server_info`` returns (sglang/srt/entrypoints/http_server.py
    ``server_info``: ``server_args.resolved_dict()``, the scheduler's init info, one internal
    state per DP rank), built from this run's own lines: its ``server_args=`` line
    (engine.py logs ``server_args.resolved_dict()``) and its scheduler line's figures."""
    args = next(ln for ln in lines if "] server_args={" in ln)
    info = ast.literal_eval(args.split("server_args=", 1)[1])
    sched = next(ln for ln in lines if "max_total_num_tokens=" in ln)
    fig = dict(kv.split("=") for kv in sched.split("] ", 1)[1].split(", ")[:5])
    info["max_total_num_tokens"] = int(fig["max_total_num_tokens"])  # scheduler.py: get_init_info
    info["internal_states"] = [{"effective_max_running_requests_per_dp": int(fig["max_running_requests"]),
                                "memory_usage": {"token_capacity": int(fig["max_total_num_tokens"])}}]
    return info


def test_the_real_log_is_the_plan():
    rep = check(planned("h200-tiny.yaml"), LOG)
    assert rep.items == [], [i.line() for i in rep.items]
    r = rep.observed.ranks[0]
    assert (r.host_kv_tokens, r.device_kv_tokens, r.device_mamba_slots) == (4097, 2048, 16)
    assert (rep.observed.max_running_requests, rep.observed.context_len) == (3, 4096)
    assert rep.compared == 8
    # /server_info not given: that half is named, never "the server's sizes are the plan's" alone
    assert rep.report_lines("serve") == [("warning", "serve: 8 figures from the server's log are the plan's; "
                                                     "/server_info not compared: not read")]


@pytest.mark.parametrize("old, new, figure", [
    ("max_total_num_tokens=2048,", "max_total_num_tokens=2049,", "device KV tokens (max_total_num_tokens)"),
    ("#tokens: 2048,", "#tokens: 2047,", "device KV tokens rank 0"),
    ("max_running_requests=3,", "max_running_requests=4,", "max running requests"),
    ("context_len=4096,", "context_len=8192,", "context length"),
    ("host pool: 4097 tokens", "host pool: 4096 tokens", "host KV pool tokens rank 0"),
    ("tokens, 0.00 GB host memory.", "tokens, 0.01 GB host memory.", "host KV pool rank 0"),
    ("Allocating 0.03 GB host memory", "Allocating 0.02 GB host memory", "host mamba pool rank 0"),
    ("max_mamba_cache_size: 16,", "max_mamba_cache_size: 15,", "device mamba slots rank 0"),
])
def test_one_number_changed_fails_naming_its_figure(old, new, figure):
    text = "\n".join(LOG)
    assert text.count(old) == 1, old
    rep = check(planned("h200-tiny.yaml"), text.replace(old, new).splitlines())
    lines = [i.line() for i in rep.items]
    assert len(lines) == 1 and lines[0].startswith(f"drift: {figure}: planned "), lines
    assert rep.report_lines("serve") == [("warning", lines[0]), ("warning", "serve: 8 figures from the server's log "
                                                                 "compared; /server_info not compared: not read")]


def test_server_info_of_that_run_agrees_and_a_changed_figure_is_named():
    info = server_info_of(LOG)
    rep = check(planned("h200-tiny.yaml"), LOG, info)
    assert rep.items == [] and rep.compared_server_info == 4
    assert rep.report_lines("serve")[0][1].endswith("(8 figures from its log, 4 from /server_info)")
    bad = copy.deepcopy(info)
    bad["internal_states"][0]["effective_max_running_requests_per_dp"] = 4
    bad["context_length"] = None  # not reported: not compared
    rep = check(planned("h200-tiny.yaml"), LOG, bad)
    assert [i.line() for i in rep.items] == [
        "drift: max running requests: planned 3 requests, /server_info reports 4 requests (+33.3%)"]
    assert rep.compared_server_info == 3


def test_the_shape_true_pool_lines_are_the_plan():
    lines = (RUN / "shape-true-pool-lines.log").read_text().splitlines()
    rep = check(planned("h200-shape.yaml"), lines)
    assert rep.items == [], [i.line() for i in rep.items]
    assert rep.compared == 5  # device KV tokens and mamba slots, host KV tokens and GB, host mamba GB


#: The wheel's format strings the parser reads (file, text), as `drift.py`'s docstring cites them.
FORMATS = [
    ("sglang/srt/managers/scheduler.py", 'f"max_running_requests={self.max_running_requests}, "'),
    ("sglang/srt/managers/scheduler.py", 'f"context_len={self.model_config.context_len}, "'),
    ("sglang/srt/managers/scheduler.py", '"effective_max_running_requests_per_dp"'),
    ("sglang/srt/managers/scheduler.py", '"max_total_num_tokens": self.max_total_num_tokens,'),
    ("sglang/srt/mem_cache/memory_pool.py", 'f"#tokens: {num_tokens}, K size: {k_size_GB:.2f} GB, "'),
    ("sglang/srt/mem_cache/memory_pool.py", 'f"max_mamba_cache_size: {size}, "'),
    ("sglang/srt/mem_cache/pool_host/base.py", '"Allocating %s hierarchical KV host pool: %d tokens, %.2f GB host memory."'),
    ("sglang/srt/mem_cache/pool_host/mamba.py", '"Allocating %.2f GB host memory for hierarchical Mamba cache (layout=%s)."'),
    ("sglang/srt/entrypoints/http_server.py", '@app.get("/server_info")'),
    ("sglang/srt/entrypoints/http_server.py", '@app.get("/get_server_info")'),
    ("sglang/srt/entrypoints/http_server.py", "**_global_state.scheduler_info,"),
]


@pytest.mark.wheel
def test_the_formats_are_the_wheels():
    wheel = os.environ.get("ESCHA_SGLANG_WHEEL", "")
    if not Path(wheel).is_file():
        pytest.skip("ESCHA_SGLANG_WHEEL names no sglang 0.5.19 wheel here (.ci/test sets it)")
    with zipfile.ZipFile(wheel) as z:
        missing = [(f, s) for f, s in FORMATS if s not in z.read(f).decode()]
    assert missing == []
