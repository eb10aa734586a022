"""Paths in patch files stay inside the tree they patch, and the diff parser never tracebacks.

A ``git format-patch`` file of a fork (``runtime import``) and a series or overlay patch
(``runtime apply``) are written by someone else: a path with ``..`` (plain, or spelled in git's
C-quoted octal escapes ``\\056\\056``), an absolute one, ``//``, a NUL, bytes that are not UTF-8,
a broken quote or escape, or a hunk header of thousands of digits is one ``error:`` line naming
the patch file and line, exit 2. ``patching.apply`` also checks every resolved target before the
first write: a symbolic link inside the tree that points out of it is refused, nothing written.
The format-patch files here are made by hand: git itself refuses to commit such paths
(``read-cache.c: verify_path``), so no real fork can hold them.
"""

from __future__ import annotations

import os

import pytest

from escha_deploy.cli.main import main
from escha_deploy.utils.errors import BadInput
from escha_deploy.utils.relpaths import confine, unquote_c
from escha_deploy.runtime import inventory as inv
from escha_deploy.runtime.fork import read_commit
from escha_deploy.runtime.series import parse_patch, read_series

from .conftest import stat_drift, stat_inventory
from .synthetic_fork import hand_made_mail as mail


def run(*args: str) -> int:
    try:
        return main(list(args))
    except SystemExit as exc:
        return int(exc.code or 0)


#: (id, the mail, its one error line after ``0001-x.patch:``)
FORK_CASES = [
    ("non-utf8", mail(b"diff --git a/python/sglang/\xff\xfe.py b/python/sglang/\xff\xfe.py",
                      b"+++ b/python/sglang/\xff\xfe.py"), "7: path is not UTF-8 (byte 0xff"),
    ("non-utf8-plus-line", mail(plus=b"+++ b/python/sglang/\xff.py"),
     "11: path is not UTF-8 (byte 0xff"),
    ("unterminated-quote", mail(b'diff --git "a/python/sglang/x.py b/python/sglang/x.py'),
     "7: quoted path has no closing '\"'"),
    ("escaped-closing-quote", mail(b'diff --git "a/python/sglang/x\\" b/y'),
     "7: quoted path has no closing '\"'"),
    ("bad-x-escape", mail(b'diff --git "a/python/sglang/\\x.py" "b/python/sglang/\\x.py"'),
     "7: quoted path has an escape git does not write ('\\\\x'"),
    ("octal-over-377", mail(b'diff --git "a/python/sglang/\\400.py" "b/python/sglang/\\400.py"'),
     "7: quoted path has an escape git does not write"),
    ("hunk-5000-digits", mail(hunk=b"@@ -0,0 +1," + b"9" * 5000 + b" @@"),
     "12: hunk header has a number over 9 digits"),
    ("hunk-start-5000-digits", mail(hunk=b"@@ -0,0 +" + b"1" * 5000 + b" @@"),
     "12: hunk header has a number over 9 digits"),
    ("dotdot", mail(b"diff --git a/python/sglang/../../../../../tmp/PWNED.py "
                    b"b/python/sglang/../../../../../tmp/PWNED.py",
                    b"+++ b/python/sglang/../../../../../tmp/PWNED.py"),
     "7: path 'python/sglang/../../../../../tmp/PWNED.py' has a '..' part"),
    ("dotdot-octal", mail(b'diff --git "a/python/sglang/\\056\\056/\\056\\056/x.py" '
                          b'"b/python/sglang/\\056\\056/\\056\\056/x.py"',
                          b'+++ "b/python/sglang/\\056\\056/\\056\\056/x.py"'),
     "7: path 'python/sglang/../../x.py' has a '..' part"),
    ("dotdot-only-in-plus-line", mail(plus=b"+++ b/python/sglang/../../x.py"),
     "11: path '../../x.py' has a '..' part and would leave python/sglang"),
    ("dotdot-octal-only-in-plus-line", mail(plus=b'+++ "b/python/sglang/\\056\\056/x.py"'),
     "11: path '../x.py' has a '..' part"),
    ("dotdot-outside-the-package", mail(b"diff --git a/tools/../../x.py b/tools/../../x.py"),
     "7: path 'tools/../../x.py' has a '..' part"),
    ("double-slash", mail(b"diff --git a/python/sglang//etc/cron.d/x b/python/sglang//etc/cron.d/x",
                          b"+++ b/python/sglang//etc/cron.d/x"),
     "7: path 'python/sglang//etc/cron.d/x' has an empty part"),
    ("nul", mail(b"diff --git a/python/sglang/x\x00.py b/python/sglang/x\x00.py",
                 b"+++ b/python/sglang/x\x00.py"), "7: path 'python/sglang/x\\x00.py' holds a NUL"),
    ("nul-octal", mail(b'diff --git "a/python/sglang/x\\000.py" "b/python/sglang/x\\000.py"'),
     "7: path 'python/sglang/x\\x00.py' holds a NUL"),
    ("dot-part", mail(b"diff --git a/python/sglang/./x.py b/python/sglang/./x.py"),
     "7: path 'python/sglang/./x.py' has a '.' part"),
    ("absolute-after-prefix", mail(b"diff --git a//etc/passwd b//etc/passwd"),
     "7: path '/etc/passwd' is absolute"),
    ("no-prefix", mail(b"diff --git python/sglang/x.py python/sglang/x.py"),
     "7: expected 'diff --git a/PATH b/PATH'"),
]


@pytest.mark.parametrize("data, fragment", [c[1:] for c in FORK_CASES],
                         ids=[c[0] for c in FORK_CASES])
def test_a_bad_fork_path_is_one_line_naming_file_and_line(tmp_path, capsys, data, fragment):
    fork = tmp_path / "fork"
    fork.mkdir()
    (fork / "0001-x.patch").write_bytes(data)
    with pytest.raises(BadInput) as exc:
        read_commit(fork / "0001-x.patch")
    assert exc.value.problems == (exc.value.message,)
    assert exc.value.message.startswith("0001-x.patch:" + fragment), exc.value.message
    # the command: one error line, exit 2, nothing copied
    out = tmp_path / "out"
    assert run("runtime", "import", str(fork), "-o", str(out)) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: {exc.value.message}"]
    assert not list(out.glob("*.patch")) if out.exists() else True


def test_the_good_mail_is_imported(tmp_path, capsys):
    """The cases above differ from this one only in the path or hunk header."""
    fork = tmp_path / "fork"
    fork.mkdir()
    (fork / "0001-x.patch").write_bytes(mail())
    commit, problems = read_commit(fork / "0001-x.patch")
    assert problems == [] and commit is not None
    assert [(f.new, f.line) for f in commit.files] == [("x.py", 11)]


def test_git_quoted_names_are_read_back():
    """The octal and one-letter escapes git writes (``quote.c: quote_c_style``)."""
    assert unquote_c(b'"a/\\303\\251\\t\\"q\\\\.py" rest', "p:1") == (b'a/\xc3\xa9\t"q\\.py', b" rest")


@pytest.mark.parametrize("path, reason", [
    ("", "is empty"), ("/etc/x", "is absolute"), ("a/../../b", "'..' part"), ("..", "'..' part"),
    ("a//b", "empty part"), ("a/", "empty part"), ("a/./b", "'.' part"), ("a\0b", "NUL"),
])
def test_confine_refuses(path, reason):
    with pytest.raises(BadInput, match=f"^f:3: path .* {reason}"):
        confine(path, "f:3", "sglang/")


def test_confine_keeps_a_plain_relative_path():
    assert confine("srt/mem_cache/a b,c.py", "f:3", "sglang/") == "srt/mem_cache/a b,c.py"


@pytest.mark.parametrize("text, match", [
    (b"Capabilities:\n--- /dev/null\n+++ b/sglang/../../../tmp/PWNED.py\n@@ -0,0 +1 @@\n+a\n",
     r"p.patch:3: path '../../../tmp/PWNED.py' has a '..' part and would leave sglang"),
    (b'Capabilities:\n--- /dev/null\n+++ "b/sglang/\\056\\056/x.py"\n@@ -0,0 +1 @@\n+a\n',
     r"p.patch:3: path '../x.py' has a '..' part"),
    (b"Capabilities:\n--- a/sglang//x.py\n+++ b/sglang//x.py\n@@ -1 +1 @@\n-a\n+b\n",
     r"p.patch:2: path '/x.py' is absolute"),
    (b"Capabilities:\n--- a/sglang/\xff.py\n+++ b/sglang/\xff.py\n@@ -1 +1 @@\n-a\n+b\n",
     r"p.patch:2: path is not UTF-8 \(byte 0xff"),
    (b"Capabilities:\n--- a/sglang/a.py\n+++ b/sglang/a.py\n@@ -1 +1," + b"7" * 5000 + b" @@\n",
     r"p.patch:4: hunk header has a number over 9 digits"),
    (b"Capabilities: \xff\n--- a/sglang/a.py\n+++ b/sglang/a.py\n@@ -1 +1 @@\n-a\n+b\n",
     r"p.patch:1: header 'Capabilities' is not UTF-8"),
])
def test_series_and_overlay_patch_paths(text, match):
    with pytest.raises(BadInput, match=f"^{match}") as exc:
        parse_patch(text, "p.patch", "overlay")
    assert len(exc.value.problems) == 1


def test_a_series_line_may_name_only_a_file_of_its_folder(tmp_path):
    (tmp_path / "ov").mkdir()
    (tmp_path / "x.patch").write_text("Capabilities:\n")
    (tmp_path / "ov" / "series").write_text("# ours\n../x.patch\n")
    with pytest.raises(BadInput, match=r"series:2: path '../x.patch' has a '..' part"):
        read_series(tmp_path / "ov", "overlay")


def test_an_inventory_file_name_may_not_leave_the_package(tmp_path):
    files = {"../../etc/passwd": (1, "0" * 64)}
    text, _ = inv.inventory_text("wheel:x", "0.5.19", files)
    (tmp_path / "i.json").write_text(text)
    with pytest.raises(BadInput, match=r"i.json: files: path '../../etc/passwd' has a '..' part"):
        inv.read_inventory(tmp_path / "i.json")


OVERLAY_THROUGH_LINK = """Subject: a new module under a folder that is a link out of the tree
Capabilities:

--- /dev/null
+++ b/sglang/srt/escape/pwned.py
@@ -0,0 +1 @@
+PWNED = True
"""


@pytest.mark.wheel
def test_apply_refuses_a_target_that_resolves_outside_the_tree_before_any_write(site, tmp_path,
                                                                               capsys):
    """The parser cannot see a symbolic link inside the installed tree; the applier resolves
    every target first. Nothing is written: not the outside folder, not the tree, not the
    state folder."""
    pkg = site / "sglang"
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, pkg / "srt" / "escape")
    ov = tmp_path / "overlays"
    ov.mkdir()
    (ov / "9001-escape.patch").write_text(OVERLAY_THROUGH_LINK)
    before = stat_inventory(pkg)
    state = tmp_path / "s"
    assert run("runtime", "apply", "--sglang-dir", str(pkg), "--state-dir", str(state),
               "--overlay-dir", str(ov)) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert err == [f"error: 9001-escape.patch:5: sglang/srt/escape/pwned.py resolves to "
                      f"{outside.resolve() / 'pwned.py'}, outside {pkg.resolve()}"]
    assert list(outside.iterdir()) == []
    assert stat_drift(stat_inventory(pkg), before) == []
    assert not state.exists()


def test_check_targets_names_an_unconfined_path(tmp_path):
    """The applier's guard holds on its own for a path no parser produced (``apply_series``
    takes any ``Patch``)."""
    from escha_deploy.runtime.patching import check_targets
    from escha_deploy.runtime.series import FilePatch, Patch

    p = Patch("9002-x.patch", "overlay", "0" * 64, (), {}, (FilePatch(None, "../x.py", (), 7),))
    with pytest.raises(BadInput, match=r"^9002-x.patch:7: path '../x.py' has a '..' part"):
        check_targets(tmp_path, [p], ["../x.py"])
    assert list(tmp_path.iterdir()) == []
