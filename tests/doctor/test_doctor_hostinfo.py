"""Host readers against this machine's real /proc and cgroup files, and against fixture trees
of WSL2 and other hosts written from public facts (learn.microsoft.com/windows/wsl; fixtures/README.md)."""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import psutil
import pytest

from escha_deploy.doctor.hostinfo import (classify_docker_info, read_docker, read_memlock, read_memory,
                                          read_shm_size, read_wsl_signals)
from escha_deploy.facts.machine import detect_container, detect_platform, read_cgroup_memory
from escha_deploy.utils.units import GiB, MiB

FIXTURES = Path(__file__).parent / "fixtures"


# ----------------------------------------------------------------------- this machine, for real


def test_memory_matches_psutil_on_this_machine():
    m = read_memory()
    vm = psutil.virtual_memory()
    assert m.mem_total_bytes == vm.total  # psutil reads the same MemTotal
    assert m.mem_available_bytes is not None and m.mem_available_bytes <= m.mem_total_bytes
    sw = psutil.swap_memory()
    assert m.swap_total_bytes == sw.total
    assert m.cgroup_limit_bytes == read_cgroup_memory()[0]


def test_memlock_matches_getrlimit():
    soft, hard = read_memlock()
    rsoft, rhard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    assert soft == (None if rsoft == resource.RLIM_INFINITY else rsoft)
    assert hard == (None if rhard == resource.RLIM_INFINITY else rhard)


def test_shm_size_matches_statvfs():
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm here")
    st = os.statvfs("/dev/shm")
    assert read_shm_size() == st.f_blocks * st.f_frsize


def test_this_machine_is_not_wsl():
    sig = read_wsl_signals(environ={})
    assert sig.kernel is ("microsoft" in os.uname().release.lower())
    assert sig.osrelease == os.uname().release


# ----------------------------------------------------------------------- fixture trees


def test_wsl2_docker_desktop_container():
    root = FIXTURES / "wsl2-desktop-container"
    assert detect_platform(root) == "wsl2"
    assert detect_container(root)
    sig = read_wsl_signals(root, environ={})
    assert sig.kernel and sig.dxg and sig.wsl_lib
    assert not sig.userland  # no WSL env or /mnt/wsl inside a container (wsl2-facts 1.2)
    m = read_memory(root)
    assert m.mem_total_bytes == 16314004 * 1024
    assert m.cgroup_limit_bytes == 12 * GiB
    assert m.swap_used_bytes == (4194304 - 3145728) * 1024
    assert m.page_cache_bytes == 3900000 * 1024
    assert m.hugetlb_bytes == 0
    assert read_memlock(root) == (8 * MiB, 8 * MiB)
    assert read_shm_size(root) == 64 * MiB  # Docker's default size=65536k (field report B17)


def test_wsl2_distro_with_engine_cgroup_v1_and_hugepages():
    root = FIXTURES / "wsl2-distro-engine"
    assert detect_platform(root) == "wsl2"
    assert not detect_container(root)
    sig = read_wsl_signals(root, environ={})
    assert sig.kernel and sig.dxg and sig.wsl_lib and sig.userland  # /mnt/wsl, WSLInterop
    assert not sig.docker_desktop_socket
    m = read_memory(root)
    assert m.cgroup_limit_bytes is None  # v1's "no limit" is PAGE_COUNTER_MAX
    assert m.cgroup_usage_bytes == 6 * GiB
    assert (m.hugepages_total, m.hugepages_free, m.hugepage_size_bytes) == (1024, 1024, 2 * MiB)
    assert m.hugetlb_bytes == 2 * GiB
    assert m.swap_used_bytes == 3 * GiB
    assert read_memlock(root) == (None, None)
    # no size= option: statvfs of the fixture's dev/shm folder (a real filesystem here)
    st = os.statvfs(root / "dev/shm")
    assert read_shm_size(root) == st.f_blocks * st.f_frsize


def test_wsl2_distro_with_desktop_integration():
    root = FIXTURES / "wsl2-distro-desktop"
    sig = read_wsl_signals(root, environ={"WSL_DISTRO_NAME": "Ubuntu-24.04"})
    assert sig.kernel and sig.userland and sig.docker_desktop_socket and sig.wsl_lib
    assert not sig.dxg
    assert read_memlock(root) == (65536, 65536)
    assert read_shm_size(root) == 8157000 * 1024
    assert read_memory(root).cgroup_limit_bytes is None


@pytest.mark.parametrize("tree, wsl", [("wsl1", True), ("wsl2-419", True), ("linux-host", False)])
def test_kernel_strings(tree, wsl):
    assert read_wsl_signals(FIXTURES / tree, environ={}).kernel is wsl


def test_linux_host():
    root = FIXTURES / "linux-host"
    assert detect_platform(root) == "linux"
    assert not detect_container(root)
    m = read_memory(root)
    assert m.mem_total_bytes == 65742096 * 1024 and m.cgroup_limit_bytes is None
    assert read_shm_size(root) == 32871048 * 1024


def test_memlock_missing_file_raises(tmp_path):
    with pytest.raises(OSError):
        read_memlock(tmp_path)


# ----------------------------------------------------------------------- docker info


def _info(name: str) -> dict:
    return json.loads((FIXTURES / "docker_info" / f"{name}.json").read_text())


@pytest.mark.parametrize("name, kind, wsl, gpu", [
    ("docker-desktop-wsl2", "docker-desktop", True, ["runtime:nvidia"]),
    ("engine-wsl2-distro", "engine", True, ["cdi:nvidia.com/gpu=all"]),
    ("docker-desktop-linuxkit", "docker-desktop", False, []),
    ("engine-linux-nvidia", "engine", False, ["runtime:nvidia"]),
])
def test_classify_docker_info(name, kind, wsl, gpu):
    d = classify_docker_info(_info(name))
    assert (d.kind, d.wsl_kernel, d.gpu_runtimes) == (kind, wsl, gpu)


def test_desktop_recognised_by_label_alone():
    info = _info("docker-desktop-wsl2")
    info.update(OperatingSystem="Ubuntu 24.04 LTS", Name="box")
    assert classify_docker_info(info).kind == "docker-desktop"


@pytest.mark.docker
def test_read_docker_against_the_real_daemon():
    """This machine's dockerd (started by .ci/run); skipped when no daemon answers."""
    d = read_docker()
    if not d.reachable:
        pytest.skip(f"no Docker daemon: {d.error}")
    assert d.kind == "engine"  # a plain dockerd, not Docker Desktop
    assert d.server_version and d.kernel_version == os.uname().release


def test_read_docker_unreachable_reports_why(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    d = read_docker(timeout_s=2)
    assert not d.reachable and d.error
