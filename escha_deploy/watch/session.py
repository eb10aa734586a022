"""``status``'s loop: find the running servers (native state files, this tool's containers),
look at each, keep a window of looks, evaluate the alerts, and build the report rows.
I/O (HTTP, /proc, Docker) goes through ``watch.collect``; the arithmetic is pure.
"""

from __future__ import annotations

import collections
import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import collect
from .alerts import Thresholds, evaluate
from escha_deploy.launch.planview import PlanView
from .reading import Sample, host_window, server_window
from .report import build

#: Seconds of looks the window keeps by default (``status --window``): long enough for the
#: inert-tier rule's requests on a lightly used box.
WINDOW_S = 300.0


@dataclass
class Target:
    """A server to look at. ``row``: the keys ``status`` always printed (container or native)."""

    kind: str  # "native" | "container"
    profile: str
    url: str | None
    row: dict[str, Any]
    plan: PlanView | None = None
    api_key: str | None = None
    pids: list[int] = field(default_factory=list)
    container: Any = None
    client: Any = None
    read_host: bool = True  # this machine's memory is the server's (not a remote --endpoint)


#: ``/server_info`` fields an ``--endpoint`` row shows (SGLang's ``server_info``,
#: sglang/srt/entrypoints/http_server.py: the server's arguments and its scheduler's figures).
SERVER_INFO_FIELDS = ("version", "model_path", "served_model_name", "tp_size", "page_size",
                      "enable_hierarchical_cache", "hicache_ratio", "hicache_size", "hicache_write_policy",
                      "max_total_num_tokens", "max_mamba_cache_size", "enable_metrics")


def endpoint_target(url: str, *, profile: str | None, plan: PlanView | None, api_key: str | None,
                    server_info: dict | None, server_info_why: str | None) -> Target:
    """A server escha-deploy did not start (``status --endpoint URL``): no state file, container
    or pid to read; its ``/metrics`` and ``/server_info`` are what there is. ``plan``: the
    ``--profile``'s plan on this host, else None (the plan-relative figures are omitted, and
    the row says so). This machine's memory is read only for a loopback URL (the server is
    here); a remote server's host is not this one."""
    import ipaddress
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").strip("[]")
    try:
        local = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False
    info = {k: server_info.get(k) for k in SERVER_INFO_FIELDS if k in server_info} if server_info else None
    notes = []
    if plan is None:
        notes.append("no --profile: the plan-relative figures (planned host pools, the page-cache floor, the "
                     "measured bandwidth) are omitted")
    if not local:
        notes.append("not a loopback URL: this machine's memory is not the server's, so the host is not read")
    row = {"profile": profile or "-", "container": None, "state": "running", "endpoint": url,
           "plan_digest": plan.plan_digest[:12] if plan and plan.plan_digest else None, "image": None,
           "uptime_s": None, "restart_policy": None, "kind": "endpoint", "pid": None,
           "server_info": info, "server_info_error": None if server_info else server_info_why, "notes": notes}
    return Target(kind="endpoint", profile=profile or "-", url=url, row=row, plan=plan, api_key=api_key,
                  read_host=local)


def _read_key(path: str | None) -> str | None:
    """The API key in ``path`` (``launch.prepare.read_secret``: one bounded line); None when
    there is none or it cannot be read (SGLang 0.5.19 serves /metrics without a key anyway:
    ``srt/utils/auth.py``)."""
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.launch.prepare import read_secret

    from escha_deploy.utils.httpread import header_safe

    if not path:
        return None
    try:
        key = read_secret(path, "api key file")
    except BadInput:
        return None
    return key if header_safe(key) else None  # not sendable; /metrics needs none


def _read_json(path: Path, what: str) -> object:
    """A file ``up`` wrote, through the bounded JSON reader; None when absent or unreadable."""
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.utils.jsonio import loads_json, read_regular

    try:
        raw = read_regular(path, what, missing_ok=True)
        return None if raw is None else loads_json(raw, path, what)
    except BadInput:
        return None


def native_targets(profile: str | None) -> tuple[list[Target], list[str]]:
    """Targets from native ``serve`` state files (stale ones removed, noted)."""
    from escha_deploy.launch.serve_state import find_states

    states, notes = find_states(profile)
    out = []
    for st in states:
        uptime = round(collect.now() - st.started_at, 1)
        row = {"profile": st.profile, "container": None, "state": "running", "endpoint": st.url,
               "plan_digest": st.plan_digest[:12], "image": None, "uptime_s": uptime,
               "restart_policy": None, "kind": "native", "pid": st.pid}
        out.append(Target(kind="native", profile=st.profile, url=st.url, row=row, plan=st.plan,
                          api_key=_read_key(st.api_key_file), pids=[st.pid]))
    return out, notes


def container_targets(profile: str | None) -> list[Target]:
    """Targets from this tool's containers (``manage.status`` rows, their errors unchanged:
    nothing running is ``Refused``, a daemon not answering is the daemon's error)."""
    from escha_deploy.launch import docker as dk
    from escha_deploy.launch.manage import status as rows_of
    from escha_deploy.utils.paths import plan_view_path, spec_path

    rows = rows_of(profile)
    client = dk.connect()
    with dk.daemon_errors("status"):
        by_name = {c.name: c for c in dk.find(client, profile)}
    out = []
    for row in rows:
        plan, key = None, None
        sfile = spec_path(row["container"])
        view = _read_json(plan_view_path(sfile), "the plan figures up wrote")
        try:
            plan = PlanView.model_validate(view) if isinstance(view, dict) else None
        except ValueError:
            plan = None
        spec = _read_json(sfile, "the launch spec up wrote")
        # the host's key file (the spec's api_key_file is the path inside the container)
        container = ((spec.get("profile_data") or {}).get("container") or {}) if isinstance(spec, dict) else {}
        key = _read_key(container.get("api_key_file") if isinstance(container, dict) else None)
        c = by_name.get(row["container"])
        running = row["state"] == "running"
        pid = int((c.attrs.get("State", {}) or {}).get("Pid") or 0) if c is not None and running else 0
        out.append(Target(kind="container", profile=row["profile"], row={**row, "kind": "container"},
                          url=row["endpoint"] if running and row["endpoint"] != "-" else None,
                          plan=plan, api_key=key, container=c, client=client, pids=[pid] if pid else []))
    return out


def find_targets(profile: str | None, note=lambda line: None) -> list[Target]:
    """Native servers (state files), then this tool's containers; ``note`` gets one line per
    stale state file removed. No container of the profile is no error (``[]`` when there is no
    native server either: each caller says "nothing running" in its own words, ``status`` and
    ``ask``). With native servers found, Docker's other errors (no daemon) do not matter; without,
    they are raised as ``status`` always raised them (exit 3). With native servers found and no
    daemon to ask (``manage.daemon_configured``: no socket), Docker is not asked and docker-py
    is not imported: its import and the failed connect were a third of ``status --check``'s
    start on a native box (docs/performance.md)."""
    from escha_deploy.utils.errors import EschaError
    from escha_deploy.launch.manage import NothingRunning, daemon_configured

    nat, notes = native_targets(profile)
    for n in notes:
        note(n)
    if nat and not daemon_configured():
        return nat
    try:
        con = container_targets(profile)
    except NothingRunning:
        con = []
    except EschaError:
        if not nat:
            raise
        con = []
    return nat + con


def measured_h2d(plan: PlanView | None) -> PlanView | None:
    """The plan view with the measured host -> device bandwidth filled in from doctor's saved
    findings of this host (``restore_bandwidth.load_gbps``, the restore probe,
    ``doctor/restore_probe.py``) when the plan carries none; unchanged without findings."""
    if plan is None or plan.h2d_bytes_per_s is not None:
        return plan
    from escha_deploy.facts.saved import load_findings
    from escha_deploy.facts.machine import host_id
    from escha_deploy.utils.paths import doctor_findings_path

    f = load_findings(doctor_findings_path(), host_id=host_id())
    if f is None or f.restore_bandwidth is None:
        return plan
    return plan.model_copy(update={"h2d_bytes_per_s": f.restore_bandwidth.load_gbps * 1e9,
                                   "h2d_source": f"doctor's restore probe ({doctor_findings_path()})"})


class Watcher:
    """Looks at one target again and again; keeps the looks of the last ``window_s`` seconds."""

    def __init__(self, target: Target, *, window_s: float = WINDOW_S, thresholds: Thresholds | None = None,
                 prefill_tokens_per_s: float | None = None, root: Path = Path("/"),
                 since_start: bool = False, policy=None) -> None:
        """``since_start``: the server's counters are taken from their zero (the server's
        start) rather than over the window; host rates still need two looks. ``policy``: how
        ``/metrics`` is read (``httpread.Policy``; its default when None)."""
        target.plan = measured_h2d(target.plan)
        self.target = target
        self.since_start = since_start
        self.docker_error: str | None = None
        self.policy = policy
        self.window_s = window_s
        self.th = thresholds if thresholds is not None else (target.plan.thresholds if target.plan else Thresholds())
        self.prefill = prefill_tokens_per_s
        self.root = root
        self.history: collections.deque[Sample] = collections.deque()
        self.events_since = collect.now()

    def sample(self) -> Sample:
        """One look at the server, the host and (a container) Docker's figures."""
        t = self.target
        server, err = None, None
        if t.url is None:
            err = f"{t.row.get('container') or t.profile}: {t.row.get('state')}, no endpoint"
        else:
            try:
                server = collect.scrape(t.url, api_key=t.api_key, policy=self.policy)
            except (collect.ServerDown, collect.MetricsUnavailable) as exc:
                err = ("server not answering: " if isinstance(exc, collect.ServerDown) else "") + str(exc)
        host = collect.read_host(t.pids, self.root, cgroup=t.kind == "native") if t.read_host else None
        cont = None
        now = collect.now()
        if t.container is not None:
            from docker.errors import DockerException
            from requests import RequestException

            try:
                events = collect.container_events(t.client, t.container.id, self.events_since, now)
                cont = collect.container_reading(t.container, events)
                self.events_since = now  # the next look reads the events after this one
            except (DockerException, RequestException) as exc:  # a daemon gone quiet mid-watch
                self.docker_error = f"docker stats: {type(exc).__name__}: {exc}"
        return Sample(t=now, server=server, server_error=err, host=host, container=cont)

    def look(self, sample: Sample | None = None) -> tuple[dict[str, Any], Sample]:
        """Take (or use) a sample; the report row over the window, and the sample."""
        s = sample or self.sample()
        self.history.append(s)
        while len(self.history) > 2 and s.t - self.history[1].t >= self.window_s:
            self.history.popleft()
        old = self.history[0] if len(self.history) > 1 else None
        sw = None
        if s.server is not None:
            base = old.server if old is not None and old.server is not None and not self.since_start else None
            sw = server_window(s.server, base, (s.t - old.t) if base is not None else None)
        hw = host_window(s.host, old.host, s.t - old.t) if old and old.host and s.host and s.t > old.t else None
        ev = evaluate(server=sw, host=s.host, host_win=hw, plan=self.target.plan, th=self.th,
                      container_events=[e for x in self.history if x.container for e in x.container.events],
                      oom_killed=bool(s.container and s.container.oom_killed),
                      prefill_tokens_per_s=self.prefill, endpoint=self.target.url)
        return build(self.target.row, self.target.plan, s, sw, hw, ev), s


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")
