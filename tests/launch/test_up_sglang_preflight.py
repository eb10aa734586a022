"""`up`'s check ``sglang pre-flight`` (escha_deploy/launch/image_preflight.py): SGLang's own
pre-flight in a throw-away container of the profile's image, on the real Docker daemon. What it
says when the image is absent (it runs at `up`) and when the image's SGLang does not import (CI's
images install SGLang without its dependencies: reported, never passed); a host `plan`, where
SGLang does not import, says the pre-flight runs at `up`. SGLang's verdict through the same
container is in tests/launch/test_sglang_preflight_image.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from escha_deploy.profile import load_profile
from tests.oracle.cases import config_json

from .conftest import STANDIN_PROFILE, run_cli


def _check(stdout: str) -> dict:
    return next(c for c in json.loads(stdout)["checks"] if c["name"] == "sglang pre-flight")


def test_host_plan_says_the_pre_flight_runs_at_up(cli):
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8")
    assert r.code == 0, r.err
    assert "plan: SGLang's own pre-flight (argument resolution, model config, attention backend" in r.out
    assert "runs at `up` (and `serve`)" in r.out and "SGLang does not import here" in r.out


def test_not_needed_without_gpus_unless_asked(monkeypatch):
    from types import SimpleNamespace

    from escha_deploy.launch import image_preflight as ip

    prep = SimpleNamespace(args={"device_requests": []})
    monkeypatch.delenv(ip.PREFLIGHT_ENV, raising=False)
    assert "no GPUs requested" in (ip.not_needed(prep) or "")
    monkeypatch.setenv(ip.PREFLIGHT_ENV, "1")
    assert ip.not_needed(prep) is None
    monkeypatch.setenv(ip.PREFLIGHT_ENV, "0")
    assert ip.not_needed(SimpleNamespace(args={"device_requests": [{"count": -1}]})) == f"{ip.PREFLIGHT_ENV}=0"


@pytest.mark.docker
def test_dry_run_says_it_runs_at_up_when_the_image_is_absent(docker_client, tmp_path, no_leaks):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "ESCHA_SGLANG_PREFLIGHT": "1"}
    image = "escha-test-no-such-image:absent"
    dry = run_cli("up", "-p", str(STANDIN_PROFILE), "--set", f"container.image={image}", "--dry-run",
                  "--format", "json", env=env)
    assert dry.returncode == 3, dry.stderr  # the image check refuses
    c = _check(dry.stdout)
    assert c["state"] == "not run" and c["detail"] == f"it runs at `up`, in a container of {image}, which is not present"
    assert "up --dry-run: not checked: sglang pre-flight" in dry.stderr


@pytest.mark.docker
def test_dry_run_names_the_checks_that_failed_before_it(docker_client, tmp_path, no_leaks):
    """The plan is ok but the model folder is missing (and, on a machine without one, the NVIDIA
    runtime): the pre-flight is not run, and the dry run names those checks, not "the plan is
    refused" beside "plan: verdict ok"."""
    image = os.environ.get("ESCHA_TEST_HICACHE_IMAGE") or pytest.skip("ESCHA_TEST_HICACHE_IMAGE is not set")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    dry = run_cli("up", "--dry-run", "-p", "rtx5060ti-tp2-fp8", "--set", f"container.image={image}",
                  "--set", f"model.host_dir={tmp_path / 'no-model'}", "--format", "json", env=env)
    assert dry.returncode == 3, dry.stderr
    checks = json.loads(dry.stdout)["checks"]
    by = {c["name"]: c for c in checks}
    assert by["plan"]["state"] == "ok" and by["model folder"]["state"] == "failed"
    names = [c["name"] for c in checks]
    failed = [c["name"] for c in checks[:names.index("sglang pre-flight")] if c["state"] == "failed"]
    assert "model folder" in failed and "plan" not in failed
    said = ", ".join(failed[:-1]) + " and " + failed[-1] if failed[1:] else failed[0]
    c = by["sglang pre-flight"]
    assert c["state"] == "not run"
    assert c["detail"] == f"it runs at `up`, in a container of {image}, once the checks before it pass: {said} failed"
    assert "the plan is refused" not in dry.stdout + dry.stderr


@pytest.mark.docker
def test_dry_run_runs_it_in_the_image_and_reports_an_sglang_that_does_not_import(docker_client, tmp_path, no_leaks):
    """CI's HiCache image has SGLang without its dependencies: the throw-away container answers
    that SGLang does not import, which the dry run reports as not checked (never as passed)."""
    from docker.errors import ImageNotFound

    image = os.environ.get("ESCHA_TEST_HICACHE_IMAGE") or pytest.skip("ESCHA_TEST_HICACHE_IMAGE is not set")
    try:
        docker_client.images.get(image)
    except ImageNotFound:
        pytest.fail(f"no image {image}")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config_json(load_profile("rtx5060ti-tp2-fp8").model.architecture)))
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "ESCHA_SGLANG_PREFLIGHT": "1"}
    dry = run_cli("up", "-p", "rtx5060ti-tp2-fp8", "--set", f"container.image={image}", "--set", "container.gpus=[]",
                  "--set", f"model.host_dir={model}", "--dry-run", "--format", "json", env=env)
    c = _check(dry.stdout)
    assert c["state"] == "not run", (c, dry.stderr)
    assert "does not import" in c["detail"], c
    assert f"up --dry-run: not checked: sglang pre-flight ({c['detail']}" in dry.stderr
    assert not any(Path(tmp_path / "xdg").rglob("*.spec.json"))
