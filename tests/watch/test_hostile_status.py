"""``status`` against HOSTILE servers (tests/hostile_servers.py: raw sockets on 127.0.0.1, not
SGLang), found through a native ``serve`` state file as a real server is: ``--check`` ends
within ``--http-timeout`` + 2 s of its own wall clock with one named error and exit 5;
``--watch --format json`` and ``--record`` write JSON (never NaN) and name what was not a
number."""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest

from escha_deploy.watch.record import read_record
from escha_deploy.launch.serve_state import ServeState, write_state
from hostile_servers import HostileServer
from inproc import CLEAN_LINE, run_main

NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
DEADLINE_S = 2.0


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """One ``status --check`` against a server that answers at once, before any clock starts:
    a test's clock then counts the reading, not the first import of what ``status`` uses
    (httpx, rich, prometheus_client, the profile models: about 1 s on a loaded CI box)."""
    run = tmp_path_factory.mktemp("warm")
    with HostileServer("redirect") as srv:
        folder = run / f"escha-deploy-{os.getuid()}"
        folder.mkdir(mode=0o700)
        write_state(ServeState(pid=os.getpid(), port=srv.port, profile="warm", started_at=time.time()), folder)
        r = run_main("status", "--check", "--interval", "0.05", env={**NO_DOCKER, "XDG_RUNTIME_DIR": str(run)})
    assert r.code == 5, r.text


@pytest.fixture
def hostile(runtime, warm):
    """``hostile(kind)`` -> (server, profile name): a hostile server and the state file a
    native ``serve`` would have written for it (pid: this test process, which is alive)."""
    servers: list[HostileServer] = []

    def start(kind: str) -> tuple[HostileServer, str]:
        srv = HostileServer(kind).start()
        servers.append(srv)
        name = f"hostile-{uuid.uuid4().hex[:8]}"
        write_state(ServeState(pid=os.getpid(), port=srv.port, profile=name, started_at=time.time()))
        return srv, name

    yield start
    for s in servers:
        s.stop()


@pytest.mark.parametrize("kind, named", [
    ("slow-body", "server not answering: {url}/metrics: no whole answer within 2 s"),
    ("slow-headers", "server not answering: {url}/metrics: no whole answer within 2 s"),
    ("huge", "{url}/metrics: the answer is 49,999,982 bytes; at most 8,388,608 are read"),
    ("huge-chunked", "{url}/metrics: the answer goes past 8,388,608 bytes"),
    ("endless", "{url}/metrics: the answer goes past 8,388,608 bytes"),
    ("nan", '{url}/metrics: not a usable number (NaN, Inf, or past 2**53): '
            'sglang:cached_tokens_total{{cache_source="device"}} = nan'),
    ("overflow", '{url}/metrics: not a usable number (NaN, Inf, or past 2**53): '
                 'sglang:cached_tokens_total{{cache_source="device"}} = 1e+308'),
    ("redirect", "{url}/metrics answered HTTP 302 Found"),
])
def test_check_ends_within_its_deadline_with_a_named_error(hostile, kind, named):
    srv, name = hostile(kind)
    t0 = time.monotonic()
    r = run_main("status", "--profile", name, "--check", "--http-timeout", str(DEADLINE_S), "--interval", "0.05",
                 env=NO_DOCKER)
    took = time.monotonic() - t0
    assert "Traceback" not in r.text
    assert r.code == 5, r.text
    assert took <= DEADLINE_S + 2, f"{took:.2f} s"
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: status --check: {name}: " + named.format(url=srv.url)), r.err
    assert all(CLEAN_LINE.match(ln) for ln in r.err.splitlines() if ln.strip()), r.err
    assert "no alerts" not in r.out  # never "no alerts" over what could not be read


def test_check_exit_5_is_not_no_alerts_over_nan(hostile):
    """The table shows the reason instead of "nan of nan prompt tokens" and "no alerts"."""
    srv, name = hostile("nan")
    r = run_main("status", "--profile", name, "--check", "--interval", "0.05", env=NO_DOCKER)
    assert r.code == 5 and "nan of nan" not in r.out and "no alerts" not in r.out
    assert "metrics: " in r.out and "not a usable number" in r.out and "no server alerts judged" in r.out


def test_watch_json_and_record_write_json_over_nan(hostile, tmp_path):
    srv, name = hostile("nan")
    rec = tmp_path / "rec.jsonl"
    r = run_main("status", "--profile", name, "--watch", "--format", "json", "--count", "2", "--interval", "0.05",
                 "--record", str(rec), env=NO_DOCKER)
    assert r.code == 0, r.text
    def refuse(constant: str):
        raise AssertionError(f"{constant} in the JSON output")

    looks = [json.loads(line, parse_constant=refuse) for line in r.out.splitlines()]
    assert len(looks) == 2
    assert all("not a usable number" in look[0]["metrics_error"] for look in looks)
    recorded = read_record(rec)  # the bounded reader refuses NaN and Infinity
    assert len(recorded) == 2 and recorded[0]["targets"][0]["server"] is None


def test_a_look_that_overflows_is_written_as_null_with_a_warning(tmp_path):
    """A row value that is not a JSON number (here: summed past a double's range) is null in
    --record and named in the warning status prints; --check counts it as not proven."""
    from escha_deploy.watch import record

    bad = record.append(tmp_path / "r.jsonl", {"t": 1.0, "targets": [{"server": {"share": float("nan"),
                                                                               "n": [1.0, float("inf")]}}]})
    assert bad == ["targets.0.server.share", "targets.0.server.n.1"]
    (look,) = read_record(tmp_path / "r.jsonl")
    assert look["targets"][0]["server"] == {"share": None, "n": [1.0, None]}


def test_a_state_file_profile_with_escapes_never_reaches_the_terminal(runtime):
    (runtime / f"escha-deploy-{os.getuid()}").mkdir(mode=0o700)
    path = runtime / f"escha-deploy-{os.getuid()}" / "serve-9.json"
    path.write_text(json.dumps({"pid": os.getpid(), "port": 9, "started_at": time.time(),
                                "profile": "\u001b]0;PWNED\u0007\u001b[31mred"}))
    r = run_main("status", env=NO_DOCKER)
    assert r.code == 3 and "\x1b" not in r.text and "\x07" not in r.text
    assert f"status: {path}: unreadable state file (profile: String should match pattern" in r.err


def test_a_rate_that_overflows_is_null_named_and_unproven(hostile):
    """Usable numbers whose quotient is not (9e15 bytes in a subnormal 1e-320 s): the load-back
    rate is inf; --format json writes null there, a warning names it, --check exits 5."""
    srv, name = hostile("tiny-seconds")
    r = run_main("status", "--profile", name, "--check", "--interval", "0.05", "--format", "json", env=NO_DOCKER)
    assert r.code == 5, r.text
    (row,) = json.loads(r.out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON output"))
    assert row["server"]["ranks"]["0"]["load_back_gb_per_s"] is None
    assert (f"warning: status: {name}: server.ranks.0.load_back_gb_per_s is not a number (NaN or Inf); "
            "shown as null") in r.err.splitlines()
    assert (f"error: status --check: {name}: server.ranks.0.load_back_gb_per_s is not a number (NaN or Inf)"
            in r.err.splitlines()), r.err
    assert all(CLEAN_LINE.match(ln) for ln in r.err.splitlines() if ln.strip()), r.err
