"""Native ``serve`` writes the state file ``status`` finds it by, and removes it when it ends.

The SGLang child is a STAND-IN (tests/bench/standin_sglang.py started on the argv's ``--port``:
no GPU here); ``serve`` itself is the real one, planning the launch tests' stand-in profile."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from inproc import run_main

HERE = Path(__file__).resolve().parent
PROFILE = HERE.parent / "launch" / "standin" / "profile.yaml"

CHILD = textwrap.dedent(f'''\
    #!{sys.executable}
    # STAND-IN for `python -m sglang.launch_server`: the bench stand-in on the argv's --port.
    import sys, time
    sys.path.insert(0, {str(HERE.parent / "bench")!r})
    from standin_sglang import StandinConfig, StandinServer
    argv = sys.argv[1:]
    StandinServer(StandinConfig(tp_size=2, metrics_all_schedulers=True)).start(int(argv[argv.index("--port") + 1]))
    print("ready", flush=True)
    while True:
        time.sleep(0.1)
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_writes_the_state_file_status_reads_and_removes_it(tmp_path):
    child = tmp_path / "sglang_standin.py"
    child.write_text(CHILD)
    child.chmod(0o755)
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    port = _free_port()
    env = {**os.environ, "ESCHA_SGLANG_PYTHON": str(child), "ESCHA_SKIP_GPU_PREFLIGHT": "1",
           "XDG_RUNTIME_DIR": str(run), "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    env.pop("ESCHA_SERVE_MODE", None)
    p = subprocess.Popen([sys.executable, "-m", "escha_deploy.cli.main", "serve", "--profile", str(PROFILE),
                          "--set", "runtime.needs=[]", "--set", "hicache.hicache_ratio=0.1", "--set", "hicache.min_ratio=0.1",
                          "--set", f"container.port={port}"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert p.stdout is not None
        seen = []
        for line in p.stdout:
            seen.append(line)
            if line.strip() == "ready":
                break
        state_file = run / f"escha-deploy-{os.getuid()}" / f"serve-{port}.json"
        assert state_file.is_file(), "".join(seen)
        state = json.loads(state_file.read_text())
        assert state["pid"] == p.pid and state["port"] == port and state["profile"] == "standin-tp2"
        assert oct(state_file.stat().st_mode & 0o777) == "0o600"
        r = run_main("status", "--profile", "standin-tp2", "--format", "json",
                     env={"XDG_RUNTIME_DIR": str(run), "DOCKER_HOST": env["DOCKER_HOST"]})
        assert r.code == 0, r.err
        (row,) = json.loads(r.out)
        assert row["kind"] == "native" and row["endpoint"] == f"http://127.0.0.1:{port}"
        assert row["plan"]["host_kv_tokens"] > 0 and row["plan"]["page_cache_floor_bytes"] > 0  # the real plan
        assert set(row["server"]["ranks"]) == {"0", "1", "all"} and row["metrics_error"] is None  # all: 0.5.19 radix counters
        assert p.pid in row["host"]["server_pids"] and len(row["host"]["server_pids"]) >= 2  # serve + its child
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
    assert not state_file.exists()
