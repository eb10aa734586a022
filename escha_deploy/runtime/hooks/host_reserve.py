"""HiCache host reserve from the environment, and host memory read once per TP group.

escha-deploy runtime hook (capability ``hicache-host-reserve-env``). Patch
``runtime_patches/0001-hicache-host-reserve.patch`` copies this file byte for byte into
``sglang/srt/mem_cache/pool_host/escha_host_reserve.py``; SGLang's ``pool_host/base.py`` and
``pool_host/mamba.py`` call into it. It imports the standard library only: torch is imported
inside ``group_min`` when a group is given, so this file is importable (and tested) without
SGLang, on a CPU machine and on the GPU machine.

What it changes, against SGLang 0.5.19 ``pool_host/base.py: host_memory_budget_bytes``:

- stock: every host-pool constructor, on every rank, reads ``psutil.virtual_memory().available``
  afresh and allows ``(available - 10 GiB) // ranks_per_host()``. Ranks reach the check seconds
  apart, so a late rank sees its peers' pools already pinned *and* still divides by the rank
  count: peers are charged twice (sglang#38156).
- patched: the first check in a process reads ``available`` once, takes the MIN across the TP
  group (one gloo all-reduce, before any rank of the group has pinned: the all-reduce is a
  barrier), and keeps it as ``A0``. Each rank adds up the pools it accepted itself; a request is
  accepted iff ``accepted_so_far + requested <= (A0 - reserve) // ranks_per_host``. The reserve is
  ``ESCHA_HICACHE_HOST_RESERVE_BYTES`` (bytes, int), default 10 GiB as stock. escha-deploy's
  planner mirrors this rule as ``runtime_check.patched``.

Units: bytes (int) everywhere. The reserve default is SGLang 0.5.19's
``HICACHE_HOST_MEMORY_RESERVE_BYTES = 10 * (1024**3)`` (``pool_host/base.py``).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Optional

ENV_HOST_RESERVE = "ESCHA_HICACHE_HOST_RESERVE_BYTES"
#: SGLang 0.5.19 ``pool_host/base.py: HICACHE_HOST_MEMORY_RESERVE_BYTES`` (10 GiB).
STOCK_RESERVE_BYTES = 10 * (1024**3)

_lock = threading.Lock()
_state: dict[str, int] = {}


class HostReserveError(ValueError):
    """``ESCHA_HICACHE_HOST_RESERVE_BYTES`` is not a whole number of bytes >= 0."""


def parse_reserve(value: Optional[str]) -> int:
    """The host reserve in bytes from the variable's text; ``None`` or empty gives 10 GiB.

    Accepts a non-negative decimal integer (bytes; ``_`` separators allowed, as Python's int).
    Raises ``HostReserveError`` naming the variable for anything else (a unit such as ``8GiB``,
    a negative or fractional number), so a typo never silently keeps the stock 10 GiB.
    """
    if value is None or value.strip() == "":
        return STOCK_RESERVE_BYTES
    text = value.strip()
    try:
        reserve = int(text, 10)
    except ValueError:
        raise HostReserveError(
            f"{ENV_HOST_RESERVE}={value!r} is not a whole number of bytes "
            f"(write e.g. {4 * 1024**3} for 4 GiB; unset means {STOCK_RESERVE_BYTES} = 10 GiB)"
        ) from None
    if reserve < 0:
        raise HostReserveError(f"{ENV_HOST_RESERVE}={value!r} must be >= 0 bytes")
    return reserve


def reserve_bytes(environ: Optional[dict] = None) -> int:
    """The reserve this process uses: ``parse_reserve`` of the variable (bytes)."""
    env = os.environ if environ is None else environ
    return parse_reserve(env.get(ENV_HOST_RESERVE))


def group_min(value: int, group: Any) -> int:
    """MIN of ``value`` (bytes) across ``group`` (a torch.distributed CPU/gloo group).

    ``group=None`` returns ``value`` unchanged (a single rank). Every rank of the group must call
    this the same number of times: here it is called once per process (``snapshot_available``).
    """
    if group is None:
        return int(value)
    import torch
    import torch.distributed as dist

    t = torch.tensor([int(value)], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return int(t.item())


def snapshot_available(read_available: Callable[[], int], group: Any = None) -> int:
    """``A0``: host memory available (bytes) read once per process, MIN across ``group``.

    The first call reads ``read_available()`` (SGLang passes psutil's ``available``) and
    all-reduces it over ``group``; later calls return the same number without reading or
    communicating again.
    """
    with _lock:
        if "a0" not in _state:
            _state["a0"] = group_min(int(read_available()), group)
            _state["accepted"] = 0
        return _state["a0"]


def budget_bytes(
    read_available: Callable[[], int],
    ranks_per_host: int,
    group: Any = None,
    reserve: Optional[int] = None,
) -> int:
    """Bytes this rank may still claim: ``(A0 - reserve) // ranks_per_host - accepted_so_far``.

    ``reserve`` defaults to ``reserve_bytes()``. The result can be negative (nothing left); the
    stock check then refuses any request, as it does when ``available < reserve``.
    """
    a0 = snapshot_available(read_available, group)
    if reserve is None:
        reserve = reserve_bytes()
    with _lock:
        accepted = _state.get("accepted", 0)
    return (a0 - reserve) // max(int(ranks_per_host), 1) - accepted


def record_accepted(requested_bytes: int) -> None:
    """Add a pool this rank accepted (bytes) to its local running total."""
    with _lock:
        _state["accepted"] = _state.get("accepted", 0) + int(requested_bytes)


def accepted_bytes() -> int:
    """This rank's accepted pools so far (bytes)."""
    with _lock:
        return _state.get("accepted", 0)


def reset() -> None:
    """Forget the snapshot and the running total (tests; a fresh scheduler process)."""
    with _lock:
        _state.clear()
