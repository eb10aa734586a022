"""For one facts file and profile, every command that plans reaches the same plan digest, argv
and env: `plan --format json` (digest), `up --dry-run`, `serve --print` in container mode, the
compose file's service (its `serve --print` in the container, ESCHA_FACTS mounted), `fleet
plan` over a one-box fleet naming both, and `fleet up --box X --dry-run`; over every shipped
profile, with a runtime description that has the profile's capabilities.

STAND-INs, named: the runtime description file (/etc/escha/runtime.json of an image; written
here), the container's environment check (`launch.check.check_here`: memory, GPUs, the model
folder at model.path, which this machine does not have) and the container's L3 mount point
(`folders.read_l3_dir` for flags.CONTAINER_L3_DIR)."""

from __future__ import annotations

import json
from unittest import mock

import pytest
import yaml

from escha_deploy.profile import list_profiles, load_profile
from tests.inproc import run_main

GiB = 2**30


def _write(tmp_path, profile: str):
    from escha_deploy.facts.factsfile import FactsFile, GpuRecord, HostSection
    from escha_deploy.runtime.description import RuntimeDescription

    prof = load_profile(profile)
    hw = prof.hardware
    facts = tmp_path / "box.json"
    facts.write_text(FactsFile(host=HostSection(platform="linux", mem_total_bytes=128 * GiB), gpus=[
        GpuRecord(index=i, name=f"NVIDIA {hw.gpu_name}", memory_total_bytes=hw.gpu_vram,
                  compute_capability=hw.compute_capability or "12.0") for i in range(hw.gpu_count)]).model_dump_json())
    runtime = tmp_path / "runtime.json"
    # the capabilities `up --dry-run` assumes when it cannot read the image: the profile's needs
    runtime.write_text(RuntimeDescription(
        sglang_version="0.5.19", base="image:lmsysorg/sglang:v0.5.19", base_inventory_digest="0" * 64,
        base_inventory_committed=True, python="3.11.2", sglang_dir="/sglang",
        capabilities=list(prof.runtime.needs), inventory_digest="0" * 64).model_dump_json())
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"name": "one", "boxes": [
        {"name": "box", "address": "127.0.0.1", "profile": profile, "facts": facts.name}]}))
    return facts, runtime, fleet


def _container_checks(runtime):
    from escha_deploy.pipeline import argv as flags
    from escha_deploy.facts.folders import read_l3_dir
    from escha_deploy.launch.check import Checked

    return (mock.patch("escha_deploy.sglang.capabilities.RUNTIME_DESCRIPTION_PATH", str(runtime)),
            mock.patch("escha_deploy.launch.check.check_here", lambda *a, **k: Checked()),
            mock.patch("escha_deploy.facts.folders.read_l3_dir",
                       lambda p, **kw: ([], None) if p == flags.CONTAINER_L3_DIR else read_l3_dir(p, **kw)))


@pytest.mark.parametrize("profile", list_profiles())
def test_every_command_reaches_one_digest_argv_and_env(tmp_path, profile):
    facts, runtime, fleet = _write(tmp_path, profile)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    a, b, c = _container_checks(runtime)
    with a, b, c:
        r = run_main("plan", "-p", profile, "--facts", str(facts), "--format", "json", env=env)
        assert r.code == 0, r.err
        digest = json.loads(r.out)["plan_digest"]
        serve = run_main("serve", "--profile", profile, "--print",
                         env={**env, "ESCHA_SERVE_MODE": "container", "ESCHA_FACTS": str(facts)})
        assert serve.code == 0, serve.err
        printed = json.loads(serve.out)
        # the compose file's service: `serve --profile P` with the facts file mounted at ESCHA_FACTS
        r = run_main("compose", "--profile", profile, "--facts", str(facts), env=env)
        assert r.code == 0, r.err
        svc = yaml.safe_load(r.out)["services"]["sglang"]
        assert svc["entrypoint"] == ["escha-deploy", "serve"] and svc["command"] == ["--profile", profile]
        assert svc["environment"]["ESCHA_SERVE_MODE"] == "container"
        mounted = next(v["source"] for v in svc["volumes"] if v["target"] == svc["environment"]["ESCHA_FACTS"])
        in_compose = run_main(*svc["entrypoint"][1:], *svc["command"], "--print",
                              env={**env, "ESCHA_SERVE_MODE": "container", "ESCHA_FACTS": mounted})
        dry = run_main("up", "--profile", profile, "--facts", str(facts), "--dry-run", "--format", "json", env=env)
        fp = run_main("fleet", "plan", str(fleet), "--format", "json", env=env)
        assert fp.code == 0, fp.err
        fdry = run_main("fleet", "up", str(fleet), "--box", "box", "--dry-run", "--format", "json", env=env)
    seen = {"serve --print": printed, "compose's serve --print": json.loads(in_compose.out),
            "up --dry-run": json.loads(dry.out), "fleet up --box --dry-run": json.loads(fdry.out)}
    for name, got in seen.items():
        assert (got["plan_digest"], got["argv"], got["env"]) == (digest, printed["argv"], printed["env"]), name
    assert json.loads(fp.out)["boxes"][0]["plan"]["plan_digest"] == digest
