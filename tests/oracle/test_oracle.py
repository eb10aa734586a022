"""SGLang 0.5.19 as the oracle: its own argument resolution, memory defaults and host-pool
classes, run on the CPU (``scripts/sglang_oracle.py``), against ``plan`` for every shipped
profile, a generated matrix (48 cases) and the configurations SGLang refuses; and each other
supported release's host-pool classes on a few cases (``test_another_releases_host_pools_agree_with_plan``).

Marked ``wheel``: needs the flag-catalog venv (``.ci/check-flag-catalog.sh`` builds it; CI runs
the same check as its own step, ``python -m tests.oracle.cases``, and saves SGLang's results
to ``$ESCHA_ORACLE_RESULTS``, which these tests reuse instead of importing SGLang again).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import escha_deploy.planner as planner_mod
from escha_deploy.sglang import releases
from escha_deploy.planner import device as devmod
from escha_deploy.planner import pools as poolsmod
from escha_deploy.sglang.releases import default_release, supported_releases

from . import cases as oc

VENV = Path(os.environ.get("ESCHA_ORACLE_VENV") or os.environ.get("ESCHA_FLAGCAT_VENV")
            or oc.REPO / ".cache" / "flagcat-venv")

pytestmark = [
    pytest.mark.wheel,
    pytest.mark.skipif(not (VENV / "bin" / "python").exists(), reason=f"no flag-catalog venv at {VENV}"),
]


@pytest.fixture(scope="module")
def sglang_results(tmp_path_factory):
    saved = os.environ.get("ESCHA_ORACLE_RESULTS")
    if saved and Path(saved).is_file():
        results = json.loads(Path(saved).read_text())
        # results saved before a case was added: SGLang answers the missing cases now
        have = {r["id"] for r in results["results"]}
        missing = [oc.build_case(c)[0] for c in oc.all_cases() if c.id not in have]
        if missing:
            extra = oc.run_oracle(missing, tmp_path_factory.mktemp("oracle"), VENV)
            results = {**results, "results": results["results"] + extra["results"]}
        return results
    cases = [oc.build_case(c)[0] for c in oc.all_cases()]
    return oc.run_oracle(cases, tmp_path_factory.mktemp("oracle"), VENV)


def _check(results, tmp_path):
    return oc.check_all(oc.all_cases(), tmp_path, VENV, oracle_results=results)


def test_plan_agrees_with_sglang_on_every_case(sglang_results, tmp_path):
    diffs, n_cases, n_fields, _, _ = _check(sglang_results, tmp_path)
    assert diffs == []
    assert n_cases >= 40 + 3 and n_fields >= 400
    by_id = {r["id"]: r for r in sglang_results["results"]}
    # the comparison saw real values on both sides: host pools of hybrid and dense cases
    assert by_id["shipped-rtx5060ti-tp2-fp8"]["pools"]["mamba_slots"] > 0
    assert by_id["m02-tp1-12GiB-p1-dense"]["pools"]["kv_tokens"] > 0
    assert by_id["shipped-rtx5060ti-tp2"]["defaults"]["reserved_mib"] == 4192  # 12 GiB, TP 2


def test_sglang_refuses_what_plan_refuses(sglang_results):
    by_id = {r["id"]: r for r in sglang_results["results"]}
    page = by_id["refuse-page64-no-buffer"]["resolve"]
    assert not page["ok"] and page["site"].endswith("mamba_hook.py:validate_mamba_no_buffer")
    radix = by_id["refuse-hicache-no-radix"]["resolve"]
    assert not radix["ok"] and "mutually exclusive" in radix["error"]
    slots = by_id["refuse-slots-below-one-request"]["device"]
    assert slots["site"].endswith("kv_cache_configurator.py:resolve_max_num_reqs") and "too small" in slots["error"]
    assert "Unsupported layout: layer_first" in by_id["refuse-layer-first-hybrid"]["pools"]["error"]
    assert "page_first_kv_split" in by_id["refuse-kv-split-dense"]["pools"]["error"]
    for case in oc.REFUSAL_CASES:
        assert oc.plan_refuses(oc.build_case(case)[1]), case.id


def test_shipped_profiles_pass_sglangs_argument_check(sglang_results):
    by_id = {r["id"]: r for r in sglang_results["results"]}
    for case in oc.shipped_cases():
        assert by_id[case.id]["resolve"]["ok"], by_id[case.id]["resolve"]


def test_a_wrong_planner_constant_fails_the_check(sglang_results, tmp_path, monkeypatch):
    """The harness itself: a planner that believed SGLang's small-card tier were 4096 tokens
    of chunked prefill, that mamba state took 0.8 (not 0.9) of the rest, or that host pools had
    no extra page, is caught, field named."""
    real = devmod.tier_defaults
    monkeypatch.setattr(devmod, "tier_defaults",
                        lambda mib, tp, release=None: (4096, 8) if mib < 20 * 1024 else real(mib, tp, release))
    diffs, *_ = _check(sglang_results, tmp_path)
    assert any(": chunked_prefill_size: plan 4096, SGLang 2048" in d for d in diffs), diffs[:5]
    assert any(": reserved_mib:" in d for d in diffs)
    monkeypatch.setattr(devmod, "tier_defaults", real)
    monkeypatch.setattr(planner_mod, "MAMBA_FULL_MEMORY_RATIO", 0.8)  # SGLang's default is 0.9
    diffs, *_ = _check(sglang_results, tmp_path)
    assert any(": device_mamba_slots: plan" in d for d in diffs) and any(": device_kv_tokens: plan" in d for d in diffs)
    monkeypatch.setattr(planner_mod, "MAMBA_FULL_MEMORY_RATIO", 0.9)
    monkeypatch.setattr(poolsmod, "_round_pages", lambda size, page: size // page * page)
    diffs, *_ = _check(sglang_results, tmp_path)
    assert any(": host_kv_tokens: plan" in d for d in diffs) and any(": host_mamba_slots: plan" in d for d in diffs)


def _oracle_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sglang_oracle_under_test", oc.ORACLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # standard library only at import
    return module


def _raised(code: str, filename: str) -> BaseException:
    try:
        exec(compile(code, filename, "exec"), {})
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("did not raise")


def test_a_harness_call_that_does_not_fit_the_release_is_a_harness_failure():
    """A TypeError/AttributeError of the harness's own call or stand-in is its fault (exit 1),
    never counted as SGLang's refusal; the same types raised inside SGLang's files are answers."""
    m = _oracle_module()
    spy = TypeError("install_reserve_spy.<locals>.wrapped() missing 1 required positional argument: 'gpu_mem'")
    assert m._harness_fault(spy)
    assert m._harness_fault(_raised("object().stamp_derived_widths()", str(oc.ORACLE)))
    assert not m._harness_fault(_raised("object().x()", "site-packages/sglang/srt/arg_groups/mamba_hook.py"))
    assert not m._harness_fault(_raised("raise ValueError('no')", str(oc.ORACLE)))
    with pytest.raises(m.HarnessFailure, match="case c1: resolve: TypeError: install_reserve_spy"):
        m._refusal_or_fault(spy, {"id": "c1"}, "resolve")
    # the two releases whose host pools the oracle runs (their constructors adapted: host_pools)
    assert all(m.load_adapter(v)["pools"] is True for v in ("0.5.19", "0.5.23"))


def test_each_release_has_its_oracle_adapter_as_data(tmp_path, monkeypatch, capsys):
    """Every supported release has an adapter file the oracle takes
    (``releases/VERSION/oracle-adapter.json``), and only those; a release without one, or with
    a key or value the oracle does not know, is one line naming the file, exit 2, before any
    case runs."""
    m = _oracle_module()
    assert m.adapted_releases() == sorted(releases.supported_releases())
    assert m.load_adapter(releases.default_release())["pools"] is True
    for version in releases.supported_releases():
        adapter = m.load_adapter(version)
        assert adapter["pools"] is True or adapter["pools"].startswith("not adapted: "), version
    fake = tmp_path / "releases"
    (fake / "9.9.9").mkdir(parents=True)
    monkeypatch.setenv(m.RELEASES_DIR_ENV, str(fake))
    with pytest.raises(ValueError, match=r"installed sglang is 9\.9\.9: no .*oracle-adapter\.json \(adapted: none\)"):
        m.load_adapter("9.9.9")
    (fake / "9.9.9" / m.ADAPTER_FILE).write_text(json.dumps(
        {"gpu_mem": "guess", "device": 1, "pools": True, "source": "x", "extra": 0}))
    with pytest.raises(ValueError) as e:
        m.load_adapter("9.9.9")
    assert str(e.value).count("\n") == 0
    assert "extra: unknown key" in str(e.value) and "gpu_mem: 'guess' is not one of" in str(e.value)
    assert "device: 1 is not one of" in str(e.value)  # 1 is not True
    monkeypatch.setattr("importlib.metadata.version", lambda name: "9.9.9")  # the installed sglang, as run reads it
    with pytest.raises(SystemExit) as ex:
        m.run([])
    assert ex.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: {fake / '9.9.9' / m.ADAPTER_FILE}: ")


def test_sglang_sizes_the_speculative_draft_as_plan_does(sglang_results):
    """SGLang's own pool sizing with --speculative-algorithm EAGLE3 and a 1-layer draft (the dense
    64-layer case, fp8, TP 2: 65,536 B per token): its token count is the plan's, and it is the
    count with the draft's weights out of the budget and its layer in the cell, not without."""
    by_id = {r["id"]: r for r in sglang_results["results"]}
    case = next(c for c in oc.SPECULATIVE_CASES if c.id == "spec-eagle3-dense-draft")
    _, planner = oc.build_case(case)
    budget = int((12 * 2**30 - 512 * 2**20) * 0.825) - (16_200_000_000 + 10**9) // 2  # target + draft per rank
    scaled = int(65_536 * (1 + 1 / 64))
    assert by_id[case.id]["resolve"]["ok"], by_id[case.id]["resolve"]
    assert by_id[case.id]["device"]["kv_tokens"] == planner["device_kv_tokens"] == budget // scaled == 23_845
    assert budget // 65_536 != 23_845 and (budget + 10**9 // 2) // scaled != 23_845


def test_sglang_sizes_nextn_on_the_models_own_mtp_layer_as_plan_does(sglang_results, tmp_path):
    """The speculative hybrid cases, sized by SGLang 0.5.19 with the algorithm set: NEXTN on the
    model's own MTP layer packs one layer into the host KV pool (SGLang's own
    ``_can_pack_hicache_mtp``; ``get_size_per_token``: 17,408 B per token per rank at 15 GiB WSL2,
    where the plan's ratio keeps the pinned total in its budget), an EAGLE3 draft gets a sidecar
    pool at the target host pool's tokens, and 30 slots with 6 requests leave no KV budget once
    SGLang takes 1,098,252,288 B of intermediate states: it raises, and plan refuses."""
    by_id = {r["id"]: r for r in sglang_results["results"]}
    cases = {c.id: c for c in oc.SPECULATIVE_CASES}
    diffs, *_ = oc.check_all(list(cases.values()), tmp_path, VENV, oracle_results=sglang_results)
    assert diffs == []
    own = by_id["spec-nextn-own-wsl2-15g"]
    _, planner = oc.build_case(cases["spec-nextn-own-wsl2-15g"])
    assert own["device"]["draft"]["mode"] == "packed" and own["device"]["kv_bytes_per_token"] == 17_408
    assert own["pools"]["kv_bytes"] == own["pools"]["kv_tokens"] * 17_408 == planner["host_kv_bytes"]
    prof, host, draft = _planned(cases["spec-nextn-own-wsl2-15g"])
    result = planner_mod.plan(prof, host, draft=draft)
    assert result.per_rank.host_kv_bytes_per_token == 17_408
    assert result.pinned_total_bytes <= result.budget.pinned_budget_bytes
    side = by_id["spec-eagle3-hybrid-sidecar"]
    assert side["device"]["draft"]["mode"] == "sidecar"
    assert side["pools"]["draft_kv_tokens"] == side["pools"]["kv_tokens"] + 1 and side["pools"]["draft_kv_bytes"] > 0
    side = by_id["spec-eagle3-hybrid-sidecar-p64"]["pools"]  # 0.5.19: an independent pool, + one page of 64
    assert side["draft_kv_tokens"] == side["kv_tokens"] + 64
    refused = by_id["spec-nextn-refused-30-slots"]["device"]
    assert refused["error"].startswith("ValueError: Loaded weights leave no GPU memory for the KV cache")
    _, planner = oc.build_case(cases["spec-nextn-refused-30-slots"])
    assert planner["verdict"] == "unsafe" and any("1,098,252,288 B" in r for r in planner["reasons"])


def _planned(case):
    """``(profile, host, draft facts)`` as ``build_case`` plans ``case`` (its own-folder draft)."""
    from escha_deploy.sglang.arch import DraftFacts, draft_kv_geometry
    from escha_deploy.facts.machine import described_host
    from escha_deploy.profile import load_profile

    prof = load_profile(case.profile, list(case.overrides))
    heads, head_dim, nextn = draft_kv_geometry(oc.config_json(prof.model.architecture))
    draft = DraftFacts(path="(own)", own_folder=True, weights_bytes=case.draft["weights"], num_layers=1,
                       kv_heads=heads, head_dim=head_dim, nextn_layers=nextn)
    return prof, described_host(case.host_ram, case.platform), draft


#: Cases whose host pools each other release's oracle builds in the pytest run (hybrid and dense,
#: by ratio and by size, page_first and page_first_direct, pages of 1 and 64, a packed NEXTN
#: layer, EAGLE3 sidecars); CI's oracle step runs every case for every release.
POOL_CASES = ("shipped-rtx5060ti-tp2-fp8", "m02-tp1-12GiB-p1-dense", "m05-tp1-16GiB-p1-hybrid",
              "m07-tp1-16GiB-p64-hybrid", "spec-nextn-own-linux", "spec-eagle3-hybrid-sidecar",
              "spec-eagle3-hybrid-sidecar-p64")


def _pools_adapted() -> list[str]:
    """The supported releases after the default one whose oracle adapter runs the host pools
    (``oracle-adapter.json``: ``"pools": true``); one marked ``"not adapted: ..."`` is left out
    (``test_each_release_has_its_oracle_adapter_as_data`` checks every file's values)."""
    m = _oracle_module()
    return [r for r in supported_releases() if r != default_release() and m.load_adapter(r)["pools"] is True]


@pytest.mark.parametrize("release", _pools_adapted())
def test_another_releases_host_pools_agree_with_plan(release, tmp_path):
    """The release's own host-pool classes (0.5.23: built from an ``MHABufferInfo`` with
    ``device_capacity_tokens``, the sidecar through ``_build_mha_mla_host_pool`` with
    ``host_token_capacity``) size the pools as ``plan`` does for that release, field by field,
    with nothing left under ``cannot``; the sidecar at pages of 64 follows the release's
    facts.yaml ``draft_host_pool``. Reuses CI's saved results
    (``.cache/oracle-results-VERSION.json``) when they hold these cases' host pools."""
    from escha_deploy.sglang.releases import load_release

    venv = oc.REPO / ".cache" / f"flagcat-venv-{release}"
    if not (venv / "bin" / "python").exists():
        pytest.skip(f"no flag-catalog venv at {venv}")
    cases = [c for c in oc.all_cases() if c.id in POOL_CASES]
    assert len(cases) == len(POOL_CASES)
    saved = oc.REPO / ".cache" / f"oracle-results-{release}.json"
    results = json.loads(saved.read_text()) if saved.is_file() else None
    if results is not None:
        got = {r["id"]: r for r in results["results"]}
        if results.get("sglang") != release or any(
                c.id not in got or "pools" in (got[c.id].get("cannot") or {}) for c in cases):
            results = None  # saved before these cases or before the host pools ran on this release
    if results is not None:
        results = {**results, "results": [r for r in results["results"] if r["id"] in POOL_CASES]}
    diffs, n_cases, n_fields, _, results = oc.check_all(cases, tmp_path, venv, oracle_results=results,
                                                        release=release)
    assert results["sglang"] == release
    assert diffs == []
    by_id = {r["id"]: r for r in results["results"]}
    assert not any(r.get("cannot") for r in by_id.values()), [r.get("cannot") for r in by_id.values()]
    assert n_fields >= 12 * len(cases)
    assert by_id["shipped-rtx5060ti-tp2-fp8"]["pools"]["mamba_slots"] > 0
    assert by_id["m02-tp1-12GiB-p1-dense"]["pools"]["kv_tokens"] > 0
    packed = by_id["spec-nextn-own-linux"]
    assert packed["device"]["draft"]["mode"] == "packed" and packed["pools"]["kv_bytes"] == \
        packed["pools"]["kv_tokens"] * 17_408
    side = by_id["spec-eagle3-hybrid-sidecar-p64"]["pools"]
    padding = 0 if load_release(release).draft_host_pool.capacity == "shared" else 64
    assert side["kv_tokens"] % 64 == 0 and side["draft_kv_tokens"] == side["kv_tokens"] + padding
