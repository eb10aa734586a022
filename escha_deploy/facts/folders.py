"""The folders a server needs, checked where it will run: the model folder and the file L3
directory. The one I/O edge for both; ``pipeline.gather`` calls it (``host.read_model_folder``,
``host.l3_dir_problems``) for ``plan``, ``up`` and ``serve``, and ``plan`` of this host shows the
directory's problem as a reason of the plan (``pipeline.plan_here``).

- Model folder: SGLang's loader reads ``config.json`` first (transformers' ``AutoConfig``: "does
  not appear to have a file named config.json", eosphoros-ai/DB-GPT#1318) and then the weights
  its ``DefaultModelLoader`` globs (``sglang/srt/model_loader/loader.py``
  ``_prepare_weights``: ``*.safetensors``, then ``*.bin``, ``*.pt``). A folder without them is
  bad input (exit 2); when a sub-folder has them the fix names it (a download one level off).
- File L3 directory (``hicache.l3.dir``, SGLang's ``HiCacheFile`` backend,
  ``sglang/srt/mem_cache/hicache_storage.py``): it must exist, take a new file, and have the
  cap (``hicache.l3.max_size``) free on the filesystem it is mounted on (``statvfs``
  ``f_bavail * f_frsize``: what an unprivileged writer can use); otherwise the store fails
  late, after a 10-minute load. Refused before start (exit 3).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from escha_deploy.utils.units import fmt_gb

#: Weight files SGLang 0.5.19's default loader reads (``loader.py`` ``_prepare_weights``),
#: and the sharded-checkpoint indexes that name them.
WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt")
INDEX_GLOBS = ("*.safetensors.index.json", "*.bin.index.json")


def _has_weights(p: Path) -> bool:
    return any(next(p.glob(g), None) is not None for g in WEIGHT_GLOBS)


def _subfolders_with_model(p: Path) -> list[Path]:
    try:
        subs = sorted(d for d in p.iterdir() if d.is_dir() and not d.name.startswith("."))
    except OSError:
        return []
    return [d for d in subs if (d / "config.json").is_file() and _has_weights(d)]


#: How a Git LFS pointer file begins (https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md:
#: "version https://git-lfs.github.com/spec/v1" as the first line); a clone without `git lfs
#: pull` holds these ~130-byte files in place of the weights.
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
#: The most weight files checked one by one (a sharded checkpoint has tens).
MAX_WEIGHT_FILES_CHECKED = 4096


def _weight_problems(p: Path, field: str) -> list[str]:
    """The weight files SGLang would glob that it could not load: a symbolic link to nothing,
    a file this user may not read, a folder named like a weight file, a Git LFS pointer left by
    a clone without `git lfs pull`. At most three lines, then how many more."""
    from escha_deploy.utils.jsonio import file_problem

    out: list[str] = []
    lfs: list[str] = []
    for n, f in enumerate(f for g in WEIGHT_GLOBS for f in sorted(p.glob(g))):
        if n >= MAX_WEIGHT_FILES_CHECKED:
            break
        problem = file_problem(f)
        if problem is not None:
            if f.is_symlink() and not f.exists():
                problem = f"a symbolic link to {os.readlink(f)}, which does not exist"
            out.append(f"{field}: {f}: cannot read the weights: {problem}")
            continue
        try:
            if f.stat().st_size < 1024:
                with open(f, "rb") as fh:
                    if fh.read(len(LFS_POINTER)) == LFS_POINTER:
                        lfs.append(f.name)
        except OSError as exc:
            out.append(f"{field}: {f}: cannot read the weights: {exc.strerror or exc}")
    if lfs:
        out.append(f"{field}: {p} holds Git LFS pointer files, not weights ({', '.join(lfs[:3])}"
                   + (f" and {len(lfs) - 3} more" if len(lfs) > 3 else "") + f"): run `git lfs pull` in {p}")
    if len(out) > 3:
        out = out[:3] + [f"{field}: ... and {len(out) - 3} more weight files like these"]
    return out


def check_model_folder(path: str, field: str = "model.host_dir") -> list[str]:
    """Problems with the model folder at ``path`` (one line each, naming ``field``): not a
    folder, no ``config.json``, no weights (``WEIGHT_GLOBS``; an index file without its shards
    is named as such). Empty list: the folder looks loadable."""
    p = Path(path)
    if not os.path.isdir(p):
        return [f"{field}: {path} is not a folder here"]
    from escha_deploy.utils.jsonio import file_problem

    missing = []
    problem = file_problem(p / "config.json")
    if problem is not None and problem != os.strerror(errno.ENOENT):  # there, but a FIFO, a device...
        return [f"{field}: {p / 'config.json'}: cannot read the model's config.json: {problem}"]
    if problem is not None:
        missing.append("config.json")
    if not _has_weights(p):
        index = next((i.name for g in INDEX_GLOBS for i in p.glob(g)), None)
        missing.append(f"weights ({', '.join(WEIGHT_GLOBS)}; {index} names shards that are not here)" if index
                       else f"weights ({', '.join(WEIGHT_GLOBS)})")
    if not missing:
        return _weight_problems(p, field)
    line = f"{field}: {path} has no {' and no '.join(missing)}"
    down = _subfolders_with_model(p)
    if down:
        line += f"; the model seems to be one level down: set {field}={down[0]}"
    return [line]


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem holding ``path`` (``os.path.ismount`` upwards)."""
    p = path.resolve()
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def _writable(p: Path) -> str | None:
    """``None`` when a file can be created in ``p``, else why not (the OS's words)."""
    try:
        with tempfile.NamedTemporaryFile(dir=p, prefix=".escha-write-check-"):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def check_l3_dir(path: str, cap_bytes: int | None, field: str = "hicache.l3.dir") -> list[str]:
    """Refusals for the file L3 directory at ``path``: missing, not a folder, not writable (a
    file is really created and removed: permissions, a read-only mount and ACLs all show), or
    less free space than ``cap_bytes`` (bytes, ``hicache.l3.max_size``) on its filesystem."""
    p = Path(path)
    if not os.path.exists(p):
        return [f"{field}: {path} does not exist here; create it (mkdir -p {path}) on a disk with the cap free"]
    if not os.path.isdir(p):
        return [f"{field}: {path} is not a folder"]
    why = _writable(p)
    if why is not None:
        return [f"{field}: {path} is not writable ({why}); the L3 file store writes there "
                f"(chown it to the server's user or pick another folder)"]
    if cap_bytes:
        st = os.statvfs(p)
        free = st.f_bavail * st.f_frsize
        if free < cap_bytes:
            return [f"{field}: {path} has {fmt_gb(free)} free on {mount_point(p)} (statvfs), less than the "
                    f"{fmt_gb(cap_bytes)} cap (hicache.l3.max_size); free space there or lower the cap"]
    return []
