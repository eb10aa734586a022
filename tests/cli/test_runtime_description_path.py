"""This machine's runtime description sits where $ESCHA_RUNTIME_DESCRIPTION says (tests never
touch /etc/escha); it never leaks into plans of other boxes, and a stale one is named and
ignored."""

from __future__ import annotations

import json

import pytest

README_HEADLINE = ("plan", "--profile", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2", "--format", "json")


@pytest.fixture
def description(tmp_path, monkeypatch):
    """A stock runtime's description (no capabilities) at an overridden path; ``sglang_dir``
    exists unless the test removes it."""
    sglang = tmp_path / "site-packages" / "sglang"
    sglang.mkdir(parents=True)
    path = tmp_path / "escha" / "runtime.json"
    path.parent.mkdir()
    path.write_text(json.dumps({
        "schema_version": 1, "sglang_version": "0.5.19", "base": "wheel:sglang-0.5.19", "python": "3.11.2",
        "base_inventory_digest": "0" * 64, "inventory_digest": "0" * 64, "base_inventory_committed": True, "sglang_dir": str(sglang),
        "series": [], "capabilities": []}))
    monkeypatch.setenv("ESCHA_RUNTIME_DESCRIPTION", str(path))
    return path, sglang


def test_runtime_describe_reads_the_overridden_path(cli, description):
    r = cli("runtime", "describe", "--format", "json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["sglang_dir"] == str(description[1])


def test_a_described_box_is_planned_with_its_own_runtime_not_this_machines(cli, description):
    """The README's headline with a stock description here: still its figures (ok, 1.45), and
    the plan says which runtime it planned."""
    r = cli(*README_HEADLINE)
    data = json.loads(r.out)
    assert r.code == 0 and data["verdict"] == "ok", data["reasons"]
    assert data["recommended_ratio"] == pytest.approx(1.45)
    assert any(w.startswith("--host-ram describes another box: planned with the profile's runtime.needs")
               and str(description[0]) in w for w in data["warnings"]), data["warnings"]


def test_a_stale_description_is_named_and_ignored(cli, description):
    path, sglang = description
    sglang.rmdir()
    r = cli(*README_HEADLINE)
    data = json.loads(r.out)
    assert r.code == 0 and data["verdict"] == "ok" and data["recommended_ratio"] == pytest.approx(1.45)
    stale = [w for w in data["warnings"] if "stale runtime description" in w]
    assert stale and str(path) in stale[0] and str(sglang) in stale[0] and "ignored" in stale[0]
    here = json.loads(cli("plan", "--profile", "rtx5060ti-tp2-fp8", "--format", "json").out)
    assert any("stale runtime description" in w for w in here["warnings"])
