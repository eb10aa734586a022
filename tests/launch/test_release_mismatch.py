"""``serve --spec`` refuses a runtime of another SGLang release than the plan's (exit 3, both
named), on the real dockerd: the stand-in serve image (the real escha-deploy of this checkout)
with its runtime description saying 0.5.23, running a launch spec planned for 0.5.19."""

from __future__ import annotations

import json

import pytest

from escha_deploy.launch.prepare import prepare
from escha_deploy.pipeline.spec import spec_json

from .conftest import RUN, STANDIN_CAPS, STANDIN_PROFILE

pytestmark = pytest.mark.docker

SPEC_TARGET = "/etc/escha/launch-spec.json"


def _run(docker_client, image: str, spec_path) -> tuple[int, str]:
    c = docker_client.containers.run(image, ["--spec", SPEC_TARGET, "--print"], detach=True,
                                     name=f"escha-release-{RUN}-{image.rsplit(':', 1)[-1]}",
                                     labels={"io.escha.test": RUN},
                                     volumes={str(spec_path): {"bind": SPEC_TARGET, "mode": "ro"}})
    try:
        code = c.wait(timeout=120)["StatusCode"]
        return code, c.logs(stdout=True, stderr=True).decode()
    finally:
        c.remove(force=True)


def test_serve_spec_of_a_0_5_19_plan_in_a_0_5_23_image_exits_3_naming_both(docker_client, serve_image, tmp_path):
    prep = prepare(str(STANDIN_PROFILE), [])
    assert prep.launch.facts.sglang_release == "0.5.19"
    spec = tmp_path / "launch-spec.json"
    spec.write_text(spec_json(prep.launch))
    spec.chmod(0o644)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "runtime.json").write_text(json.dumps({
        "schema_version": 1, "sglang_version": "0.5.23", "base": "image:stand-in", "python": "3.11",
        "base_inventory_digest": "stand-in", "base_inventory_committed": False, "sglang_dir": "/nonexistent",
        "capabilities": STANDIN_CAPS, "inventory_digest": "stand-in", "escha_version": "stand-in"}))
    (ctx / "Dockerfile").write_text(f"FROM {serve_image}\nCOPY runtime.json /etc/escha/runtime.json\n")
    tag = f"escha-standin-serve:sglang-0.5.23-{RUN}"
    docker_client.images.build(path=str(ctx), tag=tag, rm=True, forcerm=True)
    try:
        code, logs = _run(docker_client, tag, spec)
        assert code == 3, logs
        assert ("SGLang release: this runtime (/etc/escha/runtime.json) runs 0.5.23, but the launch spec "
                f"{SPEC_TARGET} was planned for 0.5.19") in logs
        # the same spec in the image of the plan's release passes this check
        code, logs = _run(docker_client, serve_image, spec)
        assert "SGLang release:" not in logs, logs
    finally:
        docker_client.images.remove(tag, force=True)


def test_up_plans_the_image_release_and_refuses_a_profile_naming_another(docker_client, standin_image, tmp_path):
    """`up` reads the image's release label (a stock 0.5.23 image, no series): a profile that
    names 0.5.19 is refused naming both; one that names none plans 0.5.23, and with no series
    capability needed it is launchable."""
    from .conftest import run_cli

    ctx = tmp_path / "ctx"
    ctx.mkdir()
    base = standin_image("escha-standin:ok")
    (ctx / "Dockerfile").write_text(f"FROM {base}\nLABEL io.escha.runtime.sglang-version=0.5.23\n")
    tag = f"escha-standin:sglang-0.5.23-{RUN}"
    docker_client.images.build(path=str(ctx), tag=tag, rm=True, forcerm=True)
    env = {**__import__("os").environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    try:
        r = run_cli("up", "-p", str(STANDIN_PROFILE), "--set", f"container.image={tag}",
                    "--set", "runtime.sglang_version=0.5.19", "--dry-run", "--format", "json", env=env)
        assert r.returncode == 3, r.stderr
        assert (f"SGLang release: the image {tag} (label io.escha.runtime.sglang-version) says 0.5.23, "
                "runtime.sglang_version says 0.5.19") in r.stderr
        r = run_cli("up", "-p", str(STANDIN_PROFILE), "--set", f"container.image={tag}",
                    "--set", "runtime.needs=[]", "--dry-run", "--format", "json", env=env)
        data = json.loads(r.stdout)
        assert data["sglang_release"] == "0.5.23", r.stdout[:2000]
        assert data["sglang_release_source"].startswith(f"the image {tag}")
        assert data["verdict"] != "unsafe", r.stderr
    finally:
        docker_client.images.remove(tag, force=True)
