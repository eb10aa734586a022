"""What doctor's all-reduce smoke test found reaches the launch (docs/doctor.md, "saved as
``nccl_env`` for launch").

Two GPUs NVML calls P2P-capable (the recorded H200 pair) whose smoke test passed only with
``NCCL_P2P_DISABLE=1``: the IOMMU / PCIe ACS case of vllm#51513, where NVML's P2P status says ok
and the transport hangs. Every launch renders ``NCCL_P2P_DISABLE=1`` and, since custom
all-reduce needs the same peer mappings (sgl-project/sglang#4814), ``--disable-custom-all-reduce``:
``serve --print`` (container mode, the facts file at ``ESCHA_FACTS``), ``up --dry-run``, the
compose file and its container's ``serve --print``, and ``fleet up --dry-run``.
"""

from __future__ import annotations

import json

import yaml

from escha_deploy.facts.factsfile import FactsFile, HostSection, records_from_inventory
from escha_deploy.facts.findings import DoctorFindings
from escha_deploy.profile import load_profile
from escha_deploy.utils.units import GiB
from nvml_replay import recorded_inventory
from tests.inproc import run_main
from tests.pipeline.test_one_launch import _container_checks

PROFILE = "linux-tp2-l3"


def _facts(tmp_path, nccl_env: dict[str, str], ok: bool | None = True):
    from escha_deploy.runtime.description import RuntimeDescription

    findings = DoctorFindings(created_at="2026-12-01T00:00:00+00:00", host_id="box", platform="linux",
                              nccl_env=nccl_env, nccl_smoke_ok=ok)
    facts = tmp_path / "box.json"
    facts.write_text(FactsFile(host=HostSection(platform="linux", mem_total_bytes=128 * GiB, host_id="box"),
                               gpus=records_from_inventory(recorded_inventory("nvml-2x-h200-p2p.json")),
                               findings=findings).model_dump_json())
    runtime = tmp_path / "runtime.json"
    runtime.write_text(RuntimeDescription(
        sglang_version="0.5.19", base="image:lmsysorg/sglang:v0.5.19", base_inventory_digest="0" * 64,
        base_inventory_committed=True, python="3.11.2", sglang_dir="/sglang",
        capabilities=list(load_profile(PROFILE).runtime.needs), inventory_digest="0" * 64).model_dump_json())
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"name": "one", "boxes": [
        {"name": "box", "address": "127.0.0.1", "profile": PROFILE, "facts": facts.name}]}))
    return facts, runtime, fleet


def _launches(tmp_path, nccl_env, ok=True):
    facts, runtime, fleet = _facts(tmp_path, nccl_env, ok)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    box = {**env, "ESCHA_SERVE_MODE": "container", "ESCHA_FACTS": str(facts)}
    a, b, c = _container_checks(runtime)
    with a, b, c:
        serve = run_main("serve", "--profile", PROFILE, "--print", env=box)
        dry = run_main("up", "--profile", PROFILE, "--facts", str(facts), "--dry-run", "--format", "json", env=env)
        compose = run_main("compose", "--profile", PROFILE, "--facts", str(facts), env=env)
        fleet_dry = run_main("fleet", "up", str(fleet), "--box", "box", "--dry-run", "--format", "json", env=env)
    # `up --dry-run` (and fleet's) prints the launch, then its preflight refuses here (no Docker, no model folder)
    for name, r in (("serve", serve), ("compose", compose)):
        assert r.code == 0, (name, r.err)
    svc = yaml.safe_load(compose.out)["services"]["sglang"]
    return {"serve --print": json.loads(serve.out), "up --dry-run": json.loads(dry.out),
            "fleet up --dry-run": json.loads(fleet_dry.out)}, svc


def test_a_smoke_test_that_passed_only_with_p2p_off_reaches_every_launch(tmp_path):
    launches, svc = _launches(tmp_path, {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"})
    for name, got in launches.items():
        assert got["env"].get("NCCL_P2P_DISABLE") == "1", name
        assert got["env"].get("NCCL_SHM_DISABLE") == "1", name
        assert "--disable-custom-all-reduce" in got["argv"], name
    assert svc["environment"]["NCCL_P2P_DISABLE"] == "1" and svc["environment"]["NCCL_SHM_DISABLE"] == "1"


def test_a_smoke_test_that_passed_with_the_defaults_keeps_p2p(tmp_path):
    """The same pair whose smoke test passed with NCCL's defaults: NVML's proof stands."""
    launches, svc = _launches(tmp_path, {})
    for name, got in launches.items():
        assert "NCCL_P2P_DISABLE" not in got["env"] and "--disable-custom-all-reduce" not in got["argv"], name
    assert "NCCL_P2P_DISABLE" not in svc["environment"]


def test_an_nccl_env_naming_another_programs_variable_is_refused(tmp_path):
    facts = tmp_path / "box.json"
    doc = json.loads(FactsFile(host=HostSection(platform="linux", mem_total_bytes=128 * GiB)).model_dump_json())
    doc["findings"] = {"created_at": "2026-12-01T00:00:00+00:00", "host_id": "box",
                       "nccl_env": {"LD_PRELOAD": "/tmp/x.so"}, "nccl_smoke_ok": True}
    facts.write_text(json.dumps(doc))
    r = run_main("plan", "-p", PROFILE, "--facts", str(facts), env={"XDG_CACHE_HOME": str(tmp_path / "c")})
    assert r.code == 2 and "Traceback" not in r.err
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert any("findings.nccl_env" in ln and "LD_PRELOAD" in ln for ln in lines), r.err


def test_a_doctor_report_read_as_facts_keeps_the_environment_that_passed(tmp_path):
    """``--facts doctor-report.json``: the first attempt failed with NCCL's defaults, the second
    passed with P2P off; the findings carry the second's environment, and the plan renders it."""
    from escha_deploy.facts.factsfile import facts_file_from_data

    report = {"created_at": "2026-12-01T00:00:00+00:00", "checks": [], "facts": {
        "host_id": "box", "platform": "linux", "memory": {"mem_total_bytes": 128 * GiB},
        "probes": {"source": "ran now", "nccl": [{"ok": False, "env": {}},
                                                 {"ok": True, "env": {"NCCL_P2P_DISABLE": "1"}}]}}}
    ff = facts_file_from_data(report, tmp_path / "report.json")
    assert ff.findings is not None and ff.findings.nccl_env == {"NCCL_P2P_DISABLE": "1"}
    assert ff.host_facts().nccl_env == {"NCCL_P2P_DISABLE": "1"}
