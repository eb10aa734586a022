"""doctor reads the Windows user's .wslconfig where this WSL2 VM can (/mnt/c/Users/*/.wslconfig):
a file WSL ignores (UTF-16, or a byte-order mark: microsoft/WSL#7851, #5383) and a memory= the
VM's MemTotal does not show are warned. The host is the recorded WSL2 fixture tree (MemTotal
15.56 GiB) copied with a .wslconfig added."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from escha_deploy.doctor.checks import host_checks
from escha_deploy.doctor.facts import gather_facts
from escha_deploy.facts.gpus import GpuInventory
from escha_deploy.doctor.hostinfo import DockerFacts

FIXTURES = Path(__file__).parent / "fixtures"


def rows(tmp_path: Path, content: bytes | None, tree: str = "wsl2-distro-engine"):
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / tree, root, symlinks=True)
    if content is not None:
        d = root / "mnt" / "c" / "Users" / "alice"
        d.mkdir(parents=True)
        (d / ".wslconfig").write_bytes(content)
    f = gather_facts(root, {}, docker=lambda: DockerFacts(reachable=False, error="x"),
                     gpus=lambda: GpuInventory(source="none"))
    return [c for c in host_checks(f) if c.id == "wsl.wslconfig"]


INI = "[wsl2]\r\nmemory=16GB\r\nprocessors=8\r\n"


@pytest.mark.parametrize("encode,why", [
    (lambda t: t.encode("utf-16"), "UTF-16 with a byte-order mark"),          # Notepad's "Unicode"
    (lambda t: t.encode("utf-16-le"), "UTF-16 without a byte-order mark"),
    (lambda t: b"\xef\xbb\xbf" + t.encode(), "UTF-8 with a byte-order mark"),  # Notepad's "UTF-8 with BOM"
])
def test_a_wslconfig_wsl_ignores_is_warned(tmp_path, encode, why):
    (row,) = rows(tmp_path, encode(INI))
    assert row.status == "warn" and why in row.detail and "ignores this file" in row.detail
    assert "memory=16GB" in row.detail and "UTF-8 without a BOM" in row.fix


def test_a_memory_setting_the_vm_does_not_show_is_warned(tmp_path):
    (row,) = rows(tmp_path, b"[wsl2]\nmemory=32GB\n")
    assert row.status == "warn" and "memory=32GB (32.00 GiB)" in row.detail and "not in effect" in row.detail
    assert "wsl --shutdown" in row.fix


def test_a_memory_setting_in_effect_is_ok(tmp_path):
    (row,) = rows(tmp_path, INI.encode())
    assert row.status == "ok" and "memory=16GB" in row.detail


def test_no_row_without_a_readable_file_or_off_wsl(tmp_path):
    assert rows(tmp_path, None) == []
    assert rows(tmp_path / "l", b"[wsl2]\nmemory=32GB\n", tree="linux-host") == []
