"""The runtime tests share one unpacked wheel through hard links (tests/runtime/conftest.py).
That is safe only because ``runtime apply`` replaces a file by rename and the tests' own edits
unlink first; these tests show both, and that the pristine check catches a write through a link."""

from __future__ import annotations

import os

import pytest

from escha_deploy.runtime.patching import _write_by_rename

from .conftest import Pristine, link_tree, rewrite


@pytest.fixture
def small_pristine(tmp_path):
    src = tmp_path / "pristine"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("A = 1\n")
    (src / "pkg" / "sub" / "b.py").write_text("B = 2\n")
    os.chmod(src / "pkg" / "a.py", 0o640)
    for f in (src / "pkg" / "a.py", src / "pkg" / "sub" / "b.py"):  # unpacked well before the tests, as the wheel is
        os.utime(f, ns=(f.stat().st_mtime_ns - 10**9,) * 2)
    return Pristine(src)


def test_link_tree_shares_inodes(small_pristine, tmp_path):
    dst = link_tree(small_pristine.root, tmp_path / "copy")
    assert (dst / "pkg" / "a.py").stat().st_ino == (small_pristine.root / "pkg" / "a.py").stat().st_ino
    assert (dst / "pkg" / "sub").stat().st_ino != (small_pristine.root / "pkg" / "sub").stat().st_ino


def test_write_by_rename_leaves_the_linked_original(small_pristine, tmp_path):
    dst = link_tree(small_pristine.root, tmp_path / "copy")
    _write_by_rename(dst / "pkg" / "a.py", b"A = 3\n")
    _write_by_rename(dst / "pkg" / "new.py", b"N = 1\n")
    assert (dst / "pkg" / "a.py").read_bytes() == b"A = 3\n"
    assert (dst / "pkg" / "a.py").stat().st_mode & 0o777 == 0o640  # the old file's mode
    assert (dst / "pkg" / "new.py").read_bytes() == b"N = 1\n"
    assert not [p for p in (dst / "pkg").iterdir() if p.name.endswith(".tmp")]
    small_pristine.check("rename")  # passes: the pristine a.py kept its bytes


def test_rewrite_unlinks_first(small_pristine, tmp_path):
    dst = link_tree(small_pristine.root, tmp_path / "copy")
    rewrite(dst / "pkg" / "sub" / "b.py", "B = 5\n")
    small_pristine.check("rewrite")
    assert (small_pristine.root / "pkg" / "sub" / "b.py").read_text() == "B = 2\n"


def test_a_write_through_a_link_is_caught(small_pristine, tmp_path):
    dst = link_tree(small_pristine.root, tmp_path / "copy")
    (dst / "pkg" / "a.py").write_text("A = 99\n")  # in place: the pristine inode changes
    with pytest.raises(AssertionError, match=r"changed: a\.py|pkg/a\.py"):
        small_pristine.check("a careless test")


def test_a_same_size_write_through_a_link_is_caught(small_pristine, tmp_path):
    """The check after each test reads inode, size and mtime: a write of as many bytes changes
    the shared inode's mtime."""
    dst = link_tree(small_pristine.root, tmp_path / "copy")
    (dst / "pkg" / "a.py").write_text("A = 2\n")
    with pytest.raises(AssertionError, match=r"changed: pkg/a\.py"):
        small_pristine.check("a careless test")


def test_a_write_that_puts_the_mtime_back_is_caught_by_the_contents_check(small_pristine, tmp_path):
    """A write that also restores the mtime passes the stat check; the sha256 check at the
    session's end (``check_contents``) names it."""
    dst = link_tree(small_pristine.root, tmp_path / "copy")
    a = dst / "pkg" / "a.py"
    mtime = a.stat().st_mtime_ns
    a.write_text("A = 2\n")
    os.utime(a, ns=(mtime, mtime))
    small_pristine.check("a write that hides")
    with pytest.raises(AssertionError, match=r"a\.py"):
        small_pristine.check_contents("a write that hides")
