"""Field reports, round five: what `diagnose` weighs first.

- sglang#30314: a scheduler stalled for minutes, /health failing, SIGTERM, then SIGKILL from the
  container runtime. The log is rebuilt from the default release's own format strings (the
  SIGTERM handler, the /health failure, the ``--log-requests`` finish line rendered by the
  wheel's own ``_dataclass_to_string_truncated``); with the stall it does not lead with memory,
  without it (or without the SIGTERM) the bare SIGKILL still does.
- vllm#50705: FlashInfer's JIT with a CUDA toolkit older than the GPU (the quoted line in
  test_diagnose_table.py's ``QUOTES``) is named, not mistaken for the image's kernels.
- sglang PR #33442 / sglang#31425: a watchdog at TP > 1 with HiCache on names the load-back
  divergence; at TP 1 or with HiCache off it does not.
- sglang PR #26301: the driver's 'Cannot map memory' line puts freeing host memory first.
"""

from __future__ import annotations

import ast
import dataclasses
import typing

import pytest

from escha_deploy.launch.diagnose import HEALTH_TIMEOUT_S, STALL_FACTOR, Facts, diagnose, launch_facts
from escha_deploy.pipeline.spec import build_launch_spec
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile
from escha_deploy.sglang import releases

from .test_diagnose_field_reports import HOSTS, _function, _render, _source, _wheel

TS = "[2026-12-01 10:0{}:00] "
MEMORY = ("lower hicache.hicache_ratio", "out of memory likely")


def _joined(src: str, needle: str) -> ast.JoinedStr:
    """The one f-string in ``src`` that holds ``needle``."""
    found = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.JoinedStr)
             and needle in "".join(v.value for v in n.values if isinstance(v, ast.Constant))]
    assert len(found) == 1, needle
    return found[0]


def _finish_line(z, e2e_latency: float) -> str:
    """SGLang's ``--log-requests`` finish line for one request, formatted by the wheel's own
    ``_dataclass_to_string_truncated`` (request_logger.py), with the given latency."""
    src = _source(z, "utils/request_logger.py")
    fn = _function(src, "_dataclass_to_string_truncated")
    ns: dict = {"dataclasses": dataclasses, "Any": typing.Any, "Optional": typing.Optional, "Set": typing.Set}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "request_logger.py", "exec"), ns)
    out = {"text": "...", "meta_info": {"id": "5d1c", "finish_reason": {"type": "length", "length": 64},
                                        "prompt_tokens": 118000, "completion_tokens": 64, "e2e_latency": e2e_latency}}
    body = ns["_dataclass_to_string_truncated"](out, 2048)
    assert f"'e2e_latency': {e2e_latency}" in body
    line = _render(_joined(src, "Finish: obj="), {"obj_str": "GenerateReqInput(rid='5d1c')", "headers_str": "",
                                                   "out_str": f", out={body}"}.__getitem__)
    return line


def _stall_log(*, stall: bool = True, sigterm: bool = True) -> list[str]:
    """An sglang#30314-shaped log from the default release's wheel: requests served, (with
    ``stall``) a 225 s request and two /health failures, (with ``sigterm``) SGLang's SIGTERM
    line; the runtime's SIGKILL is the exit code the caller gives."""
    z = _wheel(releases.default_release())
    http = _source(z, "entrypoints/http_server.py")
    tm = _source(z, "managers/tokenizer_manager.py")
    health = _render(_joined(http, "Health check failed."), lambda e: {"HEALTH_CHECK_TIMEOUT": "20"}.get(e, "10:03:41"))
    term = _render(_joined(tm, "SIGTERM received."), lambda e: {"signum": "15"}.get(e, "None"))
    log = [TS.format(0) + "server_args={'tp_size': 2, 'enable_hierarchical_cache': True}",
           TS.format(1) + _finish_line(z, 3.2)]
    if stall:
        log += [TS.format(4) + health, TS.format(5) + health, TS.format(7) + _finish_line(z, 225.31)]
    if sigterm:
        log.append(TS.format(8) + term)
    return log


@pytest.mark.wheel
def test_the_30314_log_leads_with_the_stall_not_memory(cli, tmp_path):
    log = _stall_log()
    d = diagnose(log, Facts(exit_code=-9))
    first = d.matches[0]
    assert first.id == "stall-then-kill" and first.conclusive
    assert "225 s" in first.explanation and f"{HEALTH_TIMEOUT_S} s /health timeout" in first.explanation
    assert "/health failed 2 times" in first.explanation
    assert "sglang#30314" in first.explanation and first.fix.startswith("do not lower the HiCache ratio")
    assert not any(m in first.explanation + first.fix[len("do not lower the HiCache ratio"):] for m in MEMORY)
    assert "killed-sigkill" not in [m.id for m in d.matches]
    assert any("SIGTERM received" in e for e in first.evidence)
    # the command: the first cause printed is the stall, and it is a known cause (exit 0)
    path = tmp_path / "server.log"
    path.write_text("\n".join(log) + "\n")
    r = cli("diagnose", str(path), "--exit-code=-9")
    causes = [ln.strip() for ln in r.out.splitlines() if ln.strip().startswith("[")]
    assert r.code == 0 and causes[0].startswith("[stall-then-kill]"), r.out


@pytest.mark.wheel
@pytest.mark.parametrize("shape", [{"stall": False}, {"sigterm": False}], ids=["no-stall", "no-sigterm"])
def test_without_the_stall_or_the_sigterm_a_sigkill_still_leads_with_memory(shape):
    d = diagnose(_stall_log(**shape), Facts(exit_code=137))
    assert [m.id for m in d.matches][:1] == ["killed-sigkill"]
    assert "out of memory likely" in d.matches[0].explanation and "hicache_ratio" in d.matches[0].fix


@pytest.mark.wheel
def test_a_proven_oom_kill_is_memory_whatever_the_stall():
    d = diagnose(_stall_log(), Facts(exit_code=137, oom_kill=True))
    assert d.matches[0].id == "oom-killer"


def test_the_stall_bound_is_the_health_timeout_times_the_factor():
    term = "[2026-12-01 10:08:00] SIGTERM received. signum=15 frame=None. Draining requests and shutting down..."
    bound = HEALTH_TIMEOUT_S * STALL_FACTOR
    below = diagnose([f"Finish: obj=x, out={{'meta_info': {{'e2e_latency': {bound - 1}}}}}", term], Facts(exit_code=-9))
    at = diagnose([f"Finish: obj=x, out={{'meta_info': {{'e2e_latency': {bound}}}}}", term], Facts(exit_code=-9))
    assert below.matches[0].id == "killed-sigkill" and at.matches[0].id == "stall-then-kill"
    # the reports' own wording (``e2e_latency: 225s``) counts; a server that exited by itself was not killed
    assert diagnose([f"e2e_latency: {bound}s", term], Facts(exit_code=-9)).matches[0].id == "stall-then-kill"
    assert "stall-then-kill" not in [m.id for m in diagnose([f"e2e_latency: {bound}s", term], Facts(exit_code=1)).matches]


def test_a_jit_toolkit_too_old_is_named_with_the_toolkit_not_the_image():
    line = ("(EngineCore_DP0 pid=120) ERROR 01-28 06:36:45 [core.py:946] RuntimeError: No supported CUDA "
            "architectures found for major versions [12].")
    d = diagnose(["Traceback (most recent call last):", line], Facts(exit_code=1))
    m = d.matches[0]
    assert m.id == "jit-toolkit-too-old" and d.conclusive
    assert "12.9" in m.explanation and "vllm#50705" in m.explanation and "CUDA_HOME" in m.fix
    assert "nvcc --version" in m.fix


def _watchdog(tp: int, hicache: bool) -> str:
    log = [f"[2026-12-01 10:00:00] server_args={{'tp_size': {tp}, 'enable_hierarchical_cache': {hicache}}}",
           "[2026-12-01 10:05:00 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)"]
    d = diagnose(log, Facts(exit_code=1))
    m = next(m for m in d.matches if m.id == "sglang-watchdog-timeout")
    return m.explanation + " || " + m.fix


@pytest.mark.parametrize("tp,hicache,named", [(2, True, True), (1, True, False), (2, False, False)])
def test_the_watchdog_names_the_load_back_divergence_at_tp_above_one_with_hicache(tp, hicache, named):
    text = _watchdog(tp, hicache)
    assert ("sglang PR #33442" in text) is named, text
    if named:
        fix = text.split(" || ")[1]
        assert fix.startswith(f"with HiCache on at TP {tp}, first suspect the load-back divergence")
        assert "sglang#31425" in fix and "hicache.enabled: false" in fix


def test_the_launch_gives_the_tp_size_the_watchdog_row_reads():
    prof = load_profile("linux-tp2-l3")
    p = plan(prof, HOSTS["linux"])
    facts = Facts(exit_code=1, **launch_facts(p, build_launch_spec(p, prof)))
    assert facts.tp_size == p.tp_size == 2 and facts.hicache_enabled
    d = diagnose(["[2026-12-01 10:05:00 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)"],
                 facts)
    assert d.matches[0].fix.startswith("with HiCache on at TP 2, first suspect the load-back divergence")


def test_cannot_map_memory_puts_freeing_host_memory_first():
    register = "[2026-12-01 10:00:05 TP0] RuntimeError: cudaHostRegister failed (rc=1, invalid argument) " \
               "at offset=0 size=34760392704 (total=34760392704, chunk_limit=274877906944)"
    kernel = "[ 8412.331] NVRM: Cannot map memory with base addr 0x7f134c660000 and size of 0xf179a0 pages"
    without = diagnose([register], Facts(exit_code=1))
    assert without.matches[0].id == "host-register-failed"
    assert without.matches[0].fix.startswith("give the server an unlimited memlock ulimit")
    both = diagnose([register, kernel], Facts(exit_code=1))
    m = both.matches[0]
    assert m.id == "host-register-failed" and [x.id for x in both.matches].count("host-map-failed") == 0
    assert m.fix.startswith("free host memory (stop other memory users) or lower hicache.hicache_ratio")
    assert "sglang PR #26301" in m.fix
    alone = diagnose([kernel], Facts(exit_code=1))  # the kernel line on its own still names the cause
    assert alone.matches[0].id == "host-map-failed" and alone.matches[0].fix.startswith("free host memory")
