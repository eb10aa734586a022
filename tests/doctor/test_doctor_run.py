"""run_doctor end to end on this machine, the CLI's exit codes, and reuse of saved findings."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from escha_deploy.doctor.checks import ProfileNeeds
from escha_deploy.doctor.facts import gather_facts
from escha_deploy.facts.gpus import GpuInventory, GpuRecord
from escha_deploy.doctor.hostinfo import DockerFacts
from escha_deploy.doctor.probes import run_pinned_ceiling, run_store_case
from escha_deploy.doctor.run import _reusable, pinned_target, run_doctor, run_probes
from escha_deploy.facts.saved import DoctorFindings, StoreProbeResult, save_findings
from escha_deploy.utils.units import GiB

FIXTURES = Path(__file__).parent / "fixtures"


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    return subprocess.run([sys.executable, "-m", "escha_deploy.cli.main", "doctor", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def report_exit(checks: dict) -> int:
    return 3 if any(c["profile"] and c["status"] == "fail" for c in checks.values()) else 0


def test_cli_profile_without_gpu_exits_3_naming_no_gpu(tmp_path):
    out = _cli("--profile", "rtx5060ti-tp2-fp8", "--format", "json", tmp_path=tmp_path)
    assert "Traceback" not in out.stderr
    report = json.loads(out.stdout)
    checks = {c["id"]: c for c in report["checks"]}
    assert out.returncode == report_exit(checks)
    if not _cuda():
        assert out.returncode == 3
        assert checks["profile.gpus"]["status"] == "fail"
        assert "no GPU" in checks["profile.gpus"]["detail"]
        assert not (tmp_path / "escha-deploy" / "doctor.json").exists()  # no probe ran, nothing saved


def test_cli_table_says_why(tmp_path):
    out = _cli("--profile", "rtx5060ti-tp2-fp8", "--no-probes", tmp_path=tmp_path)
    if _cuda():
        pytest.skip("this text is for a GPU-less machine")
    assert out.returncode == 3 and "rtx5060ti-tp2-fp8 cannot run here: profile.gpus" in out.stdout
    assert "no GPU" in out.stdout


def test_cli_without_profile_exits_0(tmp_path):
    out = _cli("--format", "json", "--no-probes", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["profile"] is None


def test_cli_unknown_profile_exits_2_in_one_line(tmp_path):
    out = _cli("--profile", "no-such-profile", tmp_path=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    # the name is refused before any host fact is gathered: no progress line, just the error
    # (and its hint)
    lines = out.stderr.splitlines()
    assert lines[0].startswith("error: unknown profile 'no-such-profile'"), lines
    assert len(lines) == 2 and lines[1].startswith("hint: "), lines
    assert "gathering" not in out.stderr


def test_run_doctor_refuses_a_bad_profile_before_gathering(tmp_path):
    """``run_doctor`` validates the profile first: neither Docker nor the GPUs are asked, and
    the CLI's progress callback never runs."""
    from escha_deploy.utils.errors import BadInput

    asked = []

    def docker():
        asked.append("docker")
        raise AssertionError("docker asked before the profile was validated")

    def gpus():
        asked.append("gpus")
        raise AssertionError("GPUs asked before the profile was validated")

    with pytest.raises(BadInput, match="unknown profile 'no-such-profile'"):
        run_doctor("no-such-profile", findings_path=tmp_path / "doctor.json", docker=docker, gpus=gpus,
                   started=lambda: asked.append("started"))
    assert asked == []


def test_run_doctor_reads_this_machine(tmp_path):
    report = run_doctor(findings_path=tmp_path / "doctor.json", probes=False)
    ids = [c.id for c in report.checks]
    assert ids[:7] == ["platform", "host.memory", "host.swap", "host.page_cache", "host.hugepages",
                       "host.memlock", "host.shm"]
    assert report.facts["memory"]["mem_total_bytes"] > 0 and report.exit_code == 0


# ------------------------------------------------------------------ probes as processes, here


def test_store_case_without_cuda_is_a_result():
    if _cuda():
        pytest.skip("a GPU is present")
    pytest.importorskip("torch")
    result, attrs = run_store_case("device", timeout_s=120)
    assert not result.ok and result.error == "no CUDA device visible to torch" and attrs == {}


def test_pinned_ladder_timeout_is_not_a_ceiling(monkeypatch):
    """A ladder process that outlives its timeout (a STAND-IN child that sleeps: the real one,
    without torch, ends in milliseconds, so a short timeout would race it)."""
    import sys

    from escha_deploy.doctor import probes

    monkeypatch.setattr(probes, "probe_argv", lambda *a: [sys.executable, "-c", "import time; time.sleep(60)"])
    c = run_pinned_ceiling(GiB, timeout_s=0.5)
    assert c.timed_out and not c.reached and c.largest_bytes == 0 and "timed out" in c.error


# ------------------------------------------------------------------ reuse of saved findings

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.timezone.utc)


def _saved(age_h: float, ceiling: int, reached: bool, nccl: bool | None = True) -> DoctorFindings:
    return DoctorFindings(created_at=(NOW - dt.timedelta(hours=age_h)).isoformat(), host_id="h",
                          store_probe=[StoreProbeResult(case="torch_pinned", ok=True)], host_allocator="pinned",
                          pinned_ceiling_bytes=ceiling, pinned_ceiling_reached=reached,
                          pinned_ceiling_target_bytes=ceiling, nccl_smoke_ok=nccl,
                          nccl_env={"NCCL_P2P_DISABLE": "1"} if nccl else {})


@pytest.mark.parametrize("saved, target, world, reuse", [
    (_saved(2, 4 * GiB, False), 3 * GiB, 2, True),
    (_saved(25, 4 * GiB, False), 3 * GiB, 2, False),     # older than a day
    (_saved(2, 2 * GiB, False), 3 * GiB, 2, False),      # ladder stopped short of this target
    (_saved(2, GiB // 2, True), 3 * GiB, 2, True),       # a real ceiling answers any target
    (_saved(2, 4 * GiB, False, nccl=None), 3 * GiB, 2, False),  # TP 2 needs the smoke test
    (_saved(2, 4 * GiB, False, nccl=None), 3 * GiB, 1, True),
    (None, GiB, 1, False),
])
def test_reusable(saved, target, world, reuse):
    assert _reusable(saved, target, world, NOW) is reuse


def test_run_probes_reuses_fresh_findings_without_running_anything(tmp_path):
    """The GPU inventory here is a recorded value (a stand-in: no GPU on this machine); with a
    fresh saved answer for this host, no probe process starts."""
    two = GpuInventory(source="nvml", gpus=[GpuRecord(index=i, name="NVIDIA GeForce RTX 5060 Ti",
                                                    memory_total_bytes=16 * GiB) for i in range(2)])
    f = gather_facts(FIXTURES / "wsl2-distro-engine", {}, docker=lambda: DockerFacts(reachable=False),
                     gpus=lambda: two)
    saved = _saved(0, GiB // 2, True).model_copy(update={"host_id": f.host_id,
                                                         "created_at": dt.datetime.now(dt.timezone.utc).isoformat()})
    path = tmp_path / "doctor.json"
    save_findings(saved, path)
    need = ProfileNeeds(name="p", gpu_count=2, gpu_vram_bytes=12 * GiB, gpu_name="GeForce RTX 5060 Ti", tp_size=2,
                        hicache_enabled=True, pinned_per_rank_bytes=3 * GiB)
    p = run_probes(f, need, findings_path=path)
    assert p.source.startswith("saved ") and p.host_allocator == "pinned"
    assert p.pinned.largest_bytes == GiB // 2 and p.pinned.reached
    assert p.nccl_ok and p.nccl[-1]["env"] == {"NCCL_P2P_DISABLE": "1"}


def test_pinned_target_is_capped_by_available_memory():
    f = gather_facts(FIXTURES / "wsl2-distro-engine", {}, docker=lambda: DockerFacts(reachable=False),
                     gpus=lambda: GpuInventory(source="none"))
    avail = f.memory.mem_available_bytes  # 6,200,000 kB in the fixture
    need = ProfileNeeds(name="p", gpu_count=2, gpu_vram_bytes=12 * GiB, gpu_name="x", tp_size=2,
                        hicache_enabled=True, pinned_per_rank_bytes=10 * GiB)
    assert pinned_target(f, need) == avail - 2 * GiB
    assert avail - 2 * GiB < 4 * GiB
    assert pinned_target(f, None) == avail - 2 * GiB  # the 4 GiB default is capped too


def test_profile_needs_ignore_a_saved_ceiling(tmp_path, monkeypatch):
    """A plan capped by a saved ceiling would aim the next ladder at that ceiling; doctor plans
    the profile as if nothing had been measured."""
    from escha_deploy.doctor.run import needs_from_profile
    from escha_deploy.facts.machine import host_id
    from escha_deploy.utils.paths import doctor_findings_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    before = needs_from_profile("rtx5060ti-tp2")
    assert before.pinned_per_rank_bytes and before.pinned_per_rank_bytes > GiB
    tiny = DoctorFindings(created_at=dt.datetime.now(dt.timezone.utc).isoformat(), host_id=host_id(),
                          pinned_ceiling_bytes=GiB // 4, pinned_ceiling_reached=True)
    save_findings(tiny, doctor_findings_path())
    assert needs_from_profile("rtx5060ti-tp2").pinned_per_rank_bytes == before.pinned_per_rank_bytes


def test_profile_needs_are_planned_as_plan_plans_this_host(cli, tmp_path):
    """doctor plans the profile through plan's pipeline (pipeline.gather -> decide): a model
    folder at model.host_dir is read as `plan` reads it, so the KV page doctor's ladder and
    buffers are sized for is that of the folder's model (a Llama config.json behind the hybrid
    profile), the one `plan` of this host reports, not the profile's own architecture."""
    from escha_deploy.doctor.run import needs_from_profile

    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "hidden_size": 4096, "head_dim": 128}))
    (folder / "model.safetensors").write_bytes(b"\0" * 1000)
    sets = ["--set", f"model.host_dir={folder}"]
    d = json.loads(cli("plan", "-p", "rtx5060ti-tp2-fp8", *sets, "-f", "json").out)  # no findings (cli's cache)
    page = d["page_size"] * d["per_rank"]["device_kv_bytes_per_token"]
    own = json.loads(cli("plan", "-p", "rtx5060ti-tp2-fp8", "-f", "json").out)
    assert page != own["page_size"] * own["per_rank"]["device_kv_bytes_per_token"]  # the folder decides it
    need = needs_from_profile("rtx5060ti-tp2-fp8", [sets[1]])
    assert need.kv_page_bytes == page


def test_probe_all_module_answers_in_json(tmp_path):
    """What ``up`` runs inside the image, run here for real: without a GPU it says so (exit 3);
    with one, the store probe and ladder answers come back and turn into findings."""
    from escha_deploy.doctor.facts import ProbeFacts
    from escha_deploy.doctor.run import probe_findings

    out = subprocess.run([sys.executable, "-m", "escha_deploy.doctor.probe_all", "--target", str(GiB)],
                         capture_output=True, text=True, timeout=600)
    data = json.loads(out.stdout)
    probes = ProbeFacts.model_validate(data["probes"])
    if data["gpus"]["source"] == "none":
        assert out.returncode == 3 and probes.skipped == "no GPU" and data["gpus"]["reasons"]
    else:
        assert out.returncode == 0 and probes.store and probes.pinned.target_bytes <= GiB
    f = probe_findings(probes, host_id="host", platform=data["platform"], created_at=NOW.isoformat())
    assert f.host_id == "host" and f.nccl_smoke_ok is None
