"""`up --dry-run` runs `up`'s preflight (every check that needs no container) on the real
Docker daemon, and refuses as `up` does: same lines, same exit code.

This daemon has no NVIDIA runtime: a real condition here, so a GPU profile's dry run must
refuse exactly as its `up` does. The other cases use the STAND-IN profile and image
(tests/launch/standin/, no GPU requested), where `up` gets as far as the model folder, the
port and the API key file. Each dry run is compared with a real `up` of the same profile and
settings, and leaves nothing behind: no container (``no_leaks``), no spec file.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from .conftest import STANDIN_PROFILE, run_cli, STANDIN_PORT

pytestmark = pytest.mark.docker
P = str(STANDIN_PROFILE)
GPU_PROFILE = "rtx5060ti-tp2-fp8"


def _env(tmp_path: Path) -> dict:
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}


def _problems(stderr: str) -> list[str]:
    """The error and hint lines a command printed (warnings and progress left out)."""
    return [ln for ln in stderr.splitlines() if ln.startswith(("error: ", "hint: "))]


def _both(tmp_path: Path, profile: str, *sets: str):
    """The dry run (JSON) and a real `up --detach` of the same profile and settings; asserts
    neither wrote a spec file (the real one is expected to refuse before it would)."""
    env = _env(tmp_path)
    dry = run_cli("up", "-p", profile, *sets, "--dry-run", "--format", "json", env=env)
    real = run_cli("up", "-p", profile, *sets, "--detach", env=env, timeout=180)
    launch_dir = tmp_path / "xdg" / "escha-deploy" / "launch"
    assert not launch_dir.exists() or not any(launch_dir.iterdir()), list(launch_dir.iterdir())
    return dry, json.loads(dry.stdout) if dry.stdout.strip() else None, real


def _check(data: dict, name: str) -> dict:
    return next(c for c in data["checks"] if c["name"] == name)


def test_gpu_profile_dry_run_refuses_without_nvidia_runtime(docker_client, tmp_path, no_leaks):
    from escha_deploy.launch.docker import gpu_runtime

    if gpu_runtime(docker_client) is not None:
        pytest.skip("this daemon has an NVIDIA runtime; the case is a daemon without one")
    dry, data, real = _both(tmp_path, GPU_PROFILE)
    assert real.returncode == 3, real.stderr
    assert _problems(real.stderr)[0] == ("error: docker: no NVIDIA GPU runtime (docker info lists no nvidia "
                                         "runtime or CDI spec); the server needs GPUs")
    assert dry.returncode == 3, dry.stderr
    assert _problems(dry.stderr)[0] == _problems(real.stderr)[0]  # `up`'s first refusal comes first
    assert _check(data, "NVIDIA runtime")["state"] == "failed"
    assert data["refusals"][0] == _problems(real.stderr)[0].removeprefix("error: ")
    # what it could not check is named, never passed
    assert _check(data, "doctor probes")["state"] == "not run"
    assert "warning: up --dry-run: not checked: doctor probes" in dry.stderr


def test_missing_model_folder_is_refused_as_by_up(docker_client, standin_image, tmp_path, no_leaks):
    image = standin_image("escha-standin:ok")
    folder = tmp_path / "no-such-model"
    dry, data, real = _both(tmp_path, P, "--set", f"container.image={image}", "--set", f"model.host_dir={folder}")
    want = [f"error: model.host_dir / container.model_dir: {folder} is not a folder on this host"]
    assert (real.returncode, _problems(real.stderr)) == (3, want), real.stderr
    assert (dry.returncode, _problems(dry.stderr)) == (3, want), dry.stderr
    assert _check(data, "model folder") == {"name": "model folder", "state": "failed", "detail": "",
                                            "problems": [want[0].removeprefix("error: ")]}


def test_unreadable_api_key_file_is_bad_input_as_by_up(docker_client, standin_image, tmp_path, no_leaks):
    image = standin_image("escha-standin:ok")
    key = tmp_path / "missing.key"
    dry, data, real = _both(tmp_path, P, "--set", f"container.image={image}",
                            "--set", f"container.api_key_file={key}")
    want = [f"error: container.api_key_file: cannot read a value from the path given ({len(str(key))} characters, "
            f"starting {str(key)[:3]!r}; not shown whole): no such file"]  # it may be the key itself
    assert (real.returncode, _problems(real.stderr)) == (2, want), real.stderr
    assert (dry.returncode, _problems(dry.stderr)) == (2, want), dry.stderr
    assert _check(data, "api key file")["state"] == "failed"
    assert data["verdict"] == "ok"  # the plan itself was fine: the dry run did not stop at it


def test_held_port_is_refused_as_by_up(docker_client, standin_image, tmp_path, no_leaks):
    image = standin_image("escha-standin:ok")
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", STANDIN_PORT))
        s.listen()
        dry, data, real = _both(tmp_path, P, "--set", f"container.image={image}")
    assert real.returncode == 3 and _problems(real.stderr)[0].startswith(
        f"error: container.port: 127.0.0.1:{STANDIN_PORT} is held by "), real.stderr
    assert (dry.returncode, _problems(dry.stderr)) == (3, _problems(real.stderr)), dry.stderr
    assert _check(data, "port")["state"] == "failed"


def test_launchable_standin_passes_every_check_it_runs(docker_client, standin_image, tmp_path, no_leaks):
    from escha_deploy.launch.up import PREFLIGHT

    image = standin_image("escha-standin:ok")
    env = _env(tmp_path)
    r = run_cli("up", "-p", P, "--set", f"container.image={image}", "--dry-run", "--format", "json", env=env)
    assert r.returncode == 0, r.stderr
    assert "not checked" not in r.stderr and "error: " not in r.stderr
    checks = json.loads(r.stdout)["checks"]
    assert [c["name"] for c in checks] == list(PREFLIGHT)  # every check of `up`, in its order
    assert {c["name"]: c["state"] for c in checks if c["state"] != "ok"} == {
        "NVIDIA runtime": "not needed", "model folder": "not needed", "doctor probes": "not needed",
        "api key file": "not needed", "L3 folder": "not needed",  # the stand-in asks for no GPU, mounts no
        # model and no L3 folder, sets no key
        "sglang pre-flight": "not needed",  # no GPU: SGLang's stages read the GPU's platform
        "memlock": "not needed"}  # the tests' memlock switch clamps it
    assert not (tmp_path / "xdg" / "escha-deploy" / "launch").exists()  # no spec file written


def test_up_and_its_dry_run_iterate_one_check_list(monkeypatch, tmp_path):
    """A check added to ``CHECKS`` is run by `up` (which refuses with it, before connecting to
    Docker or creating anything) and by the dry run (which reports it by name and goes on)."""
    from escha_deploy.utils.errors import Refused
    from escha_deploy.launch import up as up_mod

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    seen: list[bool] = []

    def added(ctx):
        seen.append(ctx.dry)
        raise Refused("added: refused by the check the test added")

    monkeypatch.setattr(up_mod, "CHECKS", [up_mod.Check("added check", added), *up_mod.CHECKS])
    with pytest.raises(Refused) as refused:
        up_mod.up(P)
    assert refused.value.problems == ("added: refused by the check the test added",)
    dry = up_mod.dry_run(P)
    assert seen == [False, True]
    assert [c.name for c in dry.checks][:2] == ["added check", "docker daemon"]  # it went on
    assert (dry.checks[0].state, dry.checks[0].problems) == ("failed", list(refused.value.problems))
    assert dry.error().problems[0] == refused.value.problems[0]
