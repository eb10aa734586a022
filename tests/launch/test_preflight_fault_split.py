"""Whose fault an exception in SGLang's pre-flight is (escha_deploy/launch/sglang_preflight.py:
``raised_by_sglang``), and what each consumer makes of the answer (``image_preflight.failure``,
``up --dry-run``'s ``DryRun.error``): SGLang's refusal is exit 3 naming the profile key; a fault of
the pre-flight's own code is exit 1, "internal error in the pre-flight (please report)", its
traceback in a log file, no profile key named.

The classification is by the traceback's frames: the innermost frame that is the ``sglang``
package's or the pre-flight file's decides. Here the ``sglang`` package is a STAND-IN: a module
object in ``sys.modules`` whose ``__path__`` is a temporary folder, and functions compiled with
file names inside that folder (what a frame of the real package carries); the real wheel's
refusals and a planted harness fault in the real pre-flight are in test_sglang_preflight.py.
"""

from __future__ import annotations

import functools
import json
import sys
import types
from pathlib import Path

import pytest

from escha_deploy.utils.errors import ExitCode, Internal, Refused
from escha_deploy.launch import image_preflight as ip
from escha_deploy.launch import sglang_preflight as pf


def _compiled(filename: str, source: str, name: str):
    """Function ``name`` of ``source`` compiled as if it lived in ``filename`` (its frames say so)."""
    ns: dict = {}
    exec(compile(source, filename, "exec"), ns)  # noqa: S102  (the test's own source)
    return ns[name]


def _caught(f) -> BaseException:
    try:
        f()
    except Exception as exc:  # noqa: BLE001  the test inspects whatever was raised
        return exc
    raise AssertionError("nothing raised")


@pytest.fixture
def sglang_here(tmp_path, monkeypatch):
    """A STAND-IN ``sglang`` package location: ``(call, refuse)``, SGLang functions compiled as
    files of it (``call(f)`` calls ``f``; ``refuse()`` raises SGLang's ValueError)."""
    root = tmp_path / "site-packages" / "sglang"
    root.mkdir(parents=True)
    mod = types.ModuleType("sglang")
    mod.__path__ = [str(root)]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sglang", mod)
    call = _compiled(str(root / "srt" / "mem_cache" / "kv_cache_configurator.py"), "def call(f):\n    return f()\n",
                     "call")
    refuse = _compiled(str(root / "srt" / "arg_groups" / "memory_hook.py"),
                       "def refuse():\n    raise ValueError('--mem-fraction-static must be in (0, 1)')\n", "refuse")
    return call, refuse


#: A function of the pre-flight's own file (a stand-in it puts into SGLang's module, say)
harness_reading = _compiled(pf._HERE, "def reading(*a):\n    raise KeyError('free_before_weights')\n", "reading")


def test_where_it_was_raised_decides_whose_it_is(sglang_here):
    call, refuse = sglang_here
    assert pf.raised_by_sglang(_caught(refuse))  # SGLang raised it
    assert pf.raised_by_sglang(_caught(lambda: call(refuse)))
    # a library SGLang called (int() here, a C function: no frame of its own) is SGLang's
    assert pf.raised_by_sglang(_caught(lambda: call(functools.partial(int, "x"))))
    # the harness's own code, or a stand-in of the harness that SGLang called: ours
    assert not pf.raised_by_sglang(_caught(harness_reading))
    assert not pf.raised_by_sglang(_caught(lambda: call(harness_reading)))
    # no SGLang frame at all (a library the harness called, a plain bug): ours
    assert not pf.raised_by_sglang(_caught(lambda: {}["kv_budget_bytes"]))


def test_without_sglang_imported_nothing_is_sglangs(monkeypatch):
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    assert not pf.raised_by_sglang(_caught(lambda: int("x")))


def test_a_harness_fault_answer_names_our_function_and_no_flag(sglang_here):
    call, _ = sglang_here
    ans = pf.harness_fault(_caught(lambda: call(harness_reading)), "KV cache configurator")
    assert ans["ok"] is False and ans["fault"] == "harness" and ans["flags"] == []
    assert ans["site"] == "launch/sglang_preflight.py:reading" and ans["type"] == "KeyError"
    assert ans["stage"] == "KV cache configurator" and "KeyError: 'free_before_weights'" in ans["traceback"]
    json.dumps(ans)  # the answer is one JSON line


def _results(*answers: dict, n: int | None = None) -> list[pf.PreflightResult]:
    out = "\n".join(json.dumps(a) for a in answers) + "\n"
    return pf.parse_answers(out, len(answers) if n is None else n, 0.0, "test", 0, "")


HARNESS = {"ok": False, "fault": "harness", "stage": "KV cache configurator", "type": "KeyError",
           "message": "'kv_budget_bytes'", "site": "launch/sglang_preflight.py:_sized", "flags": [],
           "traceback": "Traceback (most recent call last):\n  ...\nKeyError: 'kv_budget_bytes'\n"}
REFUSAL = {"ok": False, "stage": "KV cache configurator", "type": "ValueError",
           "message": "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.3",
           "site": "srt/mem_cache/kv_cache_configurator.py:_profile_available_bytes", "flags": ["--mem-fraction-static"]}
PROFILE = {"runtime": {"extra_args": []}}


def test_parse_answers_keeps_the_fault_and_its_traceback():
    harness, refusal = _results(HARNESS, REFUSAL)
    assert harness.internal and harness.ok is False and "KeyError" in harness.traceback
    assert not refusal.internal and refusal.ok is False
    # an unreadable request gets one harness answer from main(): every argv's
    assert [r.internal for r in _results({**HARNESS, "stage": "request"}, n=3)] == [True] * 3


def test_failure_is_exit_1_with_the_traceback_in_a_log_never_a_profile_key(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ESCHA_SERVE_MODE", raising=False)
    key = "sk-" + "a1B2c3D4" * 5
    res = _results({**HARNESS, "traceback": HARNESS["traceback"] + f"  argv: --api-key={key}\n"})[0]
    err = ip.failure(res, PROFILE)
    assert isinstance(err, Internal) and err.exit_code == ExitCode.INTERNAL == 1
    assert len(err.problems) == 1
    line = err.problems[0]
    assert line.startswith("internal error in the pre-flight (please report): KeyError: 'kv_budget_bytes' in "
                           "launch/sglang_preflight.py:_sized (stage KV cache configurator); the traceback is in ")
    assert "set by" not in line and "mem_fraction_static" not in line and "change the key" not in (err.hint or "")
    log = Path(line.rsplit("the traceback is in ", 1)[1])
    assert log.parent == tmp_path / "xdg" / "escha-deploy" / "preflight" and log.stat().st_mode & 0o777 == 0o600
    text = log.read_text()
    assert "KeyError: 'kv_budget_bytes'" in text and "stage: KV cache configurator" in text
    assert key not in text  # a traceback may quote an argv value: masked
    # SGLang's refusal stays a refusal naming the key that set the input
    refused = ip.failure(_results(REFUSAL)[0], PROFILE)
    assert isinstance(refused, Refused) and "set by runtime.mem_fraction_static" in refused.problems[0]


def test_in_a_container_the_traceback_goes_to_its_log_stream(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("ESCHA_SERVE_MODE", "container")
    said: list[tuple[str, str]] = []
    err = ip.failure(_results(HARNESS)[0], PROFILE, lambda level, msg: said.append((level, msg)))
    assert isinstance(err, Internal) and err.problems[0].endswith("; the traceback is above")
    assert any("KeyError: 'kv_budget_bytes'" in msg for _, msg in said), said
    assert not (tmp_path / "xdg").exists()


def test_dry_run_with_an_internal_error_exits_1_whatever_failed_first():
    from escha_deploy.launch.up import DryRun

    dry = DryRun(None, [], [Refused("port: 127.0.0.1:8000 is taken"), Internal("internal error in the pre-flight")])
    err = dry.error()
    assert isinstance(err, Internal) and err.exit_code == 1 and len(err.problems) == 2
    assert type(DryRun(None, [], [Refused("a"), Refused("b")]).error()) is Refused
