"""doctor's ``gpu.kernel_log``: the GPU's lines in the kernel log read through the diagnosis
table's device rows. The host is the recorded Linux and WSL2 fixture trees; the kernel log is
the lines public reports quote (NVIDIA/open-gpu-kernel-modules#1151, microsoft/WSL#41176 and
#40715's harmless boot line), passed as doctor's reader would return them."""

from __future__ import annotations

from pathlib import Path

from escha_deploy.doctor.checks import host_checks
from escha_deploy.doctor.facts import gather_facts
from escha_deploy.doctor.hostinfo import DockerFacts
from escha_deploy.doctor.kernel_log import GPU_LINE
from escha_deploy.facts.gpus import GpuInventory

FIXTURES = Path(__file__).parent / "fixtures"
XID_79 = "[ 2012.01] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."
DXG = "[ 3305.05] misc dxg: dxgk: dxgkio_make_resident: Ioctl failed: -12"
HARMLESS = "[    1.27] misc dxg: dxgk: dxgkio_query_adapter_info: Ioctl failed: -22"


def rows(tree: str, lines: list[str], how: str = "dmesg"):
    kept = [ln for ln in lines if GPU_LINE.search(ln)]  # what doctor's reader keeps
    f = gather_facts(FIXTURES / tree, {}, docker=lambda: DockerFacts(reachable=False, error="x"),
                     gpus=lambda: GpuInventory(source="none"), kernel=lambda: (kept, how))
    return [c for c in host_checks(f) if c.id == "gpu.kernel_log"]


def test_a_gpu_off_the_bus_is_warned_as_the_card_not_the_configuration():
    (row,) = rows("linux-host", [XID_79])
    assert row.status == "warn" and "fell off the bus (Xid 79)" in row.detail and XID_79 in row.detail
    assert "not the launch configuration" in row.detail and "power the machine off and on" in row.fix


def test_wsl2_residency_failures_are_warned_and_boot_lines_are_not():
    (row,) = rows("wsl2-distro-engine", [HARMLESS, DXG])
    assert row.status == "warn" and "dxgkrnl" in row.detail and "runtime.mem_fraction_static" in row.fix
    (quiet,) = rows("wsl2-distro-engine", [HARMLESS])
    assert quiet.status == "ok" and "no GPU error" in quiet.detail


def test_an_unreadable_kernel_log_is_unknown_with_the_reason():
    (row,) = rows("linux-host", [], "the kernel log could not be read (dmesg: Operation not permitted)")
    assert row.status == "unknown" and "Operation not permitted" in row.detail
