"""A Docker daemon that cannot raise RLIMIT_MEMLOCK (rootless Docker, an unprivileged LXC
container; this CI machine's daemon is one): doctor probes it with a one-second container of
the image and says what to do instead of "--ulimit memlock=-1"; `up` refuses before creating
anything; diagnose names the runc line. What the daemon does is first asked of the docker CLI
(`docker run --ulimit memlock=-1:-1 IMAGE true`), so each test checks the tool against the
daemon, whichever kind it is."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from escha_deploy.launch.diagnose import diagnose

from .conftest import STANDIN_PROFILE, run_cli, STANDIN_LABEL

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def daemon_memlock(docker_client, base_image) -> tuple[bool, str]:
    """``(can raise memlock, the CLI's stderr)`` for this daemon, by the docker CLI itself."""
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI to ask the daemon independently")
    name = f"escha-test-memlock-cli-{os.getpid()}"
    r = subprocess.run(["docker", "run", "--rm", "--name", name, "--network", "none",
                        "--ulimit", "memlock=-1:-1", "--entrypoint", "true", base_image],
                       capture_output=True, text=True, timeout=120)
    subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    return r.returncode == 0, r.stderr


def test_doctor_probes_the_daemon_and_advises_what_works(daemon_memlock, base_image, no_leaks):
    from escha_deploy.doctor.run import run_doctor

    can, _ = daemon_memlock
    r = run_doctor("rtx5060ti-tp2-fp8", [f"container.image={base_image}"], probes=False, save=False)
    row = r.check("docker.memlock")
    assert row is not None and base_image in row.detail
    if can:
        assert row.status == "ok" and r.check("profile.memlock") is None
        return
    assert row.status == "fail" and "cannot raise memlock" in row.detail and "rlimit type 8" in row.detail
    assert "LimitMEMLOCK=infinity" in row.fix and "CAP_SYS_RESOURCE" in row.fix
    assert r.check("profile.memlock").status == "fail" and r.exit_code == 3
    host = r.check("host.memlock")
    assert not host.fix.startswith("run with --ulimit memlock=-1")  # the advice that cannot work here


def test_doctor_without_an_image_says_the_probe_did_not_run_and_why(docker_client, no_leaks):
    from escha_deploy.doctor.run import run_doctor

    tag = f"escha-test-absent-{os.getpid()}:none"
    r = run_doctor("rtx5060ti-tp2-fp8", [f"container.image={tag}", f"runtime.base_image={tag}-base"],
                   probes=False, save=False)
    row = r.check("docker.memlock")
    assert row.status == "warn" and row.detail.startswith("not run: no image to run it from") and tag in row.detail
    assert "escha-deploy build --hicache" in row.fix  # the daemon answered: the missing step is the image


def test_up_refuses_before_creating_when_the_daemon_cannot_raise_memlock(daemon_memlock, docker_client, no_leaks):
    can, _ = daemon_memlock
    if can:
        pytest.skip("this daemon raises memlock: `up` has nothing to refuse")
    image = os.environ.get("ESCHA_TEST_HICACHE_IMAGE", "escha-sglang:ci-hicache")
    from docker.errors import ImageNotFound

    try:
        docker_client.images.get(image)
    except ImageNotFound:
        pytest.skip(f"{image} is not built here")
    r = run_cli("up", "--profile", str(STANDIN_PROFILE), "--set", f"container.image={image}", "--detach",
                env={**os.environ, "ESCHA_TEST_CLAMP_MEMLOCK": "0"})
    assert r.returncode == 3, r.stderr
    assert "this daemon cannot raise memlock" in r.stderr and "LimitMEMLOCK=infinity" in r.stderr, r.stderr
    assert not docker_client.containers.list(all=True, filters={"label": STANDIN_LABEL})


def test_the_runc_line_from_this_daemon_is_diagnosed(daemon_memlock):
    can, err = daemon_memlock
    if can:
        pytest.skip("this daemon raises memlock: it prints no rlimit error")
    d = diagnose(err.splitlines())
    assert [m.id for m in d.matches] == ["memlock-rlimit-refused"], err
    assert "rootful Docker" in d.matches[0].fix
