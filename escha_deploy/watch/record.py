"""``status --record FILE``: one JSON object per look, appended as a line (JSON Lines), and
the reader that reads such a file back (``read_record``), line by line through the bounded
JSON reader: the file must be a regular file under the size cap, each line JSON with no
duplicate key and bounded nesting; a bad line is named as ``FILE:LINE``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Any

from escha_deploy.utils.errors import BadInput

#: The largest record read back (256 MiB): a look of a TP 8 box is about 6 KB, so a day of looks
#: every 5 s is about 100 MB.
MAX_RECORD_BYTES = 256 * 2**20

RECORD_SCHEMA_VERSION = 1


def finite_json(value: Any, path: str = "") -> tuple[Any, list[str]]:
    """``value`` (JSON-able: dicts, lists, scalars) with every float that is NaN or +/-Inf
    replaced by ``None``, and the dotted path of each one replaced (``0.server.requests``).
    JSON has no such numbers (RFC 8259 section 6), so a look that carries one is written with
    ``null`` there and the caller warns, naming the path."""
    if isinstance(value, float) and not math.isfinite(value):
        return None, [path or "(the value)"]
    if isinstance(value, dict):
        out, bad = {}, []
        for k, v in value.items():
            out[k], b = finite_json(v, f"{path}.{k}" if path else str(k))
            bad += b
        return out, bad
    if isinstance(value, (list, tuple)):
        items, bad = [], []
        for i, v in enumerate(value):
            item, b = finite_json(v, f"{path}.{i}" if path else str(i))
            items.append(item)
            bad += b
        return items, bad
    return value, []


def append(path: str | Path, look: dict[str, Any], option: str = "--record") -> list[str]:
    """Append one look (``{"t", "targets": [...]}``) as a line, flushed to the file. A NaN or
    +/-Inf in it is written as ``null``; returns their paths (``finite_json``). Raises
    ``BadInput`` (exit 2), one line naming ``option`` and the file, when the file cannot be
    opened or written (a full disk, a read-only file system, ``/dev/full``, a FIFO without a
    reader: opened without blocking, ``open(2)`` O_NONBLOCK gives ENXIO)."""
    import fcntl

    from escha_deploy.utils.paths import _cannot_write

    data, bad = finite_json({"schema_version": RECORD_SCHEMA_VERSION, **look})
    line = json.dumps(data, separators=(",", ":"), allow_nan=False, default=str)
    buf = (line + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            _append_whole(fd, buf, path)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _cannot_write(option, path, exc) from None
    return bad


def _last_byte(path: str | Path, size: int) -> bytes:
    """The byte at ``size - 1`` of ``path`` (b"" when it cannot be read)."""
    try:
        rfd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        return os.pread(rfd, 1, size - 1)
    except OSError:
        return b""
    finally:
        os.close(rfd)


def _append_whole(fd: int, buf: bytes, path: str | Path) -> None:
    """Append ``buf`` (one line) to the open file ``fd`` whole or not at all: under an exclusive
    ``flock(2)`` (another ``status --record`` appending to the file waits), after a newline when
    the file's last line is unfinished (a torn line an older version left: the new one starts
    on a line of its own), and on a failed write (``ENOSPC``) the file is cut back to its size
    before (``ftruncate(2)``) so the next append does not continue a torn line. A file that is
    not a regular file (a FIFO, ``/dev/full``) is written as it comes. Raises ``OSError``."""
    import fcntl
    import stat

    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        while buf:  # os.write may write part of it
            buf = buf[os.write(fd, buf):]
        return
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        size = os.fstat(fd).st_size
        if size and _last_byte(path, size) not in (b"\n", b""):
            buf = b"\n" + buf
        view = memoryview(buf)
        try:
            while view:  # os.write may write part of it
                view = view[os.write(fd, view):]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _bounded():
    """The bounded reader's two calls: (read_regular, loads_json)."""
    from escha_deploy.utils import jsonio

    return jsonio.read_regular, jsonio.loads_json


def read_record(path: str | Path, *, max_bytes: int = MAX_RECORD_BYTES) -> list[dict[str, Any]]:
    """The looks of a record file, oldest first. Raises ``BadInput`` (2) naming the file (and
    the line) when it is not a regular file under ``max_bytes``, a line is not a JSON object,
    or a line's schema version is not ``RECORD_SCHEMA_VERSION``."""
    read_regular, loads_json = _bounded()
    raw = read_regular(path, "the record (status --record)", max_bytes=max_bytes)
    out = []
    for i, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        obj = loads_json(line, f"{path}:{i}", "a record line")
        if not isinstance(obj, dict):
            raise BadInput(f"{path}:{i}: a record line must be a JSON object")
        if obj.get("schema_version") != RECORD_SCHEMA_VERSION:
            raise BadInput(f"{path}:{i}: record schema version {obj.get('schema_version')!r}; this "
                           f"escha-deploy reads {RECORD_SCHEMA_VERSION}")
        out.append(obj)
    return out
