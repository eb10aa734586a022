"""Native ``serve --profile`` checks and launches one model folder: ``model.host_dir`` (the
host folder the plan reads), which is also the argv's ``--model-path``; a missing folder is
named by that key. Real CLI (``serve --print``), no GPU needed (the documented test switch)."""

from __future__ import annotations

import json
import os

from escha_deploy.profile import load_profile

from .conftest import run_cli

PROFILE = "rtx5060ti-tp2-fp8"


def _model_folder(path):
    """A folder the checks accept: the profile's architecture as config.json, one safetensors file."""
    path.mkdir()
    arch = load_profile(PROFILE, []).model.architecture.model_dump(mode="json")
    (path / "config.json").write_text(json.dumps(arch))
    (path / "model.safetensors").write_bytes(b"\0" * 16)
    return path


def _serve_print(*sets: str):
    env = dict(os.environ, ESCHA_SKIP_GPU_PREFLIGHT="1")
    env.pop("ESCHA_SERVE_MODE", None)
    args = ["serve", "--print", "-p", PROFILE, "--set", "runtime.needs=[]"]
    for s in sets:
        args += ["--set", s]
    return run_cli(*args, env=env)


def _model_arg(stdout: str) -> str:
    argv = json.loads(stdout)["argv"]
    return argv[argv.index("--model-path") + 1]


def test_native_serve_launches_the_host_dir_it_checked(tmp_path):
    m1 = _model_folder(tmp_path / "m1")
    r = _serve_print(f"model.host_dir={m1}")
    assert r.returncode == 0, r.stderr
    assert _model_arg(r.stdout) == str(m1)
    assert json.loads(r.stdout)["refusals"] == []


def test_native_serve_names_host_dir_for_a_missing_folder(tmp_path):
    m1 = _model_folder(tmp_path / "m1")
    host_dir = load_profile(PROFILE, []).model.host_dir
    assert host_dir and not os.path.isdir(host_dir)  # the shipped profile's folder is not on this machine
    r = _serve_print(f"model.path={m1}")
    assert r.returncode == 2, r.stderr
    line = (f"model.host_dir: {host_dir} is not a folder here (natively serve loads model.host_dir; "
            "model.path is the folder as a container sees it)")
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")] == [f"error: {line}"]
    assert _model_arg(r.stdout) == host_dir  # the folder reported is the folder it would launch


def test_native_serve_without_host_dir_passes_model_path_as_given(tmp_path):
    m1 = _model_folder(tmp_path / "m1")
    r = _serve_print("model.host_dir=null", f"model.path={m1}")
    assert r.returncode == 0, r.stderr
    assert _model_arg(r.stdout) == str(m1)
