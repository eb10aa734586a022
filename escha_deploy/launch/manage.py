"""Containers of this tool after `up`: `down`, `status` and `logs` through docker-py."""

from __future__ import annotations

import sys
from typing import Any

from escha_deploy.utils.errors import Failed, Refused
from escha_deploy.utils.netaddr import url as http_url
from escha_deploy.utils.redact import Redactor, printable


class NothingRunning(Refused):
    """No container of this tool (of the profile, when one is named) exists: exit 3. Its own
    type so the commands that look for a server (``status``, ``ask``: ``watch.session.find_targets``)
    say it in their own words."""


def _containers(profile: str | None, *, natives: bool, command: str = "down") -> tuple[Any, list]:
    """``(client, containers)`` of this tool for ``profile``; when native servers were found
    (``natives``), a daemon that does not answer, or answers with an error, is no error
    (``(None, [])``), as for ``status`` (``watch.session.find_targets``)."""
    from escha_deploy.utils.errors import EschaError

    from . import docker as dk

    try:
        client = dk.connect()
        with dk.daemon_errors(command):
            return client, dk.find(client, profile)
    except EschaError:
        if natives:
            return None, []
        raise


def native_servers(profile: str | None) -> list:
    """The live native ``serve`` processes of ``profile`` (all when None), as ``status``
    finds them: their state files (``serve_state.find_states``; stale ones removed)."""
    from escha_deploy.launch.serve_state import find_states

    return find_states(profile)[0]


def _stop_native(state, grace_s: float) -> str:
    """SIGTERM the native ``serve`` (it forwards the signal to SGLang and, ``grace_s`` after,
    SIGKILLs what is left: ``native.supervise``), then wait for it to exit, up to ``grace_s``
    plus 15 s. Only the process that wrote the state file is signalled
    (``serve_state.signal_serve``: its pid and start time). Returns ``serve_state.identity``'s
    word: ``SAME`` when it was signalled and exited, ``GONE`` when it had already gone,
    ``OTHER``/``UNVERIFIED`` when nothing was signalled, and ``"running"`` when it did not exit."""
    import signal
    import time

    from .serve_state import SAME, signal_serve

    who = signal_serve(state, signal.SIGTERM)
    if who != SAME:
        return who
    end = time.monotonic() + grace_s + 15
    while time.monotonic() < end:
        if _exited(state):
            return SAME
        time.sleep(0.1)
    return SAME if _exited(state) else "running"


def _exited(state) -> bool:
    """Whether the state's process has ended: gone, its pid now another process, or a zombie
    its parent has not reaped yet (proc(5): state ``Z`` in ``/proc/PID/stat``, the field after
    the parenthesised command name)."""
    from .serve_state import SAME, UNVERIFIED, identity

    if identity(state) not in (SAME, UNVERIFIED):
        return True
    try:
        stat = open(f"/proc/{state.pid}/stat", encoding="ascii", errors="replace").read()
    except OSError:
        return identity(state) not in (SAME, UNVERIFIED)
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def down(profile: str | None, *, timeout_s: int | None = None) -> list[str]:
    """Stop and remove the profile's containers (all of this tool's when ``profile`` is None):
    SIGTERM, the stop timeout, then kill; returns once their ports are free. Native ``serve``
    processes of the profile (the servers ``status`` lists by their state files) get SIGTERM
    and are waited for. Bind-mounted folders (the L3 directory) and volumes are left alone.
    Returns the names stopped (a native server as ``serve pid N``). Raises ``Failed`` (4) when
    a port stays busy or a native server does not exit; ``Refused`` (3), once the rest is
    stopped, when a state file's pid cannot be verified as the ``serve`` that wrote it (a file
    of an older version, with no start time): it is not signalled, and the line says how to
    stop it. A pid that is now another process is never signalled: its file is removed."""
    from . import docker as dk
    from .serve_state import OTHER, UNVERIFIED, state_path, unverified_line

    natives = native_servers(profile)
    client, found = _containers(profile, natives=bool(natives))
    stopped, unverified = [], []
    for st in natives:
        grace = float(timeout_s if timeout_s is not None else 60)
        who = _stop_native(st, grace)
        if who == "running":
            raise Failed(f"down: native serve pid {st.pid} (profile {st.profile}, port {st.port}) "
                         f"did not exit within {grace + 15:g} s of SIGTERM")
        if who == UNVERIFIED:
            unverified.append(st)
            continue
        if who == OTHER:  # reused between status's look and ours: stale, never signalled
            state_path(st.port).unlink(missing_ok=True)
            continue
        stopped.append(f"serve pid {st.pid} (native, port {st.port})")
    for c in found:
        pub = dk.published(c)
        grace = timeout_s if timeout_s is not None else int(
            c.labels.get(dk.LABEL_STOP_TIMEOUT) or c.attrs["Config"].get("StopTimeout") or 60)
        with dk.daemon_errors("down"):
            dk.stop(c, grace)
        if pub and not dk.wait_port_free(*pub):
            port = pub[1]
            raise Failed(f"down: port {port} still busy after stopping {c.name}")
        stopped.append(c.name)
    if unverified:
        raise Refused(*(f"down: {unverified_line(st)}" for st in unverified),
                      hint=f"the others were stopped: {', '.join(stopped)}" if stopped else None)
    return stopped


#: The socket docker-py talks to without ``DOCKER_HOST`` (docker-py ``docker/constants.py``
#: ``DEFAULT_UNIX_SOCKET``).
DEFAULT_SOCKET = "/var/run/docker.sock"


def daemon_configured(environ: dict[str, str] | None = None) -> bool:
    """Whether ``docker.connect`` could reach a daemon at all, told without importing docker-py
    (or ``launch.docker``, which imports the launch spec's models) or connecting:
    ``DOCKER_HOST`` names a unix socket that exists or any other address (tcp, ssh: only a
    connect tells), or, without it, ``DEFAULT_SOCKET`` exists. False means no container of this
    tool can be asked for (docker-py's ``from_env`` reads only ``DOCKER_HOST``)."""
    import os

    host = ((os.environ if environ is None else environ).get("DOCKER_HOST") or "").strip()
    if not host:
        return os.path.exists(DEFAULT_SOCKET)
    if host.startswith("unix://"):
        return os.path.exists(host[len("unix://"):])
    return True


def status(profile: str | None) -> list[dict[str, Any]]:
    """One row per container of this tool: state, endpoint, plan digest, uptime (s).
    Raises ``Refused`` (exit 3, as systemctl is-active) when nothing is there."""
    import datetime as dt

    from . import docker as dk

    client = dk.connect()
    with dk.daemon_errors("status"):
        found = dk.find(client, profile)
    rows = []
    for c in found:
        st = c.attrs.get("State", {})
        started = st.get("StartedAt", "")
        uptime = None
        if c.status == "running" and started:
            t0 = dt.datetime.fromisoformat(started[:26].rstrip("Z") + "+00:00")
            uptime = round((dt.datetime.now(dt.timezone.utc) - t0).total_seconds(), 1)
        host_ip, port = dk.published(c) or ("-", 0)
        rows.append({
            "profile": c.labels.get(dk.LABEL_PROFILE, ""),
            "container": c.name,
            "state": c.status,
            "endpoint": http_url(host_ip, port) if port else "-",
            "plan_digest": c.labels.get(dk.LABEL_PLAN_DIGEST, "")[:12],
            "image": (c.attrs.get("Config", {}) or {}).get("Image", ""),
            "uptime_s": uptime,
            "restart_policy": (c.attrs.get("HostConfig", {}).get("RestartPolicy") or {}).get("Name", ""),
        })
    if not rows:
        raise NothingRunning(f"status: nothing running{' for profile ' + profile if profile else ''}")
    return rows


def logs(profile: str | None, *, follow: bool, tail: int | str = "all", out=None) -> None:
    """Print the server's log (redacted) to ``out`` (stdout: the log is the result here): a
    native ``serve``'s (its log file, ``native.serve_log_path``) when one of the profile runs,
    else the container's. Raises ``Refused`` (3) when there is neither."""
    from . import docker as dk

    out = out or sys.stdout
    natives = native_servers(profile)
    if natives:
        _native_log(natives[0], follow=follow, tail=tail, out=out)
        return
    client = dk.connect()
    with dk.daemon_errors("logs"):
        found = dk.find(client, profile)
    if not found:
        raise Refused(f"logs: nothing running{' for profile ' + profile if profile else ''}")
    r = Redactor(container_secrets(found[0]))
    try:
        with dk.daemon_errors("logs"):
            for line in dk.log_lines(found[0], follow=follow, tail=tail):
                out.write(printable(r(line)) + "\n")
                out.flush()
    except KeyboardInterrupt:
        pass


def _native_log(state, *, follow: bool, tail: int | str, out) -> None:
    """A native server's log file: the last ``tail`` lines (or all), then, with ``follow``,
    what it appends while that ``serve`` runs (polled every 0.2 s). Already redacted by
    ``serve``. Raises ``Refused`` (3) when the file is not there (a ``serve`` of an older
    version, which kept no log file)."""
    import time

    from .native import serve_log_path
    from .serve_state import SAME, UNVERIFIED, identity

    path = serve_log_path(state.port)
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError as exc:
        raise Refused(f"logs: native serve pid {state.pid} (profile {state.profile}) keeps no log at {path} "
                      f"({exc.strerror or exc})", hint="its output goes to the terminal it runs in") from None
    with f:
        lines = f.readlines()
        shown = lines if tail == "all" else (lines[-int(tail):] if int(tail) else [])
        out.write("".join(shown))
        out.flush()
        try:
            while follow and identity(state) in (SAME, UNVERIFIED):  # a pid given out again ends it
                chunk = f.read()
                if chunk:
                    out.write(chunk)
                    out.flush()
                else:
                    time.sleep(0.2)
        except KeyboardInterrupt:
            pass


def container_secrets(container) -> list[str]:
    """The secrets a container of this tool was given, read from their host files (the bind
    mounts at ``launch_spec.SECRET_API_KEY_PATH`` and the HF token's path), so that `logs` masks
    the key's value wherever the server logged it, as native ``serve`` does. A file that cannot
    be read here is skipped (the patterns of ``redact.Redactor`` still apply)."""
    from escha_deploy.utils.errors import EschaError
    from escha_deploy.pipeline.spec import SECRET_API_KEY_PATH, SECRET_HF_TOKEN_PATH

    from .prepare import read_secret

    out = []
    for m in container.attrs.get("Mounts") or []:
        if m.get("Destination") in (SECRET_API_KEY_PATH, SECRET_HF_TOKEN_PATH) and m.get("Source"):
            try:
                out.append(read_secret(m["Source"], "secret"))
            except EschaError:
                pass
    return out


def facts_from_container(container) -> dict[str, Any]:
    """``diagnose.Facts`` fields from a container's state (docker-py ``attrs``): the exit code
    once it exited, and ``oom_kill`` from ``State.OOMKilled`` (dockerd sets it when the
    container cgroup's ``memory.events`` reported an ``oom_kill``), plus HiCache and the
    platform from this tool's labels where present."""
    from . import docker as dk

    container.reload()
    st = container.attrs.get("State", {}) or {}
    exited = st.get("Status") in ("exited", "dead")
    labels = container.labels or {}
    out: dict[str, Any] = {"exit_code": st.get("ExitCode") if exited else None,
                           "oom_kill": bool(st.get("OOMKilled")) if exited else None}
    if labels.get(dk.LABEL_PROFILE):
        out["hicache_enabled"] = labels.get("io.escha.hicache", "") == "on"
    return out


def diagnose_container(profile: str | None, container=None):
    """The diagnosis of a native server of ``profile`` (its log file) or else a container of
    this tool (or ``container`` itself): its whole log (redacted) and its state. Raises ``Refused`` (3) when there is no container."""
    from . import docker as dk
    from .diagnose import Facts, diagnose

    if container is None and (natives := native_servers(profile)):
        from .native import serve_log_path

        path = serve_log_path(natives[0].port)
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError as exc:
            raise Refused(f"logs: native serve pid {natives[0].pid} keeps no log at {path} "
                          f"({exc.strerror or exc})") from None
        return diagnose(lines, Facts())  # already redacted by serve; it is running: no exit code
    with dk.daemon_errors("diagnose"):
        if container is None:
            client = dk.connect()
            found = dk.find(client, profile)
            if not found:
                raise Refused(f"logs: nothing running{' for profile ' + profile if profile else ''}")
            container = found[0]
        r = Redactor(container_secrets(container))
        lines = [r(ln) for ln in dk.log_lines(container, follow=False)]
        facts = facts_from_container(container)
    return diagnose(lines, Facts(**facts))
