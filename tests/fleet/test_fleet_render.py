"""Renderers: per-node multi-node argv (SGLang 0.5.19's flag catalog, and its refusals), the
compose file per box (``docker-compose config``), and the multi-node refusals."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from escha_deploy.cli.main import main
from escha_deploy.sglang.flagcheck import check_argv
from escha_deploy.fleet.compose import render_all
from escha_deploy.fleet.model import load_fleet
from escha_deploy.fleet.multinode import render_nodes
from escha_deploy.fleet.plan import plan_fleet

PROFILE = "rtx5060ti-tp2-fp8"


def write(tmp: Path, *, parallel: str = "pp", extra: list[str] | None = None, sets: list[str] | None = None) -> Path:
    (tmp / "router.key").write_text("k-123\n")
    (tmp / "api.key").write_text("k-123\n")
    replica_set = ["container.expose=true", f"container.api_key_file={tmp / 'api.key'}"]
    node_set = ([f"runtime.extra_args={json.dumps(extra)}"] if extra else []) + list(sets or [])
    # one loopback address per box (127.0.0.0/8), none of them 127.0.0.1, where the router reaches
    # its own box's worker: the boxes share one container.port, as `fleet render k8s` requires
    # (SMG's discovery takes one --service-discovery-port)
    doc = {
        "name": "lab",
        "boxes": [
            {"name": "r1", "address": "127.0.0.2", "profile": PROFILE, "host_ram": "16GiB", "platform": "wsl2",
             "set": replica_set},
            {"name": "r2", "address": "127.0.0.3", "profile": PROFILE, "host_ram": "64GiB", "set": replica_set},
            {"name": "n0", "address": "127.0.0.4", "profile": PROFILE, "host_ram": "64GiB", "nic": "eth0",
             "set": node_set},
            {"name": "n1", "address": "127.0.0.5", "profile": PROFILE, "host_ram": "14GiB", "nic": "enp3s0",
             "set": node_set},
        ],
        "groups": [{"name": "chat", "boxes": ["r1", "r2"]},
                   {"name": "big", "nodes": 2, "boxes": ["n0", "n1"], "parallel": parallel}],
        "router": {"box": "r2", "api_key_file": "router.key", "expose": True},
    }
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def nodes_of(path: Path):
    loaded = load_fleet(path)
    fp = plan_fleet(loaded)
    inst = next(i for i in loaded.fleet.instances() if i.multi_node)
    return fp, render_nodes(inst, [fp.box_plan(b).plan for b in inst.boxes], [fp.profile(b) for b in inst.boxes],
                            [loaded.fleet.box(b).address for b in inst.boxes],
                            [loaded.fleet.box(b).nic for b in inst.boxes])


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("parallel,tp,pp", [("pp", "2", "2"), ("tp", "4", None)])
def test_per_node_argv_passes_the_flag_catalog(tmp_path, parallel, tp, pp):
    fp, nodes = nodes_of(write(tmp_path, parallel=parallel))
    assert fp.verdict == "ok", fp.problems
    assert [n.node_rank for n in nodes] == [0, 1] and [n.serves_api for n in nodes] == [True, False]
    for n in nodes:
        check = check_argv(n.argv, set(fp.box_plan(n.box).plan.capabilities))
        assert not check.errors, check.error_lines()
        assert {"--nnodes", "--node-rank", "--dist-init-addr"} <= {f.flag for f in check.flags}
        assert flag(n.argv, "--nnodes") == "2" and flag(n.argv, "--node-rank") == str(n.node_rank)
        assert flag(n.argv, "--dist-init-addr") == "127.0.0.4:20000"
        assert flag(n.argv, "--tp-size") == tp and n.argv.count("--tp-size") == 1
        assert (flag(n.argv, "--pp-size") if pp else "--pp-size" not in n.argv) == (pp or True)
        assert n.env["NCCL_IB_DISABLE"] == "1"
    assert nodes[0].env["NCCL_SOCKET_IFNAME"] == "eth0" and nodes[1].env["GLOO_SOCKET_IFNAME"] == "enp3s0"
    # both nodes pass the same flags but the rank: the smaller node's (14 GiB) host pools
    strip = lambda a: [x for i, x in enumerate(a) if not (i and a[i - 1] == "--node-rank")]  # noqa: E731
    assert strip(nodes[0].argv) == strip(nodes[1].argv)
    small = fp.box_plan("n1").plan
    assert flag(nodes[0].argv, "--hicache-ratio") == f"{small.hicache.ratio:g}"
    assert small.hicache.ratio < fp.box_plan("n0").plan.hicache.ratio


@pytest.mark.parametrize("extra,sets,parallel,want", [
    (["--dp-size", "2"], [], "pp", "SGLang refuses multi-node data parallel without DP attention"),
    ([], ["runtime.speculative.algorithm=EAGLE"], "pp", "SGLang refuses pipeline parallelism with speculative decoding"),
    (["--nnodes", "3"], [], "tp", "the fleet renders those"),
])
def test_what_sglang_refuses_is_refused_with_the_reason(tmp_path, extra, sets, parallel, want):
    fp = plan_fleet(load_fleet(write(tmp_path, parallel=parallel, extra=extra, sets=sets)))
    assert fp.verdict == "unsafe"
    assert any(want in p and p.startswith("big-0:") for p in fp.problems), fp.problems


def test_speculative_decoding_with_tp_across_nodes_is_not_refused(tmp_path):
    fp = plan_fleet(load_fleet(write(tmp_path, parallel="tp", sets=["runtime.speculative.algorithm=EAGLE"])))
    assert not any("speculative" in p for p in fp.problems)


def test_a_replica_the_router_cannot_reach_is_refused(tmp_path, capsys):
    path = write(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["boxes"][0]["set"] = []
    # r1 on another machine: a loopback address is the router's own machine, where it reaches any
    # published port (fleet.plan._reachability_problems), so this one is not loopback; 192.0.2.1 is
    # RFC 5737's documentation range, and nothing here connects to it (plan and render only)
    doc["boxes"][0]["address"] = "192.0.2.1"
    path.write_text(yaml.safe_dump(doc))
    fp = plan_fleet(load_fleet(path))
    assert fp.verdict == "unsafe" and fp.problems == []  # Kubernetes pods are reachable: k8s renders
    assert [p[:35] for p in fp.docker_problems] == ["box r1: container.expose is false, "]
    for args in (["fleet", "compose", str(path), "--out", str(tmp_path / "out")], ["fleet", "plan", str(path)]):
        capsys.readouterr()
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 3
    err = [ln for ln in capsys.readouterr().err.splitlines() if "box r1" in ln and not ln.startswith("warning: box r1: ")]  # its plan warnings are its own lines
    assert len(err) == 1 and err[0].startswith("refused: box r1: container.expose is false"), err
    main(["fleet", "render", "k8s", str(path), "--out", str(tmp_path / "k8s")])


def test_the_router_reaches_its_own_boxs_worker_at_loopback(tmp_path):
    """The router's box (r2) serves a replica that is not exposed: its port is published on
    127.0.0.1, which takes no connection addressed to 127.0.0.3, so the router (host networking)
    is given 127.0.0.1; the other box's replica is exposed and reached at its address."""
    path = write(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["boxes"][1]["set"] = []
    path.write_text(yaml.safe_dump(doc))
    loaded = load_fleet(path)
    fp = plan_fleet(loaded)
    assert fp.verdict == "ok" and fp.docker_problems == [], fp.docker_problems
    docs = {b: yaml.safe_load(t) for b, t in render_all(loaded, fp).items()}
    r2 = docs["r2"]["services"]
    assert r2["sglang"]["ports"] == ["127.0.0.1:30000:30000"] and r2["smg"]["network_mode"] == "host"
    cmd = r2["smg"]["command"]
    urls = cmd[cmd.index("--worker-urls") + 1:cmd.index("--policy")]
    # r1's replica, r2's own (loopback), the multi-node instance's rank 0 (binds its address)
    assert urls == ["http://127.0.0.2:30000", "http://127.0.0.1:30000", "http://127.0.0.4:30000"]
    assert docs["r1"]["services"]["sglang"]["ports"] == ["0.0.0.0:30000:30000"]
    n0 = docs["n0"]["services"]["node0"]
    assert n0["network_mode"] == "host" and flag(n0["command"], "--host") == "127.0.0.4"


def test_compose_files_per_box(tmp_path, capsys):
    path = write(tmp_path)
    out = tmp_path / "deploy"
    try:
        main(["fleet", "compose", str(path), "--out", str(out)])
        code = 0
    except SystemExit as exc:
        code = exc.code
    assert code in (0, None)
    files = sorted(p.name for p in out.iterdir())
    assert files == ["compose.n0.yaml", "compose.n1.yaml", "compose.r1.yaml", "compose.r2.yaml"]
    docs = {f: yaml.safe_load((out / f).read_text()) for f in files}
    assert set(docs["compose.r2.yaml"]["services"]) == {"sglang", "smg"}
    smg = docs["compose.r2.yaml"]["services"]["smg"]
    assert smg["network_mode"] == "host" and "k-123" not in (out / "compose.r2.yaml").read_text()
    assert smg["command"][smg["command"].index("--worker-urls") + 1:][:3] == [
        "http://127.0.0.2:30000", "http://127.0.0.1:30000", "http://127.0.0.4:30000"]  # r2: the router's box
    n0, n1 = docs["compose.n0.yaml"]["services"]["node0"], docs["compose.n1.yaml"]["services"]["node1"]
    assert n0["network_mode"] == n1["network_mode"] == "host"
    assert "ports" not in n0 and "ports" not in n1
    assert "test" in n0["healthcheck"] and n1["healthcheck"] == {"disable": True}
    assert flag(n0["command"], "--host") == "127.0.0.4" and flag(n1["command"], "--node-rank") == "1"
    if shutil.which("docker-compose") is None:
        pytest.skip("Debian's docker-compose not installed (.ci/test installs it)")
    for f in files:
        r = subprocess.run(["docker-compose", "-f", str(out / f), "config", "-q"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, f"{f}: {r.stderr}"


def docs_fleet(tmp: Path) -> Path:
    """docs/scale-out.md's fleet file, in a temp folder with what it names: wsl-a's facts
    (written by `plan --write-facts`, as the docs say) and the router's key file."""
    import re

    text = (Path(__file__).parents[2] / "docs" / "scale-out.md").read_text()
    block = re.search(r"## The fleet file\n\n```yaml\n(.*?)```", text, re.S).group(1)
    (tmp / "router.key").write_text("k-123\n")
    cli(["plan", "-p", PROFILE, "--host-ram", "16GiB", "--wsl2", "--write-facts", str(tmp / "wsl-a.json")])
    path = tmp / "fleet.yaml"
    path.write_text(block)
    return path


def cli(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("argv, out, reason", [
    (["fleet", "compose"], "/proc/nope", "No such file or directory"),
    (["fleet", "render", "k8s"], "/proc/nope", "No such file or directory"),
    (["fleet", "compose"], "fleet.yaml", "Not a directory"),  # the fleet file itself
    (["fleet", "render", "k8s"], "fleet.yaml", "Not a directory"),
    (["fleet", "compose"], "no/such/dir", "No such file or directory"),
    (["fleet", "render", "k8s"], "no/such/dir", "No such file or directory"),
])
def test_an_out_folder_that_cannot_be_made_is_one_line_exit_2(tmp_path, capsys, monkeypatch, argv, out, reason):
    """docs/scale-out.md's fleet: --out names a folder; one that is a file, or whose parent is
    missing or cannot hold one, is refused as `compose -o` refuses: one line naming --out and
    the path, exit 2, no traceback, nothing created or changed."""
    path = docs_fleet(tmp_path)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    before = tree(tmp_path)
    assert cli([*argv, str(path), "--out", out]) == 2
    got = capsys.readouterr()
    assert "Traceback" not in got.err and got.out == ""
    assert got.err.splitlines() == [f"error: --out {out}: cannot write: {reason}"]
    assert tree(tmp_path) == before and not (tmp_path / "no").exists()


def test_a_box_file_that_is_a_folder_is_refused_before_any_is_written(tmp_path, capsys):
    path = docs_fleet(tmp_path)
    out = tmp_path / "deploy"
    (out / "compose.lin-b.yaml").mkdir(parents=True)
    capsys.readouterr()
    assert cli(["fleet", "compose", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"error: --out {out / 'compose.lin-b.yaml'}: cannot write: Is a directory"]
    assert [p.name for p in out.iterdir()] == ["compose.lin-b.yaml"]  # wsl-a's file not written either


def test_docs_fleet_renders_into_a_new_folder(tmp_path, capsys):
    path = docs_fleet(tmp_path)
    capsys.readouterr()
    assert cli(["fleet", "compose", str(path), "--out", str(tmp_path / "deploy")]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "deploy" / f"compose.{b}.yaml") for b in ("wsl-a", "lin-b")]
    assert set(yaml.safe_load((tmp_path / "deploy" / "compose.lin-b.yaml").read_text())["services"]) == {"sglang", "smg"}
    assert cli(["fleet", "render", "k8s", str(path), "--out", str(tmp_path / "k8s")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "k8s" / "fleet.k8s.yaml")


def test_compose_files_work_after_copying_them_to_the_box(tmp_path, capsys):
    """Each compose file names the files it needs relative to itself (`./router.key`), the CLI
    says which to copy next to it, and after copying exactly those into another folder (the
    box), docker compose resolves every secret and the profile file to the copies."""
    path = write(tmp_path)
    doc = yaml.safe_load(path.read_text())
    shutil.copy(Path(__file__).parents[2] / "profiles" / f"{PROFILE}.yaml", tmp_path / "mine.yaml")
    doc["boxes"][0]["profile"] = "mine.yaml"  # a profile given as a path is mounted from the box too
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "deploy"
    main(["fleet", "compose", str(path), "--out", str(out)])
    err = capsys.readouterr().err
    lines = {ln.split(":")[0]: ln for ln in err.splitlines() if ": copy compose." in ln}
    assert lines["r2"].startswith(f"r2: copy compose.r2.yaml, api.key (from {tmp_path / 'api.key'}), router.key "
                                  f"(from {tmp_path / 'router.key'}) into one folder on r2, then run `docker compose "
                                  "-f compose.r2.yaml up -d` in that folder")
    assert "mine.yaml (from" in lines["r1"] and lines["n1"].startswith("n1: copy compose.n1.yaml into")
    want = {"r1": {"api.key", "mine.yaml"}, "r2": {"router.key", "api.key"}, "n0": set(), "n1": set()}
    for box, names in want.items():
        text = (out / f"compose.{box}.yaml").read_text()
        assert str(tmp_path) not in text.split("\nservices:", 1)[1].replace(f"api_key_file={tmp_path}", ""), box
        rendered = yaml.safe_load(text)
        assert {s["file"] for s in rendered.get("secrets", {}).values()} | {
            v["source"] for s in rendered["services"].values() for v in s.get("volumes", [])
            if v["source"].startswith("./")} == {f"./{n}" for n in names}, box
        for n in names:
            assert f"#   {n}  (here: {tmp_path / n})" in text
        # the box: a folder elsewhere holding the compose file and the named files only
        there = tmp_path / "on" / box
        there.mkdir(parents=True)
        shutil.copy(out / f"compose.{box}.yaml", there)
        for n in names:
            shutil.copy(tmp_path / n, there / n)
        if shutil.which("docker-compose") is None:
            continue
        r = subprocess.run(["docker-compose", "-f", f"compose.{box}.yaml", "config"], cwd=there, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        resolved = yaml.safe_load(r.stdout)
        files = {s["file"] for s in resolved.get("secrets", {}).values()}
        files |= {v["source"] for s in resolved["services"].values() for v in s.get("volumes", [])
                  if v["source"].endswith("mine.yaml")}
        assert files == {str(there / n) for n in names}, (box, files)
    r2 = yaml.safe_load((out / "compose.r2.yaml").read_text())
    # the router's key and the replica's key are two secrets, both mounted as escha_api_key
    assert r2["services"]["smg"]["secrets"] == [{"source": "escha_router_api_key", "target": "escha_api_key"}]
    assert r2["services"]["sglang"]["secrets"] == [{"source": "escha_api_key", "target": "escha_api_key"}]


def test_two_files_of_one_name_for_one_box_are_refused(tmp_path):
    path = write(tmp_path)
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "router.key").write_text("k-123\n")
    doc = yaml.safe_load(path.read_text())
    doc["boxes"][1]["set"] = ["container.expose=true", f"container.api_key_file={tmp_path / 'keys' / 'router.key'}"]
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SystemExit) as info:
        main(["fleet", "compose", str(path), "--out", str(tmp_path / "out")])
    assert info.value.code == 2


def test_docs_fleet_as_rendered_reaches_every_worker_and_names_box_files(tmp_path, capsys):
    """docs/scale-out.md's fleet: lin-b's replica is not exposed (published on 127.0.0.1) and
    the router on lin-b reaches it at 127.0.0.1; wsl-a's key path does not exist here, so it is
    kept as a path on the box; the router's key exists here and is copied next to the file."""
    path = docs_fleet(tmp_path)
    capsys.readouterr()
    assert cli(["fleet", "plan", str(path)]) == 0
    assert cli(["fleet", "compose", str(path), "--out", str(tmp_path / "deploy")]) == 0
    err = capsys.readouterr().err
    assert f"lin-b: copy compose.lin-b.yaml, router.key (from {tmp_path / 'router.key'}) into one folder" in err
    assert "wsl-a: copy compose.wsl-a.yaml into one folder on wsl-a" in err
    lin = yaml.safe_load((tmp_path / "deploy" / "compose.lin-b.yaml").read_text())
    wsl = yaml.safe_load((tmp_path / "deploy" / "compose.wsl-a.yaml").read_text())
    cmd = lin["services"]["smg"]["command"]
    assert cmd[cmd.index("--worker-urls") + 1:cmd.index("--policy")] == [
        "http://192.168.1.20:30000", "http://127.0.0.1:30000"]
    assert lin["services"]["sglang"]["ports"] == ["127.0.0.1:30000:30000"]
    assert wsl["services"]["sglang"]["ports"] == ["0.0.0.0:30000:30000"]
    assert lin["secrets"] == {"escha_router_api_key": {"file": "./router.key"}}
    assert wsl["secrets"] == {"escha_api_key": {"file": "/etc/escha/api.key"}}


@pytest.mark.parametrize("change, want", [
    ("other-key", "box r1: container.api_key_file ("),
    ("no-router-key", "box r1: its server requires the key in container.api_key_file and the router sends none"),
])
def test_a_replica_whose_key_the_router_does_not_send_is_refused(tmp_path, capsys, change, want):
    """SGLang with --api-key answers 401 on all but /health and /metrics without that key, and
    SMG sends the router's key (or none) to every worker: a replica whose key differs from the
    router's, or a router without a key in front of a keyed replica, cannot serve as rendered.
    `fleet plan` refuses it (exit 3, one line naming the box, never the key); k8s (one Secret
    for all) still renders."""
    path = write(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["groups"] = [{"name": "chat", "boxes": ["r1", "r2"]}]
    doc["boxes"] = doc["boxes"][:2]
    if change == "other-key":
        (tmp_path / "r1.key").write_text("k-456\n")
        doc["boxes"][0]["set"] = ["container.expose=true", f"container.api_key_file={tmp_path / 'r1.key'}"]
    else:
        doc["router"].update({"expose": False, "api_key_file": None})
    path.write_text(yaml.safe_dump(doc))
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["fleet", "plan", str(path)])
    assert info.value.code == 3
    err = capsys.readouterr().err
    refused = [ln for ln in err.splitlines() if ln.startswith("refused: ")]
    assert any(ln.startswith(f"refused: {want}") for ln in refused), err
    assert "k-456" not in err and "k-123" not in err
    main(["fleet", "render", "k8s", str(path), "--out", str(tmp_path / "k8s")])



def test_a_boxs_plan_and_its_compose_service_come_from_one_request(tmp_path, capsys):
    """One request per box (``pipeline.plan_request`` with a launch): ``fleet plan``'s digest for
    a replica is the one ``escha-deploy plan`` gives that box (same profile, ``set`` items and
    described host), the launch spec that compose writes carries the same digest, and its
    container runs ``serve`` with the box's ``set`` items."""
    path = write(tmp_path)
    fp = plan_fleet(load_fleet(path))
    digest = fp.box_plan("r1").plan.plan_digest
    assert digest and fp.launch("r1").plan_digest == digest
    box = next(b for b in yaml.safe_load(path.read_text())["boxes"] if b["name"] == "r1")
    capsys.readouterr()
    assert cli(["plan", "-p", PROFILE, "--host-ram", "16GiB", "--wsl2", "--format", "json",
                *[a for s in box["set"] for a in ("--set", s)]]) == 0
    assert json.loads(capsys.readouterr().out)["plan_digest"] == digest
    out = tmp_path / "deploy"
    assert cli(["fleet", "compose", str(path), "--out", str(out)]) == 0
    command = yaml.safe_load((out / "compose.r1.yaml").read_text())["services"]["sglang"]["command"]
    assert command == list(fp.launch("r1").container.command)
    assert all(s in command for s in box["set"]), command
