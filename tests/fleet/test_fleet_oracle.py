"""SGLang 0.5.19's own argument check on every node's rendered multi-node argv: the oracle's
``prepare_server_args`` + ``ServerArgs.resolve_once()`` (``scripts/sglang_oracle.py``, run in the
flag-catalog venv with the real wheel; tests/oracle), for PP and TP across nodes, and a refusal
SGLang makes that ``fleet plan`` makes too."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from escha_deploy.fleet.model import load_fleet
from escha_deploy.fleet.multinode import render_nodes
from escha_deploy.fleet.plan import plan_fleet

REPO = Path(__file__).resolve().parents[2]


def _cases_module():
    spec = importlib.util.spec_from_file_location("oracle_cases_fleet", REPO / "tests" / "oracle" / "cases.py")
    mod = importlib.util.module_from_spec(spec)
    import sys

    sys.modules[spec.name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


oc = _cases_module()
VENV = Path(os.environ.get("ESCHA_ORACLE_VENV") or os.environ.get("ESCHA_FLAGCAT_VENV")
            or REPO / ".cache" / "flagcat-venv")
pytestmark = [pytest.mark.wheel,
              pytest.mark.skipif(not (VENV / "bin" / "python").exists(), reason=f"no flag-catalog venv at {VENV}")]
PROFILE = "rtx5060ti-tp2-fp8"


def instance(tmp: Path, parallel: str, extra: list[str] | None = None):
    sets = [f"runtime.extra_args={json.dumps(extra)}"] if extra else []
    doc = {"name": "o", "boxes": [{"name": f"n{i}", "address": "127.0.0.1", "profile": PROFILE,
                                   "host_ram": "64GiB", "nic": "eth0", "set": sets} for i in range(2)],
           "groups": [{"name": "big", "nodes": 2, "boxes": ["n0", "n1"], "parallel": parallel}]}
    path = tmp / f"fleet-{parallel}.yaml"
    path.write_text(yaml.safe_dump(doc))
    loaded = load_fleet(path)
    fp = plan_fleet(loaded)
    inst = loaded.fleet.instances()[0]
    nodes = render_nodes(inst, [fp.box_plan(b).plan for b in inst.boxes], [fp.profile(b) for b in inst.boxes],
                         ["127.0.0.1", "127.0.0.1"], ["eth0", "eth0"])
    return fp, nodes


def oracle_case(case_id: str, fp, node) -> dict:
    prof = fp.profile(node.box)
    return {"id": case_id, "argv": oc.stock_argv(node.argv), "config": oc.config_json(prof.model.architecture),
            "gpu": {"vram_bytes": prof.hardware.gpu_vram, "name": "NVIDIA " + prof.hardware.gpu_name,
                    "capability": prof.hardware.compute_capability or "12.0", "count": prof.runtime.tp_size}}


def test_sglang_accepts_every_node_and_refuses_what_fleet_refuses(tmp_path):
    cases, expect = [], {}
    for parallel in ("pp", "tp"):
        fp, nodes = instance(tmp_path, parallel)
        assert fp.verdict == "ok", fp.problems
        for n in nodes:
            cases.append(oracle_case(f"{parallel}-node{n.node_rank}", fp, n))
            expect[cases[-1]["id"]] = True
    fp, nodes = instance(tmp_path, "tp", extra=["--dp-size", "2"])
    assert any("without DP attention" in p for p in fp.problems)
    cases.append(oracle_case("dp-across-nodes", fp, nodes[1]))
    expect["dp-across-nodes"] = False
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    proc = subprocess.run([str(VENV / "bin" / "python"), str(Path(__file__).with_name("sglang_check_nodes.py")),
                           str(tmp_path / "cases.json"), str(tmp_path / "out.json")], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "out.json").read_text())
    for cid, ok in expect.items():
        assert results[cid]["ok"] is ok, (cid, results[cid])
    assert "multi-node data parallel is not supported unless dp attention" in results["dp-across-nodes"]["error"]
    assert results["dp-across-nodes"]["site"].endswith("validation_hook.py:check_server_args")
    pp0, tp1 = results["pp-node0"], results["tp-node1"]
    assert (pp0["tp_size"], pp0["pp_size"], pp0["nnodes"], pp0["node_rank"]) == (2, 2, 2, 0)
    assert (tp1["tp_size"], tp1["pp_size"], tp1["node_rank"], tp1["dist_init_addr"]) == (4, 1, 1, "127.0.0.1:20000")
    # SGLang turns the overlap scheduler off itself for PP (overrides.py), as multinode.py says
    assert pp0["disable_overlap_schedule"] is True
