"""The ``serve`` supervisor: run SGLang as a child, forward signals, redact, diagnose.

``supervise(argv, ...)`` starts ``python -m sglang.launch_server ...`` (the argv a
``LaunchSpec`` carries) as a child process in its own session, and then

- forwards SIGTERM and SIGINT to it (SGLang's own handler then tears down its scheduler and
  detokenizer processes); after a forwarded signal the supervisor exits with the child's code;
- copies the child's output (stdout and stderr merged, line by line) to its own stderr with
  secrets masked (``redact.Redactor``; SGLang 0.5.19 logs the API key in its ``server_args=``
  startup line);
- on any other non-zero exit prints ``diagnose.diagnose`` of the last lines with the child's
  code and returns ``ExitCode.FAILED`` (4).

Secrets never reach the child's command line: values that SGLang only takes as flags (the API
key) are written to a private YAML file (mode 0600 in a 0700 directory) passed with SGLang's
``--config`` option (``sglang/srt/utils/server_args_config_parser.py``
``ConfigArgumentMerger``: YAML keys become flags; it needs a ``.yaml`` path, so no pipe).
Natively the directory is on tmpfs (``$XDG_RUNTIME_DIR``, else ``/dev/shm``), so the key never
reaches a disk. SGLang reads the file while parsing its arguments, before anything else, so
the file is unlinked as soon as the server logs that it is ready; until then a ``serve`` killed
with SIGKILL leaves at most that file, which its watchdog removes, or else the next ``serve``
(``sweep_secret_dirs``: directories named after a pid that no longer runs).

Nothing of the server outlives ``serve``: the child gets a parent-death signal (SIGTERM,
``PR_SET_PDEATHSIG``), and a watchdog process (``watchdog.py``) ends the child's whole process
group, SGLang's scheduler processes included, once ``serve`` ends for any reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from escha_deploy.errors import ExitCode

from .diagnose import Diagnosis, Facts, diagnose
from .redact import Redactor

#: Lines kept for the diagnosis (the printed tail is diagnose.TAIL_LINES of these).
KEEP_LINES = 400


@dataclass
class Outcome:
    """How the child ended: its code (negative: killed by that signal), the forwarded signal
    (None when the supervisor forwarded none), the kept lines (redacted), and the diagnosis
    when one was made."""

    child_code: int
    forwarded: int | None
    lines: list[str]
    diagnosis: Diagnosis | None = None
    exit_code: int = 0
    extra: dict = field(default_factory=dict)


#: Prefix of the private secrets directories: ``escha-serve-<pid of serve>-<random>``.
SECRET_DIR_PREFIX = "escha-serve-"
#: The line after which SGLang has read its ``--config`` file and serves:
#: sglang/srt/entrypoints/http_server.py ``_wait_and_warmup`` (``ready.PHASES`` "warmup done").
READY_LINE = "The server is fired up and ready to roll!"
#: Seconds the watchdog gives the process group after SIGTERM before SIGKILL (default).
GRACE_S = 10.0


def tmpfs_root() -> Path | None:
    """Where native secrets go: ``$XDG_RUNTIME_DIR`` (a per-user tmpfs under systemd), else
    ``/dev/shm``; None when neither is a directory (then the system temp dir)."""
    for d in (os.environ.get("XDG_RUNTIME_DIR"), "/dev/shm"):
        if d and os.path.isdir(d):
            return Path(d)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_secret_dirs(root: Path | None) -> list[Path]:
    """Remove the secrets directories under ``root`` that a ``serve`` killed before its server
    was ready left behind: ours (same uid), named after a pid that no longer runs. Returns
    them."""
    removed = []
    if root is None:
        return removed
    for d in root.glob(SECRET_DIR_PREFIX + "*-*"):
        try:
            pid = int(d.name[len(SECRET_DIR_PREFIX):].split("-", 1)[0])
            if d.is_symlink() or not d.is_dir() or d.stat().st_uid != os.getuid() or _pid_alive(pid):
                continue
        except (ValueError, OSError):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def runtime_dir(*, make: bool = True) -> Path:
    """This user's private runtime folder, ``<tmpfs_root()>/escha-deploy-<uid>`` (else under
    the system temp dir): the port locks and the state files of native ``serve``. Raises
    ``Refused`` (3) when it is a link or another user's."""
    from escha_deploy.errors import Refused

    d = (tmpfs_root() or Path(tempfile.gettempdir())) / f"escha-deploy-{os.getuid()}"
    if make:
        d.mkdir(mode=0o700, exist_ok=True)
    elif not d.exists():
        return d
    st = d.lstat()
    if d.is_symlink() or st.st_uid != os.getuid():
        raise Refused(f"serve: {d} is not this user's private directory; refusing to use it")
    return d


@contextlib.contextmanager
def server_lock(port: int) -> Iterator[int]:
    """One native ``serve`` per server port on this host: an exclusive ``fcntl.flock`` on
    ``<tmpfs_root()>/escha-deploy-<uid>/serve-<port>.lock`` (it holds the holder's pid), held
    for the block; yields the descriptor. Raises ``Refused`` (exit 3) naming the holder when
    another ``serve`` has it. The kernel drops a flock with its last descriptor, so a killed
    ``serve`` never leaves a stale lock (its watchdog holds a copy until the server is gone)."""
    import fcntl

    from escha_deploy.errors import Refused

    d = runtime_dir()
    path = d / f"serve-{port}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            raise Refused(f"serve: another `serve` (pid {holder}) is running the server on port {port} "
                          f"(lock {path})", hint="stop it first (Ctrl-C or SIGTERM), or set container.port "
                          "to another port") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield fd
    finally:
        os.close(fd)


def write_secret_config(values: Mapping[str, str], root: Path | None = None) -> tuple[Path, Path]:
    """Write ``values`` (SGLang config keys -> secret values) to a private YAML file.

    Returns ``(file, directory)``; the caller removes the directory. The file is mode 0600 in a
    fresh 0700 directory (``tempfile.mkdtemp``) named ``escha-serve-<pid>-*`` under ``root``
    (``tmpfs_root()`` natively; None: the system temp dir).
    """
    import yaml

    d = Path(tempfile.mkdtemp(prefix=f"{SECRET_DIR_PREFIX}{os.getpid()}-", dir=root))
    f = d / "secrets.yaml"
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(dict(values), fh)
    return f, d


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _die_with(parent: int):
    """A ``preexec_fn``: the child gets SIGTERM when ``parent`` dies (prctl(2)
    ``PR_SET_PDEATHSIG``); if ``parent`` is already gone, the child exits at once."""
    def setup() -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG = 1 (linux/prctl.h)
        if os.getppid() != parent:
            os._exit(1)
    return setup


def _start_watchdog(pgid: int, grace_s: float, secret_dir: Path | None,
                    lock_fd: int | None) -> tuple[subprocess.Popen, int]:
    """Start ``watchdog.py`` for process group ``pgid``; returns it and the write end of its
    pipe (close it to let the watchdog act; a dead supervisor closes it too)."""
    r, w = os.pipe()  # both ends non-inheritable: the server never holds the write end
    try:
        dog = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).with_name("watchdog.py")), str(pgid),
             str(grace_s), str(secret_dir or "")],
            stdin=r, stdout=subprocess.DEVNULL, start_new_session=True,
            pass_fds=(lock_fd,) if lock_fd is not None else (),
        )
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    return dog, w


def exit_code_for(child_code: int) -> int:
    """A child's returncode as a process exit status: -N (killed by signal N) becomes 128+N."""
    return 128 - child_code if child_code < 0 else child_code


def supervise(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    secrets: Sequence[str] = (),
    config_flag: str | None = None,
    config_secrets: Mapping[str, str] | None = None,
    facts: Facts | None = None,
    out: IO[str] | None = None,
    secret_root: Path | None = None,
    lock_fd: int | None = None,
    grace_s: float = GRACE_S,
) -> Outcome:
    """Run ``argv`` as a supervised child and return how it ended (see module docstring).

    ``env``: the child's full environment (default: ours). ``secrets``: values to mask in its
    output. ``config_flag`` + ``config_secrets``: when both are given, the secrets are written
    to a private YAML file and ``[config_flag, path]`` is appended to ``argv``. ``facts``: passed
    to the diagnosis (HiCache on, platform). ``out``: where the redacted output goes (stderr).
    ``Outcome.exit_code`` is what ``serve`` exits with: the child's code after a forwarded
    signal, 0 on success, ``ExitCode.FAILED`` (4) on any other failure.
    ``secret_root``: where the secrets directory goes (``tmpfs_root()`` natively). ``lock_fd``:
    the caller's lock, handed to the watchdog so it is held until the process group is gone.
    ``grace_s``: the watchdog's SIGTERM-to-SIGKILL grace for what is left of the group.
    Raises ``OSError`` when the child cannot be started at all (the caller reports it).
    """
    out = out or sys.stderr
    redact = Redactor([*secrets, *(config_secrets or {}).values()])
    cmd = list(argv)
    tmpdir: Path | None = None
    if config_flag and config_secrets:
        cfg, tmpdir = write_secret_config(config_secrets, secret_root)
        cmd += [config_flag, str(cfg)]
    kept: deque[str] = deque(maxlen=KEEP_LINES)
    forwarded: list[int] = []
    try:
        child = subprocess.Popen(
            cmd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C reaches the child only through us
            preexec_fn=_die_with(os.getpid()),
            text=True,
            errors="replace",
            bufsize=1,
        )
    except BaseException:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
        raise
    try:
        dog, dog_pipe = _start_watchdog(child.pid, grace_s, tmpdir, lock_fd)
    except BaseException:
        child.kill()
        child.wait()
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
        raise

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {}
    on_main = threading.current_thread() is threading.main_thread()
    if on_main:
        for s in (signal.SIGTERM, signal.SIGINT):
            previous[s] = signal.signal(s, forward)
    def pump() -> None:
        # SGLang's scheduler processes inherit this pipe: it ends when the whole group has gone,
        # not when the child exits, so it is read here and the child is waited for below.
        assert child.stdout is not None
        for raw in child.stdout:
            line = redact(raw.rstrip("\n"))
            kept.append(line)
            out.write(line + "\n")
            out.flush()
            if READY_LINE in line and tmpdir is not None:  # SGLang read --config long ago
                shutil.rmtree(tmpdir, ignore_errors=True)

    reader = threading.Thread(target=pump, name="serve-output", daemon=True)
    reader.start()
    try:
        code = child.wait()
    finally:
        if on_main:
            for s, h in previous.items():
                signal.signal(s, h)
        os.close(dog_pipe)  # the watchdog ends what is left of the group, then exits
        try:
            dog.wait(timeout=grace_s + 10)
        except subprocess.TimeoutExpired:
            dog.kill()
        reader.join(timeout=5)
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
    lines = list(kept)
    if forwarded:
        return Outcome(code, forwarded[0], lines, exit_code=exit_code_for(code))
    if code == 0:
        return Outcome(code, None, lines, exit_code=0)
    f = (facts or Facts()).model_copy(update={"exit_code": code})
    diag = diagnose(lines, f)
    for ln in diag.lines():
        out.write(ln + "\n")
    how = (f"was killed by signal {-code} ({_signal_name(-code)})" if code < 0
           else f"exited with code {code}")
    out.write(f"serve: SGLang {how}; exiting {int(ExitCode.FAILED)}\n")
    out.flush()
    return Outcome(code, None, lines, diagnosis=diag, exit_code=int(ExitCode.FAILED))
