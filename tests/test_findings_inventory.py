"""Every finding doctor saves is read by the launch path, or is the evidence of one that is.

An inventory over ``DoctorFindings``' fields (the saved probe results), read from the product's
own source with Python's parser: each field is a launch input, evidence summarised into one,
or bookkeeping. A launch input must be read where this machine's findings and a facts file's
become the host facts a plan is made from (``facts/machine.py: read_this_host``,
``facts/file.py: FactsFile.host_facts``) or where the plan is requested
(``pipeline/request.py``), and the host fact it becomes must be read by the planner or the
launch rendering; a piece of evidence names the launch input doctor derives from it, and
doctor's ``probe_findings`` must read the evidence. A field added without a reader fails here:
a probe result that is saved and never used is what docs/doctor.md's "saved for launch" must
not say of it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from escha_deploy.facts.findings import DoctorFindings

ROOT = Path(__file__).resolve().parent.parent / "escha_deploy"

#: Launch inputs: field -> the host fact (``HostFacts`` field) it becomes, or None where the
#: request reads the finding itself.
LAUNCH = {
    "host_allocator": "host_allocator",
    "pinned_ceiling_bytes": "pinned_ceiling_bytes",
    "pinned_ceiling_reached": "pinned_ceiling_reached",
    "nccl_env": "nccl_env",
    "nccl_smoke_ok": "nccl_env",  # the environment is used only when the smoke test passed with it
    "restore_bandwidth": "restore_bandwidth",
    "driver_version": None,  # pipeline/request.py: findings older than a driver change are stale
}
#: Evidence: field -> the launch input doctor summarises it into (``doctor/run.py``).
EVIDENCE = {
    "store_probe": "host_allocator",  # pick_allocator over the store probe's cases
    # CanUseHostPointerForRegisteredMem, printed beside the store probe's cases in doctor's probe.store
    # check: the evidence shown with the allocator choice, not a second decision
    "device_attributes": "host_allocator",
    "pinned_ceiling_target_bytes": "pinned_ceiling_reached",  # the ladder's target: a ceiling or only a stop
    "pinned_ceiling_allocator": "pinned_ceiling_bytes",  # the allocator the ceiling was measured with
}
#: Bookkeeping: who measured, where, when, and the report's checks as printed (a record of the
#: run, not a probe result).
BOOKKEEPING = {"schema_version", "created_at", "host_id", "platform", "checks"}


def _functions(path: str, *names: str) -> list[ast.AST]:
    tree = ast.parse((ROOT / path).read_text())
    found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {f.name for f in found} == set(names), (path, names)
    return found


def _attrs(nodes) -> set[str]:
    return {n.attr for node in nodes for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def _source_attrs(*folders: str) -> set[str]:
    out: set[str] = set()
    for folder in folders:
        for p in (ROOT / folder).rglob("*.py"):
            out |= _attrs([ast.parse(p.read_text())])
    return out


def test_every_saved_finding_is_classified_once():
    fields = set(DoctorFindings.model_fields)
    classes = [set(LAUNCH), set(EVIDENCE), BOOKKEEPING]
    assert set().union(*classes) == fields, sorted(fields ^ set().union(*classes))
    assert sum(len(c) for c in classes) == len(fields)  # no field in two classes


def test_every_launch_input_is_read_where_the_host_facts_are_made():
    readers = _attrs(_functions("facts/machine.py", "read_this_host") + _functions("facts/file.py", "host_facts"))
    request = (ROOT / "pipeline" / "request.py").read_text()
    unread = [f for f, fact in LAUNCH.items() if fact is not None and f not in readers]
    assert unread == []
    # the one the request reads itself: the driver, through DoctorFindings.driver_changed
    assert "driver_version" in _attrs(_functions("facts/findings.py", "driver_changed"))
    assert "findings.driver_changed(" in request


def test_every_host_fact_a_finding_becomes_is_read_by_the_planner_or_the_launch():
    used = _source_attrs("planner", "pipeline")
    unused = sorted({fact for fact in LAUNCH.values() if fact is not None} - used)
    assert unused == []


def test_every_piece_of_evidence_feeds_a_launch_input_through_doctor():
    assert set(EVIDENCE.values()) <= set(LAUNCH)
    run = ast.parse((ROOT / "doctor" / "run.py").read_text())
    made = next(n for n in ast.walk(run) if isinstance(n, ast.FunctionDef) and n.name == "probe_findings")
    keywords = {k.arg for n in ast.walk(made) if isinstance(n, ast.Call) for k in n.keywords}
    assert set(EVIDENCE) | set(LAUNCH) <= keywords  # doctor saves every one of them
