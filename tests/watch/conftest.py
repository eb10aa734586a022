"""Fixtures for ``status``: STAND-IN SGLang servers (tests/bench/standin_sglang.py: no GPU
here) on 127.0.0.1 and a free port, found by ``status`` through a native ``serve`` state file
in a per-test runtime folder (``XDG_RUNTIME_DIR``)."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from bench.standin_sglang import StandinConfig, StandinServer
from escha_deploy.launch.planview import PlanView
from escha_deploy.launch.serve_state import ServeState, write_state

#: Rates that keep a request well under a millisecond of modelled compute.
FAST = dict(prefill_tps=1e7, decode_tps=1e6, load_back_tps=1e9)


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    """A private runtime folder for state files; the profile name is unique per test."""
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(d))
    return d


@pytest.fixture
def box(runtime):
    """``box(plan=dict, **StandinConfig)`` -> (server, profile name): a stand-in and the state
    file ``serve`` would write for it (pid: this test process, which is alive)."""
    servers: list[StandinServer] = []

    def start(plan: dict | None = None, **kw) -> tuple[StandinServer, str]:
        srv = StandinServer(StandinConfig(**{**FAST, **kw})).start()
        servers.append(srv)
        name = f"watch-{uuid.uuid4().hex[:8]}"
        view = PlanView(**{"profile": name, "tp_size": srv.cfg.tp_size, "hicache_enabled": srv.cfg.hicache,
                           "host_kv_tokens": srv.cfg.host_tokens, "host_kv_bytes": srv.cfg.host_tokens * 4096,
                           "page_cache_floor_bytes": 1, **(plan or {})})
        port = int(srv.url.rsplit(":", 1)[1])
        write_state(ServeState(pid=os.getpid(), port=port, profile=name, plan_digest="d" * 64,
                               started_at=time.time(), plan=view))
        return srv, name

    yield start
    for s in servers:
        s.stop()
