"""The folders a server needs, checked where it will run: the model folder and the file L3
directory. The one I/O edge for both; ``host.gather_plan_inputs`` calls it for ``up`` and
``serve``, and ``plan`` of this host calls ``check_l3_dir`` itself so that the plan is shown
with the directory's problem as a reason (``cli/plan.make_plan``).

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

import os
import tempfile
from pathlib import Path

from .units import fmt_gb

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


def check_model_folder(path: str, field: str = "model.host_dir") -> list[str]:
    """Problems with the model folder at ``path`` (one line each, naming ``field``): not a
    folder, no ``config.json``, no weights (``WEIGHT_GLOBS``; an index file without its shards
    is named as such). Empty list: the folder looks loadable."""
    p = Path(path)
    if not p.is_dir():
        return [f"{field}: {path} is not a folder here"]
    missing = []
    if not (p / "config.json").is_file():
        missing.append("config.json")
    if not _has_weights(p):
        index = next((i.name for g in INDEX_GLOBS for i in p.glob(g)), None)
        missing.append(f"weights ({', '.join(WEIGHT_GLOBS)}; {index} names shards that are not here)" if index
                       else f"weights ({', '.join(WEIGHT_GLOBS)})")
    if not missing:
        return []
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
    if not p.exists():
        return [f"{field}: {path} does not exist here; create it (mkdir -p {path}) on a disk with the cap free"]
    if not p.is_dir():
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
