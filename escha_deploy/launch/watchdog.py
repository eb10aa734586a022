"""The `serve` supervisor's watchdog: ends the server's whole process group when `serve` ends,
however it ends (SIGKILL included), and removes the private secrets directory.

Run by ``native.supervise`` as ``python -I watchdog.py PGID GRACE_S [SECRET_DIR]`` in its own
session, with standard input the read end of a pipe only the supervisor holds. End of file on
it means the supervisor is done or dead (the kernel closes a dead process's descriptors). Then:
SIGTERM to the process group (SGLang's launcher, its scheduler and detokenizer processes: they
inherit the group ``start_new_session`` gave the launcher), ``GRACE_S`` seconds for them to go
(SGLang tears down on SIGTERM; sglang#22779: never SIGKILL first), SIGKILL to any left.

A parent-death signal alone (``PR_SET_PDEATHSIG``, prctl(2)) reaches only the direct child; its
own children would be orphaned. The supervisor also passes its ``serve`` lock descriptor here,
so the lock is released only once the group is gone. Standard library only: it must start fast
and import nothing of the server's environment.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time


def members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``, from /proc/PID/stat."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "(comm)": state ppid pgrp ...
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            out.append(int(name))
    return out


def end_group(pgid: int, grace_s: float) -> None:
    """SIGTERM the group, wait up to ``grace_s`` for it to empty, then SIGKILL what is left."""
    if not members(pgid):
        return
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not members(pgid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    pgid, grace_s = int(argv[0]), float(argv[1])
    secret_dir = argv[2] if len(argv) > 2 and argv[2] else None
    for s in (signal.SIGINT, signal.SIGHUP):  # a terminal's Ctrl-C or hang-up is the supervisor's
        signal.signal(s, signal.SIG_IGN)
    while True:
        try:
            if not os.read(0, 64):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    if secret_dir:
        shutil.rmtree(secret_dir, ignore_errors=True)
    end_group(pgid, grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
