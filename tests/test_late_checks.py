"""The startup-refusal catalog (``scripts/gen_late_checks.py``): generated from the real 0.5.19
wheel (and 0.5.23's where it is beside it), every configuration-reading row with a reason, each
mirrored row's test present, ``preflight`` rows backed by the committed import trace, the
annotations of one release carried to the next by key.

Marked ``wheel``: needs the wheel file (``$ESCHA_SGLANG_WHEEL``; ``.ci/test`` downloads it).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest
import yaml

from tests.script_module import load_script

REPO = Path(__file__).resolve().parent.parent
WHEEL = Path(os.environ.get("ESCHA_SGLANG_WHEEL", "/nonexistent"))

pytestmark = [pytest.mark.wheel, pytest.mark.skipif(not WHEEL.is_file(), reason="no sglang wheel ($ESCHA_SGLANG_WHEEL)")]


@pytest.fixture(scope="module")
def gen():
    module = load_script("gen_late_checks")
    # the wheel is read once for the module: ``main`` calls ``scan`` by its global name, and each
    # caller gets its own list of the (unchanged) rows
    scan = functools.cache(module.scan)
    module.scan = lambda wheel: list(scan(Path(wheel)))
    return module


@pytest.fixture(scope="module")
def checks(gen):
    return gen.scan(WHEEL)


def test_committed_table_is_current(gen, capsys):
    assert gen.main(["--wheel", str(WHEEL), "--check"]) == 0
    err = capsys.readouterr().err
    assert "late checks: sglang 0.5.19: 3466 rows;" in err and "20 mirrored" in err and "unreviewed" not in err


def test_scope_covers_startup_modules_of_the_shipped_profiles(checks):
    files = {c.file for c in checks}
    for want in ("srt/server_args.py", "srt/arg_groups/kv_cache_hook.py", "srt/configs/model_config.py",
                 "srt/layers/attention/attention_registry.py", "srt/layers/quantization/fp8.py",
                 "srt/layers/quantization/utils.py", "srt/models/qwen3_5.py", "srt/model_executor/pool_configurator.py",
                 "srt/distributed/device_communicators/pynccl.py", "srt/mem_cache/memory_pool.py"):
        assert want in files, want
    # quantizations no shipped profile names stay out (fp8 and gptq_marlin are shipped; awq is not)
    assert not any(f.startswith(("srt/layers/quantization/awq", "srt/layers/quantization/gguf")) for f in files)
    assert "srt/models/qwen3_next.py" in files  # a hybrid GDN type plan models (arch.py)
    assert not any(f.startswith("srt/models/") and not f.startswith(("srt/models/qwen3_5", "srt/models/qwen3_next.py"))
                   for f in files)


def test_header_names_traced_modules_outside_the_scope(gen):
    text = (REPO / "escha_deploy" / "catalog" / "releases" / "0.5.19" / "late-checks.md").read_text()
    head = text[:text.index("\n## ")]
    trace = gen.load_trace("0.5.19")
    assert "sglang.srt.arg_groups.kv_cache_hook" in trace["modules"] and trace["functions"]
    outside = [m for m in trace["modules"] if m.startswith("sglang.srt.layers.moe.")]
    assert outside, "the pre-flight imports layers/moe (outside the scope)"
    assert "- `srt.layers.moe`: " in head and outside[0].rsplit(".", 1)[1] in head


def test_preflight_needs_the_trace_or_argument_resolution(gen, checks):
    trace = gen.load_trace("0.5.19")
    ran = set(trace["functions"])
    late = next(c for c in checks if c.reads_config and c.file.startswith("srt/mem_cache/") and c.site not in ran)
    resolution = next(c for c in checks if c.reads_config and c.file.startswith("srt/arg_groups/") and c.site not in ran)
    note = {"class": "preflight", "why": "x"}
    errs = gen.problems(checks, {late.key: note, resolution.key: note}, True, trace=trace)
    assert any(late.key in e and "pre-flight never runs" in e for e in errs)
    assert not any(resolution.key in e for e in errs)


def test_a_module_note_does_not_cover_rows_of_an_imported_module(gen, checks):
    trace = gen.load_trace("0.5.19")
    row = next(c for c in checks if c.reads_config and c.module in trace["modules"])
    notes = gen.Notes({}, {row.file: {"class": "not_reachable", "why": "x"}}, frozenset(), frozenset({row.file}))
    errs = gen.problems(checks, notes, trace=trace)
    assert any(row.key in e and "each row needs its own" in e for e in errs)
    outside = next(c for c in checks if c.reads_config and c.module not in trace["modules"])
    notes = gen.Notes({}, {outside.file: {"class": "not_reachable", "why": "x"}}, frozenset(), frozenset({outside.file}))
    assert not any(outside.key in e for e in gen.problems(checks, notes, trace=trace))


def test_a_row_the_fuzz_reached_cannot_be_not_reachable(gen, checks, tmp_path, capsys):
    notes = gen.release_notes("0.5.19")
    row = next(c for c in checks if notes.checks.get(c.key, {}).get("class") == "not_reachable" and c.message)
    reached = tmp_path / "reached.json"
    reached.write_text(json.dumps([{"site": row.site, "message": f"ValueError: {row.message} (drawn)"}]))
    assert gen.main(["--wheel", str(WHEEL), "--check", "--reached", str(reached)]) == 1
    assert f"{row.key!r}: not_reachable, but the fuzz reached it" in capsys.readouterr().err


def test_no_refusal_the_oracle_saw_is_not_reachable(gen):
    """SGLang's refusals in the oracle's saved results (its cases run SGLang's own code) are
    reached: none of them may be classified not_reachable."""
    results = Path(os.environ.get("ESCHA_ORACLE_RESULTS", "/nonexistent"))
    if not results.is_file():
        pytest.skip("no oracle results ($ESCHA_ORACLE_RESULTS; .ci/test saves them)")
    reached = []

    def walk(x):
        if isinstance(x, dict):
            if x.get("ok") is False and x.get("site"):
                reached.append({"site": x["site"], "message": x.get("error", "")})
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(json.loads(results.read_text())["results"])
    assert reached, "the oracle's refusal cases left no SGLang refusal"
    checks = gen.scan(WHEEL)
    notes = gen.release_notes("0.5.19")
    errs = gen.problems(checks, notes, trace=gen.load_trace("0.5.19"), reached=reached)
    assert [e for e in errs if "the fuzz reached it" in e] == []
    site = reached[0]["site"].removeprefix("sglang/")
    row = next(c for c in checks if c.site == site and c.message and c.message[:40] in reached[0]["message"])
    bad = gen.Notes({**notes.checks, row.key: {"class": "not_reachable", "why": "x"}}, notes.modules)
    assert any(row.key in e for e in gen.problems(checks, bad, trace=gen.load_trace("0.5.19"), reached=reached))


def test_the_trace_is_of_todays_shipped_argv(gen):
    """The committed trace ran SGLang's pre-flight on the argv and device figures ``serve`` gives
    it today for each shipped profile (a profile or planner change that alters them means: rerun
    --trace)."""
    trace = gen.load_trace("0.5.19")
    for name, _config, argv, device in gen.shipped_requests("0.5.19"):
        traced = trace["profiles"][name]
        assert (traced["argv"], traced["device"]) == (gen.traced_argv(argv), device), \
            f"{name}: serve's argv or device figures changed since startup-trace.json; rerun scripts/gen_late_checks.py --trace"
        assert traced["ok"] is True and traced["stage"] == "model runner"


def test_annotations_carry_over_by_key(gen):
    own19 = gen.load_annotations(REPO / "escha_deploy" / "catalog" / "releases" / "0.5.19" / "late-checks.yaml")
    own23 = gen.load_annotations(REPO / "escha_deploy" / "catalog" / "releases" / "0.5.23" / "late-checks.yaml")
    assert not [k for k, v in own23.items() if own19.get(k) == v], "0.5.23's file repeats 0.5.19's entries"
    notes = gen.release_notes("0.5.23")
    key = "srt/managers/cache_controller.py:HiCacheController.__init__:storage_backend is not None and except ValueError"
    assert key in own19 and key not in own23 and notes.checks[key] == own19[key]
    assert key not in notes.own_checks  # a key gone from 0.5.23 would not be its error





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
