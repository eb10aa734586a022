"""Where an unsafe plan fits: the smallest host memory with which the same profile plans ``ok``.

Pure: it plans the profile again (``planner.plan``, about 5 ms each here) on described hosts that
differ from the planned one only in MemTotal (same platform, huge pages, doctor's findings; no
cgroup limit; nothing measured as available now), bisecting on a 1 GiB grid. The plan's other
reasons (a profile rule, a missing capability, the device budget) are not about host memory:
when even ``FIT_SEARCH_MAX_BYTES`` does not fit, it says so instead of a size.
"""

from __future__ import annotations

from collections.abc import Callable

from escha_deploy.facts.host import HostFacts
from escha_deploy.profile import Profile
from escha_deploy.utils.units import fmt_gib

from .result import HostFit, Plan

GIB = 1 << 30
#: The largest MemTotal searched (bytes): 4 TiB, more than a workstation board holds.
FIT_SEARCH_MAX_BYTES = 4096 * GIB


def host_fit(profile: Profile, plan: Plan, host: HostFacts, replan: Callable[[HostFacts], Plan]) -> HostFit | None:
    """``HostFit`` for an unsafe ``plan`` of ``profile`` on ``host``; None for a safe one.

    ``replan(host)``: the same plan (profile, model folder, runtime, overrides) on another host.
    The smallest fitting MemTotal is ``n`` GiB for the least whole ``n`` with ``replan``'s verdict
    ``ok`` (``hicache_off`` does not count: the profile asks for HiCache), found by bisection
    between the planned MemTotal and ``FIT_SEARCH_MAX_BYTES`` (the verdict is taken as monotone
    in MemTotal: every budget term grows with it)."""
    if plan.verdict != "unsafe":
        return None
    base = host.model_copy(update={"cgroup_limit_bytes": None, "cgroup_usage_bytes": None,
                                   "cgroup_limit_file": None, "mem_available_bytes": None})

    def ok(gib: int) -> bool:
        return replan(base.model_copy(update={"mem_total_bytes": gib * GIB})).verdict == "ok"

    lo, hi = host.mem_total_bytes // GIB, FIT_SEARCH_MAX_BYTES // GIB
    fits: int | None = None
    if ok(hi):
        while hi - lo > 1:  # ok(hi), and lo is not known to fit
            mid = (lo + hi) // 2
            if ok(mid):
                hi = mid
            else:
                lo = mid
        fits = hi * GIB
    hw = profile.hardware
    where = f"a {hw.platform} host" if hw.platform != "any" else "a host"
    sized = (f"{profile.name} is sized for {where} with MemTotal {fmt_gib(hw.host_ram)} (hardware.host_ram)"
             if hw.host_ram else f"{profile.name} does not say which host it is sized for (hardware.host_ram)")
    here = f"this plan's host has {fmt_gib(host.mem_total_bytes)}"
    if fits is None:
        tail = (f"no MemTotal up to {fmt_gib(FIT_SEARCH_MAX_BYTES)} makes it fit as it is: change what the "
                "reasons above name")
    else:
        tail = (f"as it is, it fits from MemTotal {fmt_gib(fits)} ({host.platform}, no cgroup limit); on this "
                "host, change what the reasons above name")
    return HostFit(assumed_mem_total_bytes=hw.host_ram, assumed_platform=hw.platform,
                   mem_total_bytes=host.mem_total_bytes, fits_from_mem_total_bytes=fits,
                   line=f"{sized}; {here}; {tail}")
