"""Serving beyond loopback without an API key is refused alike by ``up``, ``compose`` and
native ``serve --profile``: the one ``container settings`` check (``docker.check_spec``), the
same line and exit 3; ``compose -o`` then writes nothing. Real CLI, no daemon needed."""

from __future__ import annotations

import json
import os

from .conftest import run_cli

PROFILE = "rtx5060ti-tp2-fp8"
EXPOSE = ["--set", "container.expose=true"]


def _errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error: ")]


def _up_expose_line() -> str:
    """The line `up --dry-run` gives for the exposed port (no daemon: its checks still run)."""
    env = dict(os.environ, DOCKER_HOST="unix:///nonexistent.sock")
    r = run_cli("up", "--dry-run", "-p", PROFILE, *EXPOSE, env=env)
    assert r.returncode == 3, r.stderr
    lines = [ln for ln in _errors(r.stderr) if ln.startswith("error: container.expose:")]
    assert len(lines) == 1, r.stderr
    assert "refusing to serve beyond loopback without an API key" in lines[0]
    return lines[0]


def test_compose_refuses_expose_without_key_as_up_does_and_writes_nothing(tmp_path):
    out = tmp_path / "ex.yaml"
    r = run_cli("compose", "-p", PROFILE, *EXPOSE, "-o", str(out))
    assert r.returncode == 3, r.stderr
    assert _errors(r.stderr) == [_up_expose_line()]
    assert not out.exists() and "0.0.0.0" not in r.stdout


def test_compose_with_key_still_renders_the_exposed_port(tmp_path):
    key = tmp_path / "key"
    key.write_text("sk-escha-test-0123456789\n")
    out = tmp_path / "ex.yaml"
    r = run_cli("compose", "-p", PROFILE, *EXPOSE, "--set", f"container.api_key_file={key}", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "- 0.0.0.0:30000:30000" in out.read_text()


def test_native_serve_print_refuses_expose_without_key_as_up_does():
    env = dict(os.environ, ESCHA_SKIP_GPU_PREFLIGHT="1")
    env.pop("ESCHA_SERVE_MODE", None)
    r = run_cli("serve", "--print", "-p", PROFILE, *EXPOSE, env=env)
    assert r.returncode == 3, r.stderr
    up_line = _up_expose_line()
    assert _errors(r.stderr) == [up_line]
    assert json.loads(r.stdout)["refusals"] == [up_line.removeprefix("error: ")]
