"""A Hugging Face cache snapshot's launch, run for real: the container (the Debian test base, a
stand-in for the server image) gets the dry run's bind mounts and reads config.json at
model.path through the snapshot's link into the mounted blobs/."""

from __future__ import annotations

import json
import os

import pytest

from tests.hf_layout import CONFIG, hf_cache, snapshot

from .conftest import run_cli

pytestmark = pytest.mark.docker


def test_the_container_reads_config_json_through_the_mounts(docker_client, base_image, tmp_path):
    from docker.types import Mount

    snap = snapshot(hf_cache(tmp_path / "hub"))
    r = run_cli("up", "-p", "rtx5060ti-tp2-fp8", "--set", f"model.host_dir={snap}", "--dry-run", "-f", "json",
                env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"})
    spec = json.loads(r.stdout)
    binds = [m for m in spec["container"]["mounts"] if m["type"] == "bind" and os.path.isdir(m["source"])]
    assert [m["target"] for m in binds] == ["/models/Qwen3.x-27B-GPTQ-Int4", "/blobs"]
    # detached, waited, then its logs read, then removed: a run(remove=True) of a container this short
    # once came back with empty output under CI's load (docker-py reads the logs after the exit)
    box = docker_client.containers.run(
        base_image, ["cat", "/models/Qwen3.x-27B-GPTQ-Int4/config.json"], detach=True,
        mounts=[Mount(target=m["target"], source=m["source"], type="bind", read_only=True) for m in binds])
    try:
        assert box.wait(timeout=120)["StatusCode"] == 0, box.logs(stderr=True)
        out = box.logs(stdout=True, stderr=False)
    finally:
        box.remove(force=True)
    assert json.loads(out) == CONFIG
