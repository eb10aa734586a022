"""Where escha-deploy finds its data and keeps its state.

Data (profiles, runtime patches, the flag catalog) ships inside the wheel under
``escha_deploy/_data`` (pyproject ``force-include``); in a source checkout it is read from the
repository's top-level folders. State (doctor findings) lives under the user cache directory
(XDG: ``$XDG_CACHE_HOME/escha-deploy``, default ``~/.cache/escha-deploy``).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The bounded JSON reader (``jsonio``), re-exported for the callers that import it from here.
from escha_deploy.utils.jsonio import read_json  # noqa: F401

#: The environment variable naming a facts file (``factsfile``); compose sets it to the file's
#: path inside the container. Here rather than in ``factsfile`` so reading it builds no model.
FACTS_ENV = "ESCHA_FACTS"
#: Where ``compose --facts FILE`` mounts the file in the container (here, beside ``FACTS_ENV``,
#: so the launch spec renders the mount without importing ``factsfile``'s models).
CONTAINER_FACTS_PATH = "/etc/escha/facts.json"

PACKAGE_DIR = Path(__file__).resolve().parent.parent
_REPO_ROOT = PACKAGE_DIR.parent


def _data_dir(name: str) -> Path:
    shipped = PACKAGE_DIR / "_data" / name
    if shipped.is_dir():
        return shipped
    return _REPO_ROOT / name


def profiles_dir() -> Path:
    """Folder of the shipped profiles (``profiles/*.yaml``)."""
    return _data_dir("profiles")


def runtime_patches_dir() -> Path:
    """Folder of the patch series (``runtime_patches/``)."""
    return _data_dir("runtime_patches")


def catalog_dir() -> Path:
    """Folder of generated catalogs (SGLang flag catalog), inside the package."""
    return PACKAGE_DIR / "catalog"


def cache_dir() -> Path:
    """User cache directory for escha-deploy state (XDG)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "escha-deploy"


def facts_file(given: str | None) -> tuple[str | None, str]:
    """The facts file a command plans from: ``given`` (``--facts``), else ``$ESCHA_FACTS`` when
    set, else ``None``; with the name to give it in messages (``--facts`` or
    ``ESCHA_FACTS=PATH``, so a user who never typed --facts sees where it came from)."""
    if given:
        return given, "--facts"
    env = os.environ.get(FACTS_ENV) or None
    return env, (f"{FACTS_ENV}={env}" if env else "--facts")


def doctor_findings_path() -> Path:
    """``escha-deploy/doctor.json`` under the user cache directory."""
    return cache_dir() / "doctor.json"


def spec_path(container: str) -> Path:
    """The host file ``up`` writes a container's ``LaunchSpec`` to (under the user cache
    directory; overwritten by the next ``up`` of that profile). Here, not in ``launch.up``, so
    ``status`` finds it without importing `up`'s preflight."""
    return cache_dir() / "launch" / f"{container}.json"


def plan_view_path(spec_file: Path) -> Path:
    """Where ``up`` keeps the plan's figures for ``status`` (``launch.planview``), beside the spec."""
    return spec_file.with_suffix(".plan.json")


def _cannot_write(option: str, path: str | Path, err: int | OSError) -> Exception:
    """The ``BadInput`` (exit 2) for an output path: ``OPTION PATH: cannot write: REASON``."""
    from escha_deploy.utils.errors import BadInput

    reason = os.strerror(err) if isinstance(err, int) else (err.strerror or str(err))
    return BadInput(f"{option} {path}: cannot write: {reason}")


def check_output(path: str | Path, option: str) -> None:
    """Refuse, before any work, an output file the user named that cannot be written: a folder
    (``EISDIR``), or one whose parent folder is missing (``ENOENT``) or is not a folder
    (``ENOTDIR``). The parent is never created. Raises ``BadInput`` (exit 2), one line:
    ``--output PATH: cannot write: No such file or directory``."""
    import errno

    if os.path.isdir(path):  # os.path never raises: Path.is_dir does for a name too long
        raise _cannot_write(option, path, errno.EISDIR)
    _parent_is_folder(path, option)


def _parent_is_folder(path: str | Path, option: str) -> None:
    """``BadInput`` (``ENOENT``/``ENOTDIR``) when the folder that would hold ``path`` is missing
    or is not a folder; never creates it."""
    import errno

    parent = Path(path).parent
    if not os.path.isdir(parent):
        raise _cannot_write(option, path, errno.ENOTDIR if os.path.exists(parent) else errno.ENOENT)


def replace_file(target: Path, data: bytes, *, in_place_fallback: bool = False) -> None:
    """Write ``data`` to ``target`` through a temporary file in the same folder, then
    ``os.replace`` it over ``target`` (an atomic rename on POSIX): a reader never sees a
    half-written file, and a file hard-linked elsewhere keeps its old bytes there. The mode is
    the old file's, or 0o666 less the umask for a new file (what ``Path.write_bytes`` gives).
    ``in_place_fallback``: when no temporary file can be made in the folder (a writable file in
    a read-only folder), write ``target`` in place instead. Raises ``OSError``."""
    import tempfile

    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError:
        if not in_place_fallback:
            raise
        with open(target, "wb") as f:
            f.write(data)
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_output(path: str | Path, data: str | bytes, option: str) -> Path:
    """Write ``data`` (text as UTF-8, or bytes) to the file a user named with ``option``
    (``--output``, ``--write-facts``, ``--chart``...); every command writing such a file uses
    this. Returns the path written.

    Never half-written: the bytes go to a temporary file in the same folder that is then
    ``os.replace``d over the target (the old file's mode kept, 0o666 less the umask for a new
    one; a symbolic link's target is replaced, not the link). Where no file can be created in
    that folder but the target exists (a writable file in a read-only folder) it is written in
    place; a device or a pipe (``/dev/stdout``) is written directly. No folder is created.
    Any ``OSError`` becomes ``BadInput`` (exit 2), one line naming ``option`` and the path,
    with the system's reason, e.g. ``--write-facts /tmp: cannot write: Is a directory``.
    """
    import stat

    raw = data.encode() if isinstance(data, str) else data
    check_output(path, option)
    target = Path(os.path.realpath(path))
    try:
        try:
            st = target.stat()
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            with open(target, "wb") as f:
                f.write(raw)
            return Path(path)
        replace_file(target, raw, in_place_fallback=st is not None)
    except OSError as exc:
        raise _cannot_write(option, path, exc) from None
    return Path(path)


def output_folder(path: str | Path, option: str, *, make: bool = True) -> Path:
    """The folder a user named with ``option`` for a command's output files (``fleet compose
    --out DIR``): made when missing, as ``mkdir`` without ``-p`` (its parent must exist).
    Raises ``BadInput`` (exit 2), one line naming ``option`` and the path, when it is a file
    (``--out fleet.yaml: cannot write: Not a directory``) or cannot be made. ``make=False``
    only checks, before a command's work, that it could be made and written in (``EACCES``
    when this user may not, by ``os.access``). Returns the path."""
    import errno

    p = Path(path)
    if os.path.isdir(p):
        if not make and not os.access(p, os.W_OK | os.X_OK):
            raise _cannot_write(option, path, errno.EACCES)
        return p
    if os.path.exists(p):
        raise _cannot_write(option, path, errno.ENOTDIR)
    if not make:
        _parent_is_folder(p, option)
        if not os.access(p.parent, os.W_OK | os.X_OK):
            raise _cannot_write(option, path, errno.EACCES)
        return p
    try:
        p.mkdir()
    except OSError as exc:
        raise _cannot_write(option, path, exc) from None
    return p


def source_checkout(cwd: str | Path | None = None, dockerfile: str = "Dockerfile.hicache") -> Path | None:
    """The escha-deploy source checkout an image is built from (``escha-deploy build``'s default
    ``--context``, ``docker compose``'s build context): the current folder (or ``cwd``) when it
    holds ``dockerfile`` (a path relative to the checkout), else the checkout this package runs
    from; ``None`` for an install from the wheel (no ``dockerfile`` beside the package). An
    absolute, resolved path."""
    for folder in (Path(cwd) if cwd is not None else Path.cwd(), PACKAGE_DIR.parent):
        if (folder / dockerfile).is_file():
            return folder.resolve()
    return None

