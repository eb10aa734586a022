"""The upgrade report in docs/runtime.md (``scripts/gen_upgrade_report.py``): current, one block
per shipped profile and supported release after the default, and stale text is found."""

from __future__ import annotations

from pathlib import Path

from tests.script_module import load_script

REPO = Path(__file__).resolve().parent.parent


def test_the_report_in_docs_is_current():
    assert load_script("gen_upgrade_report").main(["--check"]) == 0


def test_each_shipped_profile_has_its_comparison():
    gen = load_script("gen_upgrade_report")
    doc = (REPO / "docs" / "runtime.md").read_text(encoding="utf-8")
    part = doc[doc.index(gen.BEGIN):doc.index(gen.END)]
    a, others = gen.releases()
    assert others, "index.yaml supports one release only: nothing to compare"
    for b in others:
        for profile in sorted((REPO / "profiles").glob("*.yaml")):
            head = f"**{profile.stem}**: `escha-deploy plan --profile {profile.stem} --sglang-version {b} --compare {a} "
            assert head in part, profile.stem
    assert part.count("| host guard |") == len(others) * len(list((REPO / "profiles").glob("*.yaml")))


def test_a_stale_report_is_found(monkeypatch, tmp_path):
    gen = load_script("gen_upgrade_report")
    doc = (REPO / "docs" / "runtime.md").read_text(encoding="utf-8")
    stale = tmp_path / "runtime.md"
    stale.write_text(doc.replace("| host guard | per-pool-available |", "| host guard | edited by hand |", 1),
                     encoding="utf-8")
    monkeypatch.setattr(gen, "DOC", stale)
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and stale.read_text(encoding="utf-8") == doc
