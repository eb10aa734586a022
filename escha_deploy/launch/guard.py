"""`up` against signals and other commands: who owns a starting container, and how it ended.

Three things can end `up`'s wait besides the server itself, and each gets its own message and
exit code instead of a traceback or "server exited with code 0":

- **A signal to `up`** (Ctrl-C is SIGINT; a service manager sends SIGTERM): ``interruptible``
  turns it into a stop of the container `up` started (SIGTERM, the stop timeout, then SIGKILL,
  as ``docker stop`` does), keeps the stopped container for ``escha-deploy logs`` like the
  crash path does, and exits 128 + the signal number (130 for SIGINT, 143 for SIGTERM), the
  shell's convention for "ended by signal N". A second signal while stopping is noted, not
  obeyed: obeying it would leave the container running.
- **Another command**: a second `up` of the same profile, or `down`. The Docker daemon is the
  arbiter: the container name is fixed per profile, so a second ``containers.create`` gets 409
  Conflict (``Refused``, exit 3). A container still starting carries the starting `up`'s
  identity in a label (``LABEL_UP_OWNER``: host id, pid, process start time); a second `up`
  refuses (3) while that process lives, and replaces the container only once it is gone (an
  `up` killed with SIGKILL). `down` during `up` wins: `up` sees its container removed, or a
  ``kill`` event it did not send (Docker's events API), and exits 4 saying so.
- **The daemon itself** going away (its socket closes): exit 4, the container's state unknown.

A container that ended by a signal is named by it: Docker reports 128 + N as its exit code
(``State.ExitCode``), and ``State.OOMKilled`` when the kernel's OOM killer sent the SIGKILL.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import shlex
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from escha_deploy.sglang.capabilities import LABEL_PREFIX
from escha_deploy.utils.errors import EschaError

from .progress import Report, quiet

#: Label on a container `up` is starting: "HOSTID:PID:STARTTIME" of that `up` process
#: (``host.host_id``; ``psutil.Process.create_time``, seconds since the epoch, 2 decimals).
LABEL_UP_OWNER = LABEL_PREFIX + "up-owner"


def signal_name(signum: int) -> str:
    """``9`` -> ``"SIGKILL"`` (``signal.Signals``); ``"signal N"`` when Python has no name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signal_of(exit_code: int | None) -> int | None:
    """The signal behind an exit status: Docker and shells report 128 + N, ``subprocess``
    reports -N. None for an ordinary exit."""
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code
    if 128 < exit_code <= 128 + 64:
        return exit_code - 128
    return None


class Interrupted(EschaError):
    """`up` was stopped by a signal while it waited; exit status 128 + the signal number."""

    def __init__(self, signum: int, *problems: str, hint: str | None = None) -> None:
        super().__init__(*problems, hint=hint)
        self.exit_code = 128 + signum  # type: ignore[assignment]


# --------------------------------------------------------------------------- ownership


def owner_label() -> str:
    """This process as ``LABEL_UP_OWNER`` value: ``HOSTID:PID:STARTTIME``."""
    import psutil

    from escha_deploy.facts.machine import host_id

    return f"{host_id()}:{os.getpid()}:{psutil.Process().create_time():.2f}"


def owner_alive(value: str | None) -> bool | None:
    """Whether the `up` named by a ``LABEL_UP_OWNER`` value still runs: True or False on this
    host (pid alive with the same start time, so a reused pid does not count); None when the
    label names another host (the daemon is shared) and nobody here can tell. A missing or
    malformed label is False: containers from before the label, treated as stale."""
    import psutil

    from escha_deploy.facts.machine import host_id

    try:
        host, pid, started = (value or "").split(":")
        pid_i, started_f = int(pid), float(started)
    except ValueError:
        return False
    if host != host_id():
        return None
    try:
        return abs(psutil.Process(pid_i).create_time() - started_f) < 0.05
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def owner_pid(value: str | None) -> str:
    """The pid part of a ``LABEL_UP_OWNER`` value, for messages ("?" when unreadable)."""
    parts = (value or "").split(":")
    return parts[1] if len(parts) == 3 else "?"


# --------------------------------------------------------------------------- signals


class Signalled(BaseException):
    """Raised in the main thread by ``signals_raise``'s handler (not an ``Exception``, so no
    ``except Exception`` on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Scope:
    """The one SIGINT/SIGTERM handler's state while a ``signals_raise`` block runs: whether a
    signal was obeyed yet (``armed``: none was), and the innermost ``signals_deferred`` block's
    message and list of noted signals (``deferred``: None outside one)."""

    def __init__(self, report: Report) -> None:
        self.armed = True
        self.report = report
        self.what = "up: still cleaning up"
        self.deferred: list[int] | None = None

    def handler(self, signum: int, frame: object) -> None:
        if self.armed and self.deferred is None:
            if _in_a_finalizer(frame):
                # An exception raised here would be printed as "Exception ignored in ..." and
                # dropped (a __del__ or weakref.finalize callback, such as an event loop's or a
                # socket's, ran when the signal came), leaving `up` following the log with the
                # signal spent. The same signal again in 50 ms, when the finalizer has returned.
                threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
                return
            self.armed = False  # the first signal is obeyed once; every later one only noted
            raise Signalled(signum)
        if self.deferred is not None:
            self.deferred.append(signum)
        self.report("info", f"{self.what} ({signal_name(signum)} noted; SIGKILL would leave it running)")

    def unraisable(self, hook: object, unraisable: object) -> None:
        """``sys.unraisablehook`` while the scope is open: a ``Signalled`` that Python dropped
        (raised in a callback whose exceptions it prints and ignores, which ``_in_a_finalizer``
        cannot see from the frames: a ``weakref.ref`` callback such as importlib's module-lock
        ``_get_module_lock.<locals>.cb``, run when an import's lock is freed) re-arms the scope
        and sends the same signal again in 50 ms, outside the callback. Anything else goes to
        ``hook``, the hook that was set before the scope opened."""
        exc = getattr(unraisable, "exc_value", None)
        if isinstance(exc, Signalled):
            self.armed = True  # nobody obeyed it: the next delivery raises again
            threading.Timer(0.05, os.kill, (os.getpid(), exc.signum)).start()
            return
        hook(unraisable)  # type: ignore[operator]


_scope: _Scope | None = None


def _in_a_finalizer(frame: object) -> bool:
    """Whether ``frame`` (a signal handler's: where the main thread was) runs inside a finalizer,
    where Python prints and drops any exception: a ``__del__`` method or a ``weakref.finalize``
    callback on the stack."""
    f = frame
    while f is not None:
        code = getattr(f, "f_code", None)
        if code is not None and (code.co_name == "__del__" or code.co_filename.endswith("weakref.py")):
            return True
        f = getattr(f, "f_back", None)
    return False


@contextlib.contextmanager
def signals_raise(report: Report = quiet) -> Iterator[None]:
    """Within the block, the first SIGINT or SIGTERM raises ``Signalled`` in the main thread;
    every later one is noted and reported through ``report``, never obeyed, so the cleanup the
    first one started (stopping a container) runs to its end. A block inside another shares
    the outer one's handler: one obeyed signal per outermost block, which is how `up` covers
    everything from its first daemon call to the end of its log follow with no moment where
    the default action (SIGTERM: death; SIGINT: ``KeyboardInterrupt``) applies. Outside the
    main thread: no change (Python runs handlers in the main thread only). A ``Signalled``
    that Python drops anyway (raised inside a callback whose exceptions it ignores) is caught by
    the scope's ``sys.unraisablehook`` and the signal sent again (``_Scope.unraisable``)."""
    global _scope
    if threading.current_thread() is not threading.main_thread() or _scope is not None:
        yield
        return
    scope = _Scope(report)
    previous = {s: signal.signal(s, scope.handler) for s in (signal.SIGINT, signal.SIGTERM)}
    previous_hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(scope.unraisable, previous_hook)
    _scope = scope
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        sys.unraisablehook = previous_hook
        _scope = None


@contextlib.contextmanager
def signals_deferred(report: Report, what: str, *, then_obey: bool = True) -> Iterator[list[int]]:
    """Within the block, SIGINT and SIGTERM are noted (the list yielded) and reported as
    ``"{what} (SIGTERM noted; ...)"``, not obeyed: cleanup that must finish (stopping a
    container) runs to its end. With ``then_obey``, when no signal had been obeyed before the
    block (the one that came during it is the first), it is raised as ``Signalled`` once the
    block completes; without, the scope obeys no signal from here on (the last cleanup).
    Opens a ``signals_raise`` scope when none is open."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    with signals_raise(report):
        scope = _scope
        assert scope is not None
        saved = (scope.report, scope.what, scope.deferred)
        if not then_obey:
            scope.armed = False
        got: list[int] = []
        scope.report, scope.what, scope.deferred = report, what, got
        try:
            yield got
        finally:
            scope.report, scope.what, scope.deferred = saved
        if got and scope.armed:
            scope.armed = False
            raise Signalled(got[0])


@dataclass
class Held:
    """What ``interruptible`` stops on a signal: the container once created (``container``),
    else the one named ``name`` if it carries this process's owner label."""

    client: object
    name: str
    owner: str
    stop_timeout_s: int
    container: object | None = None


def stop_keep(held: Held) -> str | None:
    """Stop ``held``'s container (SIGTERM, grace, SIGKILL) and keep it; its name, or None when
    there was none of ours (a signal before the create answered, and nothing created)."""
    from docker.errors import APIError, NotFound

    c = held.container
    if c is None:
        try:
            c = held.client.containers.get(held.name)  # type: ignore[attr-defined]
        except NotFound:
            return None
        if c.labels.get(LABEL_UP_OWNER) != held.owner:
            return None  # another `up`'s container: not ours to stop
    try:
        c.stop(timeout=held.stop_timeout_s)
    except NotFound:
        return None
    except APIError:
        c.kill()
    return c.name


@contextlib.contextmanager
def interruptible(client, *, name: str, owner: str, stop_timeout_s: int, profile: str,
                  report: Report = quiet) -> Iterator[Held]:
    """Run `up`'s create-and-wait with SIGINT/SIGTERM raising; on one, stop the container
    (kept, for `logs`) and raise ``Interrupted`` (exit 128 + N). Set ``held.container`` as soon
    as the container exists. The stop runs inside the same ``signals_raise`` scope, so a
    second signal is noted while it runs, never obeyed."""
    held = Held(client, name, owner, stop_timeout_s)
    with signals_raise(report):
        try:
            yield held
        except (Signalled, KeyboardInterrupt) as exc:
            signum = exc.signum if isinstance(exc, Signalled) else signal.SIGINT
            sig = signal_name(signum)
            if _scope is not None:
                _scope.armed = False  # this one is obeyed: later ones are only noted
            with signals_deferred(report, f"up: still stopping {name}"):
                report("info", f"up: {sig}: stopping {name} (SIGTERM, up to {stop_timeout_s} s, then SIGKILL)")
                stopped = stop_keep(held)
            if stopped is None:
                raise Interrupted(signum, f"up: interrupted by {sig} before the container was created; "
                                  "nothing was started") from None
            raise Interrupted(signum, f"up: interrupted by {sig} while waiting for ready; container "
                              f"{stopped} is stopped (not running) and kept for its log",
                              hint=f"`escha-deploy logs --profile {shlex.quote(profile)}`; `escha-deploy down --profile "
                              f"{shlex.quote(profile)}` removes it") from None


@dataclass
class Ready:
    """What `up` tells its caller as it goes, so that a signal which arrives after `up` has
    returned (its caller printing "ready", or following the log) still finds its container:
    ``container`` is the name once this `up` confirmed its own container ready (None before,
    and when the profile's server was already running)."""

    container: str | None = None


# --------------------------------------------------------------------------- how it ended


@dataclass
class End:
    """Why a container `up` waited on stopped running (``Watch.end``).

    ``gone``: removed by another command. ``daemon_gone``: the daemon stopped answering.
    ``exit_code``/``oom_killed``: Docker's ``State``. ``kill_signal``: a ``kill`` event this
    `up` did not send (``docker stop``/``kill``, `escha-deploy down`), its signal number."""

    gone: bool = False
    daemon_gone: bool = False
    exit_code: int | None = None
    oom_killed: bool | None = None
    kill_signal: int | None = None

    @property
    def signal(self) -> int | None:
        """The signal that ended the server (from its exit status), or None."""
        return signal_of(self.exit_code)

    def what(self) -> str:
        """The cause as the end of a sentence beginning "up: the server ...".

        Examples: "was killed by signal 9 (SIGKILL) from the kernel's OOM killer",
        "exited with code 1"."""
        if self.daemon_gone:
            return ("is in an unknown state: the Docker daemon went away while `up` waited and did "
                    "not answer again (the container may still run, or may have died with the daemon)")
        if self.gone:
            return ("was stopped and its container removed by another command while `up` waited "
                    "(`escha-deploy down` wins over `up`)")
        if self.kill_signal is not None:
            return (f"was stopped by another command while `up` waited ({signal_name(self.kill_signal)} "
                    "from `escha-deploy down` or `docker stop`/`kill`; `down` wins over `up`)")
        sig = self.signal
        if sig is not None:
            by = " from the kernel's OOM killer (Docker State.OOMKilled)" if self.oom_killed else ""
            return f"was killed by signal {sig} ({signal_name(sig)}){by}, exit status {self.exit_code}"
        return f"exited with code {self.exit_code}"


#: Seconds `up` keeps asking a Docker daemon that stopped answering during the ready wait (a
#: dockerd restart, a socket that drops for a moment) before it says the daemon went away;
#: never past the ready timeout. A restart with live-restore (dockerd(8)) keeps the containers.
RECONNECT_S = 30.0


class Watch:
    """``alive()`` for ``ready.wait_ready`` that never raises: a container removed under it, or
    a daemon gone, reads as "not alive"; ``end()`` then says which (``End``). A daemon that
    stops answering is asked again every half second for up to ``reconnect_s`` (and not past
    ``until``, a ``time.monotonic`` deadline) before it counts as gone; ``report`` says so."""

    def __init__(self, client, container, *, reconnect_s: float = RECONNECT_S, until: float | None = None,
                 report: Report = quiet) -> None:
        self.client, self.container = client, container
        self.since = time.time() - 1
        self.gone = False
        self.daemon_gone = False
        self.reconnect_s, self.until, self.report = reconnect_s, until, report

    def alive(self) -> bool:
        from docker.errors import DockerException, NotFound
        from requests.exceptions import RequestException

        deadline = None
        while True:
            try:
                self.container.reload()
            except NotFound:
                self.gone = True
                return False
            except (DockerException, RequestException) as exc:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.reconnect_s
                    if self.until is not None:
                        deadline = min(deadline, self.until)
                    self.report("info", f"up: the Docker daemon stopped answering ({' '.join(str(exc).split())[:200]}); "
                                f"asking again for up to {max(deadline - now, 0):.0f} s")
                if now >= deadline:
                    self.daemon_gone = True
                    return False
                time.sleep(0.5)
                continue
            if deadline is not None:
                self.report("info", "up: the Docker daemon answers again")
            return self.container.status in ("created", "running")

    def end(self) -> End:
        """Classify the end once ``alive()`` was False (one inspect and one events query)."""
        from docker.errors import DockerException, NotFound
        from requests.exceptions import RequestException

        if self.daemon_gone:
            return End(daemon_gone=True)
        if self.gone:
            return End(gone=True)
        try:
            self.container.reload()
            st = self.container.attrs.get("State", {})
            end = End(exit_code=st.get("ExitCode"), oom_killed=st.get("OOMKilled"))
            for ev in self.client.events(since=self.since, until=time.time(), decode=True,
                                         filters={"container": self.container.id, "event": "kill"}):
                sig = (ev.get("Actor", {}).get("Attributes", {}) or {}).get("signal")
                if sig and sig.isdigit():
                    end.kill_signal = int(sig)
            return end
        except NotFound:
            return End(gone=True)
        except (DockerException, RequestException):
            return End(daemon_gone=True)
