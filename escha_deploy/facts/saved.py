"""Doctor findings: what ``doctor`` measured on this host, saved for ``plan`` and ``up``
(the models are ``facts.findings``'s; this module reads and writes them).

Saved as JSON at ``paths.doctor_findings_path()`` with the time and a host id. Read back through
a lenient path (unknown keys ignored) so an older or newer escha-deploy can still read it;
user-facing models are strict, stored data is not.

Used by the planner: ``pinned_ceiling_bytes`` (the largest pinned allocation that worked in one
process, which caps each rank's host pools under WSL2) and ``host_allocator`` (the allocator the
host-mapped store probe picked for the patched runtime). Plans made with ``--host-ram`` ignore
the findings (they describe another box). ``load_last_prefill`` reads the other saved
measurement of this box, ``bench``'s last cold prefill (``facts.prefill.LastPrefill``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from escha_deploy.facts.findings import MAX_AGE, SCHEMA_VERSION, DoctorFindings, StoreProbeResult  # noqa: F401  (re-exported)
from escha_deploy.facts.restore_bandwidth import RestoreBandwidth  # noqa: F401  (re-exported: the findings carry it)

if TYPE_CHECKING:
    from escha_deploy.facts.prefill import LastPrefill

def load_findings(path: Path, host_id: str | None = None) -> DoctorFindings | None:
    """Read findings from ``path``; ``None`` when absent, unreadable, or from another host."""
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.utils.jsonio import read_json

    try:
        data = read_json(path, "doctor's saved findings")
        findings = DoctorFindings.model_validate(data)
    except (BadInput, ValueError):
        return None
    if host_id is not None and findings.host_id != host_id:
        return None
    return findings


def save_findings(findings: DoctorFindings, path: Path) -> None:
    """Write findings atomically (write a temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(findings.model_dump_json(indent=2))
    tmp.replace(path)


def last_prefill_path() -> Path:
    """Where ``bench`` keeps its last cold prefill on this box: ``cache_dir()/bench-last.json``."""
    from escha_deploy.utils.paths import cache_dir

    return cache_dir() / "bench-last.json"


def load_last_prefill(path: Path | None = None) -> LastPrefill | None:
    """``bench``'s last cold prefill on this box (``facts.prefill.LastPrefill``), or ``None`` when
    absent or unreadable."""
    import json

    from escha_deploy.facts.prefill import LastPrefill

    path = path or last_prefill_path()
    try:
        return LastPrefill.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None
