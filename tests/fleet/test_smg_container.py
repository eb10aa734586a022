"""The router image built from PyPI's smg wheel (``fleet build-router``), run by ``fleet up
--router`` with ``router.run: container`` on the real dockerd, in front of two STAND-IN SGLang
servers (no GPU here). Checks the key never reaches the container's command, labels or env."""

from __future__ import annotations

import json
import os
import subprocess

import docker
import httpx
import pytest
import yaml

from escha_deploy.fleet.model import load_fleet
from escha_deploy.fleet.router_image import build_router_image
from escha_deploy.fleet.router_run import container_name, stop_router

from .test_smg_router import KEY, StandinConfig, StandinServer, cli, completions, fleet_file, free_port

pytestmark = pytest.mark.docker
TAG = f"escha-smg:ci-{os.environ.get('ESCHA_TEST_RUN') or os.getpid()}"  # this run's tag


@pytest.fixture(scope="module")
def router_image():
    """The router image under this run's tag, removed after the module (other runs' tags, and
    layers another tag still holds, stay: ``images.remove`` only prunes what nothing else names)."""
    base = os.environ.get("ESCHA_TEST_BASE_IMAGE", "escha-sglang-base:ci")
    image_id = build_router_image(base, TAG)
    yield image_id
    docker.from_env().images.remove(TAG, force=True)


def test_router_container_in_front_of_two_workers(tmp_path, router_image):
    assert router_image.startswith("sha256:")
    # port 0: the kernel picks and binds at once (a free_port() probe can lose its port to a
    # parallel test before the server binds it)
    servers = [StandinServer(StandinConfig(load_seconds=2.0)).start(0) for _ in range(2)]
    ports = [s.port for s in servers]
    router_port = free_port()
    path = fleet_file(tmp_path, ports, "cache_aware", router_port)
    doc = yaml.safe_load(path.read_text())
    doc["router"].update({"run": "container", "image": TAG})
    path.write_text(yaml.safe_dump(doc))
    loaded = load_fleet(path)
    try:
        assert cli("fleet", "up", str(path), "--router") == 0
        c = docker.from_env().containers.get(container_name(loaded))
        inspect = json.dumps(c.attrs)
        assert KEY not in inspect  # not in Cmd, Env, Labels or Mounts
        assert c.labels["io.escha.role"] == "router" and c.attrs["HostConfig"]["NetworkMode"] == "host"
        r = httpx.post(f"http://127.0.0.1:{router_port}/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                       json={"model": "standin-hybrid-27b", "prompt": "hello there", "max_tokens": 2}, timeout=30)
        assert r.status_code == 200
        assert sum(completions(s) for s in servers) == 1
        assert KEY not in c.logs().decode(errors="replace")
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert KEY not in ps
    finally:
        stop_router(loaded)
        for s in servers:
            s.stop()
