"""``plan --sglang-version B --compare A``: one profile planned for two releases on one host."""

from __future__ import annotations

import json
import re

ARGS = ("plan", "--profile", "rtx5060ti-tp2-fp8", "--sglang-version", "0.5.23", "--compare", "0.5.19",
        "--host-ram", "32GiB", "--linux", "--set", "runtime.needs=[]")


def _rows(out: dict) -> dict:
    return {r["item"]: r for r in out["rows"]}


def test_compare_names_the_guard_auto_size_and_verdict(cli):
    r = cli(*ARGS, "-f", "json")
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert (out["a"], out["b"]) == ("0.5.19", "0.5.23")
    rows = _rows(out)
    assert (rows["host guard"]["a"], rows["host guard"]["b"]) == ("per-pool-available", "cgroup-bounded")
    assert rows["host guard"]["changed"] and not rows["host guard reads as available"]["changed"]
    assert rows["auto-size would pick"]["a"] == "-" and rows["auto-size would pick"]["b"].startswith("ratio ")
    assert rows["verdict"]["a"] == rows["verdict"]["b"] == "ok"
    assert out["argv_a_on_b"] == []


def test_compare_lists_the_flags_the_new_release_refuses_and_exits_3(cli):
    r = cli(*ARGS, "--set", "runtime.extra_args=[--stream-output,--enable-dp-attention]")
    assert r.code == 3
    assert "--stream-output: unknown to sglang 0.5.23 (error)" in r.out
    assert "--enable-dp-attention: deprecated in sglang 0.5.23; use --attn-dp-size <dp-size> (warning)" in r.out


def test_compare_shows_the_series_refusal_on_the_new_release(cli, series_only_where_made):
    """Without our series for 0.5.23 (runtime_patches/ as before its rebase) the new release is
    refused (with it, as committed, both are ok: docs/runtime.md's upgrade report)."""
    r = cli("plan", "--profile", "rtx5060ti-tp2-fp8", "--sglang-version", "0.5.23", "--compare", "0.5.19",
            "--host-ram", "32GiB", "--linux", "-f", "json")
    assert r.code == 3
    rows = _rows(json.loads(r.out))
    assert (rows["verdict"]["a"], rows["verdict"]["b"]) == ("ok", "unsafe")


def test_compare_with_an_unsupported_release_is_bad_input(cli):
    r = cli(*ARGS[:6], "0.4.0", *ARGS[7:])
    assert r.code == 2 and "--compare: SGLang 0.4.0 is not a supported release" in r.err


def test_compare_on_a_described_host_prints_both_sides_reasons_and_no_negative_size(cli, series_only_where_made):
    """A release without our series (0.5.23 with runtime_patches/ as before its rebase) beside the planned 0.5.19 on a described
    16 GiB WSL2 VM: the title names that host (it said "on this host"), one reading's share below
    the reserve is 0 as the plain plan prints it (it was -0.50 GiB), and each side's verdict
    reasons are listed (only 0.5.19's were, so nothing said why 0.5.23 is unsafe)."""
    r = cli("plan", "--profile", "rtx5060ti-tp2", "--compare", "0.5.23", "--host-ram", "16GiB", "--wsl2")
    assert r.code == 0, r.err  # the planned release, 0.5.19, is ok
    lines = r.out.splitlines()
    assert lines[0].strip() == "rtx5060ti-tp2: SGLang 0.5.23 -> 0.5.19 on the described wsl2 host (--host-ram)"
    assert not re.search(r"-\d[\d.]* GiB|\(-\d", r.out) and "this host" not in r.out
    share = next(x for x in lines if "one reading's share" in x)
    assert share.count("0.00 GiB (0.00 GB)") == 2, share
    text = " ".join(r.out.split())
    a = text.index("0.5.23: unsafe - runtime.needs: hicache-host-reserve-env")
    assert "come from our patch series, which exists for SGLang 0.5.19; the plan is for SGLang 0.5.23 (--compare)" in text
    b = text.index("0.5.19: ok - pinned 7.44 GB fits")
    assert a < b
    out = json.loads(cli("plan", "--profile", "rtx5060ti-tp2", "--compare", "0.5.23", "--host-ram", "16GiB",
                         "--wsl2", "-f", "json").out)
    assert out["host"] == "the described wsl2 host (--host-ram)"
    assert out["reasons_a"][0].startswith("runtime.needs: ") and out["reasons_b"][0].startswith("pinned 7.44 GB")
    assert _rows(out)["one reading's share per rank"]["a"] == "0.00 GiB (0.00 GB)"


def test_compare_help_says_what_is_printed(cli):
    """The help said "Also plan SGLang release A" but only the comparison is printed."""
    text = " ".join(cli("plan", "--help").out.split())
    assert "Also plan SGLang release A" not in text
    assert "--compare A Instead of the plan, print how it compares with the plan for SGLang release A" in text
    assert "each release's verdict reasons" in text


def test_compare_auto_size_refusal_reads_none_not_a_negative_ratio(cli):
    """On the 16 GiB WSL2 VM 0.5.23's auto-size leaves no host memory after its reserve: the
    row said "ratio -0.4... (refused)"; it says none."""
    r = cli("plan", "--profile", "rtx5060ti-tp2", "--compare", "0.5.23", "--host-ram", "16GiB", "--wsl2", "-f", "json")
    row = _rows(json.loads(r.out))["auto-size would pick"]
    assert row["a"] == "none (refused: no host memory left after the reserve)", row
    assert not re.search(r"ratio -", r.out)
