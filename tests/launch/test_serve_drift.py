"""Native ``serve --profile`` runs ``up``'s drift check once its server is ready: the sizes the
server logged and its ``/server_info`` against the plan, the same lines ``up`` prints, and the
exit status left to the server.

SGLang cannot start here (no torch, no GPU), so the child is a STAND-IN for
``python -m sglang.launch_server``: it prints the pool lines in SGLang 0.5.19's format strings
(``memory_pool.py``: ``KVCache._finalize_allocation_log`` and ``MambaPool.__init__``;
``scheduler.py``: ``Scheduler.__init__``'s rank-0 line) with the figures the test gives it,
answers ``GET /server_info`` on the ``--host``/``--port`` of its argv with the fields
``http_server.py: server_info`` returns, then logs SGLang's ready line. ``STANDIN_COLD``
plays a cold start: until that many ``/health`` requests have been answered, ``/health`` and
``/server_info`` answer 503 (SGLang compiling kernels after its ready line), or, ``never``,
neither ever answers (the request hangs). The same check on a real
server's log is ``test_drift_real_server.py``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from .conftest import STANDIN_PROFILE

STANDIN = textwrap.dedent('''\
    #!/usr/bin/env python3
    # STAND-IN for `python -m sglang.launch_server` (see the test module's docstring).
    import json, os, signal, sys, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    argv = sys.argv[1:]
    host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
    fig = json.loads(os.environ["STANDIN_FIGURES"])
    info = json.loads(os.environ["STANDIN_SERVER_INFO"])
    def log(msg):
        print("[2026-12-01 20:03:46] " + msg, flush=True)
    log(f"Mamba Cache is allocated. max_mamba_cache_size: {fig['slots']}, conv_state size: 0.06GB, "
        "ssm_state size: 1.21GB ")
    log(f"KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: {fig['tokens']}, K size: 0.82 GB, "
        "V size: 0.82 GB")
    log(f"max_total_num_tokens={fig['tokens']}, chunked_prefill_size=2048, max_prefill_tokens=16384, "
        f"max_running_requests={fig['requests']}, context_len={fig['context']}, available_gpu_mem=0.95 GB")
    cold = os.environ.get("STANDIN_COLD", "0")
    healths = []
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            if cold == "never":
                time.sleep(3600)
            if self.path == "/health":
                healths.append(1)
            warm = len(healths) > int(cold)
            code = (200 if warm else 503) if self.path in ("/health", "/server_info") else 404
            body = json.dumps(info).encode() if self.path == "/server_info" and warm else b"{}"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    httpd = ThreadingHTTPServer((host, port), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda s, f: os._exit(0))
    log("The server is fired up and ready to roll!")
    signal.pause()
''')


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The stand-in script, and a runtime folder of this test's own (the port lock and state
    file of `serve` go to ``$XDG_RUNTIME_DIR``, as in test_serve_faults.py)."""
    import shutil
    import tempfile

    run_dir = Path(tempfile.mkdtemp(prefix="escha-test-run-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    run_dir.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run_dir))
    p = tmp_path / "standin_sglang.py"
    p.write_text(STANDIN)
    p.chmod(0o755)
    yield p
    shutil.rmtree(run_dir, ignore_errors=True)


OVERRIDES = ["runtime.needs=[]", "hicache.enabled=false"]


def planned():
    from escha_deploy.facts.machine import gather_host_facts
    from escha_deploy.launch.prepare import planned_sizes
    from escha_deploy.planner import plan
    from escha_deploy.profile import load_profile

    p = load_profile(str(STANDIN_PROFILE), OVERRIDES)
    return planned_sizes(plan(p, gather_host_facts(platform="linux"), capabilities=frozenset()), p.runtime)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: What ends the check at ready: a drift warning, all agreed, or a half not compared.
DONE = ("drift:", "the server's sizes are the plan's", "/server_info not compared")


def serve_until_checked(script: Path, figures: dict, server_info: dict, extra_env: dict | None = None,
                        times: dict[str, float] | None = None) -> tuple[int, list[str]]:
    """Run native `serve` of the stand-in until its check at ready has printed, then SIGTERM it;
    its exit status and its lines. ``times`` gets the monotonic times at which the ready line
    (``ready``) and the check's last line (``checked``) were read."""
    port = free_port()
    env = dict(os.environ, ESCHA_SGLANG_PYTHON=str(script), ESCHA_SKIP_GPU_PREFLIGHT="1",
               STANDIN_FIGURES=json.dumps(figures), STANDIN_SERVER_INFO=json.dumps(server_info),
               **(extra_env or {}))
    env.pop("ESCHA_SERVE_MODE", None)
    cmd = [sys.executable, "-m", "escha_deploy.cli.main", "serve", "--profile", str(STANDIN_PROFILE),
           *[a for o in OVERRIDES for a in ("--set", o)], "--set", f"container.port={port}",
           "--set", "container.stop_timeout_s=2"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    got: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            got.put(line.rstrip("\n"))
        got.put(None)

    threading.Thread(target=read, daemon=True).start()
    lines: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while not any(d in ln for ln in lines for d in DONE):
            line = got.get(timeout=max(deadline - time.monotonic(), 0.01))
            assert line is not None, f"serve ended before its check at ready: {lines}"
            lines.append(line)
            if times is not None and "ready to roll" in line:
                times.setdefault("ready", time.monotonic())
        if times is not None:
            times["checked"] = time.monotonic()
        p.send_signal(signal.SIGTERM)
        code = p.wait(timeout=30)
        while (line := got.get(timeout=10)) is not None:
            lines.append(line)
        return code, lines
    except queue.Empty:
        raise AssertionError(f"no check at ready within 60 s: {lines}") from None
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_sizes_as_planned_are_said_once_and_the_exit_is_the_servers(standin):
    pl = planned()
    fig = {"tokens": pl.kv_tokens, "slots": pl.device_mamba_slots, "requests": pl.max_running_requests,
           "context": pl.context_length}
    info = {"max_total_num_tokens": pl.kv_tokens, "context_length": pl.context_length,
            "max_mamba_cache_size": pl.device_mamba_slots,
            "internal_states": [{"effective_max_running_requests_per_dp": pl.max_running_requests}]}
    code, lines = serve_until_checked(standin, fig, info)
    assert code == 0, lines  # the stand-in's own exit after the forwarded SIGTERM
    said = [ln for ln in lines if "the server's sizes are the plan's" in ln]
    assert said == ["serve: the server's sizes are the plan's (5 figures from its log, 4 from /server_info)"], lines
    assert not [ln for ln in lines if "drift:" in ln]


def test_a_figure_that_differs_is_a_drift_warning_and_the_server_keeps_serving(standin):
    pl = planned()
    fig = {"tokens": pl.kv_tokens, "slots": pl.device_mamba_slots, "requests": pl.max_running_requests,
           "context": pl.context_length}
    info = {"max_total_num_tokens": pl.kv_tokens,
            "internal_states": [{"effective_max_running_requests_per_dp": pl.max_running_requests - 1}]}
    code, lines = serve_until_checked(standin, fig, info)
    assert code == 0, lines
    n = pl.max_running_requests
    assert (f"warning: drift: max running requests: planned {n} requests, /server_info reports {n - 1} "
            f"requests ({-1 / n:+.1%})") in lines, lines


def agreeing(pl) -> tuple[dict, dict]:
    """The stand-in's log figures and ``/server_info`` object, both the plan's."""
    fig = {"tokens": pl.kv_tokens, "slots": pl.device_mamba_slots, "requests": pl.max_running_requests,
           "context": pl.context_length}
    info = {"max_total_num_tokens": pl.kv_tokens, "context_length": pl.context_length,
            "max_mamba_cache_size": pl.device_mamba_slots,
            "internal_states": [{"effective_max_running_requests_per_dp": pl.max_running_requests}]}
    return fig, info


#: The test's own deadline for the first healthy answer (ESCHA_HEALTHY_WAIT), seconds.
WAIT_S = 2.0


def test_a_cold_server_is_waited_for_and_then_both_halves_are_compared(standin):
    """/health and /server_info answer 503 to the first three /health polls after the ready
    line (a cold SGLang compiling kernels): the check waits for /health 200, then reads
    /server_info."""
    fig, info = agreeing(planned())
    code, lines = serve_until_checked(standin, fig, info, {"STANDIN_COLD": "3", "ESCHA_HEALTHY_WAIT": "20"})
    assert code == 0, lines
    assert ("serve: waiting for the server's first healthy answer (/health 200) before reading /server_info, "
            "up to 20 s (a cold SGLang compiles kernels after its ready line)") in lines, "\n".join(lines)
    said = [ln for ln in lines if "the server's sizes are the plan's" in ln or "not compared" in ln]
    assert said == ["serve: the server's sizes are the plan's (5 figures from its log, 4 from /server_info)"], lines


def test_a_server_never_healthy_ends_the_wait_at_its_deadline_naming_the_half_not_compared(standin):
    """/health and /server_info never answer (each request hangs): the wait ends at the deadline
    the test sets, with one line naming what was compared and what was not."""
    fig, info = agreeing(planned())
    times: dict[str, float] = {}
    code, lines = serve_until_checked(standin, fig, info, {"STANDIN_COLD": "never",
                                                           "ESCHA_HEALTHY_WAIT": f"{WAIT_S:g}"}, times)
    assert code == 0, lines
    said = [ln for ln in lines if "plan's" in ln or "not compared" in ln]
    assert said == [f"warning: serve: 5 figures from the server's log are the plan's; /server_info not compared: "
                    f"/health did not answer 200 within {WAIT_S:g} s"], lines
    assert times["checked"] - times["ready"] <= WAIT_S + 2, times


def test_a_healthy_wait_that_is_not_seconds_is_refused_before_the_server_starts(standin):
    """ESCHA_HEALTHY_WAIT is read before the pre-flight and the start: exit 2, one line, no
    server line printed."""
    port = free_port()
    env = dict(os.environ, ESCHA_SGLANG_PYTHON=str(standin), ESCHA_SKIP_GPU_PREFLIGHT="1",
               ESCHA_HEALTHY_WAIT="soon", STANDIN_FIGURES="{}", STANDIN_SERVER_INFO="{}")
    env.pop("ESCHA_SERVE_MODE", None)
    p = subprocess.run([sys.executable, "-m", "escha_deploy.cli.main", "serve", "--profile", str(STANDIN_PROFILE),
                        *[a for o in OVERRIDES for a in ("--set", o)], "--set", f"container.port={port}"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert [ln for ln in p.stderr.splitlines() if ln.startswith("error:")] == [
        "error: ESCHA_HEALTHY_WAIT: expected a number in decimal (got the string 'soon')"], p.stderr
    assert "starting SGLang" not in p.stderr and "Traceback" not in p.stderr, p.stderr
