"""The ready wait against a real HTTP server on loopback (stdlib, no Docker): the first poll is
immediate, the waits grow from FIRST_POLL_S to POLL_S, and it returns as soon as /health and
/generate both answer."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from escha_deploy.launch import ready
from escha_deploy.launch.ready import Probe, wait_ready


class _Server:
    """Answers 503 until ``ready_after`` polls of /health have been seen, then 200; /generate
    answers SGLang's shape. Records each request's path."""

    def __init__(self, ready_after: int):
        self.ready_after, self.paths = ready_after, []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body=b"{}"):
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                outer.paths.append(self.path)
                up = outer.paths.count("/health") > outer.ready_after
                self._send(200 if up else 503)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.paths.append(self.path)
                self._send(200, json.dumps({"text": "!"}).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def sleeps(monkeypatch):
    """The waits wait_ready asks for (it still sleeps them)."""
    asked: list[float] = []
    real = time.sleep

    def sleep(s):
        asked.append(round(s, 6))
        real(s)

    monkeypatch.setattr(ready.time, "sleep", sleep)
    return asked


def test_ready_server_is_seen_without_sleeping(sleeps):
    srv = _Server(ready_after=0)
    try:
        res = wait_ready(Probe(srv.url), timeout_s=5, alive=lambda: True)
    finally:
        srv.close()
    assert res.ready and res.reason == "ready"
    assert sleeps == []
    assert srv.paths == ["/health", "/generate"]


def test_waits_back_off_from_first_poll_to_the_cap(sleeps):
    srv = _Server(ready_after=7)
    try:
        res = wait_ready(Probe(srv.url), timeout_s=10, alive=lambda: True)
    finally:
        srv.close()
    assert res.ready
    assert sleeps == [0.02, 0.03, 0.045, 0.0675, 0.1, 0.1, 0.1]
    assert srv.paths.count("/health") == 8 and srv.paths[-1] == "/generate"
    assert ready.FIRST_POLL_S * ready.BACKOFF ** 3 < ready.POLL_S  # the cap is reached, not skipped


def test_a_dead_server_stops_the_wait(sleeps):
    srv = _Server(ready_after=10**6)
    calls = []

    def alive():
        calls.append(1)
        return len(calls) < 3

    try:
        res = wait_ready(Probe(srv.url), timeout_s=10, alive=alive)
    finally:
        srv.close()
    assert not res.ready and res.reason == "server exited" and res.health_ok is False
    assert sleeps == [0.02, 0.03]


def test_the_pause_between_polls_is_the_callers(sleeps):
    srv = _Server(ready_after=2)
    asked: list[float] = []
    try:
        res = wait_ready(Probe(srv.url), timeout_s=10, alive=lambda: True, pause=asked.append)
    finally:
        srv.close()
    assert res.ready
    assert asked == [0.02, 0.03] and sleeps == []  # up's pause (the log pump's) replaces sleep


class _StandInLogContainer:
    """Stand-in for a docker-py ``Container`` whose ``logs(stream=True, follow=True)`` yields
    the stand-in server's start-up lines: ``lines`` as ``(delay_s, text)``, then the stream
    stays open (a running server) until ``close()``."""

    def __init__(self, lines):
        self.lines, self.closed = lines, threading.Event()

    def logs(self, **kwargs):
        assert kwargs["stream"] and kwargs["follow"]
        for delay, text in self.lines:
            time.sleep(delay)
            yield (text + "\n").encode()
        self.closed.wait(30)

    def close(self):
        self.closed.set()


def test_up_log_pump_pause_ends_when_the_server_logs_that_it_listens():
    from escha_deploy.launch.up import _LogPump

    c = _StandInLogContainer([(0.0, "[2026-11-30 12:00:00] Load weight begin"),
                              (0.3, "INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)")])
    pump = _LogPump(c)
    try:
        t0 = time.monotonic()
        pump.pause(0.05)  # no listening line yet (only "Load weight begin"): the full pause
        assert time.monotonic() - t0 >= 0.05
        pump.pause(20)  # ends when "Uvicorn running on" arrives, ~0.3 s in, not after 20 s
        assert time.monotonic() - t0 < 10
        assert [ready.phase_of(x) for x in pump.take()] == ["loading weights", "HTTP server up"]
        t1 = time.monotonic()
        pump.pause(0.05)  # woken once: the next pause is a full one again
        assert time.monotonic() - t1 >= 0.05
        assert pump.following()
    finally:
        c.close()


@pytest.mark.parametrize("kind", ["slow-headers", "slow-body"])
def test_a_server_sending_a_byte_a_second_cannot_hold_a_probe(kind):
    """up's ready probe reads through httpread: each request ends within its deadline in all,
    not per byte. With a per-read timeout (http.client's), a server sending one byte a second
    held /health for as long as it kept sending (the hostile server: a 4 KB header line)."""
    from escha_deploy.utils import httpread
    from hostile_servers import HostileServer

    httpread._ssl_context()  # httpx imported and its TLS context built before any clock starts
    with HostileServer(kind) as srv:
        probe = Probe(srv.url, health_s=1.0, generate_s=1.0, server_info_s=1.0)
        t0 = time.monotonic()
        assert probe.health() is False
        assert time.monotonic() - t0 < 1.0 + 2.0
        t0 = time.monotonic()
        assert probe.generate() is False
        assert time.monotonic() - t0 < 1.0 + 2.0
        t0 = time.monotonic()
        assert probe.server_info() is None  # /server_info, then /get_server_info: one deadline each
        assert time.monotonic() - t0 < 2 * 1.0 + 2.0
        res = wait_ready(probe, timeout_s=1.5, alive=lambda: True)
        assert not res.ready and res.reason == "timed out"
        assert srv.requests[:2] == ["GET /health", "POST /generate"]


def test_a_generate_answer_that_is_not_an_object_is_not_ready():
    """/generate answering 200 with JSON that is no object (``5``) is not ready (``"text" in 5``
    raised TypeError before)."""
    srv = _Server(ready_after=0)
    try:
        probe = Probe(srv.url)
        assert probe.generate() is True
        srv.httpd.RequestHandlerClass.do_POST = lambda self: (  # type: ignore[method-assign]
            self.rfile.read(int(self.headers.get("Content-Length") or 0)), self._send(200, b"5"))
        assert probe.generate() is False and probe.last_status == 200
    finally:
        srv.close()


def test_the_wait_for_a_healthy_answer_says_what_it_waits_for_every_few_seconds():
    """A server whose /health answers 503 to its first 30 polls, one poll a (simulated) second:
    a line at the first failure, then one every HEALTHY_PROGRESS_S; /server_info read after."""
    srv = _Server(ready_after=30)
    now = [0.0]
    lines: list[str] = []

    def pause(s):
        now[0] += 1.0

    try:
        got = ready.read_server_info(Probe(srv.url), wait_s=100, progress=lines.append, clock=lambda: now[0],
                                     pause=pause)
    finally:
        srv.close()
    assert got.info == {} and got.why is None
    assert lines == ["waiting for the server's first healthy answer (/health 200) before reading /server_info, "
                     "up to 100 s (a cold SGLang compiles kernels after its ready line)",
                     *(f"still waiting for /health 200 before reading /server_info ({t} s of 100 s)"
                       for t in (5, 10, 15, 20, 25))]
    assert srv.paths.count("/health") == 31 and srv.paths[-1] == "/server_info"


def test_a_server_never_healthy_is_not_asked_for_server_info():
    srv = _Server(ready_after=10**6)
    now = [0.0]

    def pause(s):
        now[0] += 1.0

    try:
        got = ready.read_server_info(Probe(srv.url), wait_s=3, clock=lambda: now[0], pause=pause)
    finally:
        srv.close()
    assert got.info is None and got.why == "/health did not answer 200 within 3 s"
    assert set(srv.paths) == {"/health"}


@pytest.mark.parametrize("raw", ["nan", "0", "-1", "3601", "soon"])
def test_a_healthy_wait_that_is_not_seconds_is_bad_input(raw):
    from escha_deploy.utils.errors import BadInput

    with pytest.raises(BadInput, match="^ESCHA_HEALTHY_WAIT: "):
        ready.healthy_wait_from_env({"ESCHA_HEALTHY_WAIT": raw})
    assert ready.healthy_wait_from_env({}) == ready.HEALTHY_WAIT_S
