"""`logs`, `down` and `status` find the same servers: a native `serve` that `status` lists is
also the one `logs` prints and `down` stops (they said "nothing running" for it).

The SGLang child is a STAND-IN (tests/bench/standin_sglang.py on the argv's ``--port``: no GPU
here); ``serve``, ``status``, ``logs`` and ``down`` are the real ones."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from inproc import run_main

HERE = Path(__file__).resolve().parent
PROFILE = HERE / "standin" / "profile.yaml"
sys.path.insert(0, str(HERE.parent / "watch"))
from test_native_state import CHILD, _free_port  # noqa: E402  (the native serve test's stand-in child)


def test_logs_and_down_find_the_native_server_status_lists(tmp_path):
    child = tmp_path / "sglang_standin.py"
    child.write_text(CHILD.replace('print("ready", flush=True)',
                                   'print("ready", flush=True)\nprint("standin: api_key=sk-planted-9f3c", flush=True)'))
    child.chmod(0o755)
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    key = tmp_path / "key"
    key.write_text("sk-planted-9f3c\n")
    port = _free_port()
    env = {**os.environ, "ESCHA_SGLANG_PYTHON": str(child), "ESCHA_SKIP_GPU_PREFLIGHT": "1",
           "XDG_RUNTIME_DIR": str(run), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
           "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    env.pop("ESCHA_SERVE_MODE", None)
    p = subprocess.Popen([sys.executable, "-m", "escha_deploy.cli.main", "serve", "--profile", str(PROFILE),
                          "--set", "runtime.needs=[]", "--set", "hicache.hicache_ratio=0.1",
                          "--set", "hicache.min_ratio=0.1", "--set", f"container.port={port}",
                          "--set", f"container.api_key_file={key}"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    small = {k: env[k] for k in ("XDG_RUNTIME_DIR", "DOCKER_HOST", "XDG_CACHE_HOME")}
    try:
        assert p.stdout is not None
        seen = []
        for line in p.stdout:
            seen.append(line)
            if "api_key=" in line:
                break
        st = run_main("status", "--profile", "standin-tp2", "--format", "json", env=small)
        assert st.code == 0, st.err
        assert [r["kind"] for r in json.loads(st.out)] == ["native"]
        lg = run_main("logs", "--profile", "standin-tp2", env=small)
        assert lg.code == 0, lg.err
        assert "ready" in lg.out.splitlines(), lg.out
        assert "sk-planted-9f3c" not in lg.out and "api_key=" in lg.out  # serve's redaction holds
        assert run_main("logs", "--profile", "standin-tp2", "--tail", "1", env=small).out.count("\n") == 1
        dn = run_main("down", "--profile", "standin-tp2", "--timeout", "20", env=small)
        assert dn.code == 0, dn.err
        assert f"serve pid {p.pid} (native, port {port}) stopped" in dn.err, dn.err
        assert p.wait(timeout=5) is not None  # down waited for it to exit
        assert run_main("status", "--profile", "standin-tp2", env=small).code == 3
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=30)
