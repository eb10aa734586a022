"""``bench`` and ``canary`` against HOSTILE servers (tests/hostile_servers.py: raw sockets on
127.0.0.1, not SGLang): a server that closes the connection mid-request is one "connection
lost" line and exit 4, never an httpx traceback; one that answers a byte a second, or without
end, is refused at the probe (exit 3) within --request-timeout."""

from __future__ import annotations

import time

import pytest

from hostile_servers import HostileServer
from inproc import CLEAN_LINE, run_main


def clean(err: str) -> list[str]:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert all(CLEAN_LINE.match(ln) for ln in lines), err
    return [ln for ln in lines if ln.startswith("error: ")]


@pytest.mark.parametrize("verb, extra", [("bench", ()), ("canary", ("--fill-tokens", "1000"))])
def test_a_server_closing_mid_request_is_one_line_exit_4(verb, extra):
    with HostileServer("reset-mid-request") as srv:
        r = run_main(verb, "-e", srv.url, "--request-timeout", "5", *extra)
    assert "Traceback" not in r.text and r.code == 4, r.text
    (error,) = clean(r.err)
    assert error == f"error: {srv.url}/v1/completions: connection lost (ReadError)", r.err
    assert "POST /v1/completions" in srv.requests


@pytest.mark.parametrize("kind, words", [
    ("slow-headers", "/health: no whole answer within 2 s"),
    ("slow-body", "/health: no whole answer within 2 s"),
    ("endless", "/health: the answer goes past 8,388,608 bytes"),
    # two codings: refused as such, never undone (each layer multiplies the size: MemoryError)
    ("gzip-twice", "/health: the answer is encoded 2 times (Content-Encoding: gzip, gzip)"),
])
def test_a_hostile_probe_is_refused_within_the_deadline(kind, words):
    with HostileServer(kind) as srv:
        t0 = time.monotonic()
        r = run_main("bench", "-e", srv.url, "--request-timeout", "2")
        took = time.monotonic() - t0
    assert "Traceback" not in r.text and r.code == 3, r.text
    (error,) = clean(r.err)
    assert error.startswith(f"error: {srv.url}: cannot probe the server ({srv.url}{words}"), r.err
    assert took <= 2 + 2, f"{took:.2f} s"


def test_the_servers_strings_reach_the_terminal_without_escapes():
    """Version, model name, model type and an error page carrying an OSC title, a CSI colour, a
    C1 CSI and rich markup: the probe keeps them as plain text, the error line is printable."""
    import asyncio

    from escha_deploy.bench.client import ServerClient

    async def probe():
        async with ServerClient(srv.url, request_timeout_s=5) as c:
            return await c.probe()

    with HostileServer("escapes") as srv:
        facts = asyncio.run(probe())
        r = run_main("bench", "-e", srv.url, "--request-timeout", "5")
    for text in (facts.version, facts.model, facts.model_type, *facts.architectures, facts.hicache_write_policy):
        assert text == "red[link=http://127.0.0.1/x]ok[/link]", text
    assert r.code == 4 and not any(c in r.text for c in "\x1b\x07\x9b"), r.text
    (error,) = clean(r.err)
    assert error == f"error: {srv.url}/v1/completions answered 500: red[link=http://127.0.0.1/x]ok[/link]"
