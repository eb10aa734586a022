"""`serve`'s check of what it can see against the spec (launch/check.py), on fixture trees and
real model folders: each disagreement named with both numbers; a model folder without
config.json or weights is bad input."""

from __future__ import annotations

import os
from pathlib import Path

from escha_deploy.facts.machine import described_host
from escha_deploy.launch.check import check_here, gpu_nodes, mounted_model_problems
from escha_deploy.pipeline.spec import build_launch_spec
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile
from escha_deploy.utils.units import GiB


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


def _l3_launch(**kw):
    prof = load_profile("linux-tp2-l3")
    return prof, build_launch_spec(plan(prof, described_host(128 * GiB, "linux")), prof, **kw)


def test_the_spec_carries_the_l3_store_as_typed_needs():
    """The folder and cap `serve --spec` checks are the spec's `needs`, the pair its env renders
    (flags.file_l3_store): the mount point in a container, hicache.l3.dir natively."""
    from escha_deploy.pipeline.argv import CONTAINER_L3_DIR

    prof, launch = _l3_launch()
    cap = prof.hicache.storage_max_size
    assert cap == 512 * 10**9
    assert (launch.needs.l3_dir, launch.needs.l3_max_bytes) == (CONTAINER_L3_DIR, cap)
    assert (launch.env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"],
            launch.env["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"]) == (CONTAINER_L3_DIR, str(cap))
    _, native = _l3_launch(native=True)
    assert (native.needs.l3_dir, native.needs.l3_max_bytes) == (prof.hicache.storage_dir, cap)
    # no file L3, nothing to provide
    assert (_launch().needs.l3_dir, _launch().needs.l3_max_bytes) == (None, None)


def test_the_l3_check_reads_the_needs_never_the_env(tmp_path):
    """A spec whose env names no L3 folder is still checked at its needs.l3_dir: a folder that
    is not there, then a real one with less free space than the cap (statvfs of tmp_path)."""
    _, launch = _l3_launch()
    env = {k: v for k, v in launch.env.items() if not k.startswith("SGLANG_HICACHE_FILE_BACKEND_")}
    missing = tmp_path / "l3"
    spec = launch.model_copy(update={"env": env, "needs": launch.needs.model_copy(update={"l3_dir": str(missing)})})
    root = _tree(tmp_path, 256 * 2**20, nvidia=2)
    got = check_here(spec, spec.facts.capabilities, where="here", root=root, environ={})
    assert [r for r in got.refusals if r.startswith("hicache.l3.dir:")] == [
        f"hicache.l3.dir: {missing} does not exist here; create it (mkdir -p {missing}) on a disk with room for the tier"]
    missing.mkdir()
    huge = spec.model_copy(update={"needs": spec.needs.model_copy(update={"l3_max_bytes": 2**62})})
    got = check_here(huge, spec.facts.capabilities, where="here", root=root, environ={})
    assert any(r.startswith("hicache.l3.max_size: the tier needs ") and "more than the whole filesystem" in r
               for r in got.refusals)
    st = os.statvfs(missing)  # each of the needs' owner ranks holds its cap: together 2 GB over the free space
    short = spec.model_copy(update={"needs": spec.needs.model_copy(update={
        "l3_max_bytes": st.f_bavail * st.f_frsize // spec.needs.l3_owner_ranks + 10**9})})
    got = check_here(short, spec.facts.capabilities, where="here", root=root, environ={})
    assert spec.needs.l3_owner_ranks == 2
    assert any(r.startswith(f"hicache.l3.dir: {missing} has ") and "less than the" in r for r in got.refusals)
    ok = spec.model_copy(update={"needs": spec.needs.model_copy(update={"l3_max_bytes": 1})})
    got = check_here(ok, spec.facts.capabilities, where="here", root=root, environ={})
    assert not [r for r in got.refusals if r.startswith("hicache.l3.dir:")]


def test_a_version_1_spec_is_refused_naming_both_versions(tmp_path):
    """Version 1 kept the L3 store in env alone; this escha-deploy reads version 3 and refuses
    another one in one line (launch/serve.read_spec), exit 3."""
    import json

    import pytest

    from escha_deploy.utils.errors import Refused
    from escha_deploy.launch.serve import read_spec
    from escha_deploy.pipeline.spec import LAUNCH_SPEC_SCHEMA_VERSION, spec_json

    _, launch = _l3_launch()
    path = tmp_path / "spec.json"
    path.write_text(spec_json(launch))
    assert read_spec(path) == launch
    data = json.loads(path.read_text())
    data["schema_version"] = 1
    for k in ("l3_dir", "l3_max_bytes"):
        del data["needs"][k]
    path.write_text(json.dumps(data))
    with pytest.raises(Refused) as err:
        read_spec(path)
    assert LAUNCH_SPEC_SCHEMA_VERSION == 3
    assert list(err.value.problems) == [f"{path}: launch spec schema version 1 (written by escha-deploy "
                                  f"{launch.escha_version}); this escha-deploy {launch.escha_version} reads "
                                  "schema version 3"]


def test_the_draft_folder_is_a_need_serve_checks(tmp_path):
    """A profile naming a speculative draft folder (``model.draft``) gives the spec
    ``needs.draft_path``, the folder as the server sees it, and ``serve``'s check refuses a
    draft folder without config.json or weights as bad input, naming the key that gave it;
    SGLang would load the draft only after the target's weights."""
    import json

    draft = tmp_path / "draft"
    sets = ["runtime.speculative.algorithm=EAGLE3", "model.draft.path=/drafts/e3",
            f"model.draft.host_dir={draft}"]
    prof = load_profile("rtx5060ti-tp2-fp8", sets)
    p = plan(prof, described_host(32 * GiB, "linux"))
    container, native = build_launch_spec(p, prof), build_launch_spec(p, prof, native=True)
    assert (container.needs.draft_path, native.needs.draft_path) == ("/drafts/e3", str(draft))
    assert _launch().needs.draft_path is None  # no draft, nothing to provide
    root = _tree(tmp_path, 64 * 1024 * 1024, nvidia=2)
    env = {"ESCHA_SKIP_GPU_PREFLIGHT": "1"}

    def draft_lines(launch, environ):  # the profile's model.host_dir is not on this machine either
        lines = check_here(launch, prof.runtime.needs, where="here", root=root, environ=environ).bad_input
        return [ln for ln in lines if ln.startswith("model.draft.")]

    got = draft_lines(native, env)
    assert got == [f"model.draft.host_dir: {draft} is not a folder here (natively serve loads model.draft.host_dir; "
                   "model.draft.path is the folder as a container sees it)"], got
    draft.mkdir()
    got = draft_lines(native, env)
    assert len(got) == 1 and got[0].startswith(f"model.draft.host_dir: {draft} has no config.json and no weights"), got
    (draft / "config.json").write_text(json.dumps({"num_hidden_layers": 1}))
    (draft / "model.safetensors").write_bytes(b"\0" * 8)
    assert draft_lines(native, env) == []
    # in the container the key is model.draft.path, where model.draft.host_dir is mounted
    got = draft_lines(container, {**env, "ESCHA_SERVE_MODE": "container"})
    assert got == ["model.draft.path: /drafts/e3 is not a folder here (is model.draft.host_dir mounted?)"], got
