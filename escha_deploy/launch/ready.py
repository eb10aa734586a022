"""Ready wait: /health answers and one tiny real generate request succeeds.

A server that answers /health can still fail to serve (sglang#22779: after a SIGKILL and a
relaunch on the same ports, /health said 200 while requests hung), so ready means both:

1. ``GET /health`` returns 200 (``sglang/srt/entrypoints/http_server.py`` ``health``);
2. ``POST /generate`` with one prompt and ``max_new_tokens`` 1 returns 200 with a ``text``.

The probe reads through ``httpread`` (a total deadline per request, a size cap on the body, no
proxy from the environment, so no proxy variable can route it elsewhere: sglang#9814). While waiting, the server's log lines are matched against its startup
phases (``PHASES``) to feed a progress display.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from escha_deploy.utils import httpread

#: The ready wait polls at once, then after FIRST_POLL_S, each wait BACKOFF times the last, up
#: to POLL_S (seconds): 0.02, 0.03, 0.045, 0.068, 0.1, 0.1, ... A server that is up within a
#: few tens of milliseconds (the stand-in) is seen then, not after a fixed 0.1 s sleep; a real
#: SGLang start (tens of seconds) is still polled ten times a second, as a hand-written loop
#: would (docs/performance.md).
FIRST_POLL_S = 0.02
BACKOFF = 1.5
POLL_S = 0.1
#: Per-request deadlines (seconds, the whole answer: ``httpread.Policy.deadline_s``): /health is
#: cheap; the first generate may compile kernels.
HEALTH_TIMEOUT_S = 2.0
GENERATE_TIMEOUT_S = 60.0
#: Seconds for one ``/server_info`` answer (it asks every scheduler for its internal state).
SERVER_INFO_TIMEOUT_S = 10.0
#: How long the drift check waits for the server's first healthy answer (``/health`` 200) before
#: it reads ``/server_info`` (``read_server_info``), seconds. SGLang logs its ready line before a
#: cold server has compiled its kernels (Triton, JIT); meanwhile ``/health`` and ``/server_info``
#: do not answer. A cold first start on an H100 took 30-50 s past the ready line; this is more
#: than twice that. ``HEALTHY_WAIT_ENV`` (seconds, more than 0 and at most 3600) changes it.
HEALTHY_WAIT_S = 120.0
HEALTHY_WAIT_ENV = "ESCHA_HEALTHY_WAIT"
#: Seconds between two progress lines of that wait; its polls back off from ``FIRST_POLL_S``
#: to ``HEALTHY_POLL_S`` (a compiling server is asked twice a second, not ten times).
HEALTHY_PROGRESS_S = 5.0
HEALTHY_POLL_S = 0.5

#: Startup phases in the order SGLang 0.5.19 logs them, each with the message that starts it.
#: Sources: model_executor/model_runner.py load_model ("Load weight begin/end"),
#: mem_cache/memory_pool.py ("KV Cache is allocated", "Mamba Cache is allocated"),
#: mem_cache/pool_host/base.py and mamba.py ("Allocating ... host"),
#: model_executor/model_runner_components/cuda_graph_setup.py ("Capture ... begin"),
#: managers/scheduler.py ("max_total_num_tokens="), uvicorn ("Uvicorn running on"),
#: entrypoints/http_server.py _wait_and_warmup ("The server is fired up and ready to roll!").
PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("loading weights", re.compile(r"Load weight begin")),
    ("weights loaded", re.compile(r"Load weight end")),
    ("device KV and mamba pools", re.compile(r"KV Cache is allocated|Mamba Cache is allocated")),
    ("host KV and mamba pools (HiCache)", re.compile(r"Allocating .*(hierarchical KV host pool|"
                                                     r"hierarchical Mamba cache)")),
    ("capturing CUDA graphs", re.compile(r"Capture .*(cuda graph|CUDA graph).* begin|"
                                         r"Capture cuda graph begin")),
    ("scheduler up", re.compile(r"max_total_num_tokens=")),
    ("HTTP server up", re.compile(r"Uvicorn running on")),
    ("warmup done", re.compile(r"The server is fired up and ready to roll!")),
)


#: The phases after which the server may answer (its HTTP server is listening): a ``pause``
#: that follows the log ends its wait when one of them is logged.
WAKE_PHASES = ("HTTP server up", "warmup done")


def phase_of(line: str) -> str | None:
    """The startup phase a log line starts, or None."""
    for name, pat in PHASES:
        if pat.search(line):
            return name
    return None


@dataclass
class ReadyResult:
    """``ready``: both checks passed. ``health_ok`` / ``generate_ok``: what the last probe saw
    (None: never reached). ``seconds``: time spent waiting. ``reason``: why it stopped
    ("ready", "server exited", "timed out", "unauthorized": /generate answered 401, the API
    key refused). ``http_status``: the last /generate status (None: no answer)."""

    ready: bool
    health_ok: bool | None
    generate_ok: bool | None
    seconds: float
    reason: str
    http_status: int | None = None


class Probe:
    """HTTP checks against one server on loopback, read through the project's one reading
    policy for servers we do not control (``httpread``): each request has a total deadline
    (connecting, headers and the whole body; not per byte, so a server that sends one byte a
    second cannot hold the ready wait), a size cap on the body, no proxy read from the
    environment (sglang#9814) and no redirect followed.

    ``health_s``, ``generate_s``, ``server_info_s``: each request's deadline, seconds
    (default ``HEALTH_TIMEOUT_S``, ``GENERATE_TIMEOUT_S``, ``SERVER_INFO_TIMEOUT_S``).
    """

    def __init__(self, base_url: str, api_key: str | None = None, *, health_s: float = HEALTH_TIMEOUT_S,
                 generate_s: float = GENERATE_TIMEOUT_S, server_info_s: float = SERVER_INFO_TIMEOUT_S) -> None:
        self._base = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._deadlines = {"health": health_s, "generate": generate_s, "server_info": server_info_s}
        self.last_status: int | None = None

    def close(self) -> None:
        pass

    def _request(self, method: str, path: str, body: bytes | None, deadline_s: float) -> "httpread.Answer":
        """The whole answer to one request; raises ``httpread.ReadFailed`` (no whole answer
        within ``deadline_s`` seconds, none at all, or one past the size cap)."""
        from escha_deploy.utils import httpread

        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        return httpread.request(method, self._base + path, policy=httpread.Policy(deadline_s=deadline_s),
                                headers=headers, content=body)

    def health(self, deadline_s: float | None = None) -> bool:
        """``GET /health`` answered 200 within ``deadline_s`` seconds (default: the probe's)."""
        from escha_deploy.utils.httpread import ReadFailed

        try:
            return self._request("GET", "/health", None,
                                 self._deadlines["health"] if deadline_s is None else deadline_s).status == 200
        except ReadFailed:
            return False

    def generate(self) -> bool:
        """One tiny real request: SGLang's native ``/generate`` with ``max_new_tokens`` 1
        (sglang/srt/entrypoints/http_server.py ``generate_request``)."""
        import json

        from escha_deploy.utils.httpread import ReadFailed

        body = json.dumps({"text": "Hello", "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
        try:
            answer = self._request("POST", "/generate", body.encode(), self._deadlines["generate"])
            self.last_status = answer.status
            got = answer.json() if answer.status == 200 else None  # the bounded JSON reader (jsonio)
        except ReadFailed:
            return False
        return isinstance(got, dict) and "text" in got

    def server_info(self) -> dict | None:
        """SGLang's ``/server_info`` as a JSON object (sglang/srt/entrypoints/http_server.py
        ``server_info``), else its deprecated alias ``/get_server_info``; None when neither
        answers 200 with an object (a server without them, or not reachable)."""
        from escha_deploy.utils.httpread import ReadFailed

        for path in ("/server_info", "/get_server_info"):
            try:
                answer = self._request("GET", path, None, self._deadlines["server_info"])
                info = answer.json() if answer.status == 200 else None  # the bounded JSON reader (jsonio)
            except ReadFailed:
                continue
            if isinstance(info, dict):
                return info
        return None


def healthy_wait_from_env(environ: dict[str, str] | None = None) -> float:
    """``read_server_info``'s wait in seconds: ``ESCHA_HEALTHY_WAIT`` when set (a plain decimal
    number of seconds, more than 0 and at most 3600), else ``HEALTHY_WAIT_S``. Raises
    ``escha_deploy.utils.errors.BadInput`` (exit 2) naming the variable."""
    import os

    from escha_deploy.utils.units import seconds_from_env

    return seconds_from_env(os.environ if environ is None else environ, HEALTHY_WAIT_ENV, HEALTHY_WAIT_S)


@dataclass
class ServerInfoRead:
    """What ``read_server_info`` got: ``info`` (the ``/server_info`` object), else ``why`` it
    has none, in words a user reads after "/server_info not compared: "."""

    info: dict | None
    why: str | None = None


def read_server_info(probe: Probe, *, wait_s: float, progress: Callable[[str], None] = lambda line: None,
                     clock: Callable[[], float] = time.monotonic,
                     pause: Callable[[float], object] = time.sleep) -> ServerInfoRead:
    """The drift check's ``/server_info``, asked once the server has answered ``/health`` 200,
    waiting for that at most ``wait_s`` seconds (``HEALTHY_WAIT_S``; each ``/health`` request's
    deadline is cut to what is left, so the wait ends within ``wait_s`` plus one poll's
    bookkeeping). ``progress`` gets a line when the first ``/health`` fails and one every
    ``HEALTHY_PROGRESS_S`` seconds after, each saying what is waited for. A server already
    healthy (``up`` asks after its ready wait) costs one ``/health``. Never raises for HTTP
    errors."""
    start = clock()
    wait = FIRST_POLL_S
    next_note: float | None = None
    while True:
        left = wait_s - (clock() - start)
        if left <= 0:
            return ServerInfoRead(None, f"/health did not answer 200 within {wait_s:g} s")
        if probe.health(min(HEALTH_TIMEOUT_S, left)):
            break
        now = clock()
        if next_note is None:
            progress(f"waiting for the server's first healthy answer (/health 200) before reading /server_info, "
                     f"up to {wait_s:g} s (a cold SGLang compiles kernels after its ready line)")
            next_note = now + HEALTHY_PROGRESS_S
        elif now >= next_note:
            progress(f"still waiting for /health 200 before reading /server_info "
                     f"({now - start:.0f} s of {wait_s:g} s)")
            next_note = now + HEALTHY_PROGRESS_S
        left = wait_s - (clock() - start)
        if left > 0:
            pause(min(wait, left))
        wait = min(wait * BACKOFF, HEALTHY_POLL_S)
    info = probe.server_info()
    if info is None:
        return ServerInfoRead(None, "neither /server_info nor /get_server_info answered 200 with a JSON object "
                                    f"(within {probe._deadlines['server_info']:g} s each)")
    return ServerInfoRead(info)


def wait_ready(
    probe: Probe,
    *,
    timeout_s: float,
    alive: Callable[[], bool],
    new_lines: Callable[[], Iterable[str]] = lambda: (),
    on_phase: Callable[[str], None] = lambda phase: None,
    on_line: Callable[[str], None] = lambda line: None,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], object] | None = None,
) -> ReadyResult:
    """Poll until ready, the server dies (``alive()`` false), or ``timeout_s`` passes. The first
    poll is immediate; the waits between polls grow from ``FIRST_POLL_S`` to ``POLL_S``.

    ``new_lines()`` returns log lines seen since the last call; each is passed to ``on_line``
    and any phase it starts to ``on_phase``. ``pause(seconds)`` is the wait between polls
    (default ``time.sleep``); ``up`` passes one that ends early when the server logs one of
    ``WAKE_PHASES``, so a server that comes up between two polls is seen at once. Never
    raises for HTTP errors.
    """
    start = clock()
    health_ok: bool | None = None
    generate_ok: bool | None = None
    wait = FIRST_POLL_S

    def drain() -> None:
        for line in new_lines():
            on_line(line)
            ph = phase_of(line)
            if ph:
                on_phase(ph)

    while True:
        drain()
        if not alive():
            drain()
            return ReadyResult(False, health_ok, generate_ok, clock() - start, "server exited")
        health_ok = probe.health()
        if health_ok:
            generate_ok = probe.generate()
            if generate_ok:
                drain()
                return ReadyResult(True, True, True, clock() - start, "ready", probe.last_status)
            if probe.last_status == 401:  # sglang/srt/utils/auth.py: the key was refused; final
                drain()
                return ReadyResult(False, True, False, clock() - start, "unauthorized", 401)
        if clock() - start > timeout_s:
            return ReadyResult(False, health_ok, generate_ok, clock() - start, "timed out",
                               probe.last_status)
        (pause or time.sleep)(wait)
        wait = min(wait * BACKOFF, POLL_S)
