"""``bench``'s last cold-prefill measurement on this box, kept for ``plan``'s host_hit_cost.

``escha-deploy bench`` writes it after every run (``cache_dir()/bench-last.json``): the cold
prefill of the run with HiCache off when there is one (what a host-tier hit saves is a
recompute), else the first run's. ``plan`` on a live host reads it back through
``host.gather_host_facts`` (``findings.load_last_prefill``); a described host or a facts file
does not (it is another box).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from escha_deploy.facts.prefill import LastPrefill
from escha_deploy.facts.saved import last_prefill_path


def from_report(report, now: _dt.datetime | None = None) -> LastPrefill | None:
    """The record of a ``BenchReport``: its HiCache-off run's prefill, else its first run's."""
    runs = list(report.runs)
    if not runs:
        return None
    run = next((r for r in runs if r.facts.hicache is False), runs[0])
    if run.prefill.tokens_per_s <= 0:
        return None
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return LastPrefill(created_at=now.isoformat(), url=run.facts.url, model=run.facts.model,
                       hicache=run.facts.hicache, prompt_tokens=run.prefill.prompt_tokens,
                       tokens_per_s=run.prefill.tokens_per_s)


def save_last_prefill(record: LastPrefill, path: Path | None = None) -> None:
    """Write ``record`` atomically (temp file, then rename); a folder that cannot be written is
    left alone (the benchmark's own output matters more than this note)."""
    path = path or last_prefill_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(record.model_dump_json(indent=2))
        tmp.replace(path)
    except OSError:
        return
