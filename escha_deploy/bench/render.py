"""The bench table (rich, the first seed's shape: one column per server) and the PNG chart.

``rows(report)`` is the single source of the table's text; ``table`` renders it with rich and
the README/docs sample is printed from the same function. ``chart`` draws three panels with
matplotlib (the optional ``chart`` extra, imported only when a chart is asked for).
"""

from __future__ import annotations

import io
from pathlib import Path

from escha_deploy.pipeline.chart import CHART_INSTALL_HINT, CHART_MISSING  # plan --chart's words, one place
from escha_deploy.utils.errors import BadInput
from escha_deploy.utils.paths import write_output

from .models import BenchReport, CachedFigure, CanaryResult, PassResult, ServerRun
from .workload import warm_marks


_SHORT_SOURCE = {
    "usage.prompt_tokens_details.cached_tokens": "usage",
    "sglext.cached_tokens_details": "sglext",
    "metrics:sglang:cached_tokens_total": "metrics",
    "sglext.cached_tokens_details.host": "sglext",
    "metrics:sglang:cached_tokens_total{cache_source=host}": "metrics",
}


def _k(tokens: int) -> str:
    """18000 -> "18K", 18432 -> "18.4K", 512 -> "512"."""
    if tokens >= 1000:
        v = tokens / 1000
        return f"{v:.0f}K" if abs(v - round(v)) < 0.05 else f"{v:.1f}K"
    return str(tokens)


def column_labels(report: BenchReport) -> list[str]:
    """One header per run: "off"/"on" from the server's HiCache state, else the URL.

    Two runs that would get the same label (both on, or state unknown) get their URLs.
    """
    labels = [r.facts.label for r in report.runs]
    if len(set(labels)) != len(labels):
        labels = [r.facts.url for r in report.runs]
    return labels


def _share(c: CachedFigure) -> str:
    if c.share is None:
        return "unknown (no cache report)"
    return f"{c.share:.0%} ({_SHORT_SOURCE.get(c.source or '', c.source)})"


def _host(c: CachedFigure) -> str:
    if c.host_tokens is None:
        return "unknown"
    return f"{c.host_tokens:,} ({_SHORT_SOURCE.get(c.host_source or '', c.host_source)})"


def _pass(p: PassResult) -> str:
    return f"{p.wall_s:.1f} s" if p.wall_s >= 1 else f"{p.wall_s:.2f} s"


#: How a cell measured on an already-warm cache is marked (table and chart); the caption says why.
WARM_MARK = "WARM CACHE"


def _warm(marks: dict[str, str], name: str) -> str:
    return f" [{WARM_MARK}: {marks[name]}]" if name in marks else ""


def rows(report: BenchReport) -> list[tuple[str, list[str]]]:
    """The table as (row name, one cell per run), in the seed's order, then the extras."""
    w = report.workload
    group = f"{w.prefixes} x {_k(w.prefix_tokens)} distinct prefixes, concurrent"
    runs: list[ServerRun] = report.runs
    warm = [warm_marks(r, w) for r in runs]
    return [
        ("cold prefill", [f"{r.prefill.tokens_per_s:,.0f} tok/s" + _warm(m, "cold prefill")
                          for r, m in zip(runs, warm, strict=True)]),
        ("decode, bs1", [f"{r.decode.tokens_per_s:.1f} tok/s" for r in runs]),
        (f"{group}, first pass", [_pass(r.first_pass) + _warm(m, "first pass") for r, m in zip(runs, warm, strict=True)]),
        (f"{group}, second pass", [_pass(r.second_pass) for r in runs]),
        ("second pass, cached share", [_share(r.second_pass.cached) for r in runs]),
        ("second pass, host-tier tokens", [_host(r.second_pass.cached) for r in runs]),
    ]


def caption(report: BenchReport) -> str:
    """Seed, token counting and the box, under the table."""
    w = report.workload
    counts = {r.token_counts for r in report.runs}
    parts = [f"seed {w.seed}", f"tokens counted by {' / '.join(sorted(counts))}"]
    if report.box:
        parts.append(f"box: {report.box}")
    if any(warm_marks(r, w) for r in report.runs):
        parts.append(f"{WARM_MARK}: the server already held these prompts (same --seed run before on it), "
                     "so that figure is no cold measurement; rerun with another --seed or after a restart")
    return "; ".join(parts)


def table(report: BenchReport):
    """A ``rich.table.Table`` of ``rows(report)``."""
    from rich.table import Table
    from rich.text import Text

    from escha_deploy.utils.termtext import printable

    # Text, not markup: a model name the server reports such as "[link=...]" stays text
    t = Table(title="escha-deploy bench", caption=Text(printable(caption(report))))
    t.add_column("")
    for label in column_labels(report):
        t.add_column(Text(printable(label)), justify="right")
    for name, cells in rows(report):
        t.add_row(Text(printable(name)), *(Text(printable(c)) for c in cells))
    return t


def markdown(report: BenchReport) -> str:
    """The same rows as a Markdown table (for docs and the README sample)."""
    labels = column_labels(report)
    out = ["| | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for name, cells in rows(report):
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def chart(report: BenchReport, path: Path) -> Path:
    """Write a PNG with three panels (prefill tok/s, decode tok/s, pass wall times).

    Raises ``BadInput`` (exit 2) with ``CHART_INSTALL_HINT`` when matplotlib is missing, when
    ``path`` does not end in ``.png``, and when it cannot be written (``paths.write_output``:
    never half-written). Returns ``path``.
    """
    if path.suffix.lower() != ".png":
        raise BadInput(f"--chart: expected a .png path, got {str(path)!r}")
    try:
        import matplotlib
    except ImportError:
        raise BadInput(CHART_MISSING, hint=CHART_INSTALL_HINT) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = column_labels(report)
    w = report.workload
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    colors = ["#888888", "#2a7ab0", "#d08c2a", "#5a9e4b"]
    panels = [
        ("cold prefill, tok/s", [r.prefill.tokens_per_s for r in report.runs]),
        ("decode bs1, tok/s", [r.decode.tokens_per_s for r in report.runs]),
    ]
    warm = [warm_marks(r, w) for r in report.runs]
    for k, (ax, (title, values)) in enumerate(zip(axes[:2], panels, strict=True)):
        bars = ax.bar(labels, values, color=colors[: len(values)])
        ax.set_title(title)
        ax.margins(y=0.12)
        for x, v in enumerate(values):
            hot = k == 0 and "cold prefill" in warm[x]
            if hot:  # measured on a warm cache: hatched and labelled on the bar
                bars[x].set_hatch("//")
            ax.annotate((f"{v:,.0f}" if v >= 100 else f"{v:.1f}") + (f"\n{WARM_MARK}" if hot else ""), (x, v),
                        ha="center", va="bottom", color="#b00020" if hot else "black")
    ax = axes[2]
    n = len(report.runs)
    width = 0.8 / n
    for i, (label, r) in enumerate(zip(labels, report.runs, strict=True)):
        xs = [j + (i - (n - 1) / 2) * width for j in range(2)]
        vals = [r.first_pass.wall_s, r.second_pass.wall_s]
        bars = ax.bar(xs, vals, width=width, label=label, color=colors[i % len(colors)])
        hot = "first pass" in warm[i]
        if hot:
            bars[0].set_hatch("//")
        for j, (x, v) in enumerate(zip(xs, vals, strict=True)):
            mark = hot and j == 0
            ax.annotate((f"{v:.2f} s" if v < 1 else f"{v:.1f} s") + (f"\n{WARM_MARK}" if mark else ""), (x, v),
                        ha="center", va="bottom", color="#b00020" if mark else "black")
    ax.margins(y=0.12)
    ax.set_xticks([0, 1], ["first pass", "second pass"])
    ax.set_title(f"{w.prefixes} x {_k(w.prefix_tokens)} prefixes, wall s")
    ax.legend()
    fig.suptitle(f"escha-deploy bench: {caption(report)}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return write_output(path, buf.getvalue(), "--chart")


def canary_lines(result: CanaryResult) -> list[str]:
    """The canary's verdict for people: verdict, reason, evidence, the answers compared."""
    out = [f"canary: {result.verdict.upper()}: {result.reason}"]
    out += [f"  evidence: {e}" for e in result.evidence]
    for a in result.answers:
        cached = "unknown" if a.cached_tokens is None else f"{a.cached_tokens:,}"
        host = "unknown" if a.host_tokens is None else f"{a.host_tokens:,}"
        out.append(f"  {a.label:6} cached {cached} (host {host}) of {a.prompt_tokens:,}: "
                   f"{a.text.strip()[:80]!r}")
    if result.upstream:
        out.append(f"  see: {result.upstream}")
    from escha_deploy.utils.termtext import printable

    return [printable(line) for line in out]  # evidence quotes the server's labels
