"""`up --dry-run` and `compose` of a profile moved to another release (runtime.sglang_version)
name that release's image: the tag `escha-deploy build --hicache` gives it
(escha_deploy/catalog/releases/index.yaml, image_tags) and, for compose's build, its official
image and the release as Dockerfile.hicache's build arguments. A profile that names its image
keeps it. The daemon is not asked (DOCKER_HOST points at a socket that does not exist)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1]))
from inproc import run_main  # noqa: E402

from escha_deploy.launch.compose import render_profile  # noqa: E402
from escha_deploy.sglang.releases import default_release, image_tag, official_image, supported_releases  # noqa: E402

BOX = Path(__file__).parents[1] / "golden" / "rtx5060ti-tp2-fp8" / "box.json"
P = "rtx5060ti-tp2-fp8"


@pytest.mark.parametrize("release", supported_releases())
def test_up_dry_run_of_a_release_names_its_image(tmp_path, release):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"}
    r = run_main("up", "--dry-run", "-p", P, "--facts", str(BOX), "--set", f"runtime.sglang_version={release}",
                 "--format", "json", env=env)
    data = json.loads(r.out)
    assert data["sglang_release"] == release and data["verdict"] == "ok", (data["verdict"], data["reasons"])
    assert data["container"]["image"] == image_tag("hicache", release) == f"escha-sglang:{release}-hicache"
    # needing our series is no refusal where runtime_patches/ holds a series for the release
    assert not any("patch series" in x for x in data["refusals"] + data["reasons"]), data["refusals"]
    named = json.loads(run_main("up", "--dry-run", "-p", P, "--facts", str(BOX), "--set",
                                f"runtime.sglang_version={release}", "--set", "container.image=mine:1",
                                "--format", "json", env=env).out)
    assert named["container"]["image"] == "mine:1"


@pytest.mark.parametrize("release", supported_releases())
def test_compose_builds_and_runs_the_release_image(release):
    doc = yaml.safe_load(render_profile(P, [f"runtime.sglang_version={release}"]))
    svc = doc["services"]["sglang"]
    assert svc["image"] == image_tag("hicache", release)
    assert svc["build"]["args"] == {"BASE_IMAGE": official_image(release), "SGLANG_VERSION": release}


def test_dockerfile_defaults_are_the_default_release():
    """A plain `docker build` of either Dockerfile builds the default release: their ARG defaults
    are its official image and its version (escha-deploy build and compose pass the planned
    release's)."""
    root = Path(__file__).parents[2]
    for dockerfile in ("Dockerfile.hicache", "docker/Dockerfile"):
        args = [ln.split(None, 1)[1] for ln in (root / dockerfile).read_text().splitlines() if ln.startswith("ARG ")]
        assert f"BASE_IMAGE={official_image()}" in args and f"SGLANG_VERSION={default_release()}" in args, (dockerfile, args)
        assert 'io.escha.runtime.sglang-version="${SGLANG_VERSION}"' in (root / dockerfile).read_text()
