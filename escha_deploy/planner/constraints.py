"""The host constraints on HiCache's host pools, each written once, as data.

Each ``HostConstraint`` is one rule the pinned host pools must keep on this box. The planner's
ratio search (``safe_ratio``: the largest safe ``--hicache-ratio`` / ``--hicache-size``), its
choice of HiCache off (``choose_hicache``) and its refusals (``host_pools``) all read the same
tuple, ``host_constraints(release)``, so the bound a search finds and the message a refusal
prints come from one function per constraint: the largest ratio the search returns passes
every constraint, and one grid step above it the first constraint it breaks is the one the
refusal names.

The four, in the order they are checked:

1. ``PINNED_BUDGET``: ranks x pinned bytes per rank <= the safety policy's pinned budget
   (memory base less server processes, OS and page-cache floor; ``Budget``). Pinned pages
   cannot be paged out, so a larger total makes the box swap.
2. ``PINNED_CEILING``: pinned bytes per rank <= the per-process ceiling ``escha-deploy doctor``
   measured (WSL2's GPU paravirtualisation caps pinned memory; microsoft/WSL#8447).
3. ``PINNED_ALLOCATION_LIMIT``: with the pinned (cudaHostAlloc) allocator, every single host
   buffer <= ``PINNED_MAX_BYTES`` (4 GiB, sglang#7666), which the runtime hook enforces
   (``runtime/hooks/host_alloc.py: resolve``); buffers from ``pools.host_buffers``.
4. the release's own host-memory guard, ``RELEASE_GUARDS[host_guard.kind]``: SGLang's check in
   ``pool_host/base.py: host_memory_budget_bytes`` (stock) or our series' once-per-group check
   (patched, capability ``hicache-host-reserve-env``), see ``checks``.

A release whose guard differs adds its constraint to ``RELEASE_GUARDS`` under its
``host_guard.kind`` (``releases/VERSION/facts.yaml``); the search and the messages pick it up.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..utils.units import fmt_gb
from .checks import patched_check, stock_check
from .pools import PINNED_MAX_BYTES, DevicePools, HostPools, host_buffers
from .result import Budget

WSL2_MEMORY_ADVICE = (
    "under WSL2 this memory is the VM's: raise memory= under [wsl2] in %UserProfile%\\.wslconfig "
    "(default half the Windows RAM) and restart the VM with `wsl --shutdown`")
WSL2_CEILING_ADVICE = (
    "under WSL2 the pinned ceiling is the GPU paravirtualisation's, not the locked-memory limit: "
    "--ulimit memlock=-1 does not lift it (microsoft/WSL#8447); lower the ratio")


@dataclass(frozen=True)
class HostView:
    """What the host constraints read about the box and the runtime, per rank unless named.

    ``ranks``: TP ranks on this box; ``platform``: ``linux`` or ``wsl2``; ``budget``: the pinned
    budget (``Budget``, bytes); ``ceiling``: doctor's measured pinned ceiling per rank (bytes),
    None when unmeasured or not reached; ``allocator``: the host allocator the launch sets
    (``pinned``, ``register``, ``auto``), None without hicache-host-allocator;
    ``allocator_why``: why it is pinned, for the message; ``runtime_applies``: ``stock`` or
    ``patched``; ``a_guard``: what the release's stock guard reads as available (bytes,
    ``checks.guard_available``); ``a_runtime``: the modelled MemAvailable when the pools are
    built (bytes); ``stock_reserve`` / ``patched_reserve``: each check's reserve (bytes);
    ``dev``: the device pools the host pools mirror."""

    ranks: int
    platform: str
    budget: Budget
    ceiling: int | None
    allocator: str | None
    allocator_why: str
    runtime_applies: str
    a_guard: int
    a_runtime: int
    stock_reserve: int
    patched_reserve: int
    dev: DevicePools


@dataclass(frozen=True)
class Breach:
    """One constraint broken by one choice of pools: ``constraint`` its ``HostConstraint.name``;
    ``message`` what breaks, with its numbers and their source (one clause, no field name: the
    caller says at which setting); ``advice`` how to lift it on this platform, or ''."""

    constraint: str
    message: str
    advice: str = ""


def _no_room(v: HostView, pools: HostPools) -> int | None:
    return None


def _no_advice(v: HostView) -> str:
    return ""


@dataclass(frozen=True)
class HostConstraint:
    """One host constraint: ``name`` (every ``Breach`` message contains it); ``bound(view)``:
    the clause the safe-ratio decision lists ("the 1.00 GB per-rank pinned ceiling"), None where
    the constraint does not apply to this box; ``check(view, pools)``: the ``Breach`` when
    ``pools`` (per rank) break it, else None. ``check`` must be monotonic in the pools' bytes
    (the ratio search bisects). ``room(view, pools)``: bytes left under this constraint, which
    the recommended ratio's headroom is measured against (``search.headroom``); None for a
    constraint the headroom does not count (a yes/no limit such as one buffer's size).
    ``advice(view)``: how to lift it on this platform ('' where there is nothing to say), in
    its ``Breach`` and wherever the plan says what binds (``binding_constraint``)."""

    name: str
    bound: Callable[[HostView], str | None]
    check: Callable[[HostView, HostPools], Breach | None]
    room: Callable[[HostView, HostPools], int | None] = _no_room
    advice: Callable[[HostView], str] = _no_advice


# --------------------------------------------------------------------------- the pinned budget


def _budget_bound(v: HostView) -> str:
    return f"the pinned budget {fmt_gb(v.budget.pinned_budget_bytes)} (pinned total)"


def _budget_check(v: HostView, pools: HostPools) -> Breach | None:
    total, b = v.ranks * pools.pinned_bytes, v.budget
    if total <= b.pinned_budget_bytes:
        return None
    over = b.binding_detail if b.binding != "ceiling" else f"the pinned budget {fmt_gb(b.pinned_budget_bytes)}"
    kind = "cgroup" if b.memory_base_kind == "cgroup" else "RAM"
    return Breach(
        PINNED_BUDGET.name,
        f"pinned {fmt_gb(total)} ({v.ranks} ranks x (KV {fmt_gb(pools.kv_bytes)} + mamba {fmt_gb(pools.mamba_bytes)}"
        + (f" + draft KV {fmt_gb(pools.draft_kv_bytes)}" if pools.draft_kv_bytes else "") + ")) "
        f"exceeds the {kind} budget, {over}: pinned pages cannot be paged out, so the box would swap (a field "
        "report: ratio 2 pinned 10.3 GB, its sum of rounded figures 2 x (2.58 + 2.55 GB) where these are SGLang "
        "0.5.19's exact bytes, on a 32 GB Windows host, and its page cache fell to 589 MB)", PINNED_BUDGET.advice(v))


def _budget_room(v: HostView, pools: HostPools) -> int:
    return v.budget.pinned_budget_bytes - v.ranks * pools.pinned_bytes


def _budget_advice(v: HostView) -> str:
    return WSL2_MEMORY_ADVICE if v.platform == "wsl2" and v.budget.memory_base_kind == "ram" else ""


PINNED_BUDGET = HostConstraint("pinned budget", _budget_bound, _budget_check, _budget_room, _budget_advice)


# --------------------------------------------------------------------------- the pinned ceiling


def _ceiling_bound(v: HostView) -> str | None:
    return None if v.ceiling is None else f"the {fmt_gb(v.ceiling)} per-rank pinned ceiling"


def _ceiling_check(v: HostView, pools: HostPools) -> Breach | None:
    if v.ceiling is None or pools.pinned_bytes <= v.ceiling:
        return None
    return Breach(PINNED_CEILING.name,
                  f"each rank pins {fmt_gb(pools.pinned_bytes)}, above the {PINNED_CEILING.name} of "
                  f"{fmt_gb(v.ceiling)} per rank `escha-deploy doctor` measured",
                  PINNED_CEILING.advice(v))


def _ceiling_room(v: HostView, pools: HostPools) -> int | None:
    return None if v.ceiling is None else v.ceiling - pools.pinned_bytes


def _ceiling_advice(v: HostView) -> str:
    return WSL2_CEILING_ADVICE if v.platform == "wsl2" else ""


PINNED_CEILING = HostConstraint("pinned ceiling", _ceiling_bound, _ceiling_check, _ceiling_room, _ceiling_advice)


# --------------------------------------------------------------------------- one pinned allocation


def buffer_over_limit(v: HostView, pools: HostPools) -> tuple[str, int] | None:
    """``(name, requested bytes)`` of the first single host buffer above ``PINNED_MAX_BYTES``
    when the allocator is pinned; None otherwise (``auto`` resolves to register off WSL2,
    where the limit does not apply). Buffers from ``pools.host_buffers``."""
    if v.allocator != "pinned":
        return None
    return next(((n, b) for n, b in host_buffers(v.dev, pools) if b > PINNED_MAX_BYTES), None)


def _allocation_bound(v: HostView) -> str | None:
    if v.allocator != "pinned":
        return None
    return f"each pinned buffer within {PINNED_MAX_BYTES:,} B (4 GiB, sglang#7666)"


def _allocation_check(v: HostView, pools: HostPools) -> Breach | None:
    too_big = buffer_over_limit(v, pools)
    if too_big is None:
        return None
    name, nbytes = too_big
    return Breach(
        PINNED_ALLOCATION_LIMIT.name,
        f"the {name} is {nbytes:,} B ({nbytes / 2**30:.2f} GiB), above the {PINNED_MAX_BYTES:,} B (4 GiB) "
        f"{PINNED_ALLOCATION_LIMIT.name}, which the host allocator ({v.allocator_why}) enforces because one pinned "
        "allocation above about 4 GB failed with \"CUDA error: invalid argument\" (sglang#7666); the server "
        "would stop at startup, after the weights load, with PinnedAllocationTooLarge")


PINNED_ALLOCATION_LIMIT = HostConstraint("limit on one pinned (cudaHostAlloc) allocation",
                                         _allocation_bound, _allocation_check)


# --------------------------------------------------------------------------- the release's guard


def _guard_bound(v: HostView) -> str:
    return f"the {v.runtime_applies} runtime's host-memory check"


def _guard_check(v: HostView, pools: HostPools) -> Breach | None:
    # a draft's sidecar pool passes the same check after the target's (pool_host/base.py:
    # HostKVCache.__init__), so it is counted with the KV pool
    kv = pools.kv_bytes + pools.draft_kv_bytes
    if v.runtime_applies == "patched":
        ok, why = patched_check(v.a_runtime, v.ranks, kv, pools.mamba_bytes, v.patched_reserve)
    else:
        ok, why = stock_check(v.a_guard, v.ranks, kv, pools.mamba_bytes, v.stock_reserve)
    if ok:
        return None
    return Breach(RUNTIME_GUARD.name, f"the {v.runtime_applies} runtime's {RUNTIME_GUARD.name} would refuse "
                  f"at startup: {why}")


RUNTIME_GUARD = HostConstraint("host-memory check", _guard_bound, _guard_check)

#: Each release's host guard by ``host_guard.kind`` (``releases/VERSION/facts.yaml``). The
#: kinds run the same check; they differ in what they read as available (``a_guard``,
#: ``checks.guard_available``).
RELEASE_GUARDS: dict[str, HostConstraint] = {"per-pool-available": RUNTIME_GUARD, "cgroup-bounded": RUNTIME_GUARD,
                                             "cgroup-bounded-cache-charged": RUNTIME_GUARD}

#: The constraints every release shares, in the order they are checked.
HOST_CONSTRAINTS: tuple[HostConstraint, ...] = (PINNED_BUDGET, PINNED_CEILING, PINNED_ALLOCATION_LIMIT)


def host_constraints(guard_kind: str) -> tuple[HostConstraint, ...]:
    """The constraints for a release whose host guard is ``guard_kind``: the shared ones, then
    the release's guard. An unknown kind raises ``KeyError`` (a release's data names one of
    ``RELEASE_GUARDS``)."""
    return (*HOST_CONSTRAINTS, RELEASE_GUARDS[guard_kind])


def binding_constraint(v: HostView) -> HostConstraint:
    """The constraint that limits the pools first on this box (``Budget.binding``): the
    measured ceiling when it is below the budget's per-rank share, else the pinned budget."""
    return PINNED_CEILING if v.budget.binding == "ceiling" else PINNED_BUDGET


def breaches(v: HostView, pools: HostPools, constraints: tuple[HostConstraint, ...]) -> list[Breach]:
    """Every constraint ``pools`` break, in ``constraints`` order."""
    return [b for c in constraints if (b := c.check(v, pools)) is not None]


def first_breach(v: HostView, pools: HostPools, constraints: tuple[HostConstraint, ...]) -> Breach | None:
    """The first constraint ``pools`` break, or None when they keep all of them."""
    return next((b for c in constraints if (b := c.check(v, pools)) is not None), None)


def bounds(v: HostView, constraints: tuple[HostConstraint, ...]) -> list[str]:
    """The clauses of the constraints that apply to this box, for the safe-ratio decision."""
    return [b for c in constraints if (b := c.bound(v)) is not None]
