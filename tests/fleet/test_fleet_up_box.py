"""``fleet up --box NAME`` is ``escha-deploy up`` with the box's profile and overrides: on the
real dockerd, both refuse the same way before creating anything (the image is absent), and a
node of a multi-node instance is sent to its compose file."""

from __future__ import annotations

import pytest
import yaml

from escha_deploy.cli.main import main

PROFILE = "rtx5060ti-tp2-fp8"
MISSING = "escha-none:not-built"


def run(capsys, *args: str, out: list | None = None) -> tuple[int, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    if out is not None:
        out.append(captured.out)
    return code, captured.err


def _not_this_box(err: str) -> str:
    """``err`` without the line saying the dry run plans this machine, not the described box."""
    return "".join(ln for ln in err.splitlines(keepends=True) if not ln.startswith("warning: fleet up --box "))


def test_dry_run_of_a_described_box_says_it_plans_this_machine(tmp_path, capsys):
    """r1 is described as 64 GiB (fleet plan plans that); the dry run here plans this machine:
    one warning names what differs and fleet plan's ratio (this machine is not 64 GiB)."""
    from escha_deploy.facts.machine import gather_host_facts

    if gather_host_facts().memory_base_bytes == 64 * 2**30:
        pytest.skip("this machine is the described box")
    code, err = run(capsys, "fleet", "up", fleet(tmp_path), "--box", "r1", "--dry-run", "--format", "json")
    line = next((ln for ln in err.splitlines() if ln.startswith("warning: fleet up --box r1 --dry-run")), None)
    assert line is not None, err
    assert "plans this machine, not r1" in line and "64.00 GiB for r1" in line and "fleet plan gave r1" in line


def test_fleet_plan_table_shows_each_boxs_warnings(tmp_path, capsys):
    doc = yaml.safe_load(open(fleet(tmp_path)))
    doc["boxes"][0]["platform"] = "wsl2"  # an unmeasured WSL2 pinned ceiling: a plan warning
    path = tmp_path / "wsl.yaml"
    path.write_text(yaml.safe_dump(doc))
    mine: list = []
    code, err = run(capsys, "fleet", "plan", str(path), out=mine)
    assert any(ln.startswith("warning: box r1: WSL2 limits pinned memory") for ln in err.splitlines()), err


def fleet(tmp_path) -> str:
    doc = {"name": "lab", "boxes": [
        {"name": "r1", "address": "127.0.0.1", "profile": PROFILE, "host_ram": "64GiB",
         "set": [f"container.image={MISSING}", "container.port=31234"]},
        {"name": "n0", "address": "127.0.0.1", "profile": PROFILE, "host_ram": "64GiB"},
        {"name": "n1", "address": "127.0.0.1", "profile": PROFILE, "host_ram": "64GiB"}],
        "groups": [{"name": "chat", "boxes": ["r1"]}, {"name": "big", "nodes": 2, "boxes": ["n0", "n1"]}]}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.docker
def test_up_box_is_up_with_the_boxes_profile(tmp_path, capsys):
    path = fleet(tmp_path)
    code_up, err_up = run(capsys, "up", "--profile", PROFILE, "--set", f"container.image={MISSING}", "--detach")
    code_box, err_box = run(capsys, "fleet", "up", path, "--box", "r1")
    assert code_up == code_box == 3
    errors = lambda err: [ln for ln in err.splitlines() if ln.startswith(("error:", "hint:"))]  # noqa: E731
    assert errors(err_box) == errors(err_up) and errors(err_box)


def test_dry_run_is_ups_dry_run_with_the_boxes_overrides(tmp_path, capsys):
    import json

    path = fleet(tmp_path)
    sets = ["--set", f"container.image={MISSING}", "--set", "container.port=31234"]
    mine: list = []
    code_up, err_up = run(capsys, "up", "--profile", PROFILE, *sets, "--dry-run", "--format", "json", out=mine)
    up = json.loads(mine[0])
    got: list = []
    code_box, err_box = run(capsys, "fleet", "up", path, "--box", "r1", "--dry-run", "--format", "json", out=got)
    box = json.loads(got[0])
    # the same preflight, the same refusals; and one line saying this machine is not r1
    assert box == up and code_box == code_up and _not_this_box(err_box) == err_up
    assert code_up == (3 if up["refusals"] else 0)  # the image is absent wherever a daemon answers
    assert box["container"]["image"] == MISSING and "31234" in box["argv"]


def test_a_node_is_started_from_its_compose_file(tmp_path, capsys):
    code, err = run(capsys, "fleet", "up", fleet(tmp_path), "--box", "n1")
    assert code == 3 and "node 1 of the multi-node instance big-0" in err and "fleet compose" in err


def test_up_needs_exactly_one_target(tmp_path, capsys):
    path = fleet(tmp_path)
    assert run(capsys, "fleet", "up", path)[0] == 2
    code, err = run(capsys, "fleet", "up", path, "--box", "zz")
    assert code == 2 and "unknown box 'zz'" in err


@pytest.mark.parametrize("extra_set, unsafe", [([], False), (["hicache.hicache_ratio=100"], True)])
def test_dry_run_prints_what_ups_dry_run_prints(tmp_path, capsys, extra_set, unsafe):
    """The table form too: the facts header with each fact's source, the verdict and its
    reasons, the warnings, the container, the argv and up's preflight checks, byte for byte as
    `up --dry-run` prints them for the box's profile and `set`; and the same exit (3 when up
    would refuse: an unsafe plan, or, wherever a daemon answers, the absent image)."""
    path = fleet(tmp_path)
    if extra_set:
        doc = yaml.safe_load(open(path))
        doc["boxes"][0]["set"] += extra_set
        doc["boxes"][0]["host_ram"] = "4096GiB"  # the fleet plan of the described box stays ok
        open(path, "w").write(yaml.safe_dump(doc))
    sets = [x for s in [f"container.image={MISSING}", "container.port=31234", *extra_set] for x in ("--set", s)]
    up_out: list = []
    code_up, err_up = run(capsys, "up", "--profile", PROFILE, *sets, "--dry-run", out=up_out)
    box_out: list = []
    code_box, err_box = run(capsys, "fleet", "up", path, "--box", "r1", "--dry-run", out=box_out)
    assert code_up == code_box
    errors = [ln for ln in err_up.splitlines() if ln.startswith("error: ")]
    assert code_up == (3 if errors else 0) and (not unsafe or any(e.startswith("error: plan: ") for e in errors))
    # MemAvailable is measured by each run (the refusal quotes it): numbers are compared as N
    import re

    n = lambda t: re.sub(r"\d[\d,.]*", "N", t)  # noqa: E731
    assert n(box_out[0]) == n(up_out[0])
    assert n(_not_this_box(err_box)) == n(err_up)
    text = box_out[0]
    assert text.startswith("# facts the plan used, and where each came from\n")
    assert "# verdict " in text and "MemTotal" in text and "# server argv" in text
    assert "warning: " in err_box
