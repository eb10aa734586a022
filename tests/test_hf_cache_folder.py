"""A model folder as `hf download` leaves it: a snapshot of a Hugging Face cache, whose files are
links to ``../../blobs/HASH``. It plans (read through the links), its launch mounts the
repository's ``blobs/`` where the links point from ``model.path`` so the server reads real files,
and a link that leaves the folder any other way is refused (exit 2, the link named)."""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import subprocess

import pytest

from tests.hf_layout import CONFIG, hf_cache, snapshot
from tests.inproc import run_main

PROFILE = ("-p", "rtx5060ti-tp2-fp8")
HOST = ("--host-ram", "64GiB", "--linux")
NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent.sock"}


def _plan(folder, *extra):
    return run_main("plan", *PROFILE, "--set", f"model.host_dir={folder}", *HOST, "-f", "json", *extra)


def _mounts(folder) -> list[dict]:
    r = run_main("up", *PROFILE, "--set", f"model.host_dir={folder}", "--dry-run", "-f", "json", env=NO_DOCKER)
    return [m for m in json.loads(r.out)["container"]["mounts"] if m["type"] == "bind"]


def test_the_layout_is_huggingface_hubs_own(tmp_path):
    from huggingface_hub import scan_cache_dir

    hf_cache(tmp_path / "hub")
    info = scan_cache_dir(tmp_path / "hub")
    assert info.warnings == [] and [(r.repo_id, len(r.revisions)) for r in info.repos] == [("escha-test/tiny", 2)]


def test_a_snapshot_plans_from_its_headers_and_mounts_its_blobs(tmp_path):
    root = hf_cache(tmp_path / "hub")
    snap = snapshot(root)
    r = _plan(snap)
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["weights_source"] == "headers" and str(snap) in d["weights_source_detail"]
    path = "/models/Qwen3.x-27B-GPTQ-Int4"  # the profile's model.path
    assert {"source": str(snap), "target": path} in [{k: m[k] for k in ("source", "target")} for m in _mounts(snap)]
    blobs = {"type": "bind", "source": str(root / "blobs"), "target": "/blobs", "read_only": True}
    assert blobs in _mounts(snap)
    # every link, read from model.path in the container, lands in the blobs mount
    for f in snap.iterdir():
        assert posixpath.normpath(posixpath.join(path, os.readlink(f))).startswith("/blobs/")


def _unshare_ok() -> bool:
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(not _unshare_ok(), reason="no user and mount namespaces here (unshare -rm)")
def test_the_container_reads_config_json_through_the_mounts(tmp_path):
    """The dry run's bind mounts, made for real (a private mount namespace, ``unshare -rm``)
    under a stand-in root: config.json read at model.path is the blob's bytes."""
    snap = snapshot(hf_cache(tmp_path / "hub"))
    fake = tmp_path / "root"
    lines = []
    for m in _mounts(snap):
        if not os.path.isdir(m["source"]):
            continue
        lines.append(f"mkdir -p '{fake}{m['target']}' && mount --bind -o ro '{m['source']}' '{fake}{m['target']}'")
    script = " && ".join(lines) + f" && cat '{fake}/models/Qwen3.x-27B-GPTQ-Int4/config.json'"
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == CONFIG


def test_a_link_that_leaves_the_folder_is_refused(tmp_path):
    root = hf_cache(tmp_path / "hub")
    snap = snapshot(root)
    (tmp_path / "elsewhere.json").write_text("{}")
    os.symlink(tmp_path / "elsewhere.json", snap / "generation_config.json")
    r = _plan(snap)
    assert r.code == 2 and r.out == ""
    assert r.err.splitlines() == [
        f"error: model.host_dir: {snap / 'generation_config.json'}: a link to {tmp_path / 'elsewhere.json'}, "
        f"outside {snap} and its cache's blobs/: the container sees only the mounted folder; copy the file into the folder"]


def test_an_absolute_link_into_the_blobs_and_a_plain_folder_escaping_are_refused(tmp_path):
    root = hf_cache(tmp_path / "hub")
    snap = snapshot(root)
    cfg = snap / "config.json"
    blob = os.path.realpath(cfg)
    cfg.unlink()
    os.symlink(blob, cfg)  # absolute: the container has no such path
    assert _plan(snap).code == 2
    plain = tmp_path / "plain"
    shutil.copytree(snapshot(root, "b" * 40), plain)  # real files (copytree follows links)
    assert _plan(plain).code == 0
    (plain / "tokenizer.json").symlink_to(tmp_path / "hub")
    r = _plan(plain)
    assert r.code == 2 and "tokenizer.json: a link to" in r.err and f"outside {plain}:" in r.err


def test_a_link_to_the_snapshot_is_told_to_name_the_snapshot(tmp_path):
    snap = snapshot(hf_cache(tmp_path / "hub"))
    (tmp_path / "model").symlink_to(snap)
    r = _plan(tmp_path / "model")
    assert r.code == 2 and f"set model.host_dir={snap} (the Hugging Face snapshot itself" in r.err
    assert len(r.err.splitlines()) <= 4
