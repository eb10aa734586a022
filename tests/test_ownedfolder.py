"""``utils.ownedfolder.replace_owned``: a folder a command fills for the user is replaced whole,
never at the cost of a file it did not write. Full disks are made by fault injection at the
write, the flush and each rename (``os.write``, ``os.fsync``, ``os.rename`` raising
``ENOSPC``/``EXDEV``), not only by a small file system: the old folder is then left as it was,
byte for byte, and no temporary sibling stays behind."""

from __future__ import annotations

import errno
import os

import pytest

from escha_deploy.utils.errors import BadInput, Refused
from escha_deploy.utils.ownedfolder import RECORD, read_record, replace_owned


def owned(name: str) -> bool:
    return name.endswith(".patch") or name == "escha-fork.yaml"


def snapshot(root):
    """Every file under ``root`` (relative name: bytes), and every entry of its parent."""
    files = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    return files, sorted(os.listdir(root.parent))


def first_import(folder):
    replace_owned(folder, {"0001-a.patch": b"a\n", "escha-fork.yaml": b"decl: 1\n"}, owned,
                  "--output", "runtime import")


def test_a_second_write_replaces_only_what_the_first_recorded(tmp_path):
    out = tmp_path / "o"
    first_import(out)
    (out / "README.md").write_text("mine\n")
    (out / "notes").mkdir()
    (out / "notes" / "n.txt").write_text("kept\n")
    replace_owned(out, {"0002-b.patch": b"b\n"}, owned, "--output", "runtime import")
    assert sorted(os.listdir(out)) == [RECORD, "0002-b.patch", "README.md", "notes"]
    assert (out / "README.md").read_text() == "mine\n"
    assert (out / "notes" / "n.txt").read_text() == "kept\n"
    assert read_record(out) is not None and set(read_record(out)) == {"0002-b.patch"}
    assert sorted(os.listdir(tmp_path)) == ["o"]  # no sibling left


@pytest.mark.parametrize("planted, recorded", [
    ("0001-other-fork.patch", True),   # another fork's patch beside ours
    ("escha-fork.yaml", True),         # a hand-edited declaration (its bytes differ)
    ("0009-x.patch", False),           # an earlier version's import: no record at all
])
def test_a_file_not_written_is_refused_and_nothing_changes(tmp_path, planted, recorded):
    out = tmp_path / "o"
    if recorded:
        first_import(out)
    else:
        out.mkdir()
    (out / planted).write_text("hand written\n")
    before = snapshot(out)
    with pytest.raises(Refused) as e:
        replace_owned(out, {"0002-b.patch": b"b\n"}, owned, "--output", "runtime import")
    assert snapshot(out) == before
    assert planted in e.value.message and "\n" not in e.value.message
    if not recorded:
        # the command that clears it, naming the file
        assert "no record" in e.value.message and f"rm -- {out / planted}" in e.value.hint


@pytest.mark.parametrize("fault", ["write", "fsync", "rename-1", "rename-2", "link"])
def test_a_full_disk_leaves_the_previous_import_whole(tmp_path, monkeypatch, fault):
    out = tmp_path / "o"
    first_import(out)
    (out / "README.md").write_text("mine\n")
    before = snapshot(out)
    real = {"write": os.write, "fsync": os.fsync, "rename": os.rename, "link": os.link}
    calls = {"n": 0}

    def write(fd, data):  # the second file's bytes: half of them, then a full disk
        calls["n"] += 1
        if calls["n"] == 2:
            return real["write"](fd, bytes(data)[: max(1, len(data) // 2)])
        if calls["n"] > 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real["write"](fd, data)

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def rename(src, dst, nth=int(fault[-1]) if fault.startswith("rename") else 0):
        calls["n"] += 1
        if calls["n"] == nth:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real["rename"](src, dst)

    def link(*a, **k):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, fault.split("-")[0], {"write": write, "fsync": fsync, "rename": rename,
                                                 "link": link}[fault.split("-")[0]])
    with pytest.raises(BadInput) as e:
        replace_owned(out, {"0002-b.patch": b"b" * 4096, "0003-c.patch": b"c" * 4096}, owned,
                      "--output", "runtime import")
    monkeypatch.undo()
    assert e.value.message.startswith(f"--output {out}: cannot write: ")
    assert snapshot(out) == before


def test_a_new_folder_appears_whole_or_not_at_all(tmp_path, monkeypatch):
    out = tmp_path / "o"
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
    with pytest.raises(BadInput):
        first_import(out)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []
    first_import(out)
    assert (out / "0001-a.patch").read_bytes() == b"a\n"
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(out).st_mode & 0o777 == 0o777 & ~umask


def test_a_record_edited_by_hand_counts_as_no_record(tmp_path):
    out = tmp_path / "o"
    first_import(out)
    (out / RECORD).write_text("[1, 2]\n")
    with pytest.raises(Refused, match="no record"):
        replace_owned(out, {"0002-b.patch": b"b\n"}, owned, "--output", "runtime import")
    assert (out / "0001-a.patch").read_bytes() == b"a\n"
