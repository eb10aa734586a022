"""The images for real, through a real Docker daemon (.ci/test starts it and makes the local
Debian base with the real sglang wheel): a series that no longer applies fails the build and
names the patch and file; the built image verifies inside, carries its labels and description,
and the layer that applies the series stays under 2 MB."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]
BASE = os.environ.get("ESCHA_TEST_BASE_IMAGE", "escha-sglang-base:ci")
IMAGE = os.environ.get("ESCHA_TEST_HICACHE_IMAGE", "escha-sglang:ci-hicache")


def _client():
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # no daemon here: skip, never fake
        pytest.skip(f"no Docker daemon ({exc}); .ci/test starts one")
    return client


def _need_image(client, name):
    import docker

    try:
        return client.images.get(name)
    except docker.errors.ImageNotFound:
        pytest.skip(f"image {name} not built (.ci/test builds it)")


def _run(image: str, *cmd: str) -> subprocess.CompletedProcess:
    """``docker run --rm``; retried once when the container was killed from outside (exit 137:
    other suites sharing a developer's daemon clean up containers; CI runs suites in turn)."""
    argv = ["docker", "run", "--rm", "--entrypoint", cmd[0], image, *cmd[1:]]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if proc.returncode == 137 and not proc.stdout and not proc.stderr:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    return proc


STALE = """\
Subject: an overlay made against another sglang (its context is not in 0.5.19)
Capabilities: int2-kv

--- a/sglang/srt/mem_cache/pool_host/mha.py
+++ b/sglang/srt/mem_cache/pool_host/mha.py
@@ -1,2 +1,2 @@
-this line is not in sglang 0.5.19
+neither is this one
 nor this
"""


def test_build_fails_naming_patch_and_file_when_series_no_longer_applies(tmp_path):
    client = _client()
    _need_image(client, BASE)
    ov = REPO / "build" / "overlays-ci-stale"
    shutil.rmtree(ov, ignore_errors=True)
    ov.mkdir(parents=True)
    (ov / "9999-stale.patch").write_text(STALE)
    try:
        proc = subprocess.run(
            ["escha-deploy", "build", "--base-image", BASE, "--python-version", "3.11",
             "--overlay-dir", "build/overlays-ci-stale", "--tag", "escha-sglang:ci-stale"],
            capture_output=True, text=True, timeout=600, cwd=REPO)
    finally:
        shutil.rmtree(ov, ignore_errors=True)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert ("error: 9999-stale.patch: sglang/srt/mem_cache/pool_host/mha.py: hunk #1"
            in proc.stderr), proc.stderr[-2000:]


def test_image_verifies_and_describes_itself():
    client = _client()
    image = _need_image(client, IMAGE)
    labels = image.labels
    assert labels["io.escha.runtime.capabilities"] == (
        "hicache-host-reserve-env,hicache-host-allocator,transfer-geometry-check,"
        "hicache-host-mamba-slots")
    verify = _run(IMAGE, "escha-deploy", "runtime", "verify", "--format", "json")
    assert verify.returncode == 0, verify.stderr
    assert json.loads(verify.stdout)["ok"]
    desc = json.loads(_run(IMAGE, "cat", "/etc/escha/runtime.json").stdout)
    assert desc["capabilities"] == labels["io.escha.runtime.capabilities"].split(",")
    assert desc["sglang_version"] == "0.5.19" and desc["python"].startswith("3.11")


def test_one_byte_changed_inside_the_image_is_named():
    client = _client()
    _need_image(client, IMAGE)
    script = (
        "set -e; f=$(ls -d /opt/sglang/venv/lib/python3*/site-packages/sglang)/srt/mem_cache/"
        "pool_host/mla.py; printf '#' >> \"$f\"; escha-deploy runtime verify"
    )
    proc = _run(IMAGE, "sh", "-c", script)
    assert proc.returncode == 3
    assert "error: changed: sglang/srt/mem_cache/pool_host/mla.py" in proc.stderr


def test_series_layer_is_small():
    client = _client()
    image = _need_image(client, IMAGE)
    layers = [h for h in image.history() if "runtime apply" in (h.get("CreatedBy") or "")]
    assert len(layers) == 1
    assert layers[0]["Size"] < 2_000_000, layers[0]["Size"]


def test_stock_image_builds_unpatched_and_describes_no_capabilities():
    client = _client()
    _need_image(client, BASE)
    tag = f"escha-sglang:ci-stock-{os.environ.get('ESCHA_TEST_RUN') or os.getpid()}"  # this run's: it removes it
    proc = subprocess.run(
        ["escha-deploy", "build", "--stock", "--base-image", BASE, "--python-version", "3.11",
         "--tag", tag, "--format", "json"],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    try:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout)["labels"]["io.escha.image"] == "stock"
        describe = _run(tag, "escha-deploy", "runtime", "describe")
        assert describe.returncode == 3 and "stock runtime" in describe.stderr
        inventory = _run(tag, "escha-deploy", "runtime", "inventory", "--format", "json")
        assert inventory.returncode == 0, inventory.stderr
        assert json.loads(inventory.stdout)["matches_committed"] is True
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
