"""``fleet up --router``: --dry-run starts nothing and asks no daemon; a router that cannot
start is one ``error:`` line with exit 3, never a pull and never a traceback.

docs/scale-out.md's fleet file (``run: container``, image ``escha-smg:1.13.0``, which no box
here has built) is the input, as a new user runs it.
"""

from __future__ import annotations

import json

import pytest

from escha_deploy.fleet.model import load_fleet
from escha_deploy.fleet.router_run import container_name

from .test_fleet_render import docs_fleet
from .test_fleet_plan import run_cli as run




def test_router_dry_run_prints_what_would_run_and_asks_no_daemon(tmp_path, capsys, monkeypatch):
    """A daemon at a socket that does not exist: any docker call would fail, so exit 0 proves
    the dry run talks to none."""
    path = docs_fleet(tmp_path)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    capsys.readouterr()
    code, out, err = run(capsys, "fleet", "up", str(path), "--router", "--dry-run")
    assert code == 0, err
    assert "Traceback" not in err
    assert "router: would run (container, nothing started)" in out
    assert "workers: http://192.168.1.20:30000 http://127.0.0.1:30000" in out
    assert "container.image: escha-smg:1.13.0" in out
    assert "--api-key-file /run/secrets/escha_api_key -- --worker-urls" in out
    assert "k-123" not in out  # the key file's path, never the key
    code, out, err = run(capsys, "fleet", "up", str(path), "--router", "--dry-run", "--format", "json")
    assert code == 0, err
    desc = json.loads(out)
    assert desc["run"] == "container" and desc["container"]["name"] == "escha-lab-router"
    assert desc["container"]["volumes"] == {str(tmp_path / "router.key"): {"bind": "/run/secrets/escha_api_key",
                                                                         "mode": "ro"}}
    assert desc["workers"] == ["http://192.168.1.20:30000", "http://127.0.0.1:30000"]


def test_router_with_no_daemon_is_one_line_exit_3(tmp_path, capsys, monkeypatch):
    path = docs_fleet(tmp_path)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    capsys.readouterr()
    code, out, err = run(capsys, "fleet", "up", str(path), "--router", "--no-wait")
    assert code == 3
    assert "Traceback" not in err
    assert err.startswith("error: docker: daemon not reachable")
    assert [ln for ln in err.splitlines() if ln.startswith("error:")] == err.splitlines()[:1]


@pytest.mark.docker
def test_router_image_not_on_this_box_is_refused_without_a_pull(tmp_path, capsys):
    """The real daemon, which reaches no registry: docker-py's ``containers.run`` would pull the
    missing image and end in an APIError traceback. Refused before anything starts: exit 3, one
    line naming the image and how to build it; no container is left behind."""
    import docker

    path = docs_fleet(tmp_path)
    client = docker.from_env()
    name = container_name(load_fleet(path))
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(name)
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get("escha-smg:1.13.0")
    capsys.readouterr()
    code, out, err = run(capsys, "fleet", "up", str(path), "--router", "--no-wait")
    assert code == 3, err
    assert "Traceback" not in err and "APIError" not in err
    assert err.splitlines()[0] == ("error: router image escha-smg:1.13.0 is not on this box: build it with "
                                   "`escha-deploy fleet build-router --base-image IMAGE`")
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(name)
