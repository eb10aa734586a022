"""A model lock file is trusted no further than its bytes: every name confined to the model
folder, every entry with a hash, at least one entry, and only the schema version this
escha-deploy reads. Each is one ``error:`` line naming the file and the entry, exit 2."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

CONFIG = b'{"architectures": ["X"]}'


def _entry(name: str = "config.json", **kw) -> dict:
    return {"name": name, "size": len(CONFIG), "sha256": hashlib.sha256(CONFIG).hexdigest(), **kw}


def _folder(tmp_path: Path, files: list[dict], **top) -> Path:
    d = tmp_path / "models" / "m"
    d.mkdir(parents=True)
    (d / "config.json").write_bytes(CONFIG)
    lock = {"schema_version": 1, "repo": "escha-test/tiny", "revision": "main", "commit": "ab" * 20,
            "endpoint": "http://127.0.0.1:9", "pulled_at": "2026-12-07T00:00:00+00:00", "files": files, **top}
    (d / "escha-model.lock.json").write_text(json.dumps(lock))
    return d


def test_a_good_lock_verifies(cli, tmp_path):
    r = cli("model", "verify", str(_folder(tmp_path, [_entry()])))
    assert r.code == 0 and "1 files verified" in r.out, r.err


@pytest.mark.parametrize("name", ["../../etc/hostname", "/etc/hostname", "a/../../x", "./config.json",
                                  "a//b", "C:/x", "..\\..\\x"])
def test_a_name_outside_the_folder_is_refused_naming_the_entry(cli, tmp_path, name):
    outside = tmp_path / "etc" / "hostname"  # what ../../etc/hostname reaches from the folder
    outside.parent.mkdir()
    outside.write_bytes(CONFIG)
    d = _folder(tmp_path, [_entry(), _entry(name)])
    r = cli("model", "verify", str(d))
    assert r.code == 2, (r.code, r.out, r.err)
    (line,) = [ln for ln in r.err.splitlines() if ln.startswith("error:")]
    assert f"files[1] {name!r}: not a name inside the model folder" in line and "escha-model.lock.json" in line


def test_an_entry_without_a_hash_is_refused(cli, tmp_path):
    d = _folder(tmp_path, [{"name": "config.json", "size": len(CONFIG)}])
    r = cli("model", "verify", str(d))
    assert r.code == 2 and "files[0] 'config.json': no hash" in r.err, r.err


def test_a_hash_that_is_not_hex_is_refused(cli, tmp_path):
    r = cli("model", "verify", str(_folder(tmp_path, [_entry(sha256="zz")])))
    assert r.code == 2 and "sha256 is not 64 hex digits" in r.err, r.err


def test_no_files_is_refused(cli, tmp_path):
    r = cli("model", "verify", str(_folder(tmp_path, [])))
    assert r.code == 2 and "files: empty" in r.err and "0 files verified" not in r.out, r.err


def test_a_name_twice_is_refused(cli, tmp_path):
    r = cli("model", "verify", str(_folder(tmp_path, [_entry(), _entry()])))
    assert r.code == 2 and "files[1] 'config.json': named twice" in r.err, r.err


@pytest.mark.parametrize("version", [99, 0, "1", None, True, 1.0])
def test_another_schema_version_is_refused(cli, tmp_path, version):
    r = cli("model", "verify", str(_folder(tmp_path, [_entry()], schema_version=version)))
    assert r.code == 2 and f"schema_version {version!r} is not the one this escha-deploy reads (1)" in r.err, r.err
    assert "Traceback" not in r.err


def test_plan_reads_a_bad_lock_as_unpinned_with_its_reason(tmp_path):
    from escha_deploy.checkpoint import pin_state

    d = _folder(tmp_path, [_entry("/etc/hostname")])
    assert pin_state(d).startswith("unpinned (") and "not a name inside the model folder" in pin_state(d)
