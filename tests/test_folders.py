"""Model folder and L3 checks (field reports B43, B33), through the CLI as a user runs it, on
real folders: ``folders.check_model_folder`` (exit 2) and ``folders.check_l3_dir`` (exit 3) at
``plan`` of this host, ``up`` and ``serve``; a plan of a described host warns instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from escha_deploy.facts.folders import check_l3_dir, check_model_folder, mount_point

FP8 = "rtx5060ti-tp2-fp8"
L3 = "linux-tp2-l3"


def cli(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "escha_deploy", *args], capture_output=True, text=True,
                          timeout=120)


def model(d: Path, config: bool = True, weights: str | None = "model.safetensors") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    if config:
        (d / "config.json").write_text("{}")
    if weights:
        (d / weights).write_bytes(b"\0" * 16)
    return d


# --------------------------------------------------------------------------- B43

def test_b43_empty_model_folder_is_bad_input_at_plan_and_up(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv in (["plan", "-p", FP8, "--set", f"model.host_dir={empty}"],
                 ["up", "-p", FP8, "--set", f"model.host_dir={empty}", "--dry-run"]):
        r = cli(*argv)
        assert f"model.host_dir: {empty} has no config.json and no weights" in r.stderr
        assert "Traceback" not in r.stderr
        # up --dry-run reports every preflight failure and exits with the code of the first one
        # up itself meets: a daemon without an NVIDIA runtime or without the image (exit 3, as
        # here) comes before the model folder (exit 2); on a ready box the folder's 2 is first
        machine = [ln for ln in r.stderr.splitlines()
                   if ln.startswith(("error: docker:", "error: container.image:"))]
        assert r.returncode == (3 if machine else 2), (argv, r.stdout, r.stderr)


def test_b43_model_one_level_down_names_the_fix(tmp_path):
    top = tmp_path / "models"
    inner = model(top / "Qwen3.x-27B-FP8")
    r = cli("plan", "-p", FP8, "--set", f"model.host_dir={top}")
    assert r.returncode == 2 and f"one level down: set model.host_dir={inner}" in r.stderr


def test_missing_config_or_weights_named_alone(tmp_path):
    assert check_model_folder(str(model(tmp_path / "a", config=False))) == [
        f"model.host_dir: {tmp_path / 'a'} has no config.json"]
    only_index = model(tmp_path / "b", weights="model.safetensors.index.json")
    [line] = check_model_folder(str(only_index))
    assert "no weights" in line and "model.safetensors.index.json names shards that are not here" in line
    assert check_model_folder(str(model(tmp_path / "c", weights="pytorch_model.bin"))) == []
    assert check_model_folder(str(tmp_path / "nope"), "model.path") == [f"model.path: {tmp_path / 'nope'} is not a folder here"]


def test_serve_checks_the_model_folder_too(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli("serve", "-p", FP8, "--set", "runtime.needs=[]", "--set", f"model.host_dir={empty}", "--print")
    assert r.returncode == 2 and "has no config.json and no weights" in r.stderr


# --------------------------------------------------------------------------- B33

def _free(p: Path) -> int:
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def test_b33_free_space_below_the_need_is_refused_at_plan_up_and_serve(tmp_path):
    # the cap is per rank (TP2: two caps); 2 GB more than this filesystem has free, less than its size
    cap = _free(tmp_path) // 2 + 10**9
    sets = ["--set", f"hicache.l3.dir={tmp_path}", "--set", f"hicache.l3.max_size={cap}B"]
    for argv in (["plan", "-p", L3, "--hicache-size", "3", *sets], ["up", "-p", L3, *sets, "--dry-run"],
                 ["serve", "-p", L3, "--set", "runtime.needs=[]", *sets, "--print"]):
        r = cli(*argv)
        assert r.returncode == 3, (argv, r.stderr)
        # up refuses with the line alone; plan shows the plan with it as a reason, serve --print its refusals
        said = " ".join((r.stderr if argv[0] == "up" else r.stdout).split())  # serve --print: its refusals
        assert f"hicache.l3.dir: {tmp_path} has" in said and f"on {mount_point(tmp_path)} (statvfs)" in said
        assert "less than the" in said and "Traceback" not in r.stderr
        assert "x 2 ranks" in said and "delete" not in said and "free space there" not in said


def test_b33_unwritable_directory_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    # root writes anywhere: drop the capabilities that let it (util-linux setpriv), as a server
    # running as an ordinary user would be
    prefix = (("setpriv", "--inh-caps=-dac_override,-dac_read_search",
               "--bounding-set=-dac_override,-dac_read_search") if os.geteuid() == 0 else ())
    r = cli("plan", "-p", L3, "--hicache-size", "3", "--set", f"hicache.l3.dir={ro}",
            "--set", "hicache.l3.max_size=1GB", prefix=prefix)
    said = " ".join(r.stdout.split())  # plan: a reason of the plan it shows
    assert r.returncode == 3 and f"hicache.l3.dir: {ro} is not writable (Permission denied)" in said
    assert "0.00 GB free" not in said


def test_missing_directory_is_refused_and_a_good_one_passes(tmp_path):
    assert "does not exist here" in check_l3_dir(str(tmp_path / "nope"), 10**9)[0]
    r = cli("plan", "-p", L3, "--hicache-size", "3", "--set", f"hicache.l3.dir={tmp_path}",
            "--set", "hicache.l3.max_size=1GB")
    assert r.returncode == 0, r.stderr
    assert "not checked" not in r.stdout + r.stderr
    assert not list(tmp_path.iterdir())  # the write check leaves nothing behind


def test_plan_of_this_host_shows_the_plan_with_a_missing_directory_as_its_reason(tmp_path):
    import json

    missing = tmp_path / "l3"
    sets = ["--set", f"hicache.l3.dir={missing}", "--set", "hicache.l3.max_size=1GB"]
    r = cli("plan", "-p", L3, "--hicache-size", "3", *sets, "--format", "json")
    assert r.returncode == 3, r.stderr
    d = json.loads(r.stdout)  # one JSON object, as for any plan
    assert d["verdict"] == "unsafe" and d["per_rank"]["pinned_bytes"] > 0
    assert d["reasons"][0] == (f"hicache.l3.dir: {missing} does not exist here; create it (mkdir -p {missing}) "
                               "on a disk with room for the tier")
    assert not any("not checked" in w for w in d["warnings"])
    table = cli("plan", "-p", L3, "--hicache-size", "3", *sets)
    assert table.returncode == 3 and "error:" not in table.stderr
    shown = " ".join(table.stdout.split())
    assert "verdict: unsafe" in shown and f"- hicache.l3.dir: {missing} does not exist here" in shown
    missing.mkdir()  # the fix the reason names: the same plan is no longer refused for it
    fixed = json.loads(cli("plan", "-p", L3, "--hicache-size", "3", *sets, "--format", "json").stdout)
    assert not any("hicache.l3.dir" in x for x in fixed["reasons"] + fixed["warnings"])


def test_described_host_warns_that_the_directory_was_not_checked(tmp_path):
    r = cli("plan", "-p", L3, "--hicache-size", "3", "--host-ram", "64GiB", "--set",
            "hicache.l3.dir=/nowhere/on/this/machine")
    assert r.returncode == 0, r.stderr
    assert "hicache.l3.dir: /nowhere/on/this/machine was not checked (this plan describes another host)" in (
        r.stdout + r.stderr)
