"""The safe-ratio search: the largest ``--hicache-ratio`` (and ``--hicache-size``) whose host pools
keep every host constraint, and the recommended ratio that also leaves headroom.

Input: the box as the constraints read it (``constraints.HostView``, which carries the device
pools the host pools mirror) and the constraints themselves (``constraints.host_constraints``);
output: ``SafeRatios``. Pinned bytes never shrink as the ratio or size grows (``pools``: the
host pool is ``int(device x ratio)`` page-rounded), and every constraint is monotonic in them,
so each search bisects its grid. Pure: no I/O.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ..utils.units import GB
from .constraints import HostConstraint, HostView, first_breach
from .pools import HostPools, host_pools_at_ratio, host_pools_at_size

#: Grid of ``max_safe_ratio``: 0.001 (the reference box's answer is 1.480, "just under 1.481").
SAFE_RATIO_GRID = 1000
#: Upper end of the ``max_safe_ratio`` search: a bound, not a policy (no host pool is that big).
MAX_RATIO_SEARCH = 1024.0


@dataclass(frozen=True)
class SafeRatios:
    """``max_safe_ratio``: the largest ratio on the 0.001 grid (not capped by
    ``hicache.max_ratio``) that keeps every constraint, None when even 0.001 breaks one;
    ``recommended_ratio``: the largest on the ``safety.ratio_step`` grid, at most
    ``hicache.max_ratio``, that also leaves ``safety.recommend_headroom`` bytes under the
    binding constraint (``headroom``), None when none does; ``max_safe_size_gb``: the largest
    whole ``--hicache-size`` (GB = 1e9 per rank) that keeps every constraint, None when not
    searched (the plan is by ratio) or when 1 GB breaks one."""

    max_safe_ratio: float | None
    recommended_ratio: float | None
    max_safe_size_gb: int | None


def headroom(v: HostView, pools: HostPools, constraints: tuple[HostConstraint, ...]) -> int:
    """Bytes left under the binding constraint: the least ``room`` of ``constraints`` (the
    pinned budget less the pinned total; the ceiling less the per-rank pinned bytes, where
    measured). Raises ``ValueError`` when no constraint counts room (the pinned budget always
    does)."""
    rooms = [r for c in constraints if (r := c.room(v, pools)) is not None]
    if not rooms:
        raise ValueError("no host constraint counts room: the pinned budget is missing")
    return min(rooms)


def fits(v: HostView, pools: HostPools, constraints: tuple[HostConstraint, ...]) -> bool:
    """Whether ``pools`` (per rank) keep every one of ``constraints``."""
    return first_breach(v, pools, constraints) is None


def search_safe(v: HostView, constraints: tuple[HostConstraint, ...], *, max_ratio: float, ratio_step: float,
                recommend_headroom: int, by_size: bool) -> SafeRatios:
    """Search the ratio grid (and the size grid when ``by_size``) for this box: ``max_ratio`` is
    ``hicache.max_ratio`` (caps the recommendation only), ``ratio_step`` the recommendation's
    grid (``safety.ratio_step``), ``recommend_headroom`` bytes (``safety.recommend_headroom``)."""
    dev = v.dev
    # The true largest safe ratio: double from the cap until a ratio does not fit, then bisect.
    top_ratio = max(max_ratio, 1.0)
    while top_ratio < MAX_RATIO_SEARCH and fits(v, host_pools_at_ratio(dev, top_ratio), constraints):
        top_ratio *= 2
    top = int(round(min(top_ratio, MAX_RATIO_SEARCH) * SAFE_RATIO_GRID))
    ks = range(1, top + 1)
    first_bad = bisect.bisect_left(
        ks, True, key=lambda k: not fits(v, host_pools_at_ratio(dev, k / SAFE_RATIO_GRID), constraints))
    max_safe = ks[first_bad - 1] / SAFE_RATIO_GRID if first_bad > 0 else None

    def leaves_headroom(i: int) -> bool:
        pools = host_pools_at_ratio(dev, round(i * ratio_step, 6))
        return fits(v, pools, constraints) and headroom(v, pools, constraints) >= recommend_headroom

    # bisected too, so the search takes log2(n) + 1 steps whatever ratio_step and max_ratio say
    # (at most 18 with the profile's bounds)
    steps = range(1, int(round(max_ratio / ratio_step)) + 1)
    first_short = bisect.bisect_left(steps, True, key=lambda i: not leaves_headroom(i))
    best = round(steps[first_short - 1] * ratio_step, 6) if first_short > 0 else None
    max_size: int | None = None
    if by_size:
        top_gb = max(int(v.budget.pinned_budget_bytes // GB // max(v.ranks, 1)) + 1, 1)
        sizes = range(1, top_gb + 1)
        first_bad = bisect.bisect_left(sizes, True,
                                       key=lambda g: not fits(v, host_pools_at_size(dev, g), constraints))
        max_size = sizes[first_bad - 1] if first_bad > 0 else None
    return SafeRatios(max_safe_ratio=max_safe, recommended_ratio=best, max_safe_size_gb=max_size)
