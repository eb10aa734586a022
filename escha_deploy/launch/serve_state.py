"""Native ``serve``'s state file, so ``status`` finds a server no container names.

``<runtime_dir>/serve-<port>.json`` (``launch.native.runtime_dir``: this user's private tmpfs
folder, beside the port lock), written when ``serve`` starts SGLang and removed when it ends;
one left by a killed ``serve`` (its pid no longer runs) is removed by the next ``status``.
It holds names and paths, never a secret: the API key travels as its file's path.

A pid alone names no process for long: Linux gives a freed pid out again. So the file records
the process's identity, its pid and its start time (proc(5), ``/proc/PID/stat`` field 22,
``starttime``: clock ticks after boot, fixed for the life of a process), and a pid whose start
time differs now is another process: the file is stale (``identity``), and nothing signals it
(``signal_serve``: through a pidfd, pidfd_open(2), so the process checked is the one signalled).
A file of an older version has no start time: ``identity`` says "unverified", and ``down``
signals nothing on its word.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from escha_deploy.profile.models import NAME_PATTERN

from .planview import PlanView

#: 2: ``pid_start`` recorded (version 1 files have none: their pid cannot be verified).
STATE_SCHEMA_VERSION = 2

#: What ``identity`` says of a state file's process.
SAME, GONE, OTHER, UNVERIFIED = "same", "gone", "other", "unverified"


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks after boot (proc(5): ``/proc/PID/stat``
    field 22, ``starttime``; the fields are counted after the command name, which is in
    parentheses and may itself hold ``)`` or spaces), or None when it cannot be read (no such
    process, no /proc)."""
    from .native import PID_MAX_LIMIT

    if not 0 < pid <= PID_MAX_LIMIT:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096)
    except OSError:
        return None
    fields = stat.rpartition(b")")[2].split()
    try:
        return int(fields[19])  # fields[0] is field 3 (state): field 22 is fields[19]
    except (IndexError, ValueError):
        return None


class ServeState(BaseModel):
    """One native server: ``pid`` is the ``serve`` process (SGLang runs below it)."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)
    schema_version: int = STATE_SCHEMA_VERSION
    pid: int = Field(strict=True, description="the serve process (one outside 1..launch.native.PID_MAX_LIMIT "
                     "runs nowhere)")
    pid_start: int | None = Field(None, strict=True, ge=0, description="the start time of ``pid``, clock ticks "
                                  "after boot (/proc/PID/stat field 22); None in a file of version 1")
    host: str = Field("127.0.0.1", description="the bind address (0.0.0.0, :: or empty: every interface)")
    port: int = Field(strict=True, ge=1, le=65535)
    profile: str = Field(pattern=NAME_PATTERN, description="a profile name, as a profile's own")
    plan_digest: str = Field("", pattern=r"^[0-9a-f]{0,128}$")
    api_key_file: str | None = Field(None, description="the key's file; the key itself never")
    started_at: float = Field(description="Unix time, seconds")
    plan: PlanView | None = None

    @field_validator("host")
    @classmethod
    def _one_host(cls, v: str) -> str:
        """A bare host (``netaddr.parse_host``): never a URL, a path or a port."""
        from escha_deploy.utils.netaddr import parse_host

        if v in ("", "0.0.0.0", "::"):
            return v
        return parse_host(v, peer=False).text

    @property
    def url(self) -> str:
        """Where to reach it from this host: a wildcard bind is asked on loopback."""
        from escha_deploy.utils.netaddr import url

        h = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return url(h, self.port)


def state_path(port: int, folder: Path | None = None) -> Path:
    from escha_deploy.launch.native import runtime_dir

    return (folder or runtime_dir()) / f"serve-{port}.json"


def write_state(state: ServeState, folder: Path | None = None) -> Path:
    """Write (replace by rename) the state file of ``state.port``, mode 0600. A state without
    ``pid_start`` gets the start time of ``state.pid`` now (the writer's own process, as
    ``serve`` writes it)."""
    from escha_deploy.utils.paths import replace_file

    if state.pid_start is None:
        state = state.model_copy(update={"pid_start": process_start(state.pid)})
    path = state_path(state.port, folder)
    replace_file(path, (state.model_dump_json(indent=2) + "\n").encode())
    os.chmod(path, 0o600)
    return path


def remove_state(port: int, pid: int, folder: Path | None = None) -> None:
    """Remove the state file of ``port`` if ``pid`` wrote it."""
    path = state_path(port, folder)
    try:
        if json.loads(path.read_text()).get("pid") == pid:
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def _alive(pid: int) -> bool:
    from escha_deploy.launch.native import _pid_alive

    return _pid_alive(pid)  # False for a pid outside 1..PID_MAX_LIMIT


def identity(state: ServeState) -> str:
    """Whether ``state.pid`` is still the process that wrote the file: ``SAME``; ``GONE`` (no
    such pid); ``OTHER`` (the pid runs with another start time: reused); ``UNVERIFIED`` (the
    file records no start time, a file of version 1, or this host shows none)."""
    if not _alive(state.pid):
        return GONE
    if state.pid_start is None:
        return UNVERIFIED
    now = process_start(state.pid)
    if now is None:
        return GONE if not _alive(state.pid) else UNVERIFIED
    return SAME if now == state.pid_start else OTHER


def unverified_line(state: ServeState, path: Path | None = None, *, down: bool = True) -> str:
    """What to do about a state file whose pid cannot be verified (``UNVERIFIED``): for
    ``down``, how to check and stop it by hand; for ``status``, that it is listed unverified."""
    path = path or state_path(state.port)
    head = (f"{path}: cannot verify that pid {state.pid} is the serve that wrote it (a state file of an older "
            f"escha-deploy records no start time)")
    if not down:
        return f"{head}; listed, but `down` will not signal it"
    return (f"{head}; not signalled. If `ps -o pid,lstart,args -p {state.pid}` shows escha-deploy serve "
            f"(profile {state.profile}, port {state.port}), stop it with `kill -TERM {state.pid}`; else remove "
            f"the file")


def signal_serve(state: ServeState, sig: int) -> str:
    """Send ``sig`` to the state's process only while it is the one that wrote the file.
    Returns ``identity``'s answer at the time of sending (``SAME``: sent). Where pidfd_open(2)
    exists (Linux 5.3) the process is pinned by a pidfd before its start time is compared, and
    the signal goes through that pidfd, so a pid freed and given out again in between is never
    signalled."""
    import signal

    fd = None
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
        try:
            fd = os.pidfd_open(state.pid)
        except ProcessLookupError:
            return GONE
        except OSError:
            fd = None  # an older kernel, a seccomp filter: the check and kill below
    try:
        who = identity(state)
        if who != SAME:
            return who
        try:
            if fd is not None:
                signal.pidfd_send_signal(fd, sig)
            else:
                os.kill(state.pid, sig)
        except ProcessLookupError:
            return GONE
        return SAME
    finally:
        if fd is not None:
            os.close(fd)


def find_states(profile: str | None = None, folder: Path | None = None) -> tuple[list[ServeState], list[str]]:
    """The live native servers (of ``profile``), and one line per state file removed as stale
    (its pid gone, or now another process: ``identity``), skipped as unreadable (named with
    its path) or kept though unverified (a file of version 1 whose pid runs: listed, with a
    note; ``down`` does not signal it)."""
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.utils.jsonio import loads_json, read_regular
    from escha_deploy.launch.native import runtime_dir
    from escha_deploy.utils.termtext import shown

    d = folder or runtime_dir(make=False)
    found, notes = [], []
    if not d.is_dir():
        return found, notes
    for path in sorted(d.glob("serve-*.json")):
        try:
            if path.is_symlink():
                raise ValueError("a symbolic link")
            state = ServeState.model_validate(loads_json(read_regular(path, "a serve state file", max_bytes=1 << 20),
                                                         path, "a serve state file"))
        except ValidationError as exc:
            e = exc.errors()[0]
            where = ".".join(str(x) for x in e["loc"]) or "the file"
            notes.append(shown(f"{path}: unreadable state file ({where}: {e['msg']}); skipped", 400))
            continue
        except (BadInput, ValueError) as exc:
            notes.append(shown(f"{path}: unreadable state file ({str(exc).splitlines()[0]}); skipped", 400))
            continue
        who = identity(state)
        if who == GONE:
            path.unlink(missing_ok=True)
            notes.append(f"{path}: removed (serve pid {state.pid} no longer runs)")
            continue
        if who == OTHER:
            path.unlink(missing_ok=True)
            notes.append(f"{path}: stale, removed (pid {state.pid} is now another process: its start time "
                         f"differs from the one recorded)")
            continue
        if profile is not None and state.profile != profile:
            continue
        if who == UNVERIFIED:
            notes.append(shown(unverified_line(state, path, down=False), 600))
        found.append(state)
    return found, notes
