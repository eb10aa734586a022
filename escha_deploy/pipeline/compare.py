"""``plan --sglang-version B --compare A``: what changes for one profile between two releases.

Pure: takes the two plans (``planner.plan`` for each release on the same host) and the argv
the plan for A renders, and lists per item A's value, B's value and whether it changed: the
verdict, the host guard (kind, what it reads as available, the per-rank share of one reading,
the stock check's answer at the chosen pools, auto-size's pick), SGLang's default memory
settings for the card, and each flag of A's argv that B's parser refuses or warns about
(``flagcheck.check_argv`` against B's catalog; ``releases/B/flags-diff.json`` says why); with
each plan's verdict reasons and the host both were planned on.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from escha_deploy.planner.result import Plan
from escha_deploy.utils.units import fmt_gib_gb


class CompareRow(BaseModel):
    item: str
    a: str
    b: str
    changed: bool


class Comparison(BaseModel):
    profile: str
    a: str
    b: str
    host: str = Field(description="the host both plans describe: 'this host', or a described one (--host-ram) "
                      "or a facts file's")
    rows: list[CompareRow]
    argv_a_on_b: list[str]  # flagcheck's errors and warnings for A's argv on B's parser
    reasons_a: list[str] = Field(description="A's verdict reasons (planner.Plan.reasons)")
    reasons_b: list[str] = Field(description="B's verdict reasons")


#: How each ``Plan.host_source`` names the host in the comparison's title.
HOST_WORDS = {"live": "this host", "described": "the described {platform} host (--host-ram)",
              "facts": "the facts file's {platform} host", "saved": "the saved {platform} host"}


def _guard(p: Plan) -> dict[str, str]:
    g = p.host_guard
    rc = p.runtime_check
    out = {
        "verdict": p.verdict,
        "host guard": g.kind if g else "-",
        "host guard reads as available": fmt_gib_gb(g.available_bytes) if g else "-",
        # a reading below the reserve leaves nothing: 0, as the plan prints it (never a negative size)
        "one reading's share per rank": fmt_gib_gb(max(g.share_per_rank_bytes, 0)) if g else "-",
        "stock check at the chosen pools": (rc.stock or "-") if rc else "no host pools",
        # a ratio <= 0 is auto-size's refusal ("No host memory is left for HiCache after the 10 GiB
        # reserve", mem_cache/hicache_auto_size.py): no host tier, never a negative ratio
        "auto-size would pick": ("-" if not g or g.auto_size is None else
                                 "none (refused: no host memory left after the reserve)" if g.auto_size.refused
                                 else f"ratio {g.auto_size.ratio:g}"),
        "HiCache": "off" if not p.hicache.enabled else (f"--hicache-size {p.hicache.size_gb}" if p.hicache.size_gb
                                                          else f"--hicache-ratio {p.hicache.ratio:g}"),
        "pinned total": fmt_gib_gb(p.pinned_total_bytes),
        "largest safe ratio": str(p.max_safe_ratio),
    }
    if p.device is not None:
        out["SGLang's default mem_fraction_static"] = str(p.device.sglang_default_mem_fraction_static)
        out["SGLang's activation + graph reserve"] = fmt_gib_gb(p.device.sglang_reserved_bytes)
    return out


def compare(a: Plan, b: Plan, argv_a: list[str]) -> Comparison:
    """The rows for two plans of one profile (``a`` for release A, ``b`` for B)."""
    from escha_deploy.sglang.flagcheck import check_argv

    ga, gb = _guard(a), _guard(b)
    rows = [CompareRow(item=k, a=ga[k], b=gb.get(k, "-"), changed=ga[k] != gb.get(k, "-")) for k in ga]
    check = check_argv(argv_a, set(a.capabilities), version=b.sglang_release)
    on_b = [f"{p.line()} (error)" for p in check.errors] + [f"{p.line()} (warning)" for p in check.warnings]
    host = HOST_WORDS.get(b.host_source, "{platform} host").format(platform=b.platform)
    return Comparison(profile=a.profile, a=a.sglang_release, b=b.sglang_release, host=host, rows=rows,
                      argv_a_on_b=on_b, reasons_a=list(a.reasons), reasons_b=list(b.reasons))
