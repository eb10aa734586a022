"""``plan --sglang-version B --compare A``: one profile planned for two releases on one host."""

from __future__ import annotations

import json

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


def test_compare_shows_the_series_refusal_on_the_new_release(cli):
    r = cli("plan", "--profile", "rtx5060ti-tp2-fp8", "--sglang-version", "0.5.23", "--compare", "0.5.19",
            "--host-ram", "32GiB", "--linux", "-f", "json")
    assert r.code == 3
    rows = _rows(json.loads(r.out))
    assert (rows["verdict"]["a"], rows["verdict"]["b"]) == ("ok", "unsafe")


def test_compare_with_an_unsupported_release_is_bad_input(cli):
    r = cli(*ARGS[:6], "0.5.21", *ARGS[7:])
    assert r.code == 2 and "--compare: SGLang 0.5.21 is not a supported release" in r.err
