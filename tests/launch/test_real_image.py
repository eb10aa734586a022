"""The real patched image (Dockerfile.hicache, built by issue 3's scripts on the Debian test
base, which carries SGLang 0.5.19 without its dependencies) started directly with its `serve`
entrypoint and the documented test switch that skips the GPU preflight: it plans inside the
container, starts SGLang's child process, which fails there (no numpy/torch, no GPU), and the
diagnosis names the cause. Nothing is left running."""

from __future__ import annotations

import json
import os

import pytest

from .conftest import RUN

pytestmark = pytest.mark.docker

#: The image .ci/test builds (tests/runtime uses the same variable).
IMAGE = os.environ.get("ESCHA_TEST_HICACHE_IMAGE", "escha-sglang:ci-hicache")


def test_serve_in_real_image_reaches_sglang_child_and_diagnoses(docker_client, tmp_path, no_leaks):
    from docker.errors import ImageNotFound

    try:
        docker_client.images.get(IMAGE)
    except ImageNotFound:
        pytest.skip(f"{IMAGE} not built here (scripts/make-base-image.sh + Dockerfile.hicache)")
    from docker.types import Mount

    key = "sk-escha-real-image-0123456789"
    kf = tmp_path / "api_key"
    kf.write_text(key + "\n")
    # serve refuses a model folder without config.json or weights (exit 2) before it starts
    # SGLang; these empty files pass that check, and the child fails at import, before loading
    model = tmp_path / "model"
    model.mkdir()
    from escha_deploy.profile import load_profile
    from tests.oracle.cases import config_json

    (model / "config.json").write_text(json.dumps(config_json(load_profile("rtx5060ti-tp2-fp8").model.architecture)))
    (model / "model.safetensors").write_bytes(b"")
    c = docker_client.containers.run(
        IMAGE, ["--profile", "rtx5060ti-tp2-fp8", "--set", "container.api_key_file=/host/api_key"],
        detach=True, name=f"escha-test-real-image-{RUN}",
        cap_add=["IPC_LOCK"],  # serve checks memlock against the pinned pools without it (up adds it)
        environment={"ESCHA_SKIP_GPU_PREFLIGHT": "1", "ESCHA_SERVE_MODE": "container"},
        mounts=[Mount("/run/secrets/escha_api_key", str(kf), type="bind", read_only=True),
                Mount("/models/Qwen3.x-27B-GPTQ-Int4", str(model), type="bind", read_only=True)],
        labels={"io.escha.test": "real-image"},
    )
    try:
        code = c.wait(timeout=120)["StatusCode"]
        log = c.logs().decode()
        c.reload()
        shown = str(c.attrs["Config"]) + str(c.attrs["Args"]) + str(c.attrs["Path"])
    finally:
        c.remove(force=True)
    assert key not in shown
    assert code == 4, log
    assert "plan ok" in log and "starting SGLang" in log  # planned inside the container
    assert "sglang/__init__.py" in log  # SGLang's own code ran in the child
    assert "[runtime-module-missing]" in log and "exited with code 1" in log
    assert key not in log
