"""The ``serve`` supervisor: run SGLang as a child, forward signals, redact, diagnose.

``supervise(argv, ...)`` starts ``python -m sglang.launch_server ...`` (the argv a
``LaunchSpec`` carries) in its own session, as the child of a watchdog process
(``watchdog.py``), and then

- forwards SIGTERM and SIGINT to it (SGLang's own handler then tears down its scheduler and
  detokenizer processes); after a forwarded signal the supervisor exits with the child's code.
  A child that has not exited ``grace_s`` (the profile's ``container.stop_timeout_s``) after
  the signal, or when a second signal comes, gets SIGKILL, with every process under it
  (sglang#22779: never SIGKILL first, but never wait for ever either);
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

Nothing of the server outlives ``serve``: the watchdog is the server's parent and a child
subreaper (prctl(2) ``PR_SET_CHILD_SUBREAPER``), so every descendant, one that called
``setsid`` included, stays under it; once ``serve`` ends for any reason (SIGKILL included: the
kernel closes its end of the watchdog's pipe) it ends them all (SIGTERM, the grace, SIGKILL)
and exits only when none is left. The server gets a parent-death signal (SIGTERM,
``PR_SET_PDEATHSIG``) should the watchdog itself be killed, and ``serve`` is a subreaper too
while it supervises (``_Reaper``): the tree the killed watchdog leaves comes to ``serve``,
which ends it as the watchdog would have (SIGTERM, the grace, SIGKILL) before it exits 4.
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
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from escha_deploy.utils.errors import ExitCode

from escha_deploy.utils.redact import Redactor, printable

if TYPE_CHECKING:  # the diagnosis is imported when a server failed (status reads only the state)
    from .diagnose import Diagnosis, Facts

#: Lines kept for the diagnosis (the printed tail is diagnose.TAIL_LINES of these).
KEEP_LINES = 400

#: Bytes a native server's log file (``serve_log_path``) grows to before it is moved to
#: ``.1`` (the one older file kept) and begun again: two files at most, on tmpfs.
LOG_MAX_BYTES = 32 << 20


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


#: The largest pid Linux gives out on 64-bit (``PID_MAX_LIMIT``, include/linux/threads.h: 4 x
#: 1024 x 1024; ``/proc/sys/kernel/pid_max`` may be set at most that high): a pid outside
#: 1..PID_MAX_LIMIT, read from a file, names no process (and ``os.kill`` refuses one past a C int
#: with ``OverflowError``; 0 and negative pids would signal process groups).
PID_MAX_LIMIT = 4 * 1024 * 1024


def _pid_alive(pid: int) -> bool:
    if not 0 < pid <= PID_MAX_LIMIT:
        return False
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
    from escha_deploy.utils.errors import Refused

    d = (tmpfs_root() or Path(tempfile.gettempdir())) / f"escha-deploy-{os.getuid()}"
    if make:
        d.mkdir(mode=0o700, exist_ok=True)
    elif not d.exists():
        return d
    st = d.lstat()
    if d.is_symlink() or st.st_uid != os.getuid():
        raise Refused(f"serve: {d} is not this user's private directory; refusing to use it")
    return d


def serve_log_path(port: int) -> Path:
    """Where a native ``serve`` on ``port`` copies its server's redacted output
    (``<runtime_dir>/serve-<port>.log``, mode 0600, beside its state file), for ``logs``; the
    file older than ``LOG_MAX_BYTES`` is ``serve-<port>.log.1``."""
    return runtime_dir() / f"serve-{port}.log"


class _LogFile:
    """The redacted server output written to ``path`` as well (mode 0600; begun empty; at
    ``LOG_MAX_BYTES`` moved to ``path.1`` and begun again). A write that fails (tmpfs full)
    stops the copy; the terminal still gets every line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.f: IO[str] | None = None
        self._open()

    def _open(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self.f = os.fdopen(fd, "w", encoding="utf-8", errors="replace")

    def write(self, line: str) -> None:
        if self.f is None:
            return
        try:
            if self.f.tell() + len(line) > LOG_MAX_BYTES:
                self.f.close()
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                self._open()
            assert self.f is not None
            self.f.write(line)
            self.f.flush()
        except OSError:
            self.close()

    def close(self) -> None:
        if self.f is not None:
            with contextlib.suppress(OSError):
                self.f.close()
            self.f = None


@contextlib.contextmanager
def server_lock(port: int) -> Iterator[int]:
    """One native ``serve`` per server port on this host: an exclusive ``fcntl.flock`` on
    ``<tmpfs_root()>/escha-deploy-<uid>/serve-<port>.lock`` (it holds the holder's pid), held
    for the block; yields the descriptor. Raises ``Refused`` (exit 3) naming the holder when
    another ``serve`` has it. The kernel drops a flock with its last descriptor, so a killed
    ``serve`` never leaves a stale lock (its watchdog holds a copy until the server is gone)."""
    import fcntl

    from escha_deploy.utils.errors import Refused

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


class _Watchdog:
    """``watchdog.py`` running the server: ``pid`` (the server's), ``code`` once it ended
    (``os.waitstatus_to_exitcode``), ``out`` (the read end of the server's merged output),
    ``send`` a command line (``sN``: forward signal N; ``k``: SIGKILL to every descendant),
    ``close`` the command pipe (the watchdog then ends what is left and exits)."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str] | None, grace_s: float,
                 secret_dir: Path | None, lock_fd: int | None) -> None:
        import json

        ctl_r, self.ctl = os.pipe()  # all ends non-inheritable: the server holds none of them
        st_r, st_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", str(Path(__file__).with_name("watchdog.py")), str(grace_s),
                 str(st_w), str(secret_dir or "")],
                stdin=ctl_r, stdout=out_w, env=dict(env) if env is not None else None,
                start_new_session=True,  # a terminal's Ctrl-C reaches the server only through us
                pass_fds=(st_w, *((lock_fd,) if lock_fd is not None else ())),
            )
        except BaseException:
            for fd in (self.ctl, st_r, out_r):
                os.close(fd)
            raise
        finally:
            for fd in (ctl_r, st_w, out_w):
                os.close(fd)
        self.status = st_r
        self.out = os.fdopen(out_r, "r", errors="replace")
        self.pid: int | None = None
        self.code: int | None = None
        self.error: OSError | None = None
        self.lost = False  # the watchdog ended before it reported the server's end
        self._buf = b""
        self.send(json.dumps({"argv": list(argv)}))

    def send(self, line: str) -> None:
        try:
            os.write(self.ctl, (line + "\n").encode())
        except OSError:
            pass  # the watchdog is gone; what it reported says the rest

    def poll(self, timeout: float) -> None:
        """Read what the watchdog reported within ``timeout`` seconds."""
        import select

        try:
            ready, _, _ = select.select([self.status], [], [], timeout)
        except InterruptedError:
            return
        if not ready:
            return
        data = os.read(self.status, 4096)
        if not data:
            self.lost = self.code is None and self.error is None
            return
        self._buf += data
        while b"\n" in self._buf:
            line, _, self._buf = self._buf.partition(b"\n")
            word, _, rest = line.decode("ascii", "replace").partition(" ")
            if word == "pid":
                self.pid = int(rest)
            elif word == "exit":
                self.code = int(rest)
            elif word == "error":
                errno_s, _, msg = rest.partition(" ")
                self.error = OSError(int(errno_s or 0), msg)

    def close(self, wait_s: float) -> None:
        try:
            os.close(self.ctl)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.status)


class _Reaper:
    """``serve`` itself a child subreaper (prctl(2) ``PR_SET_CHILD_SUBREAPER``) while it
    supervises: should the watchdog be killed (SIGKILL), the server's tree, a grandchild that
    left with ``setsid`` included, is reparented to ``serve`` rather than to init, and
    ``end_orphans`` ends it (SIGTERM, the grace, SIGKILL) as the watchdog would have. The
    children ``serve`` had before are left alone; ``restore`` puts the attribute back."""

    def __init__(self) -> None:
        import ctypes

        from .watchdog import PR_SET_CHILD_SUBREAPER, _prctl

        self._prctl, self._set = _prctl, PR_SET_CHILD_SUBREAPER
        was = ctypes.c_int(0)
        libc = ctypes.CDLL(None, use_errno=True)
        self.was = was.value if libc.prctl(PR_SET_CHILD_SUBREAPER + 1, ctypes.byref(was), 0, 0, 0) == 0 else 0
        self.before = set(_children(os.getpid()))
        _prctl(PR_SET_CHILD_SUBREAPER, 1)

    def restore(self) -> None:
        self._prctl(self._set, self.was)

    def end_orphans(self, watchdog_pid: int, grace_s: float) -> list[int]:
        """End every process reparented to ``serve`` since it began supervising (not the
        watchdog, not a child it had before), with their descendants; reap them. Returns the
        pids it found."""
        from .watchdog import _signal_all, descendants

        def tree() -> list[int]:
            top = [p for p in _children(os.getpid()) if p not in self.before and p != watchdog_pid]
            return [*top, *(d for p in top for d in descendants(p))]

        def reap() -> None:
            for pid in _children(os.getpid(), zombies=True):
                if pid not in self.before and pid != watchdog_pid:
                    with contextlib.suppress(ChildProcessError, OSError):
                        os.waitpid(pid, os.WNOHANG)

        found = tree()
        if not found:
            return []
        _signal_all(found, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while (left := tree()) and time.monotonic() < deadline:
            reap()
            time.sleep(0.05)
        while left := tree():
            _signal_all(left, signal.SIGKILL)
            reap()
            time.sleep(0.02)
        reap()
        return found


def _children(pid: int, *, zombies: bool = False) -> list[int]:
    """The direct children of ``pid`` (the ppid field of ``/proc/N/stat``), live ones unless
    ``zombies``."""
    out: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                st = fh.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = st[st.rfind(")") + 2:].split()  # after "(comm)": state ppid ...
        if len(fields) > 1 and int(fields[1]) == pid and (zombies or fields[0] not in ("Z", "X")):
            out.append(int(name))
    return out


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
    cgroup_root: Path = Path("/"),
    on_ready: Callable[[list[str]], None] | None = None,
    log_path: Path | None = None,
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
    ``cgroup_root``: where this cgroup's files are read (``host.read_oom_kill_count``): a
    count of OOM kills that rose while the child ran tells the diagnosis the OOM killer did it.
    ``on_ready``: called once, in a thread of its own (the output keeps flowing), with every
    line (redacted) up to and including the first ``READY_LINE``: ``serve``'s drift check. It
    must not raise; whatever it raises is printed as one line and does not stop the server.
    ``log_path``: a file that gets the redacted output too (``serve_log_path``: what ``logs``
    reads for a native server).
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
    log = _LogFile(log_path) if log_path is not None else None
    from escha_deploy.facts.machine import read_oom_kill_count

    oom_before = read_oom_kill_count(cgroup_root)
    reaper = _Reaper()
    try:
        dog = _Watchdog(cmd, env=env, grace_s=grace_s, secret_dir=tmpdir, lock_fd=lock_fd)
    except BaseException:
        reaper.restore()
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
        raise

    def forward(signum: int, _frame: object) -> None:
        # the command pipe only: the messages and the escalation are the wait loop's
        forwarded.append(signum)
        dog.send(f"s{signum}" if len(forwarded) == 1 else "k")

    previous = {}
    on_main = threading.current_thread() is threading.main_thread()
    if on_main:
        for s in (signal.SIGTERM, signal.SIGINT):
            previous[s] = signal.signal(s, forward)

    startup: list[str] | None = [] if on_ready is not None else None  # the lines up to ready

    def at_ready(lines: list[str]) -> None:
        assert on_ready is not None
        try:
            on_ready(lines)
        except Exception as exc:  # a check that failed must not take the server down
            out.write(f"serve: the check at ready failed: {type(exc).__name__}: {exc}\n")
            out.flush()

    def pump() -> None:
        # SGLang's scheduler processes inherit this pipe: it ends when the whole tree has gone,
        # not when the server exits, so it is read here and the watchdog's report waited for.
        nonlocal startup
        for raw in dog.out:
            line = redact(raw.rstrip("\n"))
            kept.append(line)
            out.write(printable(line) + "\n")
            out.flush()
            if log is not None:
                log.write(printable(line) + "\n")
            if startup is not None:
                startup.append(line)
            if READY_LINE in line:
                if tmpdir is not None:  # SGLang read --config long ago
                    shutil.rmtree(tmpdir, ignore_errors=True)
                if startup is not None:
                    threading.Thread(target=at_ready, args=(startup,), name="serve-ready", daemon=True).start()
                    startup = None

    reader = threading.Thread(target=pump, name="serve-output", daemon=True)
    reader.start()
    said = 0
    deadline: float | None = None
    killed = False

    def report_signals() -> None:
        """Say each signal the handler forwarded, once, in order. Called on every turn of the
        wait and once after it: a second signal's SIGKILL can end the tree (and the wait) before
        the next turn, and its line must still be printed."""
        nonlocal said, deadline, killed
        if len(forwarded) <= said:
            return
        for signum in forwarded[said:]:
            if said == 0:
                deadline = time.monotonic() + grace_s
                out.write(f"serve: {_signal_name(signum)} forwarded to SGLang; SIGKILL to all of "
                          f"its processes if it has not exited in {grace_s:g} s\n")
            elif not killed:
                killed = True
                out.write(f"serve: {_signal_name(signum)} again: SIGKILL to all of SGLang's processes\n")
            said += 1
        out.flush()

    try:
        while dog.code is None and dog.error is None and not dog.lost:
            report_signals()
            if deadline is not None and not killed and time.monotonic() >= deadline:
                killed = True
                dog.send("k")
                out.write(f"serve: SGLang did not exit within {grace_s:g} s of {_signal_name(forwarded[0])}; "
                          "SIGKILL to all of its processes\n")
                out.flush()
            dog.poll(0.1)
        report_signals()
    finally:
        if on_main:
            for s, h in previous.items():
                signal.signal(s, h)
        dog.close(grace_s + 10)  # the watchdog ends what is left of the tree, then exits
        if dog.code is None or dog.proc.returncode != 0:  # the watchdog died: its orphans are ours
            reaper.end_orphans(dog.proc.pid, grace_s)
        reaper.restore()
        reader.join(timeout=5)
        dog.out.close()
        if log is not None:
            log.close()
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
    if dog.error is not None:
        raise dog.error
    if dog.code is None:  # the watchdog died first (killed): the server had a parent-death signal
        out.write("serve: the server's watchdog ended before the server did; its state is unknown; "
                  f"exiting {int(ExitCode.FAILED)}\n")
        out.flush()
        return Outcome(-1, forwarded[0] if forwarded else None, list(kept), exit_code=int(ExitCode.FAILED))
    code = dog.code
    lines = list(kept)
    if forwarded:
        return Outcome(code, forwarded[0], lines, exit_code=exit_code_for(code))
    if code == 0:
        return Outcome(code, None, lines, exit_code=0)
    from .diagnose import Facts, diagnose

    f = (facts or Facts()).model_copy(update={"exit_code": code})
    oom_after = read_oom_kill_count(cgroup_root)
    if f.oom_kill is None and oom_before is not None and oom_after is not None:
        f = f.model_copy(update={"oom_kill": oom_after > oom_before})
    diag = diagnose(lines, f)
    for ln in diag.lines():
        out.write(printable(ln) + "\n")
    how = (f"was killed by signal {-code} ({_signal_name(-code)})" if code < 0
           else f"exited with code {code}")
    out.write(f"serve: SGLang {how}; exiting {int(ExitCode.FAILED)}\n")
    out.flush()
    return Outcome(code, None, lines, diagnosis=diag, exit_code=int(ExitCode.FAILED))
