"""``fleet plan``: each box planned as ``plan`` plans it, the fleet totals, and the refusals.

The saved doctor reports are made by doctor's own code (``gather_facts`` + ``build_report``) on
the doctor fixture trees of a WSL2 box (16 GB VM, MemTotal 16,314,004 kB) and a Linux box
(MemTotal 65,742,096 kB); the third box is described (``host_ram: 64GiB``).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import yaml

from escha_deploy.cli.main import main
from escha_deploy.doctor.facts import gather_facts
from escha_deploy.facts.gpus import GpuInventory
from escha_deploy.doctor.hostinfo import DockerFacts, ImageFacts
from escha_deploy.doctor.run import build_report
from escha_deploy.utils.errors import BadInput
from escha_deploy.fleet.model import load_fleet
from escha_deploy.facts.factsfile import load_facts_file
from escha_deploy.fleet.plan import plan_fleet

DOCTOR_FIXTURES = Path(__file__).parents[1] / "doctor" / "fixtures"
PROFILE = "rtx5060ti-tp2-fp8"
IMAGE_A = "sha256:" + "a" * 64
IMAGE_B = "sha256:" + "b" * 64


def save_report(tmp: Path, name: str, tree: str, *, mode: str | None = None, image: str | None = IMAGE_A) -> Path:
    """A doctor report as `doctor --format json` writes it, from doctor's real readers on a
    fixture tree; docker, GPUs, the WSL mode and the image are recorded answers."""
    facts = gather_facts(DOCTOR_FIXTURES / tree, {}, docker=lambda: DockerFacts(reachable=False),
                         gpus=lambda: GpuInventory(source="none"), networking_mode=lambda: mode,
                         image=(lambda: ImageFacts(ref="escha-sglang:0.5.19-hicache", id=image)) if image else None)
    report = build_report(facts, None, dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc))
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(report.model_dump(mode="json")))
    return path


def write_fleet(tmp: Path, doc: dict) -> Path:
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def three_boxes(tmp: Path, *, wsl_mode: str | None = "nat", groups=None) -> Path:
    save_report(tmp, "wsl-a", "wsl2-distro-engine", mode=wsl_mode)
    save_report(tmp, "lin-b", "linux-host")
    return write_fleet(tmp, {
        "name": "lab",
        "boxes": [
            # one machine's loopback, a container.port each: every box may serve HTTP (rank 0 or a
            # replica), and two servers on one address and port are refused
            {"name": "wsl-a", "address": "127.0.0.1", "profile": PROFILE, "facts": "wsl-a.json"},
            {"name": "lin-b", "address": "127.0.0.1", "profile": PROFILE, "facts": "lin-b.json", "nic": "eth0",
             "set": ["container.port=30001"]},
            {"name": "lin-c", "address": "127.0.0.1", "profile": PROFILE, "host_ram": "64GiB", "platform": "linux",
             "set": ["container.port=30002"]},
        ],
        **({"groups": groups} if groups is not None else {}),
    })


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_saved_report_reads_back(tmp_path):
    f = load_facts_file(save_report(tmp_path, "w", "wsl2-distro-engine", mode="nat"))
    assert (f.host.platform, f.host.mem_total_bytes, f.host.wsl_networking_mode, f.runtime.image_id) == (
        "wsl2", 16314004 * 1024, "nat", IMAGE_A)
    g = load_facts_file(save_report(tmp_path, "l", "linux-host", mode="nat"))
    assert (g.host.platform, g.host.mem_total_bytes, g.host.wsl_networking_mode) == ("linux", 65742096 * 1024, None)


def test_three_boxes_agree_with_plan_per_box(tmp_path, capsys):
    """Every box's verdict, ratio and pinned total equal `escha-deploy plan` for that box."""
    fleet_file = three_boxes(tmp_path)
    code, out, err = run_cli(capsys, "fleet", "plan", str(fleet_file), "--format", "json")
    assert code == 0, err
    fp = json.loads(out)
    assert [b["box"] for b in fp["boxes"]] == ["wsl-a", "lin-b", "lin-c"]
    single = {"wsl-a": ("--facts", str(tmp_path / "wsl-a.json")),
              "lin-b": ("--facts", str(tmp_path / "lin-b.json"), "--set", "container.port=30001"),
              "lin-c": ("--host-ram", "64GiB", "--linux", "--set", "container.port=30002")}  # each box's `set`
    for b in fp["boxes"]:
        code, out, err = run_cli(capsys, "plan", "-p", PROFILE, *single[b["box"]], "--format", "json")
        assert code == 0, err
        p = json.loads(out)
        assert (b["verdict"], b["hicache_ratio"], b["pinned_total_bytes"]) == (
            p["verdict"], p["hicache"]["ratio"], p["pinned_total_bytes"]), b["box"]
        assert b["plan"]["per_rank"] == p["per_rank"]
    # the 16 GB WSL2 box pins less than the 64 GB Linux boxes; all three serve
    wsl, lin = fp["boxes"][0], fp["boxes"][1]
    # (<=: the fp8 profile's pools, sized to keep SGLang's device floor under WSL2, reach the
    # ratio cap on both)
    assert wsl["hicache_ratio"] <= lin["hicache_ratio"] and wsl["plan"]["host_source"] == "facts"
    assert fp["boxes"][2]["plan"]["host_source"] == "described"
    assert fp["total_instances"] == 3 and fp["total_gpus"] == 6
    assert fp["host_tier_bytes"] == sum(b["pinned_total_bytes"] for b in fp["boxes"])
    assert fp["host_tier_tokens"] == sum(b["host_kv_tokens"] for b in fp["boxes"]) > 0
    assert fp["verdict"] == "ok" and fp["problems"] == []


def test_table_names_every_box(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "fleet", "plan", str(three_boxes(tmp_path)))
    assert code == 0
    for name in ("wsl-a", "lin-b", "lin-c", "3 instances, 6 GPUs"):
        assert name in out


def test_wsl2_nat_box_is_refused_as_a_multinode_member(tmp_path, capsys):
    groups = [{"name": "big", "nodes": 2, "boxes": ["lin-b", "wsl-a"]}, {"name": "chat", "boxes": ["lin-c"]}]
    code, out, err = run_cli(capsys, "fleet", "plan", str(three_boxes(tmp_path, groups=groups)), "--format", "json")
    assert code == 3
    fp = json.loads(out)
    assert len(fp["problems"]) == 1
    assert "box wsl-a" in fp["problems"][0] and "networking mode nat" in fp["problems"][0]
    assert "peer nodes cannot reach" in fp["problems"][0]
    assert "refused: box wsl-a" in err
    # every box's own plan is still ok: the refusal is the fleet's
    assert {b["verdict"] for b in fp["boxes"]} == {"ok"}


def test_wsl2_box_in_mirrored_mode_may_join(tmp_path):
    groups = [{"name": "big", "nodes": 2, "boxes": ["lin-b", "wsl-a"]}]
    fp = plan_fleet(load_fleet(three_boxes(tmp_path, wsl_mode="mirrored", groups=groups)))
    assert fp.problems == [] and fp.verdict == "ok"
    assert fp.total_instances == 1 and fp.instances[0].gpus == 4
    # the box outside any group is named
    assert any("lin-c" in w for w in fp.warnings)


def test_wsl2_nat_box_serves_as_a_replica(tmp_path):
    fp = plan_fleet(load_fleet(three_boxes(tmp_path, wsl_mode="nat")))
    assert fp.verdict == "ok"


def test_different_image_digests_in_one_instance_are_refused(tmp_path):
    save_report(tmp_path, "lin-b", "linux-host")
    save_report(tmp_path, "lin-d", "linux-host", image=IMAGE_B)
    fleet_file = write_fleet(tmp_path, {"name": "lab", "boxes": [
        {"name": "lin-b", "address": "127.0.0.1", "profile": PROFILE, "facts": "lin-b.json"},
        {"name": "lin-d", "address": "127.0.0.1", "profile": PROFILE, "facts": "lin-d.json"}],
        "groups": [{"name": "big", "nodes": 2, "boxes": ["lin-b", "lin-d"]}]})
    fp = plan_fleet(load_fleet(fleet_file))
    assert fp.verdict == "unsafe"
    assert any("different images" in p and "lin-d sha256:bbbbbbbbbbbb" in p for p in fp.problems)


def test_an_unsafe_box_makes_the_fleet_exit_3(tmp_path, capsys):
    fleet_file = write_fleet(tmp_path, {"name": "lab", "boxes": [
        {"name": "ok-box", "address": "127.0.0.1", "profile": PROFILE, "host_ram": "64GiB"},
        {"name": "tiny", "address": "127.0.0.1", "profile": PROFILE, "host_ram": "8GiB", "platform": "wsl2",
         "set": ["hicache.hicache_ratio=4", "container.port=30001"]}]})
    code, out, err = run_cli(capsys, "fleet", "plan", str(fleet_file), "--format", "json")
    fp = json.loads(out)
    assert code == 3 and fp["verdict"] == "unsafe"
    assert [b["verdict"] for b in fp["boxes"]] == ["ok", "unsafe"]
    assert any(p.startswith("box tiny: plan is unsafe") for p in fp["problems"])


@pytest.mark.parametrize("doc,expect", [
    ({"name": "lab", "boxes": [{"name": "a", "adress": "x", "profile": PROFILE, "host_ram": "8GiB"}]},
     ["boxes.0.address: required key is missing", "boxes.0.adress: unknown key (did you mean address?)"]),
    ({"name": "lab", "boxes": [{"name": "a", "address": "x", "profile": PROFILE, "host_ram": "8GiB"},
                               {"name": "a", "address": "y", "profile": PROFILE, "host_ram": "8GiB"}]},
     ["boxes.1.name: box 'a' is defined twice"]),
    ({"name": "lab", "boxes": [{"name": "a", "address": "x", "profile": PROFILE}]},
     ["boxes.0: give facts (a saved doctor report) or host_ram (and platform)"]),
    ({"name": "lab", "boxes": [{"name": "a", "address": "x", "profile": PROFILE, "host_ram": "8GiB"}],
      "groups": [{"name": "g", "boxes": ["a", "zz"], "nodes": 2}]},
     ["groups.0.boxes.1: unknown box 'zz' (boxes: a)"]),
    ({"name": "lab", "boxes": [{"name": "a", "address": "x", "profile": PROFILE, "host_ram": "8GiB"}],
      "router": {"box": "a", "expose": True}},
     ["router.expose: listening beyond 127.0.0.1 needs api_key_file"]),
    ({"name": "Lab_1", "boxes": [{"name": "a", "address": "x", "profile": PROFILE, "host_ram": "8"}]},
     ["name: String should match pattern", "boxes.0.host_ram:"]),
])
def test_bad_fleet_files_name_file_line_and_key(tmp_path, doc, expect):
    path = write_fleet(tmp_path, doc)
    with pytest.raises(BadInput) as info:
        load_fleet(path)
    lines = info.value.problems
    assert len(lines) == len(expect), lines
    for line, want in zip(lines, expect):
        assert line.startswith(f"{path}:") and want in line, line


def test_bad_fleet_file_exits_2_one_line_per_problem(tmp_path, capsys):
    path = write_fleet(tmp_path, {"name": "lab", "boxes": [{"name": "a", "address": "x", "profile": "no-such"
                                                            , "host_ram": "8GiB"}]})
    code, out, err = run_cli(capsys, "fleet", "plan", str(path))
    assert code == 2 and out == ""
    assert err.splitlines()[0].startswith(f"error: {path}:5: boxes.0.profile: unknown profile 'no-such'")


def test_every_problem_of_a_fleet_file_is_reported_with_its_line(tmp_path, capsys):
    """A typo'd key and an unknown profile in one box, a bad `set` item and a bad value in
    another, a bad profile file in a third: each is one line naming file:line and the key, all
    of them (the profile ones used to wait until the file was otherwise valid), exit 2."""
    (tmp_path / "mine.yaml").write_text("extends: rtx5060ti-tp2-fp8\nhicache:\n  hicache_ratoi: 2\n")
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "name: lab\n"
        "boxes:\n"
        "  - name: a\n"
        "    address: 127.0.0.1\n"
        "    profile: rtx5060ti-tp2-fp9\n"
        "    host_rma: 64GiB\n"
        "  - name: b\n"
        "    address: 127.0.0.1\n"
        f"    profile: {PROFILE}\n"
        "    host_ram: 64GiB\n"
        "    set:\n"
        "      - container.expose=true\n"
        "      - container.prot=31000\n"
        "    platform: macos\n"
        "  - name: c\n"
        "    address: 127.0.0.1\n"
        "    profile: mine.yaml\n"
        "    host_ram: 64GiB\n")
    code, out, err = run_cli(capsys, "fleet", "plan", str(path))
    assert code == 2 and out == ""
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 5, err
    want = [(5, "boxes.0.profile: unknown profile 'rtx5060ti-tp2-fp9'"),
            (6, "boxes.0.host_rma: unknown key (did you mean host_ram?)"),
            (13, "boxes.1.set.1: --set container.prot: unknown key"),
            (14, "boxes.1.platform: "),
            (17, f"boxes.2.profile: {tmp_path / 'mine.yaml'}:3: hicache.hicache_ratoi: unknown key")]
    for line, (n, text) in zip(lines, want):
        assert line.startswith(f"error: {path}:{n}: {text}"), (line, n, text)


def test_a_doctor_report_and_a_facts_file_plan_alike_in_plan_and_fleet(tmp_path, capsys):
    """docs/scale-out.md saves `doctor --format json` as a box's facts: `plan --facts` reads the
    same report (one conversion, factsfile.facts_from_doctor_report) and plans what `fleet plan`
    plans; a file `plan --write-facts` wrote is read back by both the same way."""
    report = save_report(tmp_path, "wsl-a", "wsl2-distro-engine", mode="nat")
    code, out, err = run_cli(capsys, "plan", "-p", PROFILE, "--facts", str(report), "--format", "json")
    assert code == 0, err
    p = json.loads(out)
    assert p["host_source"] == "facts" and p["budget"]["memory_base_bytes"] <= 16314004 * 1024
    written = tmp_path / "wsl-a-facts.json"
    code, _, err = run_cli(capsys, "plan", "-p", PROFILE, "--facts", str(report), "--write-facts", str(written))
    assert code == 0, err and json.loads(written.read_text())["schema_version"] == 1
    for facts in ("wsl-a.json", written.name):
        fleet_file = write_fleet(tmp_path, {"name": "one", "boxes": [
            {"name": "wsl-a", "address": "127.0.0.1", "profile": PROFILE, "facts": facts}]})
        code, out, err = run_cli(capsys, "fleet", "plan", str(fleet_file), "--format", "json")
        assert code == 0, err
        [b] = json.loads(out)["boxes"]
        assert (b["verdict"], b["hicache_ratio"], b["pinned_total_bytes"]) == (
            p["verdict"], p["hicache"]["ratio"], p["pinned_total_bytes"]), facts
        assert b["plan"]["per_rank"] == p["per_rank"]
    code, out, err = run_cli(capsys, "plan", "-p", PROFILE, "--facts", str(written), "--format", "json")
    assert code == 0 and json.loads(out)["pinned_total_bytes"] == p["pinned_total_bytes"]


def test_a_facts_file_of_another_schema_says_how_to_write_one(tmp_path, capsys):
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps({"schema_version": 99, "host": {}}))
    code, _, err = run_cli(capsys, "plan", "-p", PROFILE, "--facts", str(bad))
    assert code == 2 and "schema_version" in err and "--write-facts" in err


def test_table_shows_pinned_in_gb_as_plan_does(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "fleet", "plan", str(three_boxes(tmp_path)))
    assert code == 0
    _, js, _ = run_cli(capsys, "fleet", "plan", str(three_boxes(tmp_path)), "--format", "json")
    fp = json.loads(js)
    for b in fp["boxes"]:
        assert f"{b['pinned_total_bytes'] / 1e9:.2f} GB" in out, b["box"]
    assert f"host tier {fp['host_tier_bytes'] / 1e9:.2f} GB pinned" in out


def test_router_error_is_one_line_without_httpx_hint():
    """A real local HTTP server answering 401 to the request fleet status makes (httpread.get,
    as router_workers reads /workers): one line with the status and its phrase, none of the
    "For more information check:" line httpx's raise_for_status appends."""
    import http.server
    import threading

    from escha_deploy.utils import httpread

    class Deny(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(401)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Deny)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        answer = httpread.get(f"http://127.0.0.1:{srv.server_port}/workers")
    finally:
        srv.shutdown()
        srv.server_close()
    text = str(httpread.BadAnswer(answer.url, f"answered {httpread.status_problem(answer)}"))
    assert text == f"http://127.0.0.1:{srv.server_port}/workers: answered HTTP 401 Unauthorized"


def test_a_boxs_memory_is_named_by_where_the_fleet_file_gives_it(tmp_path, capsys):
    """A box's `host_ram` is the fleet file's, not a --host-ram flag nobody passed: the plan
    names it as FILE:LINE boxes.NAME.host_ram (in the refusal, the reasons and the JSON); a
    saved report is named by its file."""
    fleet_file = write_fleet(tmp_path, {"name": "lab", "boxes": [
        {"name": "ok-box", "address": "127.0.0.1", "profile": PROFILE, "host_ram": "64GiB"},
        {"name": "tiny", "address": "127.0.0.1", "profile": PROFILE, "host_ram": "8GiB", "platform": "wsl2",
         "set": ["hicache.hicache_ratio=4", "container.port=30001"]}]})
    code, out, err = run_cli(capsys, "fleet", "plan", str(fleet_file), "--format", "json")
    assert code == 3 and "--host-ram" not in out + err
    line = next(i for i, t in enumerate(fleet_file.read_text().splitlines(), 1) if "8GiB" in t)
    src = f"MemTotal 8.00 GiB ({fleet_file}:{line} boxes.tiny.host_ram)"
    refusal = [ln for ln in err.splitlines() if ln.startswith("refused: box tiny: plan is unsafe")]
    assert len(refusal) == 1 and src in refusal[0], err
    fp = json.loads(out)
    assert any(src in r for r in fp["boxes"][1]["reasons"])
    mem = next(f for f in fp["boxes"][1]["plan"]["fact_sources"] if f["fact"] == "MemTotal")
    assert mem["kind"] == "fleet_file" and mem["source"] == f"{fleet_file}:{line} boxes.tiny.host_ram"
    saved = plan_fleet(load_fleet(three_boxes(tmp_path)))
    reasons = " ".join(saved.box_plan("lin-b").reasons)
    assert "(facts file)" in reasons and "--host-ram" not in reasons, reasons  # as plan --facts words it


def test_two_servers_on_one_address_and_port_are_the_files_mistake(tmp_path, capsys):
    """Two replicas on 127.0.0.1 with the same container.port: one would not bind, and the router
    would list one worker twice. Exit 2, one line at the second box's address naming both."""
    box = {"address": "127.0.0.1", "profile": PROFILE, "host_ram": "64GiB", "platform": "linux"}
    path = write_fleet(tmp_path, {"name": "lab", "boxes": [{"name": "a", **box}, {"name": "b", **box}]})
    code, out, err = run_cli(capsys, "fleet", "plan", str(path))
    assert code == 2
    assert err.splitlines() == [
        f"error: {path}:9: boxes.1.address: box b and box a ({path}:4) both serve on 127.0.0.1:30000: the second "
        "server cannot bind the port and the router would get one worker twice; give each box its own address, "
        "or one of them another container.port"]
    code, out, err = run_cli(capsys, "fleet", "compose", str(path), "--out", str(tmp_path / "out"))
    assert code == 2 and "box b and box a" in err and not (tmp_path / "out").exists()


def test_one_address_with_two_ports_or_a_second_node_is_planned(tmp_path, capsys):
    """Two servers on one machine with their own ports, and the rank-1 node of a multi-node
    instance (it serves no HTTP) at the same address and container.port as a replica, are fine."""
    box = {"address": "127.0.0.1", "profile": PROFILE, "host_ram": "64GiB", "platform": "linux"}
    path = write_fleet(tmp_path, {"name": "lab", "boxes": [
        {"name": "a", **box}, {"name": "b", **box, "set": ["container.port=30001"]},
        {"name": "n0", **box, "set": ["container.port=30002"]}, {"name": "n1", **box}],
        "groups": [{"name": "chat", "boxes": ["a", "b"]}, {"name": "big", "nodes": 2, "boxes": ["n0", "n1"]}]})
    code, out, err = run_cli(capsys, "fleet", "plan", str(path), "--format", "json")
    assert code == 0, err
    assert [i["name"] for i in json.loads(out)["instances"]] == ["chat-0", "chat-1", "big-0"]


def test_one_instance_is_singular(tmp_path, capsys):
    """The total line of a fleet of one box: "1 instance" (it said "1 instances")."""
    fleet = write_fleet(tmp_path, {"name": "one", "boxes": [
        {"name": "solo", "address": "127.0.0.1", "profile": PROFILE, "host_ram": "64GiB", "platform": "linux"}]})
    code, out, err = run_cli(capsys, "fleet", "plan", str(fleet))
    assert code == 0, err
    total = next(x for x in out.splitlines() if x.startswith("fleet: "))
    assert total.startswith("fleet: 1 instance, 2 GPUs, host tier "), total
