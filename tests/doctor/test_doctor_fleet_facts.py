"""The two facts a fleet reads from a saved doctor report: WSL's networking mode and the server
image's digest."""

from __future__ import annotations

import os
import stat

import pytest

from escha_deploy.doctor.facts import gather_facts
from escha_deploy.facts.gpus import GpuInventory
from escha_deploy.doctor.hostinfo import DockerFacts, read_image, read_wsl_networking_mode

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def _fake_wslinfo(tmp_path, body: str) -> str:
    """A `wslinfo` executable on a private PATH (a stand-in: WSL's own binary exists only in WSL)."""
    exe = tmp_path / "wslinfo"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(tmp_path)


def test_networking_mode_from_wslinfo(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _fake_wslinfo(tmp_path, '[ "$1" = --networking-mode ] && echo Mirrored') + os.pathsep
                       + os.environ["PATH"])
    assert read_wsl_networking_mode() == "mirrored"


def test_networking_mode_unknown_without_wslinfo_or_on_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert read_wsl_networking_mode() is None
    monkeypatch.setenv("PATH", _fake_wslinfo(tmp_path, "echo nat; exit 1"))
    assert read_wsl_networking_mode() is None


def test_gather_asks_the_mode_only_on_wsl2():
    asked = []

    def mode():
        asked.append(1)
        return "nat"

    kw = dict(docker=lambda: DockerFacts(reachable=False), gpus=lambda: GpuInventory(source="none"),
              networking_mode=mode)
    assert gather_facts(FIXTURES / "wsl2-distro-engine", {}, **kw).wsl_networking_mode == "nat"
    assert gather_facts(FIXTURES / "linux-host", {}, **kw).wsl_networking_mode is None
    assert len(asked) == 1


def test_read_image_never_raises_and_says_why(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    f = read_image("escha-sglang:0.5.19-hicache", timeout_s=1)
    assert f.id is None and f.error


@pytest.mark.docker
def test_read_image_digest_from_the_real_daemon():
    ref = os.environ.get("ESCHA_TEST_BASE_IMAGE", "escha-sglang-base:ci")
    f = read_image(ref)
    assert f.error is None and f.id.startswith("sha256:") and len(f.id) == 71


def test_platform_check_names_the_networking_mode():
    from escha_deploy.doctor.checks import check_platform

    kw = dict(docker=lambda: DockerFacts(reachable=False), gpus=lambda: GpuInventory(source="none"))
    nat = gather_facts(FIXTURES / "wsl2-distro-engine", {}, networking_mode=lambda: "nat", **kw)
    assert "networking nat" in check_platform(nat).detail
    unknown = gather_facts(FIXTURES / "wsl2-distro-engine", {}, networking_mode=lambda: None, **kw)
    assert "networking mode unknown" in check_platform(unknown).detail
    linux = gather_facts(FIXTURES / "linux-host", {}, networking_mode=lambda: "nat", **kw)
    assert "networking" not in check_platform(linux).detail
