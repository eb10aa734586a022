"""`model adopt FOLDER` checks a folder already on disk offline and pins it; `plan` refuses a
folder whose safetensors index names a missing shard, or a shard shorter than its header
(exit 3, the file named)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from escha_deploy.checkpoint import LOCK_NAME
from tests.hf_layout import CONFIG, checkpoint_files, hf_cache, safetensors, snapshot
from tests.inproc import run_main

SHARD1 = "model-00001-of-00002.safetensors"


def _plan(folder):
    return run_main("plan", "-p", "rtx5060ti-tp2-fp8", "--set", f"model.host_dir={folder}",
                    "--host-ram", "64GiB", "--linux", "-f", "json")


def _plain(tmp_path, files=None):
    d = tmp_path / "model"
    d.mkdir()
    for name, data in (files or checkpoint_files()).items():
        (d / name).write_bytes(data)
    return d


def test_a_cache_snapshot_is_adopted_verified_and_planned_as_pinned(tmp_path):
    snap = snapshot(hf_cache(tmp_path / "hub"))
    r = run_main("model", "adopt", str(snap), "-f", "json")
    assert r.code == 0, r.err
    assert r.err.splitlines()[0].startswith(f"model adopt: {snap}: checked offline; hashing 4 files")
    lock = json.loads(r.out)["lock"]
    assert (lock["repo"], lock["commit"], lock["endpoint"]) == ("escha-test/tiny", "a" * 40, "local (model adopt)")
    want = {n: hashlib.sha256(d).hexdigest() for n, d in checkpoint_files().items()}
    assert {f["name"]: f["sha256"] for f in lock["files"]} == want
    assert run_main("model", "verify", str(snap)).code == 0
    d = json.loads(_plan(snap).out)
    assert d["model_pin"].startswith("pinned escha-test/tiny@aaaaaaaaaaaa")
    again = run_main("model", "adopt", str(snap))  # a lock is there: said, not overwritten
    assert again.code == 2 and "already pins escha-test/tiny@aaaaaaaaaaaa" in again.err


def test_a_plain_folder_is_pinned_by_its_contents(tmp_path):
    d = _plain(tmp_path)
    r = run_main("model", "adopt", str(d), "-f", "json")
    assert r.code == 0, r.err
    lock = json.loads(r.out)["lock"]
    assert lock["repo"] == "local/model" and len(lock["commit"]) == 64
    (d / "config.json").write_text(json.dumps({**CONFIG, "num_hidden_layers": 3}))
    v = run_main("model", "verify", str(d))
    assert v.code == 3 and "config.json: sha256" in v.err


def test_a_missing_shard_is_refused_by_plan_and_adopt_naming_it(tmp_path):
    snap = snapshot(hf_cache(tmp_path / "hub"))
    (snap / SHARD1).unlink()
    line = f"error: model.host_dir: {snap / SHARD1}: missing (model.safetensors.index.json names it for 1 tensors)"
    r = _plan(snap)
    assert r.code == 3 and r.out == "" and r.err.splitlines()[0] == line, r.err
    a = run_main("model", "adopt", str(snap))
    assert a.code == 3 and f"{snap / SHARD1}: missing" in a.err
    assert not (snap / LOCK_NAME).exists()
    for argv in (("serve", "--print"), ("up", "--dry-run")):  # the same check, before anything starts
        r = run_main(argv[0], "-p", "rtx5060ti-tp2-fp8", "--set", f"model.host_dir={snap}", *argv[1:],
                     env={"DOCKER_HOST": "unix:///nonexistent.sock"})
        assert r.code == 3 and line in r.err.splitlines(), r.err


def test_a_short_shard_is_refused_by_plan_and_adopt_naming_it(tmp_path):
    d = _plain(tmp_path)
    full = (d / SHARD1).read_bytes()
    (d / SHARD1).write_bytes(full[:-100])  # a download cut short
    r = _plan(d)
    assert r.code == 3 and r.err.splitlines()[0] == (
        f"error: model.host_dir: {d / SHARD1}: {len(full) - 100:,} bytes, shorter than the {len(full):,} its "
        "header needs (a partial download or copy?)"), r.err
    a = run_main("model", "adopt", str(d))
    assert a.code == 3 and f"{d / SHARD1}: {len(full) - 100:,} bytes" in a.err and not (d / LOCK_NAME).exists()


@pytest.mark.parametrize(("change", "said"), [
    ("dtype", f"{SHARD1}: tensor 'a.weight' is F16, but config.json's dtype is BF16"),
    ("index", "names model-00002-of-00002.safetensors for tensor 'a.weight', which is in " + SHARD1),
    ("total", "metadata.total_size is 1 bytes, the shards' tensors are 49,152"),
    ("twice", "tensor 'a.weight' is in both"),
    ("dup", "has the key 'a.weight' twice in one object"),
])
def test_a_folder_whose_parts_disagree_is_refused(tmp_path, change, said):
    files = checkpoint_files()
    index = json.loads(files["model.safetensors.index.json"])
    if change == "dtype":
        files[SHARD1] = safetensors({"a.weight": ("F16", [64, 256])})
    elif change == "index":
        index["weight_map"]["a.weight"] = "model-00002-of-00002.safetensors"
    elif change == "total":
        index["metadata"]["total_size"] = 1
    elif change == "twice":
        files["model-00002-of-00002.safetensors"] = safetensors({"a.weight": ("BF16", [64, 256])})
        index["weight_map"] = {"a.weight": SHARD1}
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    if change == "dup":  # an index naming one tensor twice (JSON keeps the last, silently)
        files["model.safetensors.index.json"] = files["model.safetensors.index.json"].replace(
            b'"weight_map": {', b'"weight_map": {"a.weight": "model-00002-of-00002.safetensors", ')
    d = _plain(tmp_path, files)
    r = run_main("model", "adopt", str(d))
    assert r.code == 3 and said in r.err and "Traceback" not in r.err, r.err
    assert not (d / LOCK_NAME).exists()


def test_bad_folders_are_one_line_and_write_nothing(tmp_path):
    r = run_main("model", "adopt", str(tmp_path / "nope"))
    assert (r.code, r.err.splitlines()) == (2, [f"error: model adopt: {tmp_path / 'nope'}: not a folder here"])
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run_main("model", "adopt", str(empty))
    assert r.code in (2, 3) and r.err.startswith(f"error: model adopt: {empty} has no config.json") and not os.listdir(empty)


@pytest.mark.skipif(shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0,
                    reason="no user and mount namespaces here (unshare -rm)")
def test_a_read_only_folder_is_refused_before_hashing(tmp_path):
    d = _plain(tmp_path)
    script = (f"mount --bind '{d}' '{d}' && mount -o remount,bind,ro '{d}' && "
              f"exec '{sys.executable}' -m escha_deploy.cli.main model adopt '{d}'")
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [f"error: model adopt: {d}: cannot write {LOCK_NAME} there (Read-only file system)"]
    assert not (d / LOCK_NAME).exists()


def test_progress_names_a_windows_drive_as_the_cause_of_a_slow_read(tmp_path, monkeypatch):
    """Under WSL2 a folder on /mnt/c is a 9p mount (/proc/self/mounts), read at tens of MB/s:
    the progress says so. The mount type and the progress interval are stood in for here."""
    from escha_deploy.checkpoint import adopt

    d = _plain(tmp_path)
    assert adopt._fs_type(d) not in (None, *adopt.WINDOWS_FS)  # read from this box's /proc/self/mounts
    monkeypatch.setattr(adopt, "_fs_type", lambda _p: "9p")
    monkeypatch.setattr(adopt, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(adopt, "SLOW_BYTES_PER_S", float("inf"))
    said: list[str] = []
    adopt.adopt(d, report=said.append)
    assert said[0].endswith("(on a Windows drive, 9p: slow under WSL2)")
    assert any(f"slow: {d} is on a Windows drive (9p)" in line for line in said), said
    assert said[-1].startswith("model adopt: hashed ")
