"""``status --record FILE`` appends a look whole or not at all. A full disk is made by fault
injection at the write (``os.write`` writing part of the line, then raising ``ENOSPC``): the
file is then as it was, and the next append is a line of its own that reads back."""

from __future__ import annotations

import errno
import json
import os

import pytest

from escha_deploy.utils.errors import BadInput
from escha_deploy.watch import record


def _look(n: int) -> dict:
    return {"t": 1000.0 + n, "targets": [{"name": "x" * 200, "n": n}]}


def test_a_full_disk_mid_line_leaves_no_torn_line(tmp_path, monkeypatch):
    f = tmp_path / "looks.jsonl"
    record.append(f, _look(1))
    before = f.read_bytes()
    real = os.write

    def write(fd, data):  # half the line lands, then the disk is full
        if len(data) > 100:
            return real(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(BadInput, match=r"--record .*: cannot write: No space left on device"):
        record.append(f, _look(2))
    monkeypatch.undo()
    assert f.read_bytes() == before
    record.append(f, _look(3))
    assert [look["t"] for look in record.read_record(f)] == [1001.0, 1003.0]


def test_an_unfinished_last_line_is_not_continued(tmp_path):
    """A torn line an older version left: the next look starts a line of its own (the torn one
    is then named by the reader as FILE:LINE, not glued to the new one)."""
    f = tmp_path / "looks.jsonl"
    record.append(f, _look(1))
    with open(f, "ab") as fh:
        fh.write(b'{"schema_version":1,"t":10')
    record.append(f, _look(2))
    lines = f.read_bytes().splitlines()
    assert len(lines) == 3 and json.loads(lines[2])["t"] == 1002.0
    with pytest.raises(BadInput, match=r"looks.jsonl:2:1: a record line is not JSON"):
        record.read_record(f)
