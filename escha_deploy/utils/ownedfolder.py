"""A folder of files a command writes for the user (``runtime import -o DIR``), replaced whole
and never at the cost of a file the command did not write.

The command records what it wrote in ``RECORD`` inside the folder (each file's name and
SHA-256). The next write may replace or remove only the files that record names with the bytes
it names; any other file of the kinds the command writes (``owned(name)``: another fork's
patches, a hand-written declaration) is refused, one line naming it, and nothing is touched.
A folder filled by an earlier version (files of those kinds, no record) is refused with the
command that clears it. Files of other kinds (a README) are kept as they are.

The new files are written into a temporary sibling folder (same parent, so the same file
system), the kept files hard-linked into it, and the two folders swapped by two renames
(``rename(2)``): a build reads the old set or the new one, never a mix. A failed write (a full
disk: ``ENOSPC``) or rename leaves the old folder as it was and removes the sibling.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from escha_deploy.utils.errors import Refused

#: The record of what was written, inside the folder; a dot file (``COPY DIR/`` carries it along,
#: it harms nothing there).
RECORD = ".escha-written.json"
#: Who writes ``RECORD``'s files, in it.
_WRITER = "escha-deploy"


def _sha256(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def read_record(folder: Path) -> dict[str, str] | None:
    """``{name: sha256}`` of the files the last write recorded in ``folder``; ``None`` when there
    is no record (or not one this module wrote: not a JSON object of that shape)."""
    from escha_deploy.utils.jsonio import is_regular_file

    rec = folder / RECORD
    if not is_regular_file(rec):
        return None
    try:
        data = json.loads(rec.read_bytes()[: 1 << 20])
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    files = data.get("files")
    if data.get("writer") != _WRITER or not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        return None
    return files


def foreign_files(folder: Path, owned: Callable[[str], bool]) -> tuple[list[str], bool]:
    """The names in ``folder`` of the kinds ``owned`` names that its record does not name with
    their present bytes (sorted), and whether there is a record at all."""
    record = read_record(folder)
    names = sorted(e.name for e in os.scandir(folder) if e.name != RECORD and owned(e.name))
    if record is None:
        return names, False
    return [n for n in names if record.get(n) != _sha256(folder / n)], True


def _rm(folder: Path, names: list[str]) -> str:
    """The shell command that removes ``names`` from ``folder``: ``rm -- DIR/NAME...``, the
    ``*.patch`` files as one glob when there are more than two."""
    import shlex

    q = shlex.quote(str(folder))
    patches = [n for n in names if n.endswith(".patch")]
    words = [f"{q}/*.patch"] if len(patches) > 2 else []
    words += [f"{q}/{shlex.quote(n)}" for n in names if not (words and n.endswith(".patch"))]
    return "rm -- " + " ".join(words)


def replace_owned(folder: Path, files: dict[str, bytes], owned: Callable[[str], bool],
                  option: str, what: str) -> None:
    """Make ``folder`` hold ``files`` (name: bytes) in place of what the last write recorded
    there, keeping every file not of the kinds ``owned`` names. Raises ``Refused`` (exit 3), one
    line, when the folder holds a file of those kinds the record does not name as written
    (``what`` names the command: ``runtime import``); ``BadInput`` (exit 2) naming ``option`` and
    the folder when it cannot be written (the old folder then is as it was)."""
    from escha_deploy.utils.paths import _cannot_write

    folder = Path(os.path.realpath(folder))
    exists = os.path.isdir(folder)
    if exists:
        try:
            foreign, recorded = foreign_files(folder, owned)
        except OSError as exc:
            raise _cannot_write(option, folder, exc) from None
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            if recorded:
                raise Refused(f"{option} {folder}: holds {shown}, not written by {what} (or "
                              "changed since); nothing was replaced",
                              hint="move it out of the folder, or name another --output")
            raise Refused(f"{option} {folder}: holds {shown} with no record of who wrote "
                          f"{'them' if len(foreign) > 1 else 'it'} (an earlier escha-deploy "
                          "writes none); nothing was replaced",
                          hint=f"when {'they are' if len(foreign) > 1 else 'it is'} an earlier import's, "
                          f"clear {'them' if len(foreign) > 1 else 'it'}: {_rm(folder, foreign)}")
    record = {"writer": _WRITER, "what": what,
              "files": {n: hashlib.sha256(b).hexdigest() for n, b in sorted(files.items())}}
    new = old = None
    old_dropped = False  # the old folder is removed only once the new one is in its place
    try:
        new = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.new-"))
        for name, data in [*files.items(), (RECORD, json.dumps(record, indent=1).encode() + b"\n")]:
            fd = os.open(new / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            try:
                view = memoryview(data)
                while view:  # os.write may write part of it
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
        if exists:
            os.chmod(new, os.stat(folder).st_mode & 0o7777)
            for e in os.scandir(folder):  # kept: not of the owned kinds
                if e.name != RECORD and not owned(e.name) and e.name not in files:
                    if e.is_dir(follow_symlinks=False):
                        shutil.copytree(e.path, new / e.name, symlinks=True)
                    else:
                        os.link(e.path, new / e.name, follow_symlinks=False)
            old = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.old-"))
            try:
                os.rename(folder, old / "d")
            except OSError:
                old.rmdir()
                old = None
                raise
            try:
                os.rename(new, folder)
            except OSError:
                os.rename(old / "d", folder)
                old_dropped = True  # empty again
                raise
            new, old_dropped = None, True
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(new, 0o777 & ~umask)
            os.rename(new, folder)
            new = None
    except OSError as exc:
        raise _cannot_write(option, folder, exc) from None
    finally:
        if new is not None:
            shutil.rmtree(new, ignore_errors=True)
        if old is not None and old_dropped:
            shutil.rmtree(old, ignore_errors=True)
