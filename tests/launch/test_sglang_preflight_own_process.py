"""SGLang's own pre-flight (escha_deploy/launch/sglang_preflight.py) where a test needs SGLang
processes of its own: native ``serve`` refuses before the server starts and names the profile key
(exit 3), or reports a fault of the pre-flight's own code as an internal error (exit 1); a harness
fault planted in the pre-flight (the TEST-ONLY runner tests/launch/preflight_fault.py, and the
source `up` hands to ``python -c``) is ours while SGLang's refusal in the same process stays
SGLang's. The planted fault and the ``serve`` subprocesses cannot share the other tests' process
(tests/launch/sglang_preflight_cases.py: ``SharedPreflight``).

Runs in the flag-catalog venv (.ci/check-flag-catalog.sh) with the test-only site hook in
tests/launch/preflight_cpu_site (the oracle's stand-ins for the GPU; named there).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from escha_deploy.launch import sglang_preflight as pf

from .sglang_preflight_cases import KV_REFUSAL, ROOT, VENV_PY, model_folder, rendered, site_env, with_value

pytestmark = pytest.mark.wheel


def free_port() -> int:
    """A free port: another suite may run beside this one."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_native_serve_refuses_before_the_server_starts_naming_the_key(tmp_path):
    """SGLang refuses ``--linear-attn-decode-backend flashkda`` (a prefill-only kernel); plan does not
    model that extra_args flag. serve exits 3 with SGLang's message, its file:function and the
    profile key, and starts nothing."""
    model = model_folder(tmp_path, "rtx5060ti-tp2-fp8")
    env = site_env(ESCHA_SGLANG_PYTHON=str(VENV_PY), ESCHA_SKIP_GPU_PREFLIGHT="1", ESCHA_SGLANG_PREFLIGHT="1",
                   XDG_CACHE_HOME=str(tmp_path / "xdg"))
    proc = subprocess.run(
        [sys.executable, "-m", "escha_deploy.cli.main", "serve", "-p", "rtx5060ti-tp2-fp8",
         "--set", f"model.host_dir={model}", "--set", "runtime.needs=[]", "--set", "runtime.extra_args=[--linear-attn-decode-backend,flashkda]",
         "--set", f"container.port={free_port()}"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 3, proc.stderr
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1, proc.stderr
    assert "SGLang's pre-flight refused at attention backend: ValueError: --linear-attn-decode-backend flashkda " \
        "is not supported" in err[0]
    assert "(srt/arg_groups/attention_hook.py:handle_linear_attn_backend)" in err[0]
    assert "set by runtime.extra_args item '--linear-attn-decode-backend'" in err[0]
    assert "starting SGLang" not in proc.stderr


FAULT_RUNNER = ROOT / "tests" / "launch" / "preflight_fault.py"


def planted_python(tmp_path: Path) -> Path:
    """SGLang's interpreter (the flag-catalog venv's) running the pre-flight through the TEST-ONLY
    fault runner (tests/launch/preflight_fault.py: the function ``$ESCHA_TEST_PREFLIGHT_FAULT``
    names raises); a shell wrapper, as ``ESCHA_SGLANG_PYTHON`` and ``run``'s ``python`` take one."""
    wrapper = tmp_path / "python-planted"
    wrapper.write_text(f'#!/bin/sh\nexec "{VENV_PY}" "{FAULT_RUNNER}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


#: Where the planted fault in ``_sized`` surfaces (the 0.5.19 configurator's function calls it)
PLANTED = ("KV cache configurator", "KeyError", "'planted harness fault'", "launch/sglang_preflight.py:_kv_configurator_ps")


def test_a_planted_harness_fault_is_ours_and_sglangs_refusal_stays_sglangs(cli, tmp_path):
    """With the pre-flight's own ``_sized`` (called once SGLang's sizing has answered) made to
    raise, the argv SGLang accepts comes back as a harness fault (stage, our function, the
    traceback; no flags), while the argv SGLang's ``_profile_available_bytes`` refuses, in the
    same process, is still SGLang's refusal. Both as ``serve`` runs the pre-flight (a script) and
    as `up`'s throw-away container does (its source given to ``python -c``: ``image_preflight``)."""
    base, dev = rendered(cli, "rtx5060ti-tp2-fp8", model_folder(tmp_path, "rtx5060ti-tp2-fp8"))
    kv = with_value(base, "--mem-fraction-static", "0.3")
    env = site_env(ESCHA_TEST_PREFLIGHT_FAULT="_sized")
    planted, refused = pf.run_many(str(planted_python(tmp_path)), [base, kv], env, devices=[dev, dev])
    # the same fault planted in the source `up` hands to `python -c`
    source = Path(pf.__file__).read_text()
    tail = '\nif __name__ == "__main__":'
    assert source.count(tail) == 1
    source = source.replace(tail, "\ndef _sized(*a, **k):\n    raise KeyError('planted harness fault')\n" + tail)
    proc = subprocess.run([str(VENV_PY), "-c", source], input=json.dumps({"argvs": [base, kv], "devices": [dev, dev]}),
                          capture_output=True, text=True, env=site_env(), timeout=300)
    by_c = pf.parse_answers(proc.stdout, 2, 0.0, "python -c", proc.returncode, proc.stderr)
    # the site is the innermost function of the pre-flight's file: in the source given to
    # `python -c` the planted function is one of them
    for (fault, refusal), how, site in (((planted, refused), "script", PLANTED[3]),
                                        (by_c, "python -c", "launch/sglang_preflight.py:_sized")):
        assert fault.internal and fault.ok is False, (how, fault)
        assert (fault.stage, fault.type, fault.message, fault.site) == (*PLANTED[:3], site), (how, fault)
        assert fault.flags == [] and "KeyError: 'planted harness fault'" in fault.traceback, (how, fault)
        assert not refusal.internal and (refusal.ok, refusal.stage, refusal.type, refusal.site) == (
            False, *KV_REFUSAL[:2], KV_REFUSAL[3]), (how, refusal)
        assert KV_REFUSAL[4] in refusal.flags, (how, refusal)


def test_native_serve_exits_1_on_a_harness_fault_and_names_no_profile_key(tmp_path):
    """The fault planted in the pre-flight's own ``_sized``: native ``serve`` exits 1 with one
    line, "internal error in the pre-flight (please report)", our function and the stage, and the
    log file holding the traceback; no profile key, no "change the key" hint, nothing started.
    (The same ``serve`` with SGLang's own refusal exits 3 naming the key:
    ``test_native_serve_refuses_before_the_server_starts_naming_the_key``.)"""
    model = model_folder(tmp_path, "rtx5060ti-tp2-fp8")
    xdg = tmp_path / "xdg"
    env = site_env(ESCHA_SGLANG_PYTHON=str(planted_python(tmp_path)), ESCHA_TEST_PREFLIGHT_FAULT="_sized",
                   ESCHA_SKIP_GPU_PREFLIGHT="1", ESCHA_SGLANG_PREFLIGHT="1", XDG_CACHE_HOME=str(xdg))
    env.pop("ESCHA_SERVE_MODE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "escha_deploy.cli.main", "serve", "-p", "rtx5060ti-tp2-fp8",
         "--set", f"model.host_dir={model}", "--set", "runtime.needs=[]", "--set", f"container.port={free_port()}"],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1, proc.stderr
    stage, typ, message, site = PLANTED
    assert err[0].startswith(f"error: internal error in the pre-flight (please report): {typ}: {message} in {site} "
                             f"(stage {stage}); the traceback is in {xdg}/escha-deploy/preflight/"), err[0]
    assert "set by" not in proc.stderr and "change the key" not in proc.stderr and "refused" not in err[0]
    assert "Traceback" not in proc.stderr and "starting SGLang" not in proc.stderr
    log = Path(err[0].rsplit("the traceback is in ", 1)[1])
    assert "KeyError: 'planted harness fault'" in log.read_text()
