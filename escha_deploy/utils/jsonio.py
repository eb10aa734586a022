"""The one bounded reader for the files a user hands escha-deploy: JSON inputs and small text files.

Every JSON file read from outside the package goes through ``read_json`` (or ``loads_json`` for
bytes already in hand, e.g. a file read out of an image): facts files (``--facts``,
``$ESCHA_FACTS``), doctor reports, launch specs (``serve --spec``), runtime descriptions
(``runtime.json``), a fleet box's saved facts, a model folder's ``config.json``, saved
records. Other small inputs (a profile, a patch, a key file) go through ``read_regular``.

What it refuses, each as one ``BadInput`` line (exit 2) naming the file, before anything else
happens:

- **anything but a regular file**: a FIFO, a socket, a device (``/dev/zero``, ``/dev/stdin`` as
  a pipe), a folder. The file is opened with ``O_NONBLOCK`` and checked with ``fstat`` on that
  descriptor, so a FIFO without a writer is refused at once instead of blocking (``open(2)``:
  "O_NONBLOCK ... the open() for reading-only returns without delay" for a FIFO), and a
  symbolic link is judged by what it points at;
- **a file larger than the cap** (``max_bytes``, ``MAX_JSON_BYTES`` by default): refused from
  its size, and at most ``max_bytes + 1`` bytes are ever read, so a file that grows while read
  cannot exhaust memory either;
- **not UTF-8** (RFC 8259 section 8.1: JSON exchanged between systems "MUST be encoded using
  UTF-8"), with the byte offset; a leading byte order mark is skipped, as section 8.1 allows;
- **not JSON**, with the line and column ``json`` reports; ``NaN``, ``Infinity`` and numbers
  that overflow a double (``1e400``) are not JSON numbers (RFC 8259 section 6) and are refused;
- **nesting deeper than** ``max_depth`` (``MAX_JSON_DEPTH``): checked after the parse without
  recursion, and the ``RecursionError`` of ``json``'s C decoder on a deeper file becomes the
  same line;
- **a duplicate key** in an object, as the profile reader refuses them in YAML
  (``yamlpos``): RFC 8259 section 4 says names "SHOULD be unique" and that with duplicates
  "many implementations report the last name/value pair only", which is what ``json`` does.

Every cap is a parameter; the defaults fit the largest real file of each kind with room to
spare.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from escha_deploy.utils.errors import BadInput

#: Largest JSON file read, in bytes (16 MiB). A facts file of an 8-GPU box is about 10 KB, a
#: launch spec about 20 KB, a doctor report about 30 KB; a model's config.json is a few KB
#: (large vocabularies keep their tables in tokenizer.json, which is not read here).
MAX_JSON_BYTES = 16 * 2**20
#: Deepest nesting of objects and arrays. The deepest real input (a launch spec's
#: ``profile_data``) is about 6 levels.
MAX_JSON_DEPTH = 64

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _human(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def file_problem(path: str | Path) -> str | None:
    """Why ``path`` is not a regular file this process can open, in words, or ``None`` when it
    is one: the system's reason (``No such file or directory``, ``Permission denied``, ``File
    name too long``) or what it is instead (``a FIFO (named pipe), not a regular file``). By
    ``stat`` (a symbolic link judged by its target), so it never blocks and never raises for
    a path, unlike ``Path.is_file``, which raises ``PermissionError`` in a folder that may not
    be searched and ``OSError`` for a name that is too long."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return exc.strerror or os.strerror(exc.errno or errno.EIO)
    except ValueError as exc:  # an embedded NUL
        return str(exc)
    if not stat.S_ISREG(st.st_mode):
        return f"{_kind(st.st_mode)}, not a regular file"
    if not os.access(path, os.R_OK):
        return os.strerror(errno.EACCES)
    return None


def is_regular_file(path: str | Path) -> bool:
    """``file_problem(path) is None``: a ``Path.is_file`` that never raises and is false for a
    file this process may not read."""
    return file_problem(path) is None


def read_regular(path: str | Path, what: str, *, max_bytes: int = MAX_JSON_BYTES,
                 hint: str | None = None, missing_ok: bool = False) -> bytes | None:
    """The bytes of the regular file at ``path`` (a file a user named, ``what`` it should be,
    e.g. ``"the facts file"``), at most ``max_bytes`` bytes.

    Raises ``BadInput`` (exit 2), one line beginning ``PATH: cannot read WHAT: ``, when it
    cannot be opened (the system's reason: ``No such file or directory``, ``Permission
    denied``, ``File name too long``), is not a regular file (``a FIFO (named pipe), not a
    regular file``), or is larger than ``max_bytes`` (refused from ``fstat`` before reading;
    a file that grows past the cap while read is refused too, and never more than
    ``max_bytes + 1`` bytes are read). Never blocks on a FIFO or a device. ``hint`` is shown
    under the error line. ``missing_ok``: return ``None`` when there is no such file
    (``ENOENT``, or ``ENOTDIR`` for a path through a file) instead of refusing; a folder that
    may not be searched (``EACCES``) is still refused, as ``Path.is_file`` would raise.
    """
    p = Path(path)

    def refuse(reason: str) -> BadInput:
        return BadInput(f"{p}: cannot read {what}: {reason}", hint=hint)

    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        if missing_ok and exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise refuse(exc.strerror or os.strerror(exc.errno or errno.EIO)) from None
    except ValueError as exc:  # an embedded NUL in the path
        raise refuse(str(exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refuse(f"{_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise refuse(f"{st.st_size} bytes, larger than the {_human(max_bytes)} read at most")
        # A regular file ignores O_NONBLOCK for reads (open(2)); read in chunks up to the cap.
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            try:
                chunk = os.read(fd, min(left, 1 << 20))
            except OSError as exc:
                raise refuse(exc.strerror or str(exc)) from None
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        raw = b"".join(chunks)
        if len(raw) > max_bytes:
            raise refuse(f"grew past the {_human(max_bytes)} read at most while being read")
        return raw
    finally:
        os.close(fd)


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class _NotFinite(ValueError):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _pairs(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


def _constant(text: str) -> float:
    raise _NotFinite(text)


def _float(text: str) -> float:
    v = float(text)
    if v in (float("inf"), float("-inf")):
        raise _NotFinite(text if len(text) <= 40 else text[:37] + "...")
    return v


def _too_deep(value: object, max_depth: int) -> bool:
    """Whether ``value`` nests objects/arrays deeper than ``max_depth`` (iterative, linear)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            items = v.values()
        elif isinstance(v, list):
            items = v
        else:
            continue
        if d > max_depth:
            return True
        stack.extend((c, d + 1) for c in items if isinstance(c, (dict, list)))
    return False


def loads_json(raw: bytes | str, source: str | Path, what: str, *, max_depth: int = MAX_JSON_DEPTH,
               hint: str | None = None, bom: bool = True) -> object:
    """Parse ``raw`` (the bytes of ``source``, a file or ``IMAGE:PATH``) as strict JSON.

    Raises ``BadInput`` (exit 2), one line naming ``source`` and ``what``: not UTF-8 (the byte
    offset), not JSON (``SOURCE:LINE: WHAT is not JSON (MESSAGE, column N)``), ``NaN``/
    ``Infinity``/an overflowing number, nesting deeper than ``max_depth``, or a duplicate key.
    Returns the value (``dict``, ``list``, ``str``, ``int``, ``float``, ``bool`` or ``None``).
    A leading UTF-8 byte order mark is skipped, or with ``bom=False`` refused (``BadInput``):
    transformers reads a config.json with ``json.loads`` of its text, which refuses one
    (``configuration_utils.py: PretrainedConfig._dict_from_json_file``).
    """
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise BadInput(f"{source}:{line}: {what} is not JSON (not UTF-8: byte 0x{raw[exc.start]:02x} "
                           f"at offset {exc.start})", hint=hint) from None
    else:
        text = raw
    if text.startswith("\ufeff"):
        if not bom:  # a file read as transformers reads config.json (json.loads of its UTF-8 text)
            raise BadInput(f"{source}:1: {what} starts with a UTF-8 byte order mark, which the reader "
                           "SGLang uses refuses (json.loads: Unexpected UTF-8 BOM)",
                           hint=hint or "save it as UTF-8 without a BOM")
        text = text[1:]
    deep = BadInput(f"{source}: {what} is nested deeper than {max_depth} levels", hint=hint)
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float)
    except _Duplicate as exc:
        raise BadInput(f"{source}: {what} has the key {exc.key!r} twice in one object "
                       "(JSON keys must be unique; the last one would win silently)", hint=hint) from None
    except _NotFinite as exc:
        raise BadInput(f"{source}: {what} is not JSON ({exc.text} is not a finite JSON number)", hint=hint) from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"{source}:{exc.lineno}: {what} is not JSON ({exc.msg}, column {exc.colno})",
                       hint=hint) from None
    except RecursionError:
        raise deep from None
    except ValueError as exc:  # int('9' * 5000): "Exceeds the limit (4300 digits) ..."
        raise BadInput(f"{source}: {what} is not JSON ({str(exc).splitlines()[0]})", hint=hint) from None
    if _too_deep(value, max_depth):
        raise deep
    return value


def read_json(path: str | Path, what: str, hint: str | None = None, *, max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH) -> object:
    """The JSON value in the file a user named (a facts file, a launch spec, a box's saved
    doctor report, a model's config.json...), ``what`` it should be in messages (``"the facts
    file"``), ``hint`` how to make a good one.

    ``read_regular`` (regular files only, never blocks, at most ``max_bytes`` bytes) then
    ``loads_json`` (UTF-8, strict JSON, at most ``max_depth`` levels, unique keys); each failure
    is one ``BadInput`` line (exit 2) naming the file. For a file that may be absent, call
    ``read_regular(..., missing_ok=True)`` and then ``loads_json``.
    """
    raw = read_regular(path, what, max_bytes=max_bytes, hint=hint)
    return loads_json(raw, Path(path), what, max_depth=max_depth, hint=hint)
