"""Doctor's findings older than a driver change are stale, and `doctor` is asked for again.

A driver update or downgrade can change what pins, what registers and which NCCL transports
pass, so findings record the driver they were measured under (``driver_version``, NVML's
``nvmlSystemGetDriverVersion``) and each reader compares it with the driver NVML reports now:
``plan`` on this machine says they are stale and asks for ``doctor --fresh``, ``doctor`` does not
reuse them, ``up`` probes again instead of reusing them. The NVML answers are a recorded box's
(``nvml_replay``), replayed through the product's reader.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from escha_deploy.doctor.run import _reusable
from escha_deploy.facts.saved import DoctorFindings, StoreProbeResult, save_findings
from escha_deploy.utils.units import GiB
from nvml_replay import recorded_inventory

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)
BOX = "nvml-2x-h200-p2p.json"


def _findings(driver: str | None, *, host_id: str = "h", created_at: dt.datetime = NOW) -> DoctorFindings:
    return DoctorFindings(created_at=created_at.isoformat(), host_id=host_id,
                          store_probe=[StoreProbeResult(case="torch_pinned", ok=True)], host_allocator="pinned",
                          pinned_ceiling_bytes=8 * GiB, pinned_ceiling_reached=True, nccl_smoke_ok=True,
                          nccl_env={"NCCL_P2P_DISABLE": "1"}, driver_version=driver)


def test_the_recorded_box_names_its_driver():
    assert recorded_inventory(BOX).driver_version  # the comparison below has a driver to compare


@pytest.mark.parametrize("saved,now,stale", [
    ("570.86.10", "575.51.03", True),  # updated since the probes ran
    ("575.51.03", "570.86.10", True),  # downgraded
    ("570.86.10", "570.86.10", False),
    (None, "570.86.10", False),  # findings saved before the driver was recorded: not known to differ
    ("570.86.10", None, False),  # no NVML now: nothing to compare with
])
def test_findings_measured_under_another_driver_are_stale(saved, now, stale):
    f = _findings(saved)
    said = f.driver_changed(now)
    assert (said is not None) is stale
    if stale:
        assert f"driver {saved}" in said and f"driver {now} is loaded now" in said and "doctor --fresh" in said
    assert f.is_fresh(NOW, now) is not stale and f.is_fresh(NOW) is True
    assert _reusable(f, 4 * GiB, 2, NOW, now) is not stale  # doctor measures again instead of reusing them


@pytest.mark.parametrize("same", [True, False], ids=["same-driver", "driver-changed"])
def test_plan_on_this_machine_calls_them_stale_and_asks_for_doctor(cli, tmp_path, monkeypatch, same):
    from escha_deploy.facts import machine
    from escha_deploy.launch.up import fresh_findings_saved
    from escha_deploy.utils.paths import doctor_findings_path

    gpus = recorded_inventory(BOX)
    monkeypatch.setattr(machine, "read_gpu_facts", lambda: gpus)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))  # the cli fixture's folder
    driver = gpus.driver_version if same else "535.54.03"
    save_findings(_findings(driver, host_id=machine.host_id(), created_at=dt.datetime.now(dt.timezone.utc)),
                  doctor_findings_path())
    r = cli("plan", "-p", "linux-tp2-l3", "--format", "json")
    assert r.code in (0, 3), r.err
    warnings = json.loads(r.out)["warnings"]
    stale = [w for w in warnings if "stale" in w]
    if same:
        assert stale == [] and fresh_findings_saved()
    else:
        assert stale == [f"doctor's saved findings were measured under NVIDIA driver 535.54.03, and driver "
                         f"{gpus.driver_version} is loaded now: stale; `escha-deploy doctor --fresh` measures again"]
        assert not fresh_findings_saved()  # `up` probes in the image again instead of reusing them


def test_doctor_records_the_driver_it_measured_under():
    from escha_deploy.doctor.run import ProbeFacts, probe_findings

    f = probe_findings(ProbeFacts(source="ran now"), host_id="h", platform="linux", created_at=NOW.isoformat(),
                       driver_version="570.86.10")
    assert f.driver_version == "570.86.10"
    assert DoctorFindings.model_validate_json(f.model_dump_json()).driver_version == "570.86.10"


@pytest.mark.parametrize("same", [True, False], ids=["same-driver", "driver-changed"])
def test_serve_here_calls_a_facts_file_of_another_driver_stale(tmp_path, monkeypatch, same):
    """A facts file's GPU records (written by doctor on this box) name the driver they were read
    under; `serve` on the box compares it with NVML's now."""
    from escha_deploy.facts import machine
    from escha_deploy.facts.factsfile import FactsFile, HostSection, records_from_inventory
    from tests.inproc import run_main

    gpus = recorded_inventory(BOX)
    monkeypatch.setattr(machine, "read_gpu_facts", lambda: gpus)
    records = records_from_inventory(gpus)
    if not same:
        records = [r.model_copy(update={"driver_version": "535.54.03"}) for r in records]
    facts = tmp_path / "box.json"
    facts.write_text(FactsFile(host=HostSection(platform="linux", mem_total_bytes=128 * GiB),
                               gpus=records).model_dump_json())
    r = run_main("serve", "--profile", "rtx5060ti-tp2-fp8", "--set", "runtime.needs=[]", "--facts", str(facts), "--print",
                 env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    said = [ln for ln in r.err.splitlines() if "stale" in ln]
    if same:
        assert said == [], r.err
    else:
        assert len(said) == 1 and "driver 535.54.03" in said[0] and f"driver {gpus.driver_version} is loaded now" \
            in said[0] and "escha-deploy doctor" in said[0], r.err
