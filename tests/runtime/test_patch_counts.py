"""A fork's ``git format-patch`` file is taken no further than its bytes: a hunk with more
lines than its header counts (the next hunk of the file would be read as no hunk at all, as
``git apply`` refuses it: "patch fragment without header"), one file in two blocks of one
commit, and two mails in one file are refused, one line naming ``file:line``, exit 2, nothing
copied. The mails are made by hand (``synthetic_fork.hand_made_mail``), as git would not write
them."""

from __future__ import annotations

import pytest

from escha_deploy.cli.main import main
from escha_deploy.runtime.fork import read_commit
from escha_deploy.runtime.series import parse_patch
from escha_deploy.utils.errors import BadInput

from .synthetic_fork import hand_made_mail as mail

GOOD = mail()
BLOCK = (b"diff --git a/python/sglang/x.py b/python/sglang/x.py\nnew file mode 100644\n"
         b"index 0000000..1111111\n--- /dev/null\n+++ b/python/sglang/x.py\n@@ -0,0 +1 @@\n+y = 2\n")


def _insert_before_signature(extra: bytes) -> bytes:
    head, sep, tail = GOOD.partition(b"-- \n2.40.0\n")
    assert sep
    return head + extra + sep + tail


CASES = [
    ("more-plus-lines-than-the-header", _insert_before_signature(b"+extra = 1\n"),
     "0001-x.patch:14: hunk '@@ -0,0 +1 @@' has more lines than its header says (-0 +1)"),
    ("more-lines-then-another-hunk", _insert_before_signature(b"+extra = 1\n@@ -3,1 +4,1 @@\n-a\n+b\n"),
     "0001-x.patch:14: hunk '@@ -0,0 +1 @@' has more lines than its header says"),
    ("the-same-new-file-twice", _insert_before_signature(BLOCK),
     "0001-x.patch:18: python/sglang/x.py is changed twice in one patch (first at line 11)"),
    ("two-mails-in-one-file", GOOD + GOOD,
     "0001-x.patch:16: a second mail ('From <commit hash>' line) in one file"),
]


def test_the_good_mail_reads(tmp_path):
    (tmp_path / "0001-x.patch").write_bytes(GOOD)
    commit, problems = read_commit(tmp_path / "0001-x.patch")
    assert problems == [] and commit is not None and [f.new for f in commit.files] == ["x.py"]


@pytest.mark.parametrize("data, line", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_patch_that_says_more_than_it_counts_is_refused(tmp_path, capsys, data, line):
    fork = tmp_path / "fork"
    fork.mkdir()
    (fork / "0001-x.patch").write_bytes(data)
    with pytest.raises(BadInput) as exc:
        read_commit(fork / "0001-x.patch")
    assert exc.value.message.startswith(line), exc.value.message
    out = tmp_path / "out"
    capsys.readouterr()
    try:
        rc = main(["runtime", "import", str(fork), "-o", str(out)])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and err == [f"error: {exc.value.message}"], err
    assert not out.exists()


def test_a_series_patch_with_an_uncounted_line_is_refused():
    """Our own series' reader (``parse_patch``) is the same diff reader."""
    data = (b"Capabilities:\n--- a/sglang/a.py\n+++ b/sglang/a.py\n@@ -1 +1 @@\n-a\n+b\n+c\n")
    with pytest.raises(BadInput, match=r"^x.patch:7: hunk '@@ -1 \+1 @@' has more lines than its header"):
        parse_patch(data, "x.patch")
