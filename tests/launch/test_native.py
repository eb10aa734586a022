"""The `serve` supervisor (escha_deploy/launch/native.py) with real child processes.

SGLang itself cannot start here (no torch, no GPU), so the children that print SGLang's
startup line are STAND-INs: small Python scripts that print the line in SGLang 0.5.19's real
format (sglang/srt/entrypoints/engine.py: f"server_args={server_args.resolved_dict()}") with
the API key they received through the --config file, as SGLang's parser would merge it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import STANDIN_PROFILE, run_cli

KEY = "sk-escha-test-0123456789"
HF = "hf_" + "Zq9" * 12

STANDIN_SGLANG = textwrap.dedent('''\
    #!/usr/bin/env python3
    # STAND-IN for `python -m sglang.launch_server`: merges --config as SGLang's
    # ConfigArgumentMerger does, prints the real startup line, then behaves per STANDIN_MODE.
    import os, signal, sys, time, yaml
    argv = sys.argv[1:]
    cfg = {}
    if "--config" in argv:
        cfg = yaml.safe_load(open(argv[argv.index("--config") + 1]))
        print("config-file=" + argv[argv.index("--config") + 1], flush=True)
    print("argv=" + " ".join(argv), flush=True)
    print("[2026-11-29 16:20:00] server_args=" + repr({"model_path": "/m", "host": "127.0.0.1",
          "api_key": cfg.get("api-key"), "admin_api_key": None, "tp_size": 2}), flush=True)
    print("hf token seen: " + os.environ.get("HF_TOKEN", "none"), flush=True)
    mode = os.environ.get("STANDIN_MODE", "crash")
    if mode == "crash":
        print("ValueError: Not enough host memory available. Requesting 2.58 GB but only have "
              "1.12 GB free. Please reduce the size of the hierarchical cache.", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, lambda s, f: (print("got SIGTERM", flush=True), sys.exit(7)))
    print("ready", flush=True)
    while True:
        time.sleep(0.1)
''')


@pytest.fixture
def fake_sglang(tmp_path):
    p = tmp_path / "standin_sglang.py"
    p.write_text(STANDIN_SGLANG)
    p.chmod(0o755)
    return str(p)


@pytest.fixture
def secret_files(tmp_path):
    k = tmp_path / "api_key"
    k.write_text(KEY + "\n")
    h = tmp_path / "hf_token"
    h.write_text(HF + "\n")
    return str(k), str(h)


def serve_env(fake: str, **extra) -> dict:
    env = dict(os.environ, ESCHA_SGLANG_PYTHON=fake, ESCHA_SKIP_GPU_PREFLIGHT="1", **extra)
    env.pop("ESCHA_SERVE_MODE", None)
    return env


def serve_args(key: str, hf: str) -> list[str]:
    return ["serve", "--profile", str(STANDIN_PROFILE), "--set", "runtime.needs=[]",
            "--set", "hicache.enabled=false", "--set", f"container.api_key_file={key}",
            "--set", f"container.hf_token_file={hf}"]


def test_crash_is_diagnosed_secrets_redacted_exit_4(fake_sglang, secret_files):
    r = run_cli(*serve_args(*secret_files), env=serve_env(fake_sglang))
    out = r.stdout + r.stderr
    assert r.returncode == 4, out
    assert "server_args={" in out and "'api_key': '***'" in out
    assert KEY not in out and HF not in out
    assert "hf token seen: ***" in out  # the child got the token, the output does not show it
    assert "[host-memory-check]" in r.stderr and "exited with code 3" in r.stderr
    argv_line = next(ln for ln in out.splitlines() if ln.startswith("argv="))
    assert "--config" in argv_line and KEY not in argv_line  # never on a command line
    cfg = next(ln for ln in out.splitlines() if ln.startswith("config-file="))
    assert not Path(cfg.split("=", 1)[1]).exists()  # removed when the child exited


def test_sigterm_is_forwarded_and_child_code_returned(fake_sglang, secret_files):
    cmd = [sys.executable, "-m", "escha_deploy.cli.main", *serve_args(*secret_files)]
    p = subprocess.Popen(cmd, env=serve_env(fake_sglang, STANDIN_MODE="serve"), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    assert p.stdout is not None
    for line in p.stdout:
        if line.strip() == "ready":
            break
    p.send_signal(signal.SIGTERM)
    rest = p.stdout.read()
    assert p.wait(timeout=20) == 7  # the child's own code, not 4
    assert "got SIGTERM" in rest and "diagnosis" not in rest


def test_dry_run_shows_no_secret(fake_sglang, secret_files):
    r = run_cli(*serve_args(*secret_files), "--dry-run", env=serve_env(fake_sglang))
    assert r.returncode == 0, r.stderr
    assert KEY not in r.stdout + r.stderr and HF not in r.stdout + r.stderr
    assert "sglang.launch_server" in r.stdout


def test_unsafe_plan_exits_3_before_starting(fake_sglang, secret_files):
    # HiCache on with the stock runtime (no capabilities): 0.5.19's own host check would refuse.
    args = serve_args(*secret_files)
    i = args.index("hicache.enabled=false")
    args[i] = "hicache.hicache_ratio=4"
    r = run_cli(*args, env=serve_env(fake_sglang))
    assert r.returncode == 3, r.stderr
    assert "server_args" not in r.stdout + r.stderr  # nothing started


def test_missing_capability_exits_3(fake_sglang, secret_files):
    args = serve_args(*secret_files)
    args[args.index("runtime.needs=[]")] = "runtime.needs=[int2-kv]"
    r = run_cli(*args, env=serve_env(fake_sglang))
    assert r.returncode == 3 and "int2-kv" in r.stderr


def test_no_gpu_exits_3_without_the_test_switch(fake_sglang, secret_files):
    env = serve_env(fake_sglang)
    env.pop("ESCHA_SKIP_GPU_PREFLIGHT")
    r = run_cli(*serve_args(*secret_files), env=env)
    assert r.returncode == 3 and "no CUDA GPU" in r.stderr


@pytest.fixture(scope="session")
def sglang_unzipped(tmp_path_factory) -> Path:
    """The real sglang 0.5.19 wheel ($ESCHA_SGLANG_WHEEL, which .ci/test downloads), unzipped."""
    import zipfile

    wheel = os.environ.get("ESCHA_SGLANG_WHEEL", "")
    assert Path(wheel).is_file(), "ESCHA_SGLANG_WHEEL must name the sglang 0.5.19 wheel (.ci/test sets it)"
    out = tmp_path_factory.mktemp("sg")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(out, [n for n in z.namelist() if n.startswith("sglang/")])
    return out


@pytest.mark.wheel
def test_real_sglang_wheel_child_fails_without_torch_and_is_diagnosed(secret_files, tmp_path, sglang_unzipped):
    """The real 0.5.19 launch_server as the child: here it stops at an import SGLang needs and
    this machine lacks (torch, or with a CPU torch installed, pybase64)."""
    wrapper = tmp_path / "py"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={sglang_unzipped} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    r = run_cli(*serve_args(*secret_files), env=serve_env(str(wrapper)))
    assert r.returncode == 4, r.stderr
    assert "[runtime-module-missing]" in r.stderr and KEY not in r.stdout + r.stderr


@pytest.mark.parametrize("rises", [True, False])
def test_the_cgroups_oom_kill_count_reaches_the_diagnosis(tmp_path, rises):
    """Native `serve` reads the cgroup's oom_kill count before and after its child: a SIGKILL
    with a count that rose is the OOM killer, one without is unproven. The cgroup file is a
    STAND-IN for the kernel's (no test may make the kernel OOM-kill): the child raises the
    count, as the kernel would, and SIGKILLs itself."""
    import io

    from escha_deploy.launch.native import supervise

    events = tmp_path / "sys" / "fs" / "cgroup" / "memory.events"
    events.parent.mkdir(parents=True)
    events.write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    child = ("import os, signal, sys; "
             + (f"open({str(events)!r}, 'w').write('oom 1\\noom_kill 1\\n'); " if rises else "")
             + "os.kill(os.getpid(), signal.SIGKILL)")
    out = io.StringIO()
    outcome = supervise([sys.executable, "-c", child], out=out, cgroup_root=tmp_path)
    assert outcome.exit_code == 4
    text = out.getvalue()
    if rises:
        assert "[oom-killer]" in text, text
    else:
        assert "the cgroup's oom_kill count did not rise" in text, text
