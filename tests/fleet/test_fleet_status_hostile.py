"""``fleet status`` against HOSTILE routers (tests/hostile_servers.py: raw sockets on
127.0.0.1, not SMG): each ends within --http-timeout with one line naming why the router's
answer was not read, exit 3 (the router does not answer), never a traceback or a hang."""

from __future__ import annotations

import time

import pytest

from hostile_servers import HostileServer
from inproc import CLEAN_LINE, run_main


def fleet_file(tmp_path, port: int):
    f = tmp_path / "f.yaml"
    f.write_text("name: lab\nboxes:\n  - {name: r1, address: 127.0.0.1, profile: rtx5060ti-tp2-fp8, host_ram: 64GiB,"
                 f" platform: linux}}\nrouter: {{box: r1, port: {port}}}\n")
    return f


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """One ``fleet status`` before any clock starts: a test's clock then counts the plan and the
    reading, not the first import of what the command uses (about 2 s on a loaded CI box)."""
    with HostileServer("redirect") as srv:
        assert run_main("fleet", "status", str(fleet_file(tmp_path_factory.mktemp("warm"), srv.port))).code == 3


@pytest.mark.parametrize("kind, words", [
    ("slow-headers", "no whole answer within 2 s"),
    ("slow-body", "no whole answer within 2 s"),
    ("endless", "the answer goes past 8,388,608 bytes"),
    ("redirect", "answered HTTP 302 Found"),
    ("nan", "not JSON"),
])
def test_a_hostile_router_is_one_line_within_the_deadline(tmp_path, warm, kind, words):
    with HostileServer(kind) as srv:
        f = fleet_file(tmp_path, srv.port)
        t0 = time.monotonic()
        r = run_main("fleet", "status", str(f), "--http-timeout", "2")
        took = time.monotonic() - t0
    assert "Traceback" not in r.text and r.code == 3, r.text
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and CLEAN_LINE.match(lines[0]), r.err
    assert lines[0].startswith(f"error: fleet status: the router at {srv.url} does not answer: {srv.url}/workers: {words}")
    assert took <= 2 + 2, f"{took:.2f} s"
