"""Each host constraint is written once (``planner/constraints.py``) and both the ratio search
and the refusals read it: the largest safe ratio passes every constraint, one grid step
(0.001) above it the plan is refused, naming the constraint that bounds the search.

Boxes (each chosen so that one constraint binds first; the bounds are worked out from the
formulas each constraint cites, ``checks.py`` and ``pools.py``):

- ``pinned budget``: a 32 GiB Linux box, the patched runtime (rtx5060ti-tp2's needs): budget
  32 - 2 x 3 - 1 - 2 = 23 GiB for the pinned total, no other limit below it.
- ``pinned ceiling``: a 128 GiB Linux box where doctor measured a reached 3 GB pinned ceiling
  per process: 3 GB per rank binds long before the 119 GiB budget.
- ``limit on one pinned (cudaHostAlloc) allocation``: a 128 GiB WSL2 box whose store probe picked
  the pinned allocator: the host mamba temporal buffer passes 4 GiB at ratio 3.5 (56 slots fit,
  ``tests/planner/test_pinned_buffer_limit.py`` works it out).
- ``host-memory check``: the 32 GiB Linux box on stock SGLang (no capabilities): the stock check
  counts a late rank's peers twice (sglang#38156), 3P + M <= A - 10 GiB = 32 - 1 - 6 - 10 =
  15 GiB, tighter than the budget's 2(P + M) <= 23 GiB.
"""

from __future__ import annotations

import pytest

from escha_deploy.facts.host import HostFacts
from escha_deploy.planner import constraints as cmod
from escha_deploy.planner import plan
from escha_deploy.planner.constraints import RELEASE_GUARDS, Breach, HostConstraint, HostView
from escha_deploy.planner.pools import HostPools
from escha_deploy.profile import load_profile
from escha_deploy.utils.units import GB, GiB

GRID = 1000  # planner.SAFE_RATIO_GRID: max_safe_ratio is on a 0.001 grid

BOXES: dict[str, tuple[dict[str, object], frozenset[str] | None]] = {
    "pinned budget": ({"platform": "linux", "mem_total_bytes": 32 * GiB}, None),
    "pinned ceiling": ({"platform": "linux", "mem_total_bytes": 128 * GiB, "pinned_ceiling_bytes": 3 * GB,
                        "pinned_ceiling_reached": True}, None),
    "limit on one pinned (cudaHostAlloc) allocation": (
        {"platform": "wsl2", "mem_total_bytes": 128 * GiB, "host_allocator": "pinned"}, None),
    "host-memory check": ({"platform": "linux", "mem_total_bytes": 32 * GiB}, frozenset()),
}


def _host_refusals(p):
    """The plan's refusals from the host constraints (each starts with the setting it is at)."""
    return [r for r in p.reasons if r.startswith(("hicache.hicache_ratio: at", "hicache.hicache_size: at"))]


def _every_constraint():
    return {c.name for c in (*cmod.HOST_CONSTRAINTS, *RELEASE_GUARDS.values())}


def test_every_constraint_has_a_box_here():
    """A constraint added to the data without a box here fails: each needs the test below."""
    assert _every_constraint() == set(BOXES)


@pytest.mark.parametrize("name", sorted(BOXES))
def test_the_search_bound_and_the_refusal_agree(name):
    facts, caps = BOXES[name]
    prof = load_profile("rtx5060ti-tp2")
    host = HostFacts(source="described", **facts)
    auto = plan(prof, host, capabilities=caps)
    top = auto.max_safe_ratio
    assert top is not None and top < 8, "the box is chosen so that a constraint binds below ratio 8"
    # the search's own decision names the binding constraint's bound
    why = next(d.reason for d in auto.decisions if d.rule == "largest safe ratio")
    k = round(top * GRID)
    at_top = plan(prof, host, capabilities=caps, ratio=k / GRID)
    above = plan(prof, host, capabilities=caps, ratio=(k + 1) / GRID)
    assert _host_refusals(at_top) == []
    refused = _host_refusals(above)
    assert refused and name in refused[0], refused
    assert above.verdict == "unsafe" and refused[0] in above.reasons
    assert f"use a ratio <= {top}" in refused[0]  # the refusal says the search's answer
    if name == "pinned ceiling":
        assert "3.00 GB per-rank pinned ceiling" in why
    if name == "limit on one pinned (cudaHostAlloc) allocation":
        assert top == 3.499 and "4,294,967,296 B" in why


@pytest.mark.parametrize("profile", ["rtx5060ti-tp2", "rtx5060ti-tp2-fp8", "linux-tp2-l3"])
def test_agreement_over_boxes(profile):
    """For every shipped profile over boxes that bind on each constraint (and a cgroup), the
    search's largest ratio has no host refusal and the next grid step has one (sized by ratio:
    a profile's hicache_size wins over --ratio)."""
    prof = load_profile(profile, ["hicache.hicache_size=0"])
    boxes = [*BOXES.values(), ({"platform": "linux", "mem_total_bytes": 64 * GiB, "cgroup_limit_bytes": 24 * GiB},
                               None), ({"platform": "wsl2", "mem_total_bytes": 24 * GiB}, None)]
    checked = 0
    for facts, caps in boxes:
        host = HostFacts(source="described", **facts)
        top = plan(prof, host, capabilities=caps).max_safe_ratio
        if top is None or top >= 1024:
            continue
        k = round(top * GRID)
        assert _host_refusals(plan(prof, host, capabilities=caps, ratio=k / GRID)) == [], (facts, top)
        assert _host_refusals(plan(prof, host, capabilities=caps, ratio=(k + 1) / GRID)), (facts, top)
        checked += 1
    assert checked >= 3


def test_a_constraint_added_to_the_data_reaches_the_search_and_the_refusal(monkeypatch):
    """A new constraint written once, as data, bounds the search and names itself in the refusal:
    a made-up cap of 4 GB pinned per rank on the 32 GiB box (whose budget alone allows about 5)."""
    cap = 4 * GB

    def check(v: HostView, pools: HostPools) -> Breach | None:
        return None if pools.pinned_bytes <= cap else Breach("test cap", f"test cap: {pools.pinned_bytes:,} B")

    extra = HostConstraint("test cap", lambda v: "the test cap", check)
    prof = load_profile("rtx5060ti-tp2")
    host = HostFacts(source="described", platform="linux", mem_total_bytes=32 * GiB)
    before = plan(prof, host).max_safe_ratio
    monkeypatch.setattr(cmod, "HOST_CONSTRAINTS", (*cmod.HOST_CONSTRAINTS, extra))
    p = plan(prof, host)
    assert p.max_safe_ratio is not None and before is not None and p.max_safe_ratio < before
    assert p.per_rank.pinned_bytes <= cap and p.verdict == "ok"
    assert "the test cap" in next(d.reason for d in p.decisions if d.rule == "largest safe ratio")
    k = round(p.max_safe_ratio * GRID)
    assert _host_refusals(plan(prof, host, ratio=k / GRID)) == []
    refused = _host_refusals(plan(prof, host, ratio=(k + 1) / GRID))
    assert len(refused) == 1 and "test cap" in refused[0]


def test_hicache_off_names_the_same_constraint():
    """With the auto ratio and nothing >= hicache.min_ratio fitting, HiCache goes off with the
    message of the constraint the search hit (the 1 GB ceiling here), not a second wording."""
    prof = load_profile("rtx5060ti-tp2")
    host = HostFacts(source="described", platform="linux", mem_total_bytes=128 * GiB,
                     pinned_ceiling_bytes=GB // 4, pinned_ceiling_reached=True)
    p = plan(prof, host)
    assert p.verdict == "hicache_off"
    at_min = plan(prof, host, ratio=prof.hicache.min_ratio)
    refusal = _host_refusals(at_min)[0]
    message = refusal.split(f"at {prof.hicache.min_ratio} ", 1)[1].split("; use a ratio")[0]
    assert message in p.reasons[0] and "pinned ceiling" in p.reasons[0]


def test_a_release_guard_plugs_into_the_same_shape(monkeypatch):
    """A release's own host guard is one ``HostConstraint`` under its ``host_guard.kind``
    (0.5.19's is ``per-pool-available``): a stricter made-up guard there bounds the search and
    names itself in the refusal, with nothing else changed."""
    kind = "per-pool-available"
    base = RELEASE_GUARDS[kind]

    def check(v: HostView, pools: HostPools) -> Breach | None:
        if pools.kv_bytes + pools.mamba_bytes <= 3 * GB:
            return base.check(v, pools)
        return Breach("stricter guard", "the stricter guard would refuse")

    monkeypatch.setitem(RELEASE_GUARDS, kind, HostConstraint("stricter guard", lambda v: "the stricter guard", check))
    prof = load_profile("rtx5060ti-tp2")
    host = HostFacts(source="described", platform="linux", mem_total_bytes=32 * GiB)
    p = plan(prof, host)
    assert p.max_safe_ratio is not None
    k = round(p.max_safe_ratio * GRID)
    assert _host_refusals(plan(prof, host, ratio=k / GRID)) == []
    refused = _host_refusals(plan(prof, host, ratio=(k + 1) / GRID))
    assert refused and "stricter guard" in refused[-1]


@pytest.mark.parametrize("name", sorted(BOXES))
def test_the_size_search_and_the_refusal_agree(name):
    """The same for ``--hicache-size``: the largest safe whole GB per rank passes every
    constraint, one GB more is refused with the search's answer."""
    facts, caps = BOXES[name]
    prof = load_profile("rtx5060ti-tp2")
    host = HostFacts(source="described", **facts)
    refusals = {}
    g = 0
    while not refusals.get(g):
        g += 1
        assert g < 200, "the box is chosen so that a constraint binds below 200 GB per rank"
        refusals[g] = _host_refusals(plan(prof, host, capabilities=caps, hicache_size_gb=g))
    largest = g - 1
    assert largest >= 1
    refused = refusals[g]
    assert refused[0].startswith(f"hicache.hicache_size: at {g} GB per rank")
    assert f"use hicache_size <= {largest}" in refused[0]  # the size search's answer is the last that passed
    assert _host_refusals(plan(prof, host, capabilities=caps, hicache_size_gb=g + 1))  # and it stays refused
