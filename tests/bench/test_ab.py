"""``--hicache-ab`` through the ``Launcher`` interface, with a STAND-IN launcher that starts
stand-in servers (the docker launcher is tested in tests/launch)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from escha_deploy.bench import ab
from escha_deploy.bench.models import WorkloadSpec
from escha_deploy.utils.errors import Failed, Refused

from .conftest import FAST
from .standin_sglang import StandinConfig, StandinServer

SPEC = WorkloadSpec(seed=1, prefixes=3, prefix_tokens=1000, prefill_tokens=2000,
                    decode_tokens=20, answer_tokens=4)


class StandinLauncher:
    """STAND-IN launcher: ``start`` runs a stand-in server with HiCache as asked."""

    def __init__(self, fail_on: bool | None = None) -> None:
        self.calls: list[tuple] = []
        self.server: StandinServer | None = None
        self.fail_on = fail_on

    def start(self, profile: str, *, hicache: bool) -> str:
        self.calls.append(("start", profile, hicache))
        cfg = StandinConfig(hicache=hicache, device_tokens=1500, host_tokens=20_000, **FAST)
        self.server = StandinServer(cfg).start()
        if self.fail_on is hicache:
            self.server.cfg.max_req_input_len = 10  # every real request now fails (HTTP 400)
        return self.server.url

    def stop(self) -> None:
        self.calls.append(("stop",))
        assert self.server is not None
        self.server.stop()


def test_off_then_on_same_workload():
    launcher = StandinLauncher()
    assert isinstance(launcher, ab.Launcher)
    report = asyncio.run(ab.run_ab(launcher, "rtx5060ti-tp2-fp8", SPEC))
    assert launcher.calls == [("start", "rtx5060ti-tp2-fp8", False), ("stop",),
                              ("start", "rtx5060ti-tp2-fp8", True), ("stop",)]
    assert report.mode == "hicache-ab"
    assert [r.facts.label for r in report.runs] == ["off", "on"]
    assert report.runs[0].first_pass.prompt_tokens == report.runs[1].first_pass.prompt_tokens
    assert report.runs[1].second_pass.cached.host_tokens


def test_server_is_stopped_when_a_run_fails():
    launcher = StandinLauncher(fail_on=True)
    with pytest.raises(Failed):
        asyncio.run(ab.run_ab(launcher, "p", SPEC))
    assert launcher.calls[-1] == ("stop",) and len(launcher.calls) == 4


def test_without_a_launcher_hicache_ab_refuses(monkeypatch):
    import escha_deploy.launch as launch_pkg

    monkeypatch.delattr(launch_pkg, "bench_launcher", raising=False)
    with pytest.raises(Refused, match="bench_launcher"):
        ab.load_launcher()


def test_cli_hicache_ab_uses_the_wired_launcher(cli, monkeypatch):
    import escha_deploy.launch as launch_pkg

    launcher = StandinLauncher()
    monkeypatch.setattr(launch_pkg, "bench_launcher", lambda kind="auto", **_: launcher, raising=False)
    res = cli("bench", "--hicache-ab", "--profile", "p", "--prefixes", "3", "--prefix-tokens",
              "1000", "--prefill-tokens", "2000", "--decode-tokens", "20", "--format", "json")
    assert res.code == 0, res.err
    import json

    data = json.loads(res.out)
    assert data["mode"] == "hicache-ab" and len(data["runs"]) == 2
    assert [c[0] for c in launcher.calls] == ["start", "stop", "start", "stop"]


STANDIN = Path(__file__).with_name("standin_sglang.py")


def test_the_native_launcher_runs_serve_off_then_on_and_stops_each(tmp_path):
    """``NativeBenchLauncher`` with the STAND-IN server's script in place of ``escha-deploy``
    (no GPU here: the real ``serve --profile`` runs in tests/bench/test_ab_gpu.py): the same
    argv ``serve`` gets, HiCache off then on, each process gone after its run."""
    import sys

    from escha_deploy.launch import NativeBenchLauncher

    launcher = NativeBenchLauncher(command=[sys.executable, str(STANDIN)], log_dir=str(tmp_path),
                                   ready_timeout_s=60, stop_timeout_s=30)
    seen = []
    real_start = launcher.start

    def start(profile, *, hicache):
        url = real_start(profile, hicache=hicache)
        seen.append(launcher._proc)
        return url

    launcher.start = start  # type: ignore[method-assign]
    report = asyncio.run(ab.run_ab(launcher, "p", SPEC))
    assert [r.facts.hicache for r in report.runs] == [False, True]
    assert all(p.poll() is not None for p in seen) and len(seen) == 2
    assert sorted(x.name for x in tmp_path.iterdir()) == ["serve-hicache-off.log", "serve-hicache-on.log"]


def test_the_native_launcher_names_a_serve_that_exits_before_ready(tmp_path):
    import sys

    from escha_deploy.launch import NativeBenchLauncher

    launcher = NativeBenchLauncher(command=[sys.executable, "-c", "import sys; print('no such profile: p'); sys.exit(2)"],
                                   log_dir=str(tmp_path), ready_timeout_s=30)
    with pytest.raises(Refused, match="refused it \\(exit 2\\): no such profile: p"):
        launcher.start("p", hicache=True)


def test_auto_takes_native_without_a_daemon(monkeypatch):
    from escha_deploy import launch

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert isinstance(launch.bench_launcher("auto"), launch.NativeBenchLauncher)
    assert isinstance(launch.bench_launcher("docker"), launch.DockerBenchLauncher)
