"""Containers of this tool after `up`: `down`, `status` and `logs` through docker-py."""

from __future__ import annotations

import sys
from typing import Any

from escha_deploy.errors import Failed, Refused
from escha_deploy.netaddr import url as http_url

from .redact import Redactor, printable


def down(profile: str | None, *, timeout_s: int | None = None) -> list[str]:
    """Stop and remove the profile's containers (all of this tool's when ``profile`` is None):
    SIGTERM, the stop timeout, then kill; returns once their ports are free. Bind-mounted
    folders (the L3 directory) and volumes are left alone. Returns the names stopped."""
    from . import docker as dk

    client = dk.connect()
    stopped = []
    for c in dk.find(client, profile):
        pub = dk.published(c)
        grace = timeout_s if timeout_s is not None else int(
            c.labels.get(dk.LABEL_STOP_TIMEOUT) or c.attrs["Config"].get("StopTimeout") or 60)
        dk.stop(c, grace)
        if pub and not dk.wait_port_free(*pub):
            port = pub[1]
            raise Failed(f"down: port {port} still busy after stopping {c.name}")
        stopped.append(c.name)
    return stopped


def status(profile: str | None) -> list[dict[str, Any]]:
    """One row per container of this tool: state, endpoint, plan digest, uptime (s).
    Raises ``Refused`` (exit 3, as systemctl is-active) when nothing is there."""
    import datetime as dt

    from . import docker as dk

    client = dk.connect()
    rows = []
    for c in dk.find(client, profile):
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
        raise Refused(f"status: nothing running{' for profile ' + profile if profile else ''}")
    return rows


def logs(profile: str | None, *, follow: bool, tail: int | str = "all", out=None) -> None:
    """Print the container's log (redacted) to ``out`` (stdout: the log is the result here).
    Raises ``Refused`` (3) when there is no container."""
    from . import docker as dk

    out = out or sys.stdout
    client = dk.connect()
    found = dk.find(client, profile)
    if not found:
        raise Refused(f"logs: nothing running{' for profile ' + profile if profile else ''}")
    r = Redactor(container_secrets(found[0]))
    try:
        for line in dk.log_lines(found[0], follow=follow, tail=tail):
            out.write(printable(r(line)) + "\n")
            out.flush()
    except KeyboardInterrupt:
        pass


def container_secrets(container) -> list[str]:
    """The secrets a container of this tool was given, read from their host files (the bind
    mounts at ``launch_spec.SECRET_API_KEY_PATH`` and the HF token's path), so that `logs` masks
    the key's value wherever the server logged it, as native ``serve`` does. A file that cannot
    be read here is skipped (the patterns of ``redact.Redactor`` still apply)."""
    from escha_deploy.errors import EschaError
    from escha_deploy.launch_spec import SECRET_API_KEY_PATH, SECRET_HF_TOKEN_PATH

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
    """The diagnosis of a container of this tool (or ``container`` itself): its whole log
    (redacted) and its state. Raises ``Refused`` (3) when there is no container."""
    from . import docker as dk
    from .diagnose import Facts, diagnose

    if container is None:
        client = dk.connect()
        found = dk.find(client, profile)
        if not found:
            raise Refused(f"logs: nothing running{' for profile ' + profile if profile else ''}")
        container = found[0]
    r = Redactor(container_secrets(container))
    lines = [r(ln) for ln in dk.log_lines(container, follow=False)]
    return diagnose(lines, Facts(**facts_from_container(container)))
