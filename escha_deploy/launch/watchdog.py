"""The `serve` supervisor's watchdog: the server's parent and a child subreaper, so that every
descendant of the server, one that left its process group with ``setsid`` included, is ended
when `serve` ends, however it ends (SIGKILL included); it also removes the secrets directory.

Run by ``native.supervise`` as ``python -I watchdog.py GRACE_S STATUS_FD [SECRET_DIR]`` in its
own session. Standard input is the read end of a pipe only the supervisor holds: its first
line is JSON ``{"argv": [...]}``, the server's command, which the watchdog starts (its own
session, standard output and error the watchdog's standard output, which is the supervisor's
pipe; a parent-death signal, SIGTERM, should the watchdog itself die). Then it reads commands,
one a line: ``sN`` sends signal N to the server process (the supervisor forwards SIGTERM and
SIGINT so); ``k`` sends SIGKILL to every descendant (the supervisor's escalation after the stop
timeout, or a second signal). On ``STATUS_FD`` it writes ``pid N`` once started, ``exit N``
(``os.waitstatus_to_exitcode``: -N when killed by signal N) once the server is reaped, or
``error ERRNO MESSAGE`` when it cannot be started.

End of file on standard input means the supervisor is done or dead (the kernel closes a dead
process's descriptors). Then: SIGTERM to every live descendant, ``GRACE_S`` seconds for them to
go (SGLang tears down on SIGTERM; sglang#22779: never SIGKILL first), SIGKILL to any left, and
the watchdog exits only once none is left. ``PR_SET_CHILD_SUBREAPER`` (prctl(2)) is what makes
"every descendant" mean all of them: an orphan is reparented to its nearest subreaper ancestor,
not to init, so the tree under the watchdog never loses a member. A parent-death signal alone
(``PR_SET_PDEATHSIG``) reaches only the direct child, and a process group misses ``setsid``.

The supervisor also passes its ``serve`` lock descriptor here, so the lock is released only
once the tree is gone. Standard library only: it must start fast and import nothing of the
server's environment.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

#: linux/prctl.h
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, arg: int) -> int:
    return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)


def descendants(root: int) -> list[int]:
    """Live (not zombie) descendants of ``root``, from /proc/PID/stat's ppid fields."""
    parent: dict[int, int] = {}
    dead: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "(comm)": state ppid pgrp ...
        if len(fields) > 1:
            parent[int(name)] = int(fields[1])
            if fields[0] in ("Z", "X"):
                dead.add(int(name))
    out, todo = [], [root]
    children: dict[int, list[int]] = {}
    for pid, pp in parent.items():
        children.setdefault(pp, []).append(pid)
    while todo:
        for kid in children.get(todo.pop(), []):
            todo.append(kid)
            if kid not in dead:
                out.append(kid)
    return out


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class Tree:
    """The server process and what it leaves: reaps every child of the watchdog (orphans come
    here too) and reports the server's own end on the status descriptor."""

    def __init__(self, status_fd: int) -> None:
        self.status_fd = status_fd
        self.server: int | None = None
        self.reported = False

    def say(self, line: str) -> None:
        try:
            os.write(self.status_fd, (line + "\n").encode())
        except OSError:
            pass  # the supervisor is gone: nobody to tell

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.server and not self.reported:
                self.reported = True
                self.say(f"exit {os.waitstatus_to_exitcode(status)}")

    def live(self) -> list[int]:
        self.reap()
        return descendants(os.getpid())

    def end(self, grace_s: float) -> None:
        """SIGTERM every descendant, ``grace_s`` for them to go, then SIGKILL until none is
        left (new ones forked meanwhile included)."""
        left = self.live()
        if not left:
            return
        _signal_all(left, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while (left := self.live()) and time.monotonic() < deadline:
            time.sleep(0.05)
        while left := self.live():
            _signal_all(left, signal.SIGKILL)
            time.sleep(0.02)


def start(argv: list[str], tree: Tree) -> bool:
    """Start the server as our child; False (reported as ``error``) when it cannot start."""
    me = os.getpid()

    def setup() -> None:
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != me:
            os._exit(1)

    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                 start_new_session=True, preexec_fn=setup)
    except OSError as exc:
        tree.say(f"error {exc.errno or 0} {exc.strerror or exc}")
        return False
    child.returncode = 0  # reaped by Tree.reap (waitpid -1), never by Popen
    tree.server = child.pid
    tree.say(f"pid {child.pid}")
    return True


def main(argv: list[str]) -> int:
    grace_s, status_fd = float(argv[0]), int(argv[1])
    secret_dir = argv[2] if len(argv) > 2 and argv[2] else None
    for s in (signal.SIGINT, signal.SIGHUP):  # a terminal's Ctrl-C or hang-up is the supervisor's
        signal.signal(s, signal.SIG_IGN)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    tree = Tree(status_fd)
    buf = b""
    while b"\n" not in buf:  # the first line: the server's command
        data = os.read(0, 65536)
        if not data:
            break
        buf += data
    head, _, buf = buf.partition(b"\n")
    started = False
    if head:
        started = start(json.loads(head)["argv"], tree)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the server's output pipe: the supervisor's reader ends with the server
    os.close(devnull)
    eof = not head or not started
    while not eof:
        while b"\n" in buf:
            cmd, _, buf = buf.partition(b"\n")
            if cmd == b"k":
                _signal_all(tree.live(), signal.SIGKILL)
            elif cmd[:1] == b"s" and cmd[1:].isdigit() and tree.server is not None and not tree.reported:
                try:
                    os.kill(tree.server, int(cmd[1:]))
                except ProcessLookupError:
                    pass
        try:
            ready, _, _ = select.select([0], [], [], 0.1)
            data = os.read(0, 4096) if ready else None
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if data == b"":
            eof = True
        elif data:
            buf += data
        tree.reap()
    if secret_dir:
        shutil.rmtree(secret_dir, ignore_errors=True)
    tree.end(grace_s)
    tree.reap()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
