"""The folders a server needs, checked where it will run: the model folder and the file L3
directory. The one I/O edge for both; ``pipeline.gather`` calls it (``host.read_model_folder``,
``host.l3_dir_problems``) for ``plan``, ``up`` and ``serve``, and ``plan`` of this host shows the
directory's problem as a reason of the plan (``pipeline.plan_here``).

- Model folder: SGLang's loader reads ``config.json`` first (transformers' ``AutoConfig``: "does
  not appear to have a file named config.json", eosphoros-ai/DB-GPT#1318) and then the weights
  its ``DefaultModelLoader`` globs (``sglang/srt/model_loader/loader.py``
  ``_prepare_weights``: ``*.safetensors``, then ``*.bin``, ``*.pt``). A folder without them is
  bad input (exit 2); when a sub-folder has them the fix names it (a download one level off).
- A Hugging Face cache snapshot (``hf download`` without ``--local-dir``:
  ``HUB/models--ORG--NAME/snapshots/REV/`` holding relative symbolic links to
  ``../../blobs/HASH``, https://huggingface.co/docs/huggingface_hub/guides/manage-cache) is a
  model folder too: read here through its links, and mounted with its repository's ``blobs/``
  (``hf_blobs_mount``) so the links resolve in the container. Any other link that leaves the
  folder (or, for a snapshot, its repository's ``blobs/``) is refused: the container sees only
  what is mounted.
- File L3 directory (``hicache.l3.dir``, SGLang's ``HiCacheFile`` backend,
  ``sglang/srt/mem_cache/hicache_storage.py``): it must exist, take a new file, and its files
  be listable (``read_l3_dir``, which also reads the filesystem as SGLang's
  ``LRUFileEvictor._fs_stats`` does and sums the store's own files, those SGLang counts inside
  the cap at start: ``_scan_existing_files``). The disk the tier needs is each owning rank's
  cap plus the free-space watermark (``sglang.filestore``); free space plus the store's own
  files must cover it (``l3_space_problems``): a store reused across restarts is counted, never
  to be deleted. Otherwise the store fails late, after a 10-minute load. Refused before start
  (exit 3); nothing in the folder is ever removed here.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from typing import TYPE_CHECKING

from escha_deploy.utils.units import fmt_gb

if TYPE_CHECKING:
    from escha_deploy.facts.host import L3DirReading

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


#: The folders a Hugging Face cache keeps repositories in (``models--``, ``datasets--``,
#: ``spaces--`` + the id with ``/`` as ``--``; huggingface_hub ``constants.REPO_ID_SEPARATOR``).
HF_REPO_PREFIXES = ("models--", "datasets--", "spaces--")


def hf_repo_root(path: str) -> str | None:
    """The repository folder (``.../models--ORG--NAME``) when ``path`` names, as written, a
    snapshot of a Hugging Face cache (``.../models--ORG--NAME/snapshots/REV``), else ``None``.
    Pure: the path's words only (a launch spec is derived without I/O)."""
    import posixpath

    p = posixpath.normpath(path)
    snapshots = posixpath.dirname(p)
    repo = posixpath.dirname(snapshots)
    if posixpath.basename(snapshots) == "snapshots" and posixpath.basename(repo).startswith(HF_REPO_PREFIXES) \
            and posixpath.basename(p) not in ("", ".", ".."):
        return repo
    return None


def hf_blobs_mount(host_dir: str, container_path: str) -> tuple[str, str] | None:
    """``(host blobs folder, where the container must see it)`` for a snapshot folder mounted at
    ``container_path``: its links read ``../../blobs/HASH`` (relative, as huggingface_hub makes
    them), so the repository's ``blobs/`` goes at ``container_path/../../blobs``. ``None`` for a
    folder that is not a snapshot. Pure."""
    import posixpath

    repo = hf_repo_root(host_dir)
    if repo is None:
        return None
    return posixpath.join(repo, "blobs"), posixpath.normpath(posixpath.join(container_path, "..", "..", "blobs"))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _link_problems(p: Path, field: str) -> list[str]:
    """Symbolic links in the folder that the container could not follow: one that resolves
    outside the folder, except, in a Hugging Face snapshot, a relative one into its
    repository's ``blobs/`` (mounted beside it). At most three lines, then how many more."""
    repo = hf_repo_root(str(p))
    real = os.path.realpath(p)
    blobs = os.path.realpath(os.path.join(repo, "blobs")) if repo else None
    out: list[str] = []
    seen = 0
    for top, dirs, files in os.walk(p):
        for name in sorted(dirs + files):
            f = os.path.join(top, name)
            if not os.path.islink(f):
                continue
            seen += 1
            if seen > MAX_WEIGHT_FILES_CHECKED:
                break
            target, resolved = os.readlink(f), os.path.realpath(f)
            if _inside(resolved, real) or (blobs and not os.path.isabs(target) and _inside(resolved, blobs)):
                continue
            where = f"outside {p}" + (" and its cache's blobs/" if blobs else "")
            fix = "copy the file into the folder"
            snapshot = hf_repo_root(real)
            if snapshot and not repo:
                fix = f"set {field}={real} (the Hugging Face snapshot itself, so its blobs/ is mounted)"
            out.append(f"{field}: {f}: a link to {target}, {where}: the container sees only the mounted "
                       f"folder; {fix}")
    if len(out) > 3:
        out = out[:3] + [f"{field}: ... and {len(out) - 3} more links like these"]
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
        # links are judged on the host (``*.host_dir``), where the mounts are decided; inside
        # the container (``model.path``) what is mounted is all there is, a dangling link named above
        return _weight_problems(p, field) or (_link_problems(p, field) if field.endswith("host_dir") else [])
    line = f"{field}: {path} has no {' and no '.join(missing)}"
    down = _subfolders_with_model(p)
    if down:
        line += f"; the model seems to be one level down: set {field}={down[0]}"
    return [line]


def shard_problems(path: str, field: str = "model.host_dir") -> list[str]:
    """The weights a safetensors checkpoint lacks: a shard its index
    (``*.safetensors.index.json``, ``weight_map``: tensor -> shard, as transformers writes it)
    names that is not in the folder, and a shard shorter than its own header says
    (``arch.safetensors_shortfall``: a partial download). One line each naming the file, at
    most three, then how many more; empty when whole. SGLang would fail on either after
    minutes of loading, so ``plan``, ``up`` and ``serve`` refuse them (exit 3)."""
    from escha_deploy.sglang.arch import safetensors_shortfall
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.utils.jsonio import is_regular_file, read_json

    p = Path(path)
    out: list[str] = []
    for index in sorted(p.glob("*.safetensors.index.json")):
        try:
            data = read_json(index, "a safetensors index")
        except BadInput as exc:
            out.append(f"{field}: {exc.problems[0]}")
            continue
        wmap = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
            out.append(f"{field}: {index}: not a safetensors index (no weight_map of tensor -> file)")
            continue
        counts: dict[str, int] = {}
        for shard in wmap.values():
            counts[shard] = counts.get(shard, 0) + 1
        for shard, n in sorted(counts.items()):
            if "/" in shard or shard in ("", ".", ".."):
                out.append(f"{field}: {index}: names {shard!r}, not a file of this folder")
            elif not is_regular_file(p / shard):
                out.append(f"{field}: {p / shard}: missing ({index.name} names it for {n:,} tensors)")
    for f in sorted(p.glob("*.safetensors")):
        try:
            short = safetensors_shortfall(f)
        except OSError:
            continue  # unreadable: _weight_problems names it
        if short is not None:
            out.append(f"{field}: {f}: {short[0]:,} bytes, shorter than the {short[1]:,} its header "
                       "needs (a partial download or copy?)")
    if len(out) > 3:
        out = out[:3] + [f"{field}: ... and {len(out) - 3} more files like these"]
    return out


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


#: Seconds a scan of the store's files runs before it says how far it got (then every as many).
SCAN_PROGRESS_S = 2.0


def _say_progress(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)


def read_l3_dir(path: str, *, tp_size: int, mla: bool, field: str = "hicache.l3.dir",
                progress=_say_progress, clock=None) -> tuple[list[str], "L3DirReading | None"]:
    """The file L3 folder at ``path`` where the server runs: its refusals (missing, not a
    folder, not writable: a file is really created and removed, so permissions, a read-only
    mount and ACLs all show; its filesystem or files unreadable), else its reading: the
    filesystem's size and free space (``statvfs``) and the bytes of the store's own page files
    (``sglang.filestore.own_file`` for a TP ``tp_size`` server, ``mla``: rank-replicated KV).
    Reads only; removes nothing but its own probe file. A scan of a large store says how far it
    got every ``SCAN_PROGRESS_S`` seconds (``progress``, a line on stderr by default)."""
    import time

    clock = clock or time.monotonic
    from escha_deploy.facts.host import L3DirReading
    from escha_deploy.sglang.filestore import own_file

    p = Path(path)
    if not os.path.exists(p):
        return [f"{field}: {path} does not exist here; create it (mkdir -p {path}) on a disk with room for the tier"], None
    if not os.path.isdir(p):
        return [f"{field}: {path} is not a folder"], None
    why = _writable(p)
    if why is not None:
        return [f"{field}: {path} is not writable ({why}); the L3 file store writes there "
                f"(chown it to the server's user or pick another folder)"], None
    try:
        st = os.statvfs(p)
    except OSError as exc:
        return [f"{field}: {path}: cannot read its filesystem (statvfs: {exc.strerror or exc})"], None
    own = own_n = other = seen = 0
    next_say = clock() + SCAN_PROGRESS_S
    try:
        with os.scandir(p) as it:
            for entry in it:
                seen += 1
                if seen % 1024 == 0 and clock() >= next_say:
                    progress(f"{field}: scanning {path}: {seen:,} entries so far, {fmt_gb(own)} in this store's "
                             f"own {own_n:,} files")
                    next_say = clock() + SCAN_PROGRESS_S
                if not entry.name.endswith(".bin"):
                    continue
                size = entry.stat(follow_symlinks=False).st_size
                if own_file(entry.name, tp_size, mla=mla):
                    own, own_n = own + size, own_n + 1
                else:
                    other += size
    except OSError as exc:
        return [f"{field}: {path}: cannot read the store's files ({exc.strerror or exc}); SGLang counts them "
                f"at start (lru_file_evictor.py: _scan_existing_files): let the server's user list and read the "
                f"folder"], None
    return [], L3DirReading(path=str(path), mount=str(mount_point(p)), fs_bytes=st.f_blocks * st.f_frsize,
                            free_bytes=st.f_bavail * st.f_frsize, store_bytes=own, store_files=own_n,
                            other_bytes=other)


def _floor_gb(n: int) -> str:
    return f"{max(0, n) // 10**9}GB"


def l3_space_problems(r: "L3DirReading", *, cap: int, ranks: int, min_free: int) -> list[str]:
    """Refusals of the file L3 store's room (pure): the watermark (``hicache.l3.min_free_space``)
    not below the filesystem's size; the tier's need (``cap`` bytes per owning rank x ``ranks``
    + ``min_free``) above the filesystem's size (SGLang would clamp each rank's cap to the
    filesystem less the watermark, so the ranks together could fill it: ``LRUFileEvictor.__init__``);
    free space plus the store's own files (which SGLang counts inside the cap at start and
    evicts as it needs room) short of the need. The advice lowers the cap or moves the folder;
    it never asks to delete the store."""
    need = cap * ranks + min_free
    wm = f" + min_free_space {fmt_gb(min_free)}" if min_free else ""
    how = f"hicache.l3.max_size {fmt_gb(cap)} per rank x {ranks} rank{'s' if ranks != 1 else ''}{wm}"
    if min_free and min_free >= r.fs_bytes:
        return [f"hicache.l3.min_free_space: {fmt_gb(min_free)} is not less than the whole filesystem at {r.mount} "
                f"({fmt_gb(r.fs_bytes)}, statvfs): SGLang would clamp every rank's cap to 0 and keep nothing there; "
                f"lower it"]
    if need > r.fs_bytes:
        return [f"hicache.l3.max_size: the tier needs {fmt_gb(need)} ({how}), more than the whole filesystem at "
                f"{r.mount} holds ({fmt_gb(r.fs_bytes)}, statvfs): lower hicache.l3.max_size to "
                f"{_floor_gb((r.fs_bytes - min_free) // ranks)} or put hicache.l3.dir on a larger disk"]
    room = r.free_bytes + r.store_bytes
    if room < need:
        others = (f"; {fmt_gb(r.other_bytes)} of other .bin files there belong to no rank of this server "
                  f"(another model or TP size) and are not counted" if r.other_bytes else "")
        return [f"hicache.l3.dir: {r.path} has {fmt_gb(r.free_bytes)} free + {fmt_gb(r.store_bytes)} in this "
                f"store's own files on {r.mount} (statvfs), less than the {fmt_gb(need)} the tier needs ({how}){others}: "
                f"lower hicache.l3.max_size to {_floor_gb((room - min_free) // ranks)} (the store's files stay and "
                f"count) or put hicache.l3.dir on a larger disk"]
    return []


def check_l3_dir(path: str, cap_bytes: int | None, field: str = "hicache.l3.dir", *, tp_size: int = 1,
                 ranks: int = 1, mla: bool = False, min_free: int = 0) -> list[str]:
    """Refusals for the file L3 directory at ``path`` (``read_l3_dir``), and, with a cap
    (``cap_bytes`` per owning rank, ``hicache.l3.max_size``), of its room for ``ranks`` owning
    ranks and the watermark ``min_free`` (``l3_space_problems``)."""
    problems, reading = read_l3_dir(path, tp_size=tp_size, mla=mla, field=field)
    if problems or reading is None:
        return problems
    if cap_bytes:
        return l3_space_problems(reading, cap=cap_bytes, ranks=ranks, min_free=min_free)
    if min_free and min_free >= reading.fs_bytes:
        return l3_space_problems(reading, cap=0, ranks=ranks, min_free=min_free)
    return []
