"""``status --record FILE``: one JSON object per look, appended as a line (JSON Lines), and
the reader that reads such a file back (``read_record``), line by line through the bounded
JSON reader: the file must be a regular file under the size cap, each line JSON with no
duplicate key and bounded nesting; a bad line is named as ``FILE:LINE``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from escha_deploy.errors import BadInput

#: The largest record read back (256 MiB): a look of a TP 8 box is about 6 KB, so a day of looks
#: every 5 s is about 100 MB.
MAX_RECORD_BYTES = 256 * 2**20

RECORD_SCHEMA_VERSION = 1


def append(path: str | Path, look: dict[str, Any]) -> None:
    """Append one look (``{"t", "targets": [...]}``) as a line, flushed to the file."""
    line = json.dumps({"schema_version": RECORD_SCHEMA_VERSION, **look}, separators=(",", ":"),
                      allow_nan=False, default=str)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _bounded():
    """The bounded reader's two calls: (read_regular, loads_json)."""
    from escha_deploy import jsonio

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
