"""The I/O edge of ``status``: the server's ``/metrics``, the host's memory files, Docker's
stats and events. Everything read here is handed to the pure parsers (``watch.procfs``,
``watch.reading``); ``root`` lets tests read a fixture tree instead of ``/``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from . import procfs
from .reading import CgroupReading, ContainerReading, HostReading, ServerReading, server_reading


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def server_pids(root_pids: list[int], root: Path = Path("/")) -> list[int]:
    """The given pids and their descendants (``PPid`` of every ``/proc/PID/status``)."""
    if not root_pids:
        return []
    parents: dict[int, int | None] = {}
    proc = root / "proc"
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return []
    for e in entries:
        text = _read(proc / e / "status")
        if text is not None:
            parents[int(e)] = procfs.parse_ppid(text)
    return procfs.descendants(parents, root_pids)


def read_cgroup(path: str, root: Path = Path("/")) -> CgroupReading | None:
    """The cgroup v2 memory files of ``path`` (as ``/proc/PID/cgroup`` names it); None when the
    cgroup's folder is not visible here (cgroup v1, another namespace, Docker Desktop)."""
    d = root / "sys/fs/cgroup" / path.lstrip("/")
    cur = _read(d / "memory.current")
    if cur is None:
        return None
    stat = procfs.parse_flat_keyed(_read(d / "memory.stat") or "")
    mx, hi, pr = _read(d / "memory.max"), _read(d / "memory.high"), _read(d / "memory.pressure")
    return CgroupReading(path=path, current_bytes=procfs.parse_limit(cur),
                         max_bytes=procfs.parse_limit(mx) if mx else None,
                         high_bytes=procfs.parse_limit(hi) if hi else None,
                         anon_bytes=stat.get("anon"), file_bytes=stat.get("file"),
                         events=procfs.parse_flat_keyed(_read(d / "memory.events") or ""),
                         psi=procfs.parse_psi(pr) if pr else None)


def read_host(pids: list[int] = (), root: Path = Path("/"), *, cgroup: bool = True) -> HostReading:
    """This host's memory now: ``/proc/meminfo``, ``/proc/vmstat``, ``/proc/pressure/memory``,
    the RSS of ``pids`` and their descendants, and (``cgroup``) the cgroup of the first pid."""
    mem = procfs.parse_meminfo(_read(root / "proc/meminfo") or "")
    vm = procfs.parse_flat_keyed(_read(root / "proc/vmstat") or "")
    psi_text = _read(root / "proc/pressure/memory")
    all_pids = server_pids(list(pids), root)
    rss = [procfs.parse_rss_bytes(_read(root / f"proc/{p}/status") or "") for p in all_pids]
    cg = None
    if cgroup and all_pids:
        path = procfs.parse_cgroup_path(_read(root / f"proc/{all_pids[0]}/cgroup") or "")
        cg = read_cgroup(path, root) if path else None
    try:
        page = os.sysconf("SC_PAGE_SIZE") if root == Path("/") else 4096
    except (ValueError, OSError):
        page = 4096
    return HostReading(
        mem_total_bytes=mem.get("MemTotal"), mem_available_bytes=mem.get("MemAvailable"),
        page_cache_bytes=procfs.page_cache_bytes(mem), swap_total_bytes=mem.get("SwapTotal"),
        swap_free_bytes=mem.get("SwapFree"), swap_in_pages=vm.get("pswpin"),
        swap_out_pages=vm.get("pswpout"), page_size_bytes=page,
        psi=procfs.parse_psi(psi_text) if psi_text else None, server_pids=all_pids,
        server_rss_bytes=sum(r for r in rss if r is not None) if all_pids else None, cgroup=cg)


class MetricsUnavailable(Exception):
    """The server answered, but not with metrics (``--enable-metrics`` off, 404, bad text, too
    large, a series it reads that is not a number)."""


class ServerDown(Exception):
    """Nothing answers at the server's address, or not within the deadline."""


def scrape(base_url: str, *, api_key: str | None = None, policy=None) -> ServerReading:
    """``GET base_url/metrics`` -> ``ServerReading``, read under the HTTP reading policy
    (``httpread``: ``policy``, the default when None: a total deadline, a size cap, a series
    cap). Raises ``ServerDown`` when nothing answers (or not within the deadline, or the
    connection breaks), ``MetricsUnavailable`` when it answers without SGLang metrics: not
    HTTP 200, not Prometheus text, too large, no ``sglang:`` series, or a series ``status``
    reads (``names.ALL``) that is NaN, +/-Inf or past ``httpread.MAX_SAMPLE``: "not a number"
    names it, since a total over it means nothing (a series ``status`` does not read may be NaN: SGLang 0.5.19 exports
    ``sglang:fwd_occupancy`` as NaN before its first forward pass; it is left out)."""
    import time as _time

    from escha_deploy.utils import httpread
    from escha_deploy.bench.metrics import Snapshot

    from . import names

    policy = policy or httpread.Policy()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/metrics"
    t0 = _time.monotonic()
    try:
        answer = httpread.get(url, policy=policy, headers=headers)
    except (httpread.Unreachable, httpread.ConnectionLost, httpread.DeadlinePassed) as exc:
        raise ServerDown(str(exc)) from None
    except httpread.ReadFailed as exc:
        raise MetricsUnavailable(str(exc)) from None
    if (problem := httpread.status_problem(answer)) is not None:
        raise MetricsUnavailable(f"{answer.url} answered {problem} (is the server started with --enable-metrics?)")
    try:
        snap = Snapshot.parse(answer.text(), answer.url, policy, started=t0)
    except httpread.ReadFailed as exc:
        raise MetricsUnavailable(str(exc)) from None
    if not any(k[0].startswith("sglang:") for k in (*snap.samples, *snap.nonfinite)):
        raise MetricsUnavailable(f"{answer.url} has no sglang: series (metrics off?)")
    bad = snap.nonfinite_read((*names.ALL, *names.LATER))
    if bad:
        raise MetricsUnavailable(f"{answer.url}: {httpread.unusable_text(snap.nonfinite, bad)}")
    return server_reading(snap)


def container_reading(container, events: list[str] = ()) -> ContainerReading:
    """A docker-py container's memory from ``stats(stream=False)`` (``memory_stats``: usage,
    limit, and on cgroup v2 ``stats.file`` / ``stats.anon``) and ``State.OOMKilled``."""
    from docker.errors import APIError, InvalidVersion

    try:  # one reading, not two a second apart (Docker API 1.41+)
        st = container.stats(stream=False, one_shot=True) or {}
    except (APIError, InvalidVersion):  # an older daemon refuses one_shot
        st = container.stats(stream=False) or {}
    ms = st.get("memory_stats") or {}
    inner = ms.get("stats") or {}
    container.reload()
    state = container.attrs.get("State", {}) or {}
    return ContainerReading(name=container.name, usage_bytes=ms.get("usage"), limit_bytes=ms.get("limit"),
                            file_bytes=inner.get("file", inner.get("cache")),
                            anon_bytes=inner.get("anon", inner.get("rss")),
                            events=list(events), oom_killed=bool(state.get("OOMKilled")))


def container_events(client, container_id: str, since: float, until: float) -> list[str]:
    """Docker's event actions for one container after ``since`` up to ``until`` (Unix times,
    s), oldest first: ``oom``, ``die``, ``kill``, ``restart``, ..."""
    out = []
    for ev in client.events(since=int(since), until=int(until) + 1, decode=True,
                            filters={"container": container_id, "type": "container"}):
        t_ns = ev.get("timeNano") or int(ev.get("time", 0)) * 10**9
        if since * 1e9 < t_ns <= until * 1e9:  # the API's bounds are whole seconds
            out.append(str(ev.get("Action") or ev.get("status") or ""))
    return [e for e in out if e]


def now() -> float:
    """Unix time, seconds."""
    return time.time()
