"""The facts file: versioned, checked with file and field named, and one input that gives one
plan and one digest whatever machine reads it (the digest covers fact values, not sources)."""

from __future__ import annotations

import json

import pytest

from escha_deploy.utils.errors import BadInput
from escha_deploy.facts.factsfile import FACTS_SCHEMA_VERSION, FactsFile, GpuRecord, HostSection, load_facts_file
from escha_deploy.pipeline import (FactsFileHost, ProfileTarget, decide, facts_source, gather, launch_facts,
                                   resolve_runtime)
from escha_deploy.pipeline.spec import build_launch_spec
from escha_deploy.profile import load_profile
from escha_deploy.utils.units import GiB


def _write(tmp_path, doc: dict, name: str = "box.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def _doc(mem=16 * GiB, **kw) -> dict:
    return FactsFile(host=HostSection(platform="linux", mem_total_bytes=mem),
                     gpus=[GpuRecord(index=0, memory_total_bytes=16 * GiB, compute_capability="12.0")],
                     **kw).model_dump(mode="json")


def test_another_schema_version_names_both(tmp_path):
    p = _write(tmp_path, {**_doc(), "schema_version": 7})
    with pytest.raises(BadInput) as err:
        load_facts_file(p)
    assert f"{p}: schema_version: facts file schema version 7" in err.value.problems[0]
    assert f"reads version {FACTS_SCHEMA_VERSION}" in err.value.problems[0]


def test_a_bad_field_is_named_with_the_file(tmp_path):
    doc = _doc()
    doc["host"]["mem_total_bytes"] = -1
    with pytest.raises(BadInput) as err:
        load_facts_file(_write(tmp_path, doc))
    assert err.value.problems[0].startswith(f"{tmp_path / 'box.json'}: host.mem_total_bytes: ")


def _spec(facts_path):
    prof = load_profile("rtx5060ti-tp2-fp8")
    g = gather(prof, FactsFileHost(str(facts_path)))
    plan = decide(prof, g, resolve_runtime(prof, g, ProfileTarget()))
    return g, plan, build_launch_spec(plan, prof, facts=launch_facts(plan, g), sources=g.sources)


def test_the_digest_covers_fact_values_not_where_they_came_from(tmp_path):
    a = _write(tmp_path, _doc(created_at="2026-01-01T00:00:00+00:00", escha_version="0.0.1"), "a.json")
    b = _write(tmp_path, _doc(created_at="2026-11-30T00:00:00+00:00"), "b.json")
    c = _write(tmp_path, _doc(mem=24 * GiB), "c.json")
    ga, pa, sa = _spec(a)
    _, _, sb = _spec(b)
    _, _, sc = _spec(c)
    assert ga.host.source == "facts" and pa.budget.memory_base_bytes == 16 * GiB
    assert any(s.source == f"facts file {a}" for s in sa.sources)
    assert sa.sources != sb.sources and sa.plan_digest == sb.plan_digest  # who/when/where: not digested
    assert sc.plan_digest != sa.plan_digest  # another MemTotal is another plan
    assert sa.facts.gpus[0].compute_capability == "12.0"


def test_facts_and_host_ram_are_exclusive(tmp_path):
    with pytest.raises(BadInput):
        facts_source(str(_write(tmp_path, _doc())), host_ram=8 * GiB)


@pytest.mark.parametrize("when", ["yesterday", "2026-13-45T00:00:00", ""])
def test_created_at_that_is_not_a_time_is_named(tmp_path, when):
    """``created_at`` says when the file was written; ``yesterday`` said it no better than
    nothing and was accepted."""
    doc = {**_doc(), "created_at": when}
    with pytest.raises(BadInput) as err:
        load_facts_file(_write(tmp_path, doc))
    line = err.value.problems[0]
    assert line.startswith(f"{tmp_path / 'box.json'}:") and "created_at" in line
    assert "expected an ISO 8601 date and time" in line, line


def test_created_at_as_the_file_writes_it_is_read(tmp_path):
    f = load_facts_file(_write(tmp_path, _doc(created_at="2026-11-30T00:00:00+00:00")))
    assert f is not None
