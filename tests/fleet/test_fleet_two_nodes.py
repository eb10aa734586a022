"""A two-node instance's rendered environment, run as two "nodes" on one machine through
doctor's all-reduce smoke test (``doctor/nccl_smoke.py``): each rank gets its node's
environment (``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` = lo, ``NCCL_IB_DISABLE=1``), its
own ``NCCL_HOSTID`` (NCCL's host identity is hostname + boot id otherwise, so two processes on
one host count as one node) and the rendezvous from the rendered ``--dist-init-addr``.

Here (CI, no GPU) the ranks use gloo on the CPU; on a machine with 2 GPUs (the device
machine, ``-m gpu``) they use NCCL with one GPU each, and NCCL must report two nodes joined
through its socket transport.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import yaml

from escha_deploy.doctor.nccl_smoke import launch
from escha_deploy.fleet.model import load_fleet
from escha_deploy.fleet.multinode import render_nodes
from escha_deploy.fleet.plan import plan_fleet


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(tmp: Path):
    doc = {"name": "loop", "boxes": [
        {"name": f"n{i}", "address": "127.0.0.1", "profile": "rtx5060ti-tp2-fp8", "host_ram": "64GiB", "nic": "lo",
         "set": ["hicache.enabled=false"]} for i in range(2)],
        "groups": [{"name": "big", "nodes": 2, "boxes": ["n0", "n1"], "parallel": "tp",
                    "dist_init_port": free_port()}]}
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    loaded = load_fleet(path)
    fp = plan_fleet(loaded)
    assert fp.verdict == "ok", fp.problems
    inst = loaded.fleet.instances()[0]
    return render_nodes(inst, [fp.box_plan(b).plan for b in inst.boxes], [fp.profile(b) for b in inst.boxes],
                        ["127.0.0.1", "127.0.0.1"], ["lo", "lo"])


def node_envs(nodes, gpu: bool) -> tuple[list[dict], tuple[str, int]]:
    envs = []
    for n in nodes:
        env = {k: v for k, v in n.env.items() if k.startswith(("NCCL_", "GLOO_"))}
        env["NCCL_HOSTID"] = f"node{n.node_rank}"
        if gpu:
            env.update({"CUDA_VISIBLE_DEVICES": str(n.node_rank), "NCCL_DEBUG": "INFO"})
        envs.append(env)
    host, port = nodes[0].dist_init_addr.rsplit(":", 1)
    return envs, (host, int(port))


def test_rendered_node_env_names_loopback(tmp_path):
    nodes = two_nodes(tmp_path)
    for n in nodes:
        assert n.env["NCCL_SOCKET_IFNAME"] == n.env["GLOO_SOCKET_IFNAME"] == "lo"
        assert n.dist_init_addr.startswith("127.0.0.1:")
        assert n.argv[n.argv.index("--tp-size") + 1] == "4"  # 2 GPUs a node x 2 nodes


def test_two_nodes_gloo_on_the_cpu(tmp_path):
    pytest.importorskip("torch")
    envs, master = node_envs(two_nodes(tmp_path), gpu=False)
    r = launch(2, backend="gloo", timeout_s=60, rank_env=envs, master=master)
    assert r["ok"], r["error"]
    assert [x["sum"] for x in r["ranks"]] == [3.0, 3.0]


@pytest.mark.gpu
def test_two_nodes_nccl_socket_transport(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    envs, master = node_envs(two_nodes(tmp_path), gpu=True)
    r = launch(2, backend="nccl", timeout_s=120, rank_env=envs, master=master)
    out = os.environ.get("ESCHA_TEST_OUT")
    if out:
        Path(out, "two-nodes-nccl.json").write_text(json.dumps({"rank_env": envs, "master": master, **r}, indent=1))
    assert r["ok"], r["error"]
    assert [x["sum"] for x in r["ranks"]] == [3.0, 3.0] and all(x["wrong_elements"] == 0 for x in r["ranks"])
    lines = [ln for rank in r.get("nccl_info", []) for ln in rank]
    assert any("nNodes 2" in ln for ln in lines), lines
    assert any("via NET/Socket" in ln for ln in lines), lines
