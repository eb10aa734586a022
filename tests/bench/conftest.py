"""Fixtures for the bench tests: STAND-IN SGLang servers (``standin_sglang.py``) on loopback."""

from __future__ import annotations

import pytest

from .standin_sglang import StandinConfig, StandinServer

#: Small sizes that keep each test well under a second per server, with rates slow enough
#: that the client's timing is dominated by the modelled compute, not by HTTP overhead.
FAST = dict(prefill_tps=100_000.0, decode_tps=1_000.0, load_back_tps=10_000_000.0)


@pytest.fixture
def standin():
    """``standin(**StandinConfig fields)`` starts a stand-in server; all are stopped after."""
    servers: list[StandinServer] = []

    def start(**kw) -> StandinServer:
        cfg = StandinConfig(**{**FAST, **kw})
        srv = StandinServer(cfg).start()
        servers.append(srv)
        return srv

    yield start
    for s in servers:
        s.stop()
