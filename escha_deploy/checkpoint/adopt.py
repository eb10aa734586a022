"""`escha-deploy model adopt FOLDER`: pin a model folder that is already on disk, offline.

A folder copied in, downloaded by hand or left by `hf download` (a Hugging Face cache snapshot)
has no lock file, so `model verify` and `model pull --offline` could not check it. Adoption
checks it as SGLang would load it, with no request sent:

1. ``config.json`` is there and is a JSON object; the weights are there and whole
   (``facts.folders.shard_problems``: every shard its safetensors index names, none shorter
   than its header says) and every header passes (``sglang.arch.safetensors_header``: dtype x
   shape equals each tensor's bytes, offsets inside the file);
2. the index's tensors are the shards' tensors (none missing, none in two shards) and its
   ``metadata.total_size``, when given, is their bytes;
3. the 16-bit floating-point tensors are the ``torch_dtype`` (``dtype`` in newer transformers)
   ``config.json`` names, as SGLang's model config reads it (``float16`` is F16, ``bfloat16``
   BF16); quantized weights (integers, FP8) and FP32 norms are not compared;

then hashes every top-level file (sha256, with progress on stderr, saying when the folder is on
a Windows drive under WSL2, whose 9p mount reads slowly) and writes ``escha-model.lock.json``
(``checkpoint.lock``) from what it read: the repository and commit of a Hugging Face cache
snapshot (``models--ORG--NAME/snapshots/COMMIT``), else ``local/FOLDER-NAME`` pinned by a
digest of the files' hashes. Problems are refused before anything is written.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from . import LOCK_NAME
from .lock import CHUNK, LockedFile, ModelLock, read_lock, write_lock

Report = Callable[[str], None]

#: ``config.json``'s dtype names -> the safetensors dtype of its 16-bit float tensors
#: (transformers' ``torch_dtype``; safetensors' dtype names, ``Dtype`` in its Rust crate).
CONFIG_DTYPES = {"bfloat16": "BF16", "float16": "F16", "half": "F16"}
#: Where the lock's endpoint says the files came from: nowhere on the network.
LOCAL = "local (model adopt)"
#: Filesystem types of a Windows drive seen from WSL2 (``/mnt/c``): 9p, as /proc/mounts names it.
WINDOWS_FS = ("9p", "drvfs", "v9fs")
#: Below this rate (bytes/s) a read is called slow.
SLOW_BYTES_PER_S = 100_000_000
#: Seconds between two progress lines while a file is hashed.
PROGRESS_EVERY_S = 5.0


def _fs_type(path: Path) -> str | None:
    """The filesystem type of the mount holding ``path`` (/proc/self/mounts, longest match)."""
    real = os.path.realpath(path)
    best, kind = "", None
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3:
                    mnt = parts[1].replace("\\040", " ")
                    if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                        best, kind = mnt, parts[2]
    except OSError:
        return None
    return kind


def _config_dtype(config: dict) -> str | None:
    for key in ("torch_dtype", "dtype"):
        value = config.get(key)
        text = config.get("text_config", {}).get(key) if isinstance(config.get("text_config"), dict) else None
        for v in (value, text):
            if isinstance(v, str) and v.removeprefix("torch.") in CONFIG_DTYPES:
                return CONFIG_DTYPES[v.removeprefix("torch.")]
    return None


def check(folder: Path) -> list[str]:
    """Every problem of the folder (steps 1-3 of the module docstring), one line each naming the
    file; empty when it can be adopted."""
    from escha_deploy.facts.folders import check_model_folder, shard_problems
    from escha_deploy.sglang.arch import safetensors_header
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.utils.jsonio import read_json

    field = "model adopt"
    problems = check_model_folder(str(folder), field) or shard_problems(str(folder), field)
    if problems:
        return problems
    try:
        config = read_json(folder / "config.json", "the model's config.json")
    except BadInput as exc:
        return [f"{field}: {p}" for p in exc.problems]
    if not isinstance(config, dict):
        return [f"{field}: {folder / 'config.json'}: not a JSON object"]
    want = _config_dtype(config)
    where: dict[str, str] = {}
    total = 0
    for f in sorted(folder.glob("*.safetensors")):
        try:
            tensors = safetensors_header(f)
        except BadInput as exc:
            problems.append(f"{field}: {exc.problems[0]}")
            continue
        except OSError as exc:
            problems.append(f"{field}: {f}: cannot read: {exc.strerror or exc}")
            continue
        for name, info in tensors.items():
            if name in where:
                problems.append(f"{field}: tensor {name!r} is in both {where[name]} and {f.name}")
            where[name] = f.name
            total += info["data_offsets"][1] - info["data_offsets"][0]
            if want and info["dtype"] in CONFIG_DTYPES.values() and info["dtype"] != want:
                problems.append(f"{field}: {f}: tensor {name!r} is {info['dtype']}, but config.json's "
                                f"dtype is {want} ({folder / 'config.json'})")
    for index in sorted(folder.glob("*.safetensors.index.json")):
        data = read_json(index, "a safetensors index")
        assert isinstance(data, dict)  # shard_problems passed: a weight_map of names
        wmap: dict = data["weight_map"]
        for name, shard in sorted(wmap.items()):
            if where.get(name) != shard:
                found = f"is in {where[name]}" if name in where else "is in no shard"
                problems.append(f"{field}: {index}: names {shard} for tensor {name!r}, which {found}")
        stray = sorted(set(where) - set(wmap))
        if stray:
            problems.append(f"{field}: {index}: does not name tensor {stray[0]!r} of {where[stray[0]]}"
                            + (f" (and {len(stray) - 1} more)" if len(stray) > 1 else ""))
        meta = data.get("metadata")
        size = meta.get("total_size") if isinstance(meta, dict) else None
        if isinstance(size, int) and not isinstance(size, bool) and size != total:
            problems.append(f"{field}: {index}: metadata.total_size is {size:,} bytes, the shards' "
                            f"tensors are {total:,}")
    if len(problems) > 5:
        problems = problems[:5] + [f"{field}: ... and {len(problems) - 5} more problems like these"]
    return problems


def _files(folder: Path) -> list[Path]:
    """The top-level files to pin (regular files, through links), the lock file and hidden
    entries left out, sorted by name."""
    out = []
    for f in sorted(folder.iterdir()):
        if f.name == LOCK_NAME or f.name.startswith("."):
            continue
        if os.path.isfile(f):
            out.append(f)
    return out


def _hash(f: Path, report: Report, done: int, total: int, slow_fs: str | None) -> str:
    """sha256 of ``f``, saying every few seconds how far the whole folder is and how fast."""
    h = hashlib.sha256()
    t0 = last = time.monotonic()
    read = 0
    with open(f, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
            read += len(chunk)
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY_S:
                last = now
                rate = read / max(now - t0, 1e-9)
                why = ""
                if rate < SLOW_BYTES_PER_S and slow_fs:
                    why = (f"; slow: {f.parent} is on a Windows drive ({slow_fs}), which WSL2 reads "
                           "slowly; the server will load it as slowly, a copy inside the WSL2 "
                           "filesystem reads faster")
                report(f"model adopt: hashing {f.name}: {(done + read) / 1e9:.2f} of {total / 1e9:.2f} GB "
                       f"at {rate / 1e6:.0f} MB/s{why}")
    return h.hexdigest()


def _origin(folder: Path) -> tuple[str, str, str]:
    """``(repo, revision, commit)``: a Hugging Face cache snapshot's, else local ones."""
    from escha_deploy.facts.folders import hf_repo_root

    repo = hf_repo_root(str(folder)) or hf_repo_root(os.path.realpath(folder))
    if repo is not None:
        snap = Path(os.path.realpath(folder)).name if hf_repo_root(os.path.realpath(folder)) else folder.name
        owner_name = Path(repo).name.split("--", 1)[1].replace("--", "/")
        return owner_name, snap, snap
    return f"local/{Path(os.path.realpath(folder)).name}", "adopted", ""


def _writable(folder: Path) -> str | None:
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".escha-write-check-"):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def adopt(folder: str | Path, *, report: Report = lambda _: None, force: bool = False) -> ModelLock:
    """Check ``folder`` (``check``), hash its files and write its lock file; returns the lock.
    Raises ``BadInput`` (exit 2: not a folder, not writable, already pinned without ``force``)
    or ``Refused`` (exit 3: a problem ``check`` found), writing nothing."""
    from escha_deploy.utils.errors import BadInput, Refused

    p = Path(folder)
    if not os.path.isdir(p):
        raise BadInput(f"model adopt: {folder}: not a folder here")
    existing = read_lock(p)
    if existing is not None and not force:
        raise BadInput(f"model adopt: {p / LOCK_NAME}: already pins {existing.pin()}",
                       hint=f"`escha-deploy model verify {p}` checks the folder against it; --force re-pins it")
    problems = check(p)
    if problems:
        raise Refused(*problems)
    why = _writable(p)
    if why is not None:
        raise BadInput(f"model adopt: {p}: cannot write {LOCK_NAME} there ({why})")
    files = _files(p)
    total = sum(f.stat().st_size for f in files)
    fs = _fs_type(p)
    slow_fs = fs if fs in WINDOWS_FS else None
    report(f"model adopt: {p}: checked offline; hashing {len(files)} files, {total / 1e9:.2f} GB"
           + (f" (on a Windows drive, {fs}: slow under WSL2)" if slow_fs else ""))
    locked, done = [], 0
    t0 = time.monotonic()
    for f in files:
        digest = _hash(f, report, done, total, slow_fs)
        size = f.stat().st_size
        done += size
        locked.append(LockedFile(name=f.name, size=size, sha256=digest))
    took = time.monotonic() - t0
    report(f"model adopt: hashed {total / 1e9:.2f} GB in {took:.1f} s")
    repo, revision, commit = _origin(p)
    if not commit:  # a local folder: pinned by what it holds
        commit = hashlib.sha256("".join(f"{x.name}\0{x.size}\0{x.sha256}\n" for x in locked).encode()).hexdigest()
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    lock = ModelLock(repo=repo, revision=revision, commit=commit, endpoint=LOCAL, pulled_at=now, files=locked)
    try:
        write_lock(p, lock)
    except OSError as exc:
        raise BadInput(f"model adopt: {p / LOCK_NAME}: cannot write: {exc.strerror or exc}") from None
    return lock
