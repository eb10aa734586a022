"""``bench --hicache-ab`` and ``up --canary`` end to end through the real launcher on a real
dockerd, with a STAND-IN server image: the local Debian base plus the bench's stand-in SGLang
server (tests/bench/standin_sglang.py) as the container's ``escha-deploy`` command, and a
STAND-IN test profile that needs no GPU. Nothing here is a real SGLang server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .conftest import RUN, STANDIN_PROFILE, _free_port, run_cli

pytestmark = pytest.mark.docker

BENCH_STANDIN = Path(__file__).resolve().parents[1] / "bench" / "standin_sglang.py"
#: This run's own names and port (conftest.RUN): two copies of the suite share one daemon, and one
#: run's module teardown must never remove the other's image or meet its container.
NAME = f"bench-standin-{RUN}"
IMAGE = f"escha-bench-standin:test-{RUN}"
PORT = _free_port()
# A small two-tier cache so a test workload evicts from the device pool into the host pool.
STANDIN_CONFIG = {"device_tokens": 12000, "host_tokens": 60000, "prefill_tps": 400000.0,
                  "decode_tps": 4000.0}


def _build(docker_client, base_image, tmp_path_factory, tag: str, config: dict) -> str:
    ctx = tmp_path_factory.mktemp("bench-standin")
    shutil.copy(BENCH_STANDIN, ctx / "standin_sglang.py")
    cfg = json.dumps(config).replace('"', '\\"')
    (ctx / "Dockerfile").write_text(
        "ARG BASE\nFROM ${BASE}\nCOPY standin_sglang.py /standin/standin_sglang.py\n"
        "RUN printf '#!/bin/sh\\nexec python3 -u /standin/standin_sglang.py --host 0.0.0.0 "
        f"--port {PORT} --config \"{cfg}\" \"$@\"\\n' > /usr/local/bin/escha-deploy "
        "&& chmod +x /usr/local/bin/escha-deploy\n"
        'LABEL io.escha.runtime.capabilities="hicache-host-reserve-env,hicache-host-allocator,'
        'transfer-geometry-check" io.escha.standin="true"\n')
    docker_client.images.build(path=str(ctx), tag=tag, buildargs={"BASE": base_image}, rm=True, forcerm=True)
    return tag


@pytest.fixture(scope="module")
def bench_image(docker_client, base_image, tmp_path_factory):
    yield _build(docker_client, base_image, tmp_path_factory, IMAGE, STANDIN_CONFIG)
    docker_client.images.remove(IMAGE, force=True)


@pytest.fixture(scope="module")
def pruning_image(docker_client, base_image, tmp_path_factory):
    """The stand-in with sglang#33713's behaviour: evicted hybrid prefixes are dropped, never
    kept in the host tier, so no host hit can ever prove a restore."""
    tag = f"escha-bench-standin:prune-{RUN}"
    yield _build(docker_client, base_image, tmp_path_factory, tag, {**STANDIN_CONFIG, "prune_on_evict": True})
    docker_client.images.remove(tag, force=True)


@pytest.fixture
def profile(tmp_path, bench_image):
    p = tmp_path / "bench-standin.yaml"
    p.write_text(f"extends: {STANDIN_PROFILE}\nname: {NAME}\n"
                 f"container:\n  image: {bench_image}\n  port: {PORT}\n")
    return str(p)


def test_hicache_ab_runs_both_servers_through_the_launcher(profile, tmp_path, no_leaks):
    out = tmp_path / "ab.json"
    r = run_cli("bench", "--hicache-ab", "--profile", profile, "--prefixes", "4", "--prefix-tokens", "5000",
                "--prefill-tokens", "2000", "--decode-tokens", "16", "--answer-tokens", "4", "--format", "json",
                timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    out.write_text(r.stdout)
    runs = report["runs"]
    assert [run["facts"]["hicache"] for run in runs] == [False, True]  # as each server reports it
    off, on = runs
    # 4 x 5000 tokens overflow the 12,000-token device pool: off recomputes the evicted
    # prefixes on the second pass, on restores them from the host tier
    assert off["second_pass"]["cached"]["host_tokens"] == 0
    assert on["second_pass"]["cached"]["host_tokens"] > 0
    assert off["second_pass"]["cached"]["share"] < on["second_pass"]["cached"]["share"]
    assert "HiCache on" in r.stderr


def test_up_canary_passes_on_a_correct_server(profile, no_leaks):
    r = run_cli("up", "--profile", profile, "--detach", "--canary", timeout=300)
    try:
        assert r.returncode == 0, r.stderr[-2000:]
        assert "canary" in r.stderr.lower()
    finally:
        assert run_cli("down", "--profile", NAME).returncode == 0


def test_up_canary_is_inconclusive_without_host_hits(tmp_path, pruning_image, no_leaks):
    """No host hit proves the second answer (sglang#33713): exit 5, never 'pass'."""
    p = tmp_path / "prune.yaml"
    p.write_text(f"extends: {STANDIN_PROFILE}\nname: {NAME}\ncontainer:\n  image: {pruning_image}\n"
                 f"  port: {PORT}\n")
    r = run_cli("up", "--profile", str(p), "--detach", "--canary", timeout=300)
    try:
        assert r.returncode == 5, r.stderr[-2000:]
        assert "33713" in r.stderr
    finally:
        assert run_cli("down", "--profile", NAME).returncode == 0


def test_up_canary_refuses_a_server_without_hicache(profile, no_leaks):
    r = run_cli("up", "--profile", profile, "--detach", "--canary", "--set", "hicache.enabled=false", timeout=300)
    try:
        assert r.returncode == 3, r.stderr[-2000:]
        assert "without --enable-hierarchical-cache" in r.stderr
    finally:
        assert run_cli("down", "--profile", NAME).returncode == 0
