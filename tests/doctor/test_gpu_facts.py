"""GPU facts, not names (field reports B35, B37): NVML's brand, PCI ids, P2P status and topology
decide the launch flags, and doctor checks each TP GPU against the profile and the image.

The NVML answers are replayed through the product's reader (``nvml.query_nvml``) by
``nvml_replay.RecordedNvml`` (a stand-in: no NVML on the CI machine). ``nvml-h200.json`` was
recorded on a real H200 (the device machine, 2026-11-30); the others are written in the same
format, each naming the public report it describes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from escha_deploy.doctor.checks import ProfileNeeds, profile_checks
from escha_deploy.doctor.facts import gather_facts
from escha_deploy.doctor.hostinfo import DockerFacts
from escha_deploy.doctor.kernel_archs import image_kernel_archs
from escha_deploy.facts.gpus import runs_on
from escha_deploy.pipeline.argv import server_args, server_env
from escha_deploy.facts.gpu_rules import gpu_compat, peer_access
from escha_deploy.facts.machine import described_host
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile
from escha_deploy.utils.units import GiB

from nvml_replay import FIXTURES, recorded_inventory

LINUX = described_host(128 * GiB, "linux")
B35_SETS = ["hardware.gpu_name=RTX 4090", "hicache.hicache_size=0"]


def _launch(inv, sets=(), host=LINUX, profile="linux-tp2-l3"):
    prof = load_profile(profile, list(sets))
    p = plan(prof, host.model_copy(update={"gpus": inv}))
    return server_args(p, prof), server_env(p, prof), p


def test_h200_record_reads_as_nvml_facts():
    inv = recorded_inventory("nvml-h200.json")
    g = inv.gpus[0]
    assert (inv.source, inv.driver_version, inv.cuda_driver_version) == ("nvml", "580.159.04", "13.0")
    assert (g.name, g.brand, g.architecture, g.compute_capability) == ("NVIDIA H200", "NVIDIA", "Hopper", "9.0")
    assert (g.pci_device_id >> 16, g.pci_device_id & 0xFFFF) == (0x2335, 0x10DE)  # H200, NVIDIA's vendor id
    assert g.memory_total_bytes == 150_754_820_096 and g.driver_version == "580.159.04" and g.pci_bus_id == "00000000:00:06.0"


def test_b35_consumer_pair_without_p2p_gets_the_flags_whatever_its_name():
    """B35: the profile's free-text name says nothing ('RTX 4090', no 'GeForce'); NVML's brand
    and P2P status put --disable-custom-all-reduce in argv and NCCL_P2P_DISABLE=1 in env."""
    inv = recorded_inventory("nvml-2x-rtx4090.json")
    assert inv.p2p_pairs == {"0-1": "not supported"} and inv.gpus[0].brand == "GeForce"
    args, env, p = _launch(inv, B35_SETS)
    assert "--disable-custom-all-reduce" in args and env["NCCL_P2P_DISABLE"] == "1"
    assert not p.peer_access.proven and p.peer_access.consumer
    assert any(d.value == "--disable-custom-all-reduce" and "GeForce" in d.reason for d in p.decisions)


def test_proven_peer_access_keeps_custom_all_reduce_even_with_a_geforce_name():
    inv = recorded_inventory("nvml-2x-h200-p2p.json")
    args, env, p = _launch(inv, ["hardware.gpu_name=GeForce RTX 4090", "hicache.hicache_size=0"])
    assert p.peer_access.proven and "--disable-custom-all-reduce" not in args and "NCCL_P2P_DISABLE" not in env


def test_geforce_brand_claiming_p2p_is_not_trusted():
    rec = json.loads((FIXTURES / "nvml-2x-rtx4090.json").read_text())
    for k in rec["nvmlDeviceGetP2PStatus"].values():
        k["NVML_P2P_CAPS_INDEX_READ"] = 0
    args, env, _ = _launch(recorded_inventory(rec), B35_SETS)
    assert "--disable-custom-all-reduce" in args and env["NCCL_P2P_DISABLE"] == "1"


def test_without_nvml_facts_tp2_disables_custom_all_reduce_only():
    args, env, p = _launch(None, B35_SETS)
    assert "--disable-custom-all-reduce" in args and "NCCL_P2P_DISABLE" not in env
    assert "no NVML facts" in p.peer_access.detail


def test_p2p_error_or_missing_pair_is_not_proof():
    rec = json.loads((FIXTURES / "nvml-2x-h200-p2p.json").read_text())
    rec["nvmlDeviceGetP2PStatus"]["0-1"]["NVML_P2P_CAPS_INDEX_READ"] = {"error": "Unknown Error"}
    inv = recorded_inventory(rec)
    assert inv.p2p_pairs["0-1"].startswith("error:")
    assert not peer_access(inv, [0, 1], "linux").proven
    assert not peer_access(recorded_inventory("nvml-h200.json"), [0, 1], "linux").proven  # GPU 1 absent


def test_tp_group_follows_container_gpus():
    rec = json.loads((FIXTURES / "nvml-2x-h200-p2p.json").read_text())
    inv = recorded_inventory(rec)
    assert not peer_access(inv, [0, 2], "linux").proven and peer_access(inv, [0, 1], "linux").proven


def test_wsl2_nvml_p2p_is_not_trusted():
    inv = recorded_inventory("nvml-2x-h200-p2p.json")
    args, env, _ = _launch(inv, ["hicache.hicache_size=0"], host=described_host(128 * GiB, "wsl2"))
    assert "--disable-custom-all-reduce" in args and env["NCCL_P2P_DISABLE"] == "1"


def test_profile_setting_wins():
    inv = recorded_inventory("nvml-2x-rtx4090.json")
    args, env, _ = _launch(inv, B35_SETS + ["runtime.disable_custom_all_reduce=false", "container.nccl_p2p_disable=false"])
    assert "--disable-custom-all-reduce" not in args and "NCCL_P2P_DISABLE" not in env


def test_b35_up_dry_run_on_this_machine(tmp_path):
    """B35's input as a user types it, on this GPU-less machine (no NVML facts), through
    ``up --dry-run`` (``serve --print`` here refuses first: no patched runtime outside the image)."""
    out = subprocess.run([sys.executable, "-m", "escha_deploy", "up", "-p", "linux-tp2-l3", "--set",
                          B35_SETS[0], "--set", B35_SETS[1], "--set", f"hicache.l3.dir={tmp_path}",
                          "--set", "hicache.l3.max_size=1GB", "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    # the plan and its argv are printed first; then up's preflight, which on this machine (no
    # NVIDIA runtime, no image, no model folder) refuses with exit 3, as `up` would
    assert "--disable-custom-all-reduce" in out.stdout
    assert "verdict ok" in out.stdout, out.stdout
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert out.returncode == (3 if errors else 0), out.stderr
    assert all(ln.startswith(("error: docker:", "error: container.image:", "error: model.host_dir"))
               for ln in errors), errors


# --------------------------------------------------------------------------- compatibility (B37)

ARCHS = image_kernel_archs()


def test_kernel_arch_record_is_of_the_pinned_wheels():
    w = ARCHS["wheels"]
    assert w["sglang-kernel"]["version"] == "0.4.6.post1" and w["torch"]["version"] == "2.13.0"
    assert 120 in w["sglang-kernel"]["sass"] and 90 in w["torch"]["sass"] and ARCHS["torch_cuda"] == "13.0"
    assert runs_on(w["sglang-kernel"], "8.9") and not runs_on(w["sglang-kernel"], "7.5")


def _doctor(inv, need):
    f = gather_facts(FIXTURES / "linux-host", {}, docker=lambda: DockerFacts(reachable=False, error="x"),
                     gpus=lambda: inv)
    return {c.id: c for c in profile_checks(f, need)}


def test_b37_mixed_pair_against_a_cc_12_profile_fails_with_the_fix():
    inv = recorded_inventory("nvml-rtx3080-rtx4080s.json").model_copy(update={"driver_version": "580.65.06"})
    need = ProfileNeeds(name="rtx5060ti-tp2", gpu_count=2, gpu_vram_bytes=8 * GiB, gpu_name="GeForce RTX 5060 Ti",
                        tp_size=2, hicache_enabled=False, compute_capability="12.0")
    c = _doctor(inv, need)
    assert c["profile.gpu.compat.0"].status == "fail" and "cc 12.0" in c["profile.gpu.compat.0"].detail
    assert 'compute_capability: "8.6"' in c["profile.gpu.compat.0"].fix
    assert c["profile.gpu.compat.1"].status == "fail" and "cc 8.9" in c["profile.gpu.compat.1"].detail
    assert c["profile.gpu.compat.mixed"].status == "fail" and "cc 8.6" in c["profile.gpu.compat.mixed"].detail


def test_b37_driver_below_the_images_cuda():
    """The recorded driver 550 cannot run torch 2.13.0+cu130 (CUDA 13.0 needs 580.65.06)."""
    inv = recorded_inventory("nvml-rtx3080-rtx4080s.json")
    rows = gpu_compat(inv, [1], profile_cc="8.9", image=ARCHS)
    assert rows[0].status == "fail" and "driver 550.54.14 is older than 580.65.06" in rows[0].detail
    assert "CUDA 13.0" in rows[0].detail


def test_card_the_image_has_no_kernels_for():
    rec = json.loads((FIXTURES / "nvml-h200.json").read_text())
    rec["devices"][0]["nvmlDeviceGetCudaComputeCapability"] = [7, 5]  # a Turing card
    rows = gpu_compat(recorded_inventory(rec), [0], profile_cc=None, image=ARCHS)
    assert rows[0].status == "fail" and "no kernel image" in rows[0].detail and "sglang-kernel" in rows[0].detail


def test_h200_against_its_profile_is_ok():
    rows = gpu_compat(recorded_inventory("nvml-h200.json"), [0], profile_cc="9.0", image=ARCHS, nccl_version="2.29.7")
    assert [r.status for r in rows] == ["ok"]


def test_blackwell_nccl_floor():
    rec = json.loads((FIXTURES / "nvml-h200.json").read_text())
    rec["devices"][0]["nvmlDeviceGetCudaComputeCapability"] = [12, 0]
    rows = gpu_compat(recorded_inventory(rec), [0], profile_cc="12.0", image=ARCHS, nccl_version="2.21.5")
    assert rows[0].status == "fail" and "NCCL 2.21.5 is older than 2.26.2" in rows[0].detail


@pytest.mark.parametrize("cc,nccl,status", [((12, 0), "2.25.1", "fail"), ((12, 0), "2.26.2", "ok"),
                                            ((12, 1), "2.25.1", "fail"), ((10, 0), "2.25.1", "ok")])
def test_consumer_blackwell_needs_nccl_2_26_2(cc, nccl, status):
    """NCCL 2.25.1 runs on sm_100 but its collectives fail on RTX 5090s (sm_120); 2.26.2 fixed
    them (NVIDIA/nccl-tests#287)."""
    rec = json.loads((FIXTURES / "nvml-h200.json").read_text())
    rec["devices"][0]["nvmlDeviceGetCudaComputeCapability"] = list(cc)
    profile_cc = f"{cc[0]}.{cc[1]}"
    rows = gpu_compat(recorded_inventory(rec), [0], profile_cc=profile_cc, image=ARCHS, nccl_version=nccl)
    assert rows[0].status == status, rows[0].detail
    if status == "fail":
        assert "older than 2.26.2" in rows[0].detail and "nccl-tests#287" in rows[0].detail


# --------------------------------------------------------------------------- facts file

def _facts(path, record):
    from escha_deploy.facts.factsfile import FactsFile, HostSection, records_from_inventory

    doc = FactsFile(host=HostSection(platform="linux", mem_total_bytes=128 * GiB),
                    gpus=records_from_inventory(recorded_inventory(record)))
    path.write_text(doc.model_dump_json(indent=2))
    return doc


def test_gpu_records_travel_in_the_facts_file_and_decide_the_flags(tmp_path):
    """The NVML facts as facts-file records (brand, PCI ids, P2P per peer): ``plan --facts``
    decides peer access from them as a plan from NVML does; the digest covers them."""
    from escha_deploy.facts.factsfile import inventory_from_records

    docs = {}
    for record in ("nvml-2x-rtx4090.json", "nvml-2x-h200-p2p.json"):
        f = tmp_path / record
        docs[record] = _facts(f, record)
        r = subprocess.run([sys.executable, "-m", "escha_deploy", "plan", "-p", "linux-tp2-l3", "--facts", str(f),
                            "--set", "hicache.enabled=false", "--format", "json"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        docs[record + ".plan"] = json.loads(r.stdout)
    g = docs["nvml-2x-rtx4090.json"].gpus
    assert g[0].brand == "GeForce" and g[0].p2p == {"1": "not supported"} and g[1].p2p == {"0": "not supported"}
    assert g[0].pci_device_id >> 16 == 0x2684
    back = inventory_from_records(list(g))
    assert back.p2p_pairs == {"0-1": "not supported"} and back.gpus[1].brand == "GeForce"
    # one GPU shape: the facts file's records are the inventory's, nothing lost either way
    assert back.gpus == list(g) == recorded_inventory("nvml-2x-rtx4090.json").gpus
    assert docs["nvml-2x-rtx4090.json.plan"]["peer_access"]["proven"] is False
    assert docs["nvml-2x-h200-p2p.json.plan"]["peer_access"]["proven"] is True
    # the launch's digest covers the GPU records (and the flags they decide)
    digests = {docs[r + ".plan"]["plan_digest"] for r in ("nvml-2x-rtx4090.json", "nvml-2x-h200-p2p.json")}
    assert len(digests) == 2 and None not in digests


def test_records_without_p2p_facts_leave_nccl_alone():
    """A hand-written facts file listing GPUs without their P2P status proves nothing: the
    flag is rendered, but NCCL_P2P_DISABLE is not forced (NCCL detects P2P itself)."""
    from escha_deploy.facts.factsfile import GpuRecord, inventory_from_records

    inv = inventory_from_records([GpuRecord(index=i, name="NVIDIA H200", compute_capability="9.0") for i in (0, 1)])
    args, env, p = _launch(inv, B35_SETS)
    assert "--disable-custom-all-reduce" in args and "NCCL_P2P_DISABLE" not in env
    assert not p.peer_access.proven and not p.peer_access.denied and "not asked" in p.peer_access.detail


def test_fatbin_reader_on_a_real_library_of_the_pinned_wheel():
    """The reader over a real CUDA library: ``sgl_kernel/spatial_ops.abi3.so`` (81 KB, Apache-2.0)
    copied unchanged from the sglang-kernel 0.4.6.post1 wheel; it agrees with the committed
    record, and a file that is not ELF, or ELF without device code, gives no architectures."""
    from escha_deploy.doctor.kernel_archs import library_archs

    lib = FIXTURES / "sgl_kernel-0.4.6.post1-spatial_ops.abi3.so"
    assert library_archs([lib]) == ARCHS["wheels"]["sglang-kernel"]["libraries"]["sgl_kernel/spatial_ops.abi3.so"]
    assert library_archs([lib])["sass"] == [80, 89, 90, 100, 120]
    assert library_archs([FIXTURES / "nvml-h200.json"]) == {"sass": [], "ptx": []}
    assert library_archs([sys.executable]) == {"sass": [], "ptx": []}


def test_a_doctor_report_carries_the_gpu_records_and_an_earlier_report_still_reads(tmp_path):
    """One GPU shape from NVML to a doctor report to ``plan --facts``: the report's
    ``facts.gpus`` holds the inventory's ``GpuRecord``s and reads back to the same records. A
    report in the shape written before (each GPU's ``vram_bytes``, the pair facts at the top
    keyed ``"i-j"``) reads to the same records. NVML is a recorded answer (a stand-in: no GPU
    here); doctor runs for real, its probes off."""
    import copy

    from escha_deploy.doctor.run import run_doctor
    from escha_deploy.facts.factsfile import facts_from_doctor_report

    inv = recorded_inventory("nvml-2x-rtx4090.json")
    r = run_doctor(None, probes=False, findings_path=tmp_path / "d.json", docker=lambda: DockerFacts(reachable=False),
                   gpus=lambda: inv)
    report = json.loads(r.model_dump_json())
    assert report["facts"]["gpus"]["gpus"][0]["p2p"] == {"1": "not supported"}
    assert "p2p" not in report["facts"]["gpus"] and "vram_bytes" not in report["facts"]["gpus"]["gpus"][0]
    assert facts_from_doctor_report(report).gpus == inv.gpus
    earlier = copy.deepcopy(report)
    gpus = earlier["facts"]["gpus"]
    gpus["p2p"], gpus["topology"] = inv.p2p_pairs, inv.topology_pairs
    for g in gpus["gpus"]:
        g["vram_bytes"] = g.pop("memory_total_bytes")
        del g["p2p"], g["topology"]
    assert facts_from_doctor_report(earlier).gpus == inv.gpus
