"""`up --dry-run` and the docker-py arguments built from a LaunchSpec (no daemon needed)."""

from __future__ import annotations

import json
import os

import pytest

from escha_deploy.launch.docker import check_spec, create_args
from escha_deploy.pipeline.spec import ContainerSpec

from .conftest import STANDIN_PROFILE, run_cli, STANDIN_PORT

KEY = "sk-escha-test-0123456789"
HF = "hf_" + "Zq9" * 12


def spec(**kw) -> ContainerSpec:
    return ContainerSpec(image="i", name="n", **kw)


def test_gpus_linux_count_ids_and_wsl2_all():
    assert create_args(spec(gpu_count=2))["device_requests"] == [
        {"driver": "nvidia", "count": 2, "capabilities": [["gpu"]]}]
    assert create_args(spec(gpus=["0", "1"]))["device_requests"][0]["device_ids"] == ["0", "1"]
    wsl = create_args(spec(platform="wsl2", environment={"CUDA_VISIBLE_DEVICES": "1"}))
    assert wsl["device_requests"][0]["count"] == -1
    assert wsl["environment"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert create_args(spec(gpus=[]))["device_requests"] == []


def test_refusals():
    assert any("api_key_file" in p for p in check_spec(spec(port_host_ip="0.0.0.0")))
    ok = spec(port_host_ip="0.0.0.0", secret_files={"/run/secrets/escha_api_key": "/k"})
    assert check_spec(ok) == []
    assert any("shared memory" in p for p in check_spec(spec(ipc_mode=None)))
    assert check_spec(spec(ipc_mode=None, shm_size_bytes=16 * 10**9)) == []


def test_secret_files_are_read_only_mounts_and_restart_starts_as_no():
    a = create_args(spec(secret_files={"/run/secrets/escha_api_key": "/host/key"}))
    assert {"type": "bind", "source": "/host/key", "target": "/run/secrets/escha_api_key",
            "read_only": True} in a["mounts"]
    assert a["restart_policy"] == {"Name": "no"} and a["init"] is True


def _dry(*extra, tmp_path):
    k = tmp_path / "key"
    k.write_text(KEY + "\n")
    h = tmp_path / "hf"
    h.write_text(HF + "\n")
    # no daemon: the dry run still prints the plan and container, and refuses as `up` would
    env = dict(os.environ, DOCKER_HOST="unix:///nonexistent.sock")
    return run_cli("up", "--profile", str(STANDIN_PROFILE), "--dry-run",
                   "--set", f"container.api_key_file={k}", "--set", f"container.hf_token_file={h}",
                   *extra, env=env)


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_dry_run_has_no_secret(tmp_path, fmt):
    r = _dry("--format", fmt, tmp_path=tmp_path)
    assert r.returncode == 3, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: docker: daemon not reachable"), r.stderr
    for skipped in ("image", "capabilities", "existing container", "port"):  # named, never passed
        assert f"warning: up --dry-run: not checked: {skipped} (the Docker daemon does not answer" in r.stderr
    assert KEY not in r.stdout + r.stderr and HF not in r.stdout + r.stderr
    assert "sglang.launch_server" in r.stdout
    if fmt == "json":
        data = json.loads(r.stdout)
        assert data["container"]["restart_policy"] == {"Name": "no"}
        assert not any(KEY in a for a in data["argv"])


def test_expose_without_api_key_is_refused(tmp_path):
    env = dict(os.environ, DOCKER_HOST="unix:///nonexistent.sock")
    r = run_cli("up", "--profile", str(STANDIN_PROFILE), "--dry-run", "--set", "container.expose=true",
                env=env)
    assert r.returncode == 3 and "api_key_file" in r.stderr
    r2 = _dry("--set", "container.expose=true", "--format", "json", tmp_path=tmp_path)
    data = json.loads(r2.stdout)
    assert data["container"]["ports"][f"{STANDIN_PORT}/tcp"][0] == "0.0.0.0"
    assert r2.returncode == 3 and [ln for ln in r2.stderr.splitlines() if ln.startswith("error: ")] == [
        f"error: {data['refusals'][0]}"] and "daemon not reachable" in data["refusals"][0]  # only the daemon
    settings = next(c for c in data["checks"] if c["name"] == "container settings")
    assert settings["state"] == "ok", settings
