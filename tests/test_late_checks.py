"""The late-refusal catalog (``scripts/gen_late_checks.py``): generated from the real 0.5.19
wheel, every configuration-reading row annotated, each mirrored row's test present.

Marked ``wheel``: needs the wheel file (``$ESCHA_SGLANG_WHEEL``; ``.ci/test`` downloads it).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
WHEEL = Path(os.environ.get("ESCHA_SGLANG_WHEEL", "/nonexistent"))

pytestmark = [pytest.mark.wheel, pytest.mark.skipif(not WHEEL.is_file(), reason="no sglang wheel ($ESCHA_SGLANG_WHEEL)")]


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_late_checks", REPO / "scripts" / "gen_late_checks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_late_checks"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def checks(gen):
    return gen.scan(WHEEL)


def test_committed_table_is_current(gen, capsys):
    assert gen.main(["--wheel", str(WHEEL), "--check"]) == 0
    err = capsys.readouterr().err
    assert "late checks: sglang 0.5.19: 1497 found" in err and "15 mirrored" in err


def test_rows_carry_file_function_condition(checks):
    by_key = {c.key: c for c in checks}
    row = by_key["srt/mem_cache/kv_cache_configurator.py:KVCacheConfigurator.resolve_max_num_reqs:"
                 "self.mambaish_config is not None and max_num_reqs <= 0"]
    assert row.kind == "raise" and row.reads_config and "too small to serve any requests" in row.message
    mamba_host = by_key["srt/mem_cache/pool_host/mamba.py:MambaPoolHost.__init__:layout in ['page_first', 'page_first_direct']"]
    assert mamba_host.kind == "assert"


def test_a_row_without_annotation_fails_naming_it(gen, tmp_path, capsys):
    notes = yaml.safe_load((REPO / "escha_deploy" / "catalog" / "releases" / "0.5.19" / "late-checks.yaml").read_text())
    key = next(k for k, v in notes["checks"].items() if v["class"] == "mirrored")
    del notes["checks"][key]
    f = tmp_path / "ann.yaml"
    f.write_text(yaml.safe_dump(notes))
    assert gen.main(["--wheel", str(WHEEL), "--annotations", str(f), "--out", str(tmp_path / "t.md")]) == 1
    assert f"no annotation for {key!r}" in capsys.readouterr().err


def test_a_mirrored_row_must_name_an_existing_test(gen, checks):
    key = next(c.key for c in checks if c.reads_config)
    errs = gen.problems(checks, {key: {"class": "mirrored", "test": "tests/planner/test_late_refusals.py::test_nope"}})
    assert any("does not exist" in e for e in errs)


def test_conditions_without_configuration_are_marked_by_the_rule(checks):
    internal = [c for c in checks if not c.reads_config]
    assert internal and all(c.key for c in internal)
    sample = next(c for c in internal if c.condition == "always")
    assert not sample.reads_config
