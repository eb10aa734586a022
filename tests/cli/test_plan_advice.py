"""A plan leads with its answer, and its advice leads somewhere: every change a shipped profile's
plan names carries it as data (``Plan.fixes``: key and value for ``--set``), and following it
re-plans without that line and without a new refusal (or with verdict ok); a line whose change
cannot remove it says why. Followed two steps deep, no fix comes back to a value it left."""

from __future__ import annotations

import json
import re

import pytest

from escha_deploy.profile import load_profile
from escha_deploy.utils.units import fmt_gib

SHIPPED = ("rtx5060ti-tp2", "rtx5060ti-tp2-fp8", "linux-tp2-l3", "rtx5090-tp2-mtp3-l3")
#: lines that name a change to a profile key (the words a hint uses): each carries a fix or says
#: why it cannot
NAMES_A_CHANGE = re.compile(r"\b(?:lower|raise) (?:it|runtime\.mem_fraction_static)\b|use (?:hicache_size|a ratio) <=")


def _hosts(name: str) -> list[tuple[str, ...]]:
    """The profile's reference box (hardware.host_ram, hardware.platform: both for ``any``), a
    16 GiB WSL2 VM and a 32 GiB Linux box."""
    hw = load_profile(name).hardware
    ref = fmt_gib(hw.host_ram).replace(".00 GiB", "GiB").replace(" ", "") if hw.host_ram else "16GiB"
    platforms = ("wsl2", "linux") if hw.platform == "any" else (hw.platform,)
    hosts = [("--host-ram", ref, f"--{p}") for p in platforms]
    return list(dict.fromkeys(hosts + [("--host-ram", "16GiB", "--wsl2"), ("--host-ram", "32GiB", "--linux")]))


def _plan(cli, name: str, host: tuple[str, ...], sets: tuple[str, ...] = ()) -> dict:
    r = cli("plan", "-p", name, *host, *[x for s in sets for x in ("--set", s)], "-f", "json")
    assert r.code in (0, 3), r.err
    return json.loads(r.out)


def _subject(line: str) -> str:
    """A line's words before its first figure: the same problem with other numbers reads the same."""
    return re.split(r"\d", line, maxsplit=1)[0]


CASES = [(name, host) for name in SHIPPED for host in _hosts(name)]


@pytest.mark.parametrize(("name", "host"), CASES, ids=[f"{n}-{' '.join(h)}" for n, h in CASES])
def test_every_fix_a_shipped_plan_names_leads_toward_ok(cli, name, host):
    seen: set[tuple[str, ...]] = set()

    def follow(plan: dict, sets: tuple[str, ...], depth: int) -> None:
        lines = plan["reasons"] + plan["warnings"]
        fixed = {f["problem"] for f in plan.get("fixes", [])}
        assert all(f["problem"] in lines for f in plan.get("fixes", []))
        for line in lines:
            assert "unset it" not in line
            if NAMES_A_CHANGE.search(line):
                assert line in fixed or "cannot" in line, line
        if depth == 0:
            return
        for item in dict.fromkeys(f"{f['key']}={f['value']}" for f in plan.get("fixes", [])):
            key = item.partition("=")[0]
            after = tuple(s for s in sets if s.partition("=")[0] != key) + (item,)
            assert after not in seen, f"{item} comes back after {sets}: a loop"
            seen.add(after)
            new = _plan(cli, name, host, after)
            problems = [f["problem"] for f in plan["fixes"] if f"{f['key']}={f['value']}" == item]
            new_lines = new["reasons"] + new["warnings"]
            for problem in problems:  # its own line is gone
                assert not any(_subject(x) == _subject(problem) for x in new_lines), (item, problem)
            if new["verdict"] != "ok":  # no new refusal
                old = {_subject(r) for r in plan["reasons"]} if plan["verdict"] == "unsafe" else set()
                assert {_subject(r) for r in new["reasons"]} <= old, (item, new["reasons"])
            follow(new, after, depth - 1)

    follow(_plan(cli, name, host), (), 2)


def test_the_wsl2_fraction_warning_no_longer_loops(cli):
    """The seed box's WSL2 fraction warning used to say "unset it or lower it"; doing so made the
    plan unsafe, whose fix said raise it. Now it says why it cannot go to the WSL2 figure, and
    the fraction the unsafe plan's fix names is the one the warning says the pools need."""
    host = ("--host-ram", "16GiB", "--wsl2")
    for name in ("rtx5060ti-tp2", "rtx5060ti-tp2-fp8"):
        plan = _plan(cli, name, host)
        (warning,) = [w for w in plan["warnings"] if w.startswith("runtime.mem_fraction_static")]
        need = re.search(r"need at least ([\d.]+) of", warning)
        assert "cannot go down to" in warning and need, warning
        assert not any("mem_fraction_static" in f["problem"] for f in plan.get("fixes", []))
        unset = _plan(cli, name, host, ("runtime.mem_fraction_static=null",))  # the old advice
        assert unset["verdict"] == "unsafe"
        (fix,) = unset["fixes"]
        assert (fix["key"], fix["value"]) == ("runtime.mem_fraction_static", need.group(1))
        assert _plan(cli, name, host, (f"{fix['key']}={fix['value']}",))["verdict"] == "ok"


def test_plan_leads_with_its_answer(cli):
    r = cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2")
    d = json.loads(cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2", "-f", "json").out)
    head = "\n".join(r.out.splitlines()[:5])
    assert r.code == 0 and head.startswith("verdict: ok"), r.out
    assert f"largest safe ratio: {d['max_safe_ratio']}   recommended: {d['recommended_ratio']}" in head
    assert "pinned: 3.72 GB per rank, 7.44 GB in total against the pinned budget 7.52 GB" in head
    w = d["host_tier_reach"][0]
    assert f"host tier: not sure any of the {w['prefixes']} prefixes of 8 x 18,000 comes back" in head
    assert "next: on the host this plan describes, `escha-deploy up -p rtx5060ti-tp2 --dry-run`" in head
    # the tables follow; the warnings that said the fraction twice say it once
    assert "Pinned budget" in r.out and r.out.count("mem_fraction_static 0.8 ") == 1


def test_unsafe_plan_names_its_fix_as_the_next_command(cli):
    r = cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2", "--ratio", "2")
    assert r.code == 3
    nxt = r.out.splitlines()[4]
    assert nxt == ("next: `escha-deploy plan -p rtx5060ti-tp2 --host-ram 16GiB --wsl2 "
                   "--set hicache.hicache_ratio=1.48` (the reasons' fix, below)"), nxt
    again = cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2", "--set", "hicache.hicache_ratio=1.48")
    assert again.code == 0 and again.out.startswith("verdict: ok")


def test_readme_shows_the_plans_first_five_lines(cli):
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    r = cli("plan", "--profile", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2")
    head = r.out.splitlines()[:5]
    assert "\n".join(head) + "\n" in readme, head
