"""Pure parsers for the host's memory files: text in, numbers out (no file is opened here;
``watch.collect`` reads the files and hands the text over).

Sources (Linux ``Documentation/``):

- ``/proc/meminfo`` (``filesystems/proc.rst``, "meminfo"): ``kB`` there is KiB. Page cache here is
  ``Active(file) + Inactive(file)``: the file-backed LRU pages the kernel can drop, which is what
  a page-cache floor protects (``Cached`` also counts ``Shmem``, /dev/shm included, which reclaim
  cannot drop).
- ``/proc/vmstat``: ``pswpin`` / ``pswpout``, pages swapped in / out since boot.
- ``/proc/pressure/memory`` and cgroup v2 ``memory.pressure`` (``accounting/psi.rst``):
  ``some avg10=.. avg60=.. avg300=.. total=..`` and ``full ...``; a kernel without PSI has no
  file, which is "not available", never 0.
- cgroup v2 (``admin-guide/cgroup-v2.rst``): ``memory.current``, ``memory.max`` ("max" =
  unlimited), ``memory.high``, ``memory.events`` (``low high max oom oom_kill ...``),
  ``memory.stat`` (``anon``, ``file``, bytes).
- ``/proc/PID/status`` (``filesystems/proc.rst``): ``VmRSS`` in kB; ``/proc/PID/cgroup``:
  ``0::/path`` on cgroup v2.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

KIB = 1024


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` -> ``{key: bytes}`` (``kB`` x 1024; ``HugePages_*`` stay counts).
    Lines that do not parse are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts or not parts[0].isdigit():
            continue
        out[key.strip()] = int(parts[0]) * (KIB if parts[1:2] == ["kB"] else 1)
    return out


def page_cache_bytes(mem: dict[str, int]) -> int | None:
    """Droppable page cache: ``Active(file) + Inactive(file)`` (bytes); None when absent."""
    if "Active(file)" not in mem or "Inactive(file)" not in mem:
        return None
    return mem["Active(file)"] + mem["Inactive(file)"]


def parse_flat_keyed(text: str) -> dict[str, int]:
    """``key value`` lines (``/proc/vmstat``, ``memory.events``, ``memory.stat``) -> ints."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


class Psi(BaseModel):
    """Memory pressure stall information: percent of wall time (0..100) some / all tasks
    stalled on memory, averaged over 10 and 60 s; ``*_total_us`` cumulative microseconds."""

    model_config = ConfigDict(frozen=True)
    some_avg10: float
    some_avg60: float
    full_avg10: float | None = None
    full_avg60: float | None = None
    some_total_us: int = 0
    full_total_us: int | None = None


def parse_psi(text: str) -> Psi | None:
    """A PSI file's text -> ``Psi``; None when it has no ``some`` line."""
    rows: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        kind, *fields = line.split()
        rows[kind] = dict(f.split("=", 1) for f in fields if "=" in f)
    some = rows.get("some")
    if not some or "avg10" not in some:
        return None
    full = rows.get("full") or {}
    return Psi(some_avg10=float(some["avg10"]), some_avg60=float(some.get("avg60", 0)),
               some_total_us=int(some.get("total", 0)),
               full_avg10=float(full["avg10"]) if "avg10" in full else None,
               full_avg60=float(full["avg60"]) if "avg60" in full else None,
               full_total_us=int(full["total"]) if "total" in full else None)


def parse_rss_bytes(status_text: str) -> int | None:
    """``VmRSS`` of a ``/proc/PID/status`` text in bytes; None for a kernel thread or zombie."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            return int(parts[1]) * KIB if len(parts) >= 2 and parts[1].isdigit() else None
    return None


def parse_ppid(status_text: str) -> int | None:
    """``PPid`` of a ``/proc/PID/status`` text."""
    for line in status_text.splitlines():
        if line.startswith("PPid:"):
            v = line.split()[1:2]
            return int(v[0]) if v and v[0].isdigit() else None
    return None


def descendants(parents: dict[int, int | None], roots: list[int]) -> list[int]:
    """``roots`` and every process below them, from a pid -> ppid table (sorted)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        if ppid is not None:
            children.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    todo = [r for r in roots if r in parents]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(children.get(p, ()))
    return sorted(seen)


def parse_cgroup_path(text: str) -> str | None:
    """The cgroup v2 path (``0::/PATH``) of a ``/proc/PID/cgroup`` text; None on pure v1."""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def parse_limit(text: str) -> int | None:
    """A cgroup v2 limit file (``memory.max``, ``memory.high``): bytes, None for ``max``."""
    t = text.strip()
    return int(t) if t.isdigit() else None
