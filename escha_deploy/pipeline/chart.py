"""``plan --chart OUT.png``: the memory plan drawn as one bar against the memory base, for
people who would rather look than read. ``segments`` is pure (the plan's bytes, in order);
``draw`` needs matplotlib (the ``chart`` extra: ``pip install '.[chart]'`` in the checkout).

Bytes come from the plan (``Plan.budget`` and ``Plan.per_rank``); the chart prints GB (1e9)
and GiB (2**30) side by side, as ``plan`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

from escha_deploy.planner.result import Plan

EXTRA = "chart"


@dataclass(frozen=True)
class Segment:
    label: str
    bytes: int
    kind: str  # server | os | floor | kv | mamba | other | left | over


def segments(plan: Plan) -> list[Segment]:
    """The memory base split as the plan splits it: each rank's server processes, the OS
    reserve, the page-cache floor, each rank's KV and mamba host pools (and any other pinned
    buffer), then what is left, or ``over`` by how much the pools pass the memory base."""
    b, pr, n = plan.budget, plan.per_rank, plan.tp_size
    out = [Segment(f"rank {r} server process", b.server_processes_bytes // n, "server") for r in range(n)]
    out += [Segment("OS reserve", b.os_reserve_bytes, "os"), Segment("page-cache floor", b.page_cache_floor_bytes, "floor")]
    other = max(pr.pinned_bytes - pr.host_kv_bytes - pr.host_mamba_bytes, 0)
    for r in range(n):
        if pr.host_kv_bytes:
            out.append(Segment(f"rank {r} host KV pool ({pr.host_kv_tokens:,} tokens)", pr.host_kv_bytes, "kv"))
        if pr.host_mamba_bytes:
            out.append(Segment(f"rank {r} host mamba pool ({pr.host_mamba_slots:,} slots)", pr.host_mamba_bytes, "mamba"))
        if other:
            out.append(Segment(f"rank {r} other pinned buffers", other, "other"))
    used = sum(s.bytes for s in out)
    left = b.memory_base_bytes - used
    out.append(Segment("left" if left >= 0 else "over the memory base", abs(left), "left" if left >= 0 else "over"))
    return out


_COLORS = {"server": "#8c8c8c", "os": "#b5b5b5", "floor": "#9ecae1", "kv": "#3182bd", "mamba": "#e6550d",
           "other": "#fdae6b", "left": "#e5f5e0", "over": "#de2d26"}


def _fmt(n: int) -> str:
    return f"{n / 1e9:.2f} GB ({n / 2**30:.2f} GiB)"


def draw(plan: Plan, path: str) -> bytes:
    """The PNG of ``plan`` (bytes; the caller writes them). Raises ``ImportError`` without
    matplotlib."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    segs = segments(plan)
    base = plan.budget.memory_base_bytes
    fig, ax = plt.subplots(figsize=(11, 3.3), dpi=110)
    x = 0
    for s in segs:
        if s.kind == "over":  # hatched over the pools past the memory base, which stay visible
            ax.barh(0, s.bytes / 1e9, left=base / 1e9, height=0.8, fill=False, hatch="//", edgecolor=_COLORS["over"],
                    lw=0, label=f"{s.label}: {_fmt(s.bytes)}")
            continue
        ax.barh(0, s.bytes / 1e9, left=x / 1e9, height=0.8, color=_COLORS[s.kind], edgecolor="white",
                label=f"{s.label}: {_fmt(s.bytes)}")
        x += s.bytes
    ax.axvline(base / 1e9, color="black", lw=1.5)
    ax.text(base / 1e9, 0.45, f"memory base {_fmt(base)}: {plan.budget.memory_base_source} ", va="bottom",
            ha="right", fontsize=8)
    pb = plan.budget.pinned_budget_bytes
    start = plan.budget.server_processes_bytes + plan.budget.os_reserve_bytes + plan.budget.page_cache_floor_bytes
    if pb > 0:
        ax.annotate("", xy=(start / 1e9, -0.55), xytext=((start + pb) / 1e9, -0.55),
                    arrowprops=dict(arrowstyle="<->", color="#3182bd"))
        ax.text((start + pb / 2) / 1e9, -0.6, f"pinned budget {_fmt(pb)}: the host pools must fit here",
                ha="center", va="top", fontsize=8, color="#3182bd")
    ax.set_yticks([])
    ax.set_ylim(-0.9, 0.9)
    ax.set_xlabel("host memory, GB (1e9 bytes)")
    ratio = plan.hicache.ratio if plan.hicache.ratio is not None else plan.hicache.requested
    ax.set_title(f"{plan.profile}: TP {plan.tp_size}, {plan.platform}, HiCache "
                 f"{'ratio ' + str(ratio) if plan.hicache.enabled else 'off'}, verdict {plan.verdict}\n"
                 f"weights from {weights_words(plan)}", loc="left", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.36), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


#: What `plan --chart` and `bench --chart` say when matplotlib is missing, and how to get it:
#: escha-deploy installs from its checkout (README.md), so the extra is installed from there.
CHART_MISSING = "--chart needs matplotlib, which is not installed"
CHART_INSTALL_HINT = (
    f"install the {EXTRA} extra: pip install '.[{EXTRA}]' from the escha-deploy checkout "
    "(or: pip install matplotlib)"
)


def require_matplotlib() -> None:
    """``BadInput`` (exit 2) naming the extra when matplotlib is not installed."""
    import importlib.util

    from escha_deploy.utils.errors import BadInput

    if importlib.util.find_spec("matplotlib") is None:
        raise BadInput(CHART_MISSING, hint=CHART_INSTALL_HINT)


def weights_words(plan) -> str:
    """Which source fed the weights in the budget, and whether they are pinned, in a few words
    (the chart's title; the table's weights row says the same)."""
    src = {"headers": "the safetensors headers", "file sizes": "the safetensors file sizes",
           "estimate": "the profile's estimate"}[plan.weights_source]
    pin = plan.model_pin.split(" (")[0] if plan.model_pin else "unpinned"
    return f"{src}, {pin}"
