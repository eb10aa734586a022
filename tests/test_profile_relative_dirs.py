"""A relative L3 folder is taken from the folder of the profile file that sets it (the current
folder for a --set), whatever folder the command runs in: `plan` here and `compose` elsewhere
mount the same folder."""

from __future__ import annotations

import os

from escha_deploy.profile import load_profile


def _profile(tmp_path):
    sub = tmp_path / "profiles" / "mine"
    sub.mkdir(parents=True)
    p = sub / "p.yaml"
    p.write_text("extends: linux-tp2-l3\nhicache:\n  l3: {kind: file, dir: ../../cache/l3, max_size: 10GB}\n")
    return p


def test_a_relative_dir_is_the_files_whatever_the_current_folder(tmp_path, monkeypatch):
    p = _profile(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for cwd in (tmp_path, elsewhere, p.parent):
        monkeypatch.chdir(cwd)
        assert load_profile(os.path.relpath(p)).hicache.storage_dir == str(tmp_path / "cache" / "l3")


def test_a_relative_dir_from_set_is_the_current_folders(tmp_path, monkeypatch):
    p = _profile(tmp_path)
    monkeypatch.chdir(tmp_path / "profiles")
    prof = load_profile(str(p), ["hicache.l3.dir=here/l3"])
    assert prof.hicache.storage_dir == str(tmp_path / "profiles" / "here" / "l3")


def test_a_flat_storage_dir_is_anchored_too_and_absolute_ones_are_kept(tmp_path, monkeypatch):
    p = tmp_path / "flat.yaml"
    p.write_text("extends: rtx5060ti-tp2-fp8\nhicache:\n  hicache_storage_backend: file\n  storage_dir: l3\n"
                 "  storage_max_size: 10GB\n")
    monkeypatch.chdir("/")
    assert load_profile(str(p)).hicache.storage_dir == str(tmp_path / "l3")
    assert load_profile(str(p), ["hicache.storage_dir=/srv/l3"]).hicache.storage_dir == "/srv/l3"
    assert load_profile(str(p), ["hicache.storage_dir=~/l3"]).hicache.storage_dir.startswith("~")
