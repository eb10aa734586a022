"""The lock file `escha-deploy model pull` writes beside the weights, and its checks.

``<folder>/escha-model.lock.json`` pins what was pulled: the repository id, the revision asked
for and the commit it resolved to, and per file its size (bytes) and hash as the hub records it
(``sha256`` of the bytes for a Git LFS file, the LFS object id; ``git_sha1`` of the Git blob,
``sha1(b"blob <size>\\0" + bytes)``, for a small file kept in Git: the hub's ``blobId``). `model
verify` re-checks a folder against it; `plan` says the weights are "unpinned" until one exists.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from . import LOCK_NAME, pin_state  # noqa: F401 (re-exported: the lock file's name, plan's pin line)

LOCK_SCHEMA_VERSION = 1
#: Bytes read at a time while hashing.
CHUNK = 8 << 20


class LockedFile(BaseModel):
    """One pulled file: ``name`` relative to the folder, ``size`` in bytes, and one hash."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    size: int = Field(ge=0)
    sha256: str | None = Field(None, description="hex sha256 of the bytes (a Git LFS file)")
    git_sha1: str | None = Field(None, description="hex sha1 of the Git blob (a file kept in Git)")


class ModelLock(BaseModel):
    """``escha-model.lock.json``: what `model pull` fetched and verified."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: int = LOCK_SCHEMA_VERSION
    repo: str = Field(description="the hub repository id, e.g. Qwen/Qwen3.5-27B")
    revision: str = Field(description="the revision asked for (a branch, tag or commit)")
    commit: str = Field(description="the commit it resolved to (X-Repo-Commit, the model info's sha)")
    endpoint: str = Field(description="the hub it came from (HF_ENDPOINT)")
    pulled_at: str = Field(description="ISO 8601 UTC")
    files: list[LockedFile]

    def pin(self) -> str:
        """``REPO@COMMIT`` (the first 12 hex digits)."""
        return f"{self.repo}@{self.commit[:12]}"


def lock_path(folder: str | Path) -> Path:
    return Path(folder) / LOCK_NAME


def read_lock(folder: str | Path) -> ModelLock | None:
    """The folder's lock file, or None when there is none. Raises ``BadInput`` (2) naming the
    file when it is not a lock file (bounded JSON reader, then the model)."""
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.utils.jsonio import loads_json, read_regular

    p = lock_path(folder)
    raw = read_regular(p, "a model lock file", missing_ok=True, max_bytes=16 << 20)
    if raw is None:
        return None
    data = loads_json(raw, p, "a model lock file")
    version = data.get("schema_version", LOCK_SCHEMA_VERSION) if isinstance(data, dict) else LOCK_SCHEMA_VERSION
    if type(version) is not int or version != LOCK_SCHEMA_VERSION:
        # a later version's lock may mean something else by the same fields: never read as ours
        from escha_deploy.utils.termtext import shown

        raise BadInput(f"{p}: schema_version {shown(repr(version), 40)} is not the one this "
                       f"escha-deploy reads ({LOCK_SCHEMA_VERSION})",
                       hint="a newer escha-deploy wrote it; `escha-deploy model pull PROFILE` rewrites it for this one")
    try:
        lock = ModelLock.model_validate(data)
    except ValueError as exc:
        first = str(exc).splitlines()[1:2] or [str(exc)]
        raise BadInput(f"{p}: not a model lock file ({first[0].strip()})") from None
    problems = lock_problems(lock)
    if problems:
        raise BadInput(*(f"{p}: {x}" for x in problems))
    return lock


def lock_problems(lock: ModelLock) -> list[str]:
    """What a lock file read from disk claims that cannot be checked as it stands, one line per
    entry, naming it: no file at all (``"files": []`` would verify nothing); a name that leads
    out of the folder (absolute, ``..``, an empty or ``.`` part: the folder is the root every
    name is confined to, as a hub's repository is); a name twice; an entry with no hash (a size
    alone proves nothing of the bytes); a hash that is not hex of its length."""
    from escha_deploy.utils.termtext import shown

    if not lock.files:
        return ["files: empty; a lock names at least one file (`escha-deploy model pull PROFILE` writes them)"]
    out: list[str] = []
    seen: set[str] = set()
    for i, f in enumerate(lock.files):
        where = f"files[{i}] {shown(repr(f.name), 120)}"
        parts = f.name.replace("\\", "/").split("/")
        drive = len(f.name) > 1 and f.name[0].isalpha() and f.name[1] == ":" and f.name[2:3] in ("", "/", "\\")
        if f.name.startswith(("/", "\\")) or drive or \
                any(x in ("", ".", "..") for x in parts) or "\0" in f.name:
            out.append(f"{where}: not a name inside the model folder (absolute, or with an empty, . or .. part)")
            continue
        if f.name in seen:
            out.append(f"{where}: named twice")
        seen.add(f.name)
        if f.sha256 is None and f.git_sha1 is None:
            out.append(f"{where}: no hash (sha256 or git_sha1); a size alone does not verify the bytes")
        for key, n in (("sha256", 64), ("git_sha1", 40)):
            h = getattr(f, key)
            if h is not None and (len(h) != n or any(c not in "0123456789abcdef" for c in h.lower())):
                out.append(f"{where}: {key} is not {n} hex digits")
    return out


def write_lock(folder: str | Path, lock: ModelLock) -> Path:
    """Write the lock file atomically (``paths.replace_file``)."""
    from escha_deploy.utils.paths import replace_file

    p = lock_path(folder)
    replace_file(p, (lock.model_dump_json(indent=2) + "\n").encode())
    return p


def git_blob_sha1(path: Path) -> str:
    """The Git blob id of a file: sha1 of ``b"blob <size>\\0"`` and its bytes."""
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_problem(folder: Path, f: LockedFile) -> str | None:
    """Why ``folder/f.name`` is not the file the lock records (missing, not a regular file,
    its size, its hash), naming it; None when it is."""
    p = folder / f.name
    if not p.is_file() or p.is_symlink() and not os.path.isfile(os.path.realpath(p)):
        return f"{p}: missing"
    size = p.stat().st_size
    if size != f.size:
        return f"{p}: {size:,} bytes, the hub records {f.size:,}"
    if f.sha256 is not None:
        got = sha256_of(p)
        if got != f.sha256:
            return f"{p}: sha256 {got[:16]}... differs from the hub's {f.sha256[:16]}..."
    elif f.git_sha1 is not None:
        got = git_blob_sha1(p)
        if got != f.git_sha1:
            return f"{p}: git blob {got[:12]} differs from the hub's {f.git_sha1[:12]}"
    return None


def verify_folder(folder: str | Path) -> tuple[ModelLock, list[str]]:
    """Every file the folder's lock file records, re-checked (``file_problem``): ``(lock,
    problems)``. Raises ``BadInput`` (2) when the folder has no lock file."""
    from escha_deploy.utils.errors import BadInput

    p = Path(folder)
    lock = read_lock(p)
    if lock is None:
        raise BadInput(f"{p}: no {LOCK_NAME} here (`escha-deploy model pull PROFILE` writes it)")
    return lock, [x for f in lock.files if (x := file_problem(p, f)) is not None]


def dumps(lock: ModelLock) -> str:
    return json.dumps(lock.model_dump(mode="json"), indent=2)
