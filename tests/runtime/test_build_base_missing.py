"""``build`` with a base image the daemon lacks: one line naming it and the pull command, exit
3, before anything starts; it pulls nothing (a real Docker daemon)."""

from __future__ import annotations

import shutil
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from inproc import run_main  # noqa: E402

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]


def test_a_missing_base_image_is_named_with_its_pull_command_and_never_pulled(tmp_path):
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # no daemon here: skip, never fake
        pytest.skip(f"no Docker daemon ({exc}); .ci/test starts one")
    # a context with what build checks first (the Dockerfile, a wheelhouse); the base is a
    # per-run name that no daemon has
    (tmp_path / "docker").mkdir()
    shutil.copy(REPO / "docker" / "Dockerfile", tmp_path / "docker" / "Dockerfile")
    (tmp_path / "build" / "wheelhouse-py3.12").mkdir(parents=True)
    (tmp_path / "build" / "wheelhouse-py3.12" / "escha_deploy-0.1.0-py3-none-any.whl").write_bytes(b"")
    base = f"escha-missing-base-{uuid.uuid4().hex[:8]}:v0.5.19"
    tag = f"escha-never-built-{uuid.uuid4().hex[:8]}:x"
    r = run_main("build", "--stock", "--base-image", base, "--context", str(tmp_path), "--tag", tag)
    assert r.code == 3, r.err
    lines = [ln for ln in r.err.splitlines() if ln.startswith(("error:", "hint:"))]
    assert lines[0] == (f"error: --base-image {base}: not on this Docker daemon; build pulls nothing "
                        "(the SGLang image is tens of GB)")
    assert f"docker pull {base}" in lines[1] and "@sha256:DIGEST" in lines[1]
    assert "Step 1" not in r.err  # the build never started
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(base)
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(tag)
