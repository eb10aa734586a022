"""`serve`'s check of what it can see against the spec (launch/check.py), on fixture trees and
real model folders: each disagreement named with both numbers; a model folder without
config.json or weights is bad input."""

from __future__ import annotations

from pathlib import Path

from escha_deploy.host import described_host
from escha_deploy.launch.check import check_here, gpu_nodes, mounted_model_problems
from escha_deploy.launch_spec import build_launch_spec
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile
from escha_deploy.units import GiB


def _tree(tmp_path: Path, mem_kib: int, limit: int | None = None, nvidia: int = 0) -> Path:
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc/meminfo").write_text(f"MemTotal: {mem_kib} kB\nMemAvailable: {mem_kib} kB\n")
    (root / "sys/fs/cgroup").mkdir(parents=True)
    (root / "sys/fs/cgroup/memory.max").write_text(f"{limit}\n" if limit else "max\n")
    (root / "sys/fs/cgroup/memory.current").write_text("0\n")
    (root / "proc/self").mkdir()
    (root / "proc/self/status").write_text("CapEff:\t0000000000004000\n")  # CAP_IPC_LOCK
    (root / "dev").mkdir()
    for i in range(nvidia):
        (root / f"dev/nvidia{i}").write_text("")
    return root


def _launch():
    prof = load_profile("rtx5060ti-tp2-fp8")
    return build_launch_spec(plan(prof, described_host(32 * GiB, "linux")), prof)


def test_memory_below_the_plan_is_refused_with_both_numbers(tmp_path):
    launch = _launch()
    want = launch.facts.memory_base_bytes
    got = check_here(launch, launch.facts.capabilities, where="here", gpus=False,
                     root=_tree(tmp_path, 64 * 2**20, limit=8 * GiB))
    assert [r for r in got.refusals if r.startswith("memory:")] == [
        r for r in got.refusals if f"can have {8 * GiB:,} B" in r and f"below the {want:,} B" in r]
    assert any(r.startswith("memory:") for r in got.refusals)


def test_enough_memory_gpus_and_capabilities_pass(tmp_path):
    launch = _launch()
    got = check_here(launch, launch.facts.capabilities, where="here", root=_tree(tmp_path, 64 * 2**20, nvidia=2),
                     environ={})
    assert got.refusals == []
    # the shipped profile mounts its model folder, absent on this machine: bad input, not a refusal
    assert [m for m in got.bad_input if not m.startswith("model.path: ")] == []


def test_missing_gpus_and_capabilities_are_named(tmp_path):
    launch = _launch()
    got = check_here(launch, [], where="this runtime", root=_tree(tmp_path, 64 * 2**20, nvidia=1), environ={})
    assert any("1 CUDA device(s) here" in r and "needs 2" in r for r in got.refusals)
    assert any("runtime lacks capability 'hicache-host-reserve-env'" in r for r in got.refusals)
    assert gpu_nodes(_tree(tmp_path / "x", 1024, nvidia=3)) == (3, False)


def test_model_folder_without_config_or_weights_is_bad_input(tmp_path):
    d = tmp_path / "model"
    assert mounted_model_problems(str(d)) == [f"model.path: {d} is not a folder here (is model.host_dir mounted?)"]
    d.mkdir()
    got = " | ".join(mounted_model_problems(str(d)))
    assert got.startswith(f"model.path: {d} ") and "config.json" in got and "weights" in got
    (d / "config.json").write_text("{}")
    (d / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 8)
    assert mounted_model_problems(str(d)) == []
