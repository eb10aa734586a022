"""A probe that could not run is unknown, never failed: doctor from a Python without torch.

``pip install .`` brings no torch, so on a GPU box every probe process dies importing it. The
probes here are the real probe processes, run with this test's Python (no torch, or a torch that
sees no CUDA device: neither can run a probe); the GPU list is a recorded NVML answer of two
RTX 5060 Ti (a stand-in: this machine has no GPU).
"""

from __future__ import annotations

import pytest

from escha_deploy.facts.gpus import GpuInventory, GpuRecord
from escha_deploy.doctor.hostinfo import DockerFacts
from escha_deploy.doctor.run import run_doctor
from escha_deploy.facts.factsfile import facts_from_doctor_report
from escha_deploy.utils.units import GiB

from conftest import cuda_available

TWO_5060TI = GpuInventory(source="nvml", driver_version="581.57", gpus=[
    GpuRecord(index=i, name="NVIDIA GeForce RTX 5060 Ti", memory_total_bytes=16 * GiB, compute_capability="12.0")
    for i in range(2)])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """One doctor run for the module's tests that only read its report (each probe process
    imports torch: seconds per run)."""
    if cuda_available():
        pytest.skip("the probes can run here (a CUDA torch): this is the GPU-less, torch-less case")
    path = tmp_path_factory.mktemp("doctor-unknown") / "doctor.json"
    r = run_doctor("rtx5060ti-tp2-fp8", findings_path=path, docker=lambda: DockerFacts(reachable=False),
                   gpus=lambda: TWO_5060TI)
    return r, path


def test_probes_that_could_not_run_are_unknown_and_exit_5(report):
    r, _ = report
    rows = {c.id: c for c in r.checks}
    for id in ("probe.store", "probe.pinned", "probe.nccl", "profile.host_allocator", "profile.pinned",
               "profile.nccl"):
        assert rows[id].status == "unknown", rows[id]
        assert "torch" in rows[id].detail  # what is missing: no module torch, or no CUDA device for torch
    # no hardware verdict from probes that did not run: no "HiCache cannot run here", no 0 GB
    # ceiling, no NCCL /dev/shm fix
    assert not [c for c in r.checks if c.status == "fail"], [c for c in r.checks if c.status == "fail"]
    text = " ".join(f"{c.detail} {c.fix}" for c in r.checks)
    assert "HiCache cannot run here" not in text and "0.00 GB" not in text and "raise /dev/shm" not in text
    # the two ways out: the extra that brings torch, or up running the probes in the image
    fix = rows["profile.host_allocator"].fix
    assert "pip install '.[probes]'" in fix and "`escha-deploy up --profile rtx5060ti-tp2-fp8`" in fix
    assert r.exit_code == 5


def test_unknown_probes_are_never_saved_as_findings(report):
    r, path = report
    assert not path.exists() and not r.findings_saved
    # nor do they become findings when the report is carried as another box's facts
    assert facts_from_doctor_report(r.model_dump(mode="json")).findings is None


def test_table_says_inconclusive(report, capsys):
    from escha_deploy.cli.doctor import render_table

    render_table(report[0])
    out = capsys.readouterr().out
    assert "rtx5060ti-tp2-fp8: inconclusive" in " ".join(out.split())
    assert "can run here" not in out and "cannot run here" not in out


def test_without_a_profile_unknown_probes_exit_5(tmp_path):
    if cuda_available():
        pytest.skip("the probes can run here")
    r = run_doctor(findings_path=tmp_path / "d.json", docker=lambda: DockerFacts(reachable=False),
                   gpus=lambda: TWO_5060TI)
    assert r.check("probe.store").status == "unknown" and r.exit_code == 5
    assert "`escha-deploy" not in r.check("probe.store").fix  # no command naming a profile it lacks
