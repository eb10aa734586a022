"""Each launch value is decided once, and every command reads it the same way: the plan's
decision lines say what the argv does, `fleet` reads a facts file as `plan --facts` does (GPU
records included), and `down`/`status`/`logs` read a profile reference by the rule `--profile`
uses. Each test failed before the value had one place."""

from __future__ import annotations

import json

import pytest
import yaml

from escha_deploy.pipeline import argv as flags
from escha_deploy.facts.factsfile import FactsFile, GpuRecord, HostSection
from escha_deploy.facts.machine import described_host
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile
from tests.inproc import run_main

GiB = 2**30
CAR = "--disable-custom-all-reduce"
PROFILE = "rtx5060ti-tp2-fp8"


@pytest.mark.parametrize("setting", [None, "true", "false"])
def test_the_custom_all_reduce_decision_is_what_the_argv_renders(setting):
    prof = load_profile(PROFILE, [f"runtime.disable_custom_all_reduce={setting}"] if setting else [])
    p = plan(prof, described_host(64 * GiB, "linux"))
    argv = flags.server_args(p, prof)
    decided = [d for d in p.decisions if d.value == CAR]
    assert (CAR in argv) == bool(decided) == p.custom_all_reduce_disabled == (setting != "false")


def _facts(tmp_path, *, peers_ok: bool):
    """A 2-GPU box whose NVML records prove peer access (workstation cards, P2P read ok) or not."""
    status = "ok" if peers_ok else "not supported"
    doc = FactsFile(host=HostSection(platform="linux", mem_total_bytes=64 * GiB), gpus=[
        GpuRecord(index=i, name="NVIDIA RTX 6000 Ada Generation", brand="NVIDIA RTX", memory_total_bytes=48 * GiB,
                  compute_capability="8.9", p2p={str(1 - i): status}) for i in range(2)]).model_dump(mode="json")
    path = tmp_path / "box.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("peers_ok", [True, False])
def test_fleet_reads_the_gpu_records_of_a_facts_file_as_plan_facts_does(tmp_path, peers_ok):
    facts = _facts(tmp_path, peers_ok=peers_ok)
    r = run_main("plan", "-p", PROFILE, "--facts", str(facts), "--format", "json",
                 env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert r.code == 0, r.err
    single = json.loads(r.out)
    assert single["peer_access"]["proven"] is peers_ok
    boxes = [{"name": n, "address": f"127.0.0.{i}", "profile": PROFILE, "facts": facts.name}
             for i, n in enumerate(("solo", "n0", "n1"), start=1)]
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"name": "one", "boxes": boxes, "groups": [
        {"name": "one", "boxes": ["solo"]}, {"name": "two", "nodes": 2, "boxes": ["n0", "n1"]}]}))
    r = run_main("fleet", "plan", str(fleet), "--format", "json", env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert r.code == 0, r.err
    for b in json.loads(r.out)["boxes"]:
        assert b["plan"]["peer_access"] == single["peer_access"], b["box"]
        assert b["plan"]["decisions"] == single["decisions"], b["box"]
    out = tmp_path / "out"
    r = run_main("fleet", "compose", str(fleet), "--out", str(out), env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert r.code == 0, r.err
    for name in ("n0", "n1"):  # a node's service carries its argv (a replica's plans in its container)
        text = (out / f"compose.{name}.yaml").read_text()
        assert (CAR in text) is (not peers_ok), name


def test_down_status_and_logs_read_a_json_profile_by_its_name(tmp_path):
    """A `.json` profile is a file, as `--profile` reads it: its containers carry the name it
    loads with, so `status --profile x.json` looks for that name (it looked for `x.json`)."""
    from escha_deploy.profile import profile_name

    p = tmp_path / "x.json"
    p.write_text(json.dumps({"extends": PROFILE, "name": "jsonprof"}))
    assert profile_name(str(p)) == "jsonprof" and profile_name(PROFILE) == PROFILE and profile_name(None) is None
    r = run_main("status", "--profile", str(p), env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert "x.json" not in r.err and "jsonprof" in r.err, r.err


def test_plan_json_carries_the_digest_serve_prints(tmp_path):
    """`plan --format json` carries the plan digest, and it is the one the launch of that plan
    carries (`up --dry-run` prints it; `serve --print` in the container with the same facts)."""
    facts = _facts(tmp_path, peers_ok=True)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = run_main("plan", "-p", PROFILE, "--facts", str(facts), "--format", "json", env=env)
    assert r.code == 0, r.err
    digest = json.loads(r.out)["plan_digest"]
    assert len(digest) == 64
    r = run_main("serve", "--profile", PROFILE, "--print",
                 env={**env, "ESCHA_SERVE_MODE": "container", "ESCHA_FACTS": str(facts)})
    printed = json.loads(r.out)
    assert printed["plan_digest"] == digest, r.err
