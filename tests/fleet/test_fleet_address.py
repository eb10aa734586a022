"""Box addresses through every fleet verb: IPv6 literals bracketed wherever a host is joined with
a port (``--dist-init-addr``, worker URLs, compose port bindings), bare where a host goes alone
(``--host``), and an address that does not parse refused at load, naming file:line."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from escha_deploy.cli.main import main
from escha_deploy.utils.errors import BadInput
from escha_deploy.fleet.compose import render_all
from escha_deploy.fleet.model import load_fleet
from escha_deploy.fleet.plan import plan_fleet

PROFILE = "rtx5060ti-tp2-fp8"


def write(tmp: Path, r1: str = "::1", n0: str = "::1") -> Path:
    (tmp / "router.key").write_text("k-1\n")
    doc = {
        "name": "six",
        "boxes": [
            {"name": "r1", "address": r1, "profile": PROFILE, "host_ram": "64GiB",
             "set": ["container.port=30001"]},
            {"name": "r2", "address": "127.0.0.1", "profile": PROFILE, "host_ram": "64GiB"},
            {"name": "n0", "address": n0, "profile": PROFILE, "host_ram": "64GiB", "nic": "lo"},
            {"name": "n1", "address": "127.0.0.1", "profile": PROFILE, "host_ram": "64GiB", "nic": "lo",
             "set": ["container.port=30002"]},
        ],
        "groups": [{"name": "chat", "boxes": ["r1", "r2"]}, {"name": "big", "nodes": 2, "boxes": ["n0", "n1"]}],
        "router": {"box": "r2", "api_key_file": "router.key"},
    }
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def arg(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_ipv6_boxes_are_bracketed_where_joined_with_a_port_and_bare_alone(tmp_path):
    loaded = load_fleet(write(tmp_path, r1="[::1]", n0="0:0::1"))
    assert [b.address for b in loaded.fleet.boxes] == ["::1", "127.0.0.1", "::1", "127.0.0.1"]  # canonical
    fp = plan_fleet(loaded)
    assert fp.verdict == "ok", (fp.problems, fp.docker_problems)
    docs = {b: yaml.safe_load(t) for b, t in render_all(loaded, fp).items()}
    for node in ("n0", "n1"):
        cmd = docs[node]["services"][f"node{node[1]}"]["command"]
        assert arg(cmd, "--dist-init-addr") == "[::1]:20000"
    assert arg(docs["n0"]["services"]["node0"]["command"], "--host") == "::1"  # a host alone: bare
    smg = docs["r2"]["services"]["smg"]["command"]
    urls = smg[smg.index("--worker-urls") + 1:smg.index("--policy")]
    assert urls == ["http://[::1]:30001", "http://127.0.0.1:30000", "http://[::1]:30000"]


def test_a_compose_port_binding_on_ipv6_is_bracketed(tmp_path):
    """A port published on an IPv6 address is ``[ADDR]:HOST:CONTAINER`` (compose-spec ``ports``
    short syntax); Debian's docker-compose reads the file back, where installed."""
    from escha_deploy.launch.compose import render
    from escha_deploy.pipeline.spec import build_launch_spec

    loaded = load_fleet(write(tmp_path))
    fp = plan_fleet(loaded)
    spec = build_launch_spec(fp.box_plan("r2").plan, fp.profile("r2")).container
    doc = render(spec.model_copy(update={"port_host_ip": "::1"}), build=False)
    assert doc["services"]["sglang"]["ports"] == ["[::1]:30000:30000"]
    if shutil.which("docker-compose"):
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
        r = subprocess.run(["docker-compose", "-f", str(tmp_path / "c.yaml"), "config"], capture_output=True,
                           text=True, cwd=tmp_path)
        assert r.returncode == 0 and "- ::1:30000:30000/tcp" in r.stdout, r.stderr  # host ::1, port 30000


@pytest.mark.parametrize("address,why", [
    ("fd00::20:20000", "to join one with a port write [fd00::20]:20000"),
    ("127.0.0.1:30000", "carries a port"),
    ("http://127.0.0.1", "URL"),
    ("0.0.0.0", "unspecified"),
])
def test_an_address_that_does_not_parse_is_one_line_at_its_line(tmp_path, capsys, address, why):
    path = write(tmp_path, r1=address)
    with pytest.raises(BadInput) as info:
        load_fleet(path)
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith(f"{path}:4: boxes.0.address: ") and why in info.value.problems[0]
    with pytest.raises(SystemExit) as exit_info:
        main(["fleet", "plan", str(path)])
    assert exit_info.value.code == 2
    assert f"{path}:4: boxes.0.address" in capsys.readouterr().err


def test_one_address_written_two_ways_is_one_clash(tmp_path):
    """``::1`` and ``0:0::1`` are one host: two replicas on one port there are refused."""
    path = write(tmp_path, r1="0:0:0:0:0:0:0:1")
    doc = yaml.safe_load(path.read_text())
    doc["boxes"][0]["set"] = []
    doc["boxes"][1]["address"] = "::1"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(BadInput) as info:
        load_fleet(path)
    assert any("both serve on [::1]:30000" in p for p in info.value.problems), info.value.problems


def test_a_multi_node_member_without_nic_is_warned_and_with_nic_both_variables_render(tmp_path, capsys):
    path = write(tmp_path)
    doc = yaml.safe_load(path.read_text())
    del doc["boxes"][3]["nic"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    fp = plan_fleet(load_fleet(path))
    nic = [w for w in fp.warnings if ".nic:" in w]
    assert len(nic) == 1 and nic[0].startswith(f"{path}:") and "boxes.n1.nic: unset on node 1 of big-0" in nic[0]
    assert "Init nccl begin" in nic[0] and "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME" in nic[0]
    main(["fleet", "plan", str(path)])  # a warning: still exit 0
    assert "boxes.n1.nic: unset" in capsys.readouterr().err
    fp = plan_fleet(load_fleet(write(tmp_path)))
    assert not [w for w in fp.warnings if ".nic:" in w]
    docs = {b: yaml.safe_load(t) for b, t in render_all(load_fleet(write(tmp_path)), fp).items()}
    env = docs["n1"]["services"]["node1"]["environment"]
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "lo"


def test_router_overload_thresholds_come_from_the_workers_plans(tmp_path):
    """SMG 1.13 leaves a worker out at 8 waiting requests or 0.8 KV usage (`smg launch --help`);
    a 28,672-token context on a 28,672-token pool (the fp8 profile) is one request at 1.0, so
    the router's thresholds come from the plans, and SMG's own parser reads them back."""
    from smg.launch_router import parse_router_args

    from escha_deploy.fleet.router import overload_thresholds, router_args

    loaded = load_fleet(write(tmp_path))
    fp = plan_fleet(loaded)
    waiting, usage, why = overload_thresholds(loaded, fp)
    prof, plan = fp.profile("r2"), fp.box_plan("r2").plan
    share = min(prof.runtime.context_length, plan.per_rank.device_kv_tokens) / plan.per_rank.device_kv_tokens
    assert usage > 0.8 and usage >= min(1.0, share) and waiting == prof.runtime.max_running_requests
    assert any("KV pool" in w for w in why) and why[-1].startswith("router: a worker counts as overloaded")
    parsed = parse_router_args(router_args(loaded, fp))
    assert parsed.worker_overload_waiting_requests == waiting
    assert abs(parsed.worker_overload_token_usage - usage) < 1e-9
