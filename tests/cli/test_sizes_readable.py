"""Sizes as people write and read them: ``--host-ram 16G`` says it was read as GB; ``profiles
show`` and ``--keys`` print a size that is no whole unit readably, and it still reads back."""

from __future__ import annotations

import json

import pytest
import yaml

from escha_deploy.utils.units import fmt_size_readable, parse_size


def test_host_ram_with_a_bare_letter_warns_it_was_read_as_gb(cli):
    r = cli("plan", "--host-ram", "16G", "--wsl2", "--format", "json")
    warnings = json.loads(r.out)["warnings"]
    note = next(w for w in warnings if w.startswith("--host-ram:"))
    assert "16G was read as 16 GB = 16,000,000,000 B" in note and "16GiB" in note and "binary" in note
    r = cli("plan", "--host-ram", "16GiB", "--wsl2", "--format", "json")
    assert not [w for w in json.loads(r.out)["warnings"] if w.startswith("--host-ram:")]


def test_profiles_show_prints_sizes_readably_and_they_read_back(cli, tmp_path):
    r = cli("profiles", "show", "rtx5060ti-tp2")
    data = yaml.safe_load(r.out)
    assert data["safety"]["wsl2_hidden_vram_per_gpu"] == "1.31GiB"  # was 1406601789B
    path = tmp_path / "p.yaml"
    path.write_text(r.out)
    assert cli("profiles", "validate", str(path)).code == 0
    again = cli("profiles", "show", str(path), "--format", "json").out
    assert json.loads(again)["safety"] == json.loads(cli("profiles", "show", "rtx5060ti-tp2", "--format", "json").out)["safety"]


@pytest.mark.parametrize("n", [1406601789, 12 * 2**30, 5_900_000_000, 123456789, 2**30 + 1, 7, 0])
def test_readable_size_reads_back_exactly(n):
    assert parse_size(fmt_size_readable(n)) == n


def test_keys_show_extra_args_as_a_list_with_no_flag_of_its_own(cli):
    rows = {r["key"]: r for r in json.loads(cli("profiles", "show", "rtx5060ti-tp2-fp8", "--keys",
                                                 "--format", "json").out)}
    row = rows["runtime.extra_args"]
    assert row["sglang_flag"] == "" and row["unit"].startswith("a list")
    assert rows["container.api_key_file"]["sglang_flag"] == "--api-key"
