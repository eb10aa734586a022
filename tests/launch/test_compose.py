"""compose.yaml: the committed file equals a fresh render of the default profile, Debian's
docker-compose 1.29 accepts it, and it validates against the compose specification's JSON
schema that docker-compose ships (compose/config/compose_spec.json)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from escha_deploy.launch.compose import render_profile

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
DEFAULT_PROFILE = "rtx5060ti-tp2-fp8"
SPEC_SCHEMA = Path("/usr/lib/python3/dist-packages/compose/config/compose_spec.json")


def test_committed_compose_equals_render():
    assert COMPOSE.read_text() == render_profile(DEFAULT_PROFILE), (
        "compose.yaml is stale: escha-deploy compose --profile rtx5060ti-tp2-fp8 -o compose.yaml")


def test_compose_carries_the_launch_settings():
    svc = yaml.safe_load(COMPOSE.read_text())["services"]["sglang"]
    assert svc["ipc"] == "host" and svc["init"] is True
    assert svc["ulimits"] == {"memlock": {"soft": -1, "hard": -1},
                              "stack": {"soft": 67108864, "hard": 67108864}}
    assert svc["ports"] == ["127.0.0.1:30000:30000"]
    assert svc["entrypoint"] == ["escha-deploy", "serve"]
    assert svc["build"]["dockerfile"] == "Dockerfile.hicache"
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2
    assert "/health" in " ".join(svc["healthcheck"]["test"])
    assert svc["restart"] == "no" and "0.0.0.0" in svc["environment"]["NO_PROXY"]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="Debian's docker-compose not installed")
def test_docker_compose_config_accepts_it():
    r = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(not SPEC_SCHEMA.is_file(), reason="no packaged compose specification schema")
def test_compose_spec_schema():
    jsonschema = pytest.importorskip("jsonschema")
    # The packaged schema names draft 7's meta-schema by a URL jsonschema does not know.
    jsonschema.Draft7Validator(json.loads(SPEC_SCHEMA.read_text())).validate(
        yaml.safe_load(COMPOSE.read_text()))


def test_secrets_render_as_compose_secrets_and_expose(tmp_path):
    k = tmp_path / "key"
    k.write_text("sk-escha-test-0123456789\n")
    text = render_profile(DEFAULT_PROFILE, [f"container.api_key_file={k}", "container.expose=true"])
    doc = yaml.safe_load(text)
    assert "sk-escha-test" not in text
    assert doc["secrets"] == {"escha_api_key": {"file": str(k)}}
    assert doc["services"]["sglang"]["ports"] == ["0.0.0.0:30000:30000"]


# --- `escha-deploy compose` on the command line: the plan of this machine, --facts, -o ---

def _docker_compose_config(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["docker-compose", "-f", str(path), "config", "-q"], capture_output=True, text=True,
                          cwd=path.parent)


def test_an_unsafe_plan_here_is_warned_and_the_file_still_rendered(cli, tmp_path, monkeypatch):
    from escha_deploy.pipeline import BoxRuntime, facts_source, plan_here
    from escha_deploy.profile import load_profile

    sets = ["hicache.hicache_ratio=50"]
    here = plan_here(load_profile(DEFAULT_PROFILE, sets), facts_source(), BoxRuntime()).plan  # what `escha-deploy plan --set ...` says on this machine
    if here.verdict != "unsafe":
        pytest.skip(f"ratio 50 is {here.verdict} on this host (pins 86.28 GB): it has the RAM for it")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "compose.yaml"
    r = cli("compose", "-p", DEFAULT_PROFILE, "--set", sets[0], "-o", str(out))
    assert r.code == 0, r.err
    assert out.read_text() == render_profile(DEFAULT_PROFILE, sets, context=os.path.relpath(ROOT, tmp_path))
    lines = r.err.splitlines()
    assert lines[:len(here.reasons)] == [f"compose: warning: on this machine the plan is unsafe: {x}"
                                         for x in here.reasons]
    assert any("pinned 86.28 GB" in x for x in lines[:len(here.reasons)])
    assert lines[len(here.reasons)].startswith("compose: warning: rendered anyway, as the container plans")
    assert "would be refused by `serve` (exit 3)" in lines[len(here.reasons)]
    assert lines[len(here.reasons) + 1:] == [f"compose: wrote {out}"]


def test_a_missing_l3_folder_here_is_warned_and_stdout_still_rendered(cli, tmp_path):
    missing = tmp_path / "no-such-l3"
    r = cli("compose", "-p", "linux-tp2-l3", "--set", f"hicache.l3.dir={missing}")
    assert r.code == 0, r.err
    assert r.out.startswith("# Rendered by `escha-deploy compose --profile linux-tp2-l3`")
    assert (f"compose: warning: on this machine the plan is unsafe: hicache.l3.dir: {missing} "
            "does not exist here") in r.err
    assert "`docker compose up` on this machine would be refused by `serve` (exit 3)" in r.err.splitlines()[-1]


def test_the_box_facts_plan_refuses_an_unsafe_render_and_writes_nothing(cli, tmp_path):
    facts = tmp_path / "box.json"
    assert cli("plan", "--host-ram", "16GiB", "--wsl2", "--write-facts", str(facts)).code == 0
    out = tmp_path / "compose.yaml"
    for extra in (["-o", str(out)], []):
        r = cli("compose", "-p", DEFAULT_PROFILE, "--set", "hicache.hicache_ratio=50", "--facts", str(facts), *extra)
        assert r.code == 3, r.err
        assert r.out == "" and not out.exists()
        lines = r.err.splitlines()
        assert lines[0].startswith("error: plan: hicache.hicache_ratio: at 50.0 pinned 86.28 GB") and "(facts file)" in lines[0]
        assert all(x.startswith("error: plan: ") for x in lines[:-1]), lines
        assert lines[-1] == (f"hint: `escha-deploy plan --profile {DEFAULT_PROFILE} --set hicache.hicache_ratio=50 "
                             f"--facts {facts}` shows the budget")
        assert "on this machine" not in r.err
    # $ESCHA_FACTS is --facts' default: the box's plan, not this machine's
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ESCHA_FACTS", str(facts))
        r = cli("compose", "-p", DEFAULT_PROFILE, "--set", "hicache.hicache_ratio=50")
    assert r.code == 3 and r.out == "" and r.err.startswith("error: plan: hicache.hicache_ratio: at 50.0 pinned 86.28 GB"), r.err
    # the profile's own ratio fits the box: rendered, and this machine is not planned
    r = cli("compose", "-p", DEFAULT_PROFILE, "--facts", str(facts), "-o", str(out))
    assert r.code == 0 and r.err.splitlines() == [f"compose: wrote {out}"], r.err
    assert yaml.safe_load(out.read_text())["services"]["sglang"]["environment"]["ESCHA_FACTS"]


def test_output_elsewhere_builds_from_the_checkout(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not a checkout: the one this package runs from is found
    outdir = tmp_path / "deploy" / "box1"
    outdir.mkdir(parents=True)
    out = outdir / "compose.yaml"
    r = cli("compose", "-p", DEFAULT_PROFILE, "-o", str(out))
    assert r.code == 0, r.err
    assert r.err.splitlines()[-1] == f"compose: wrote {out}"
    build = yaml.safe_load(out.read_text())["services"]["sglang"]["build"]
    assert not os.path.isabs(build["context"])
    assert os.path.normpath(os.path.join(outdir, build["context"])) == str(ROOT)
    assert (outdir / build["context"] / build["dockerfile"]).is_file()
    if shutil.which("docker-compose"):
        c = _docker_compose_config(out)
        assert c.returncode == 0, c.stderr
        # and it resolves the context to the checkout, not to the file's folder
        full = subprocess.run(["docker-compose", "-f", str(out), "config"], capture_output=True, text=True,
                              cwd=tmp_path)
        assert yaml.safe_load(full.stdout)["services"]["sglang"]["build"]["context"] == str(ROOT)


def test_a_checkout_in_the_current_folder_is_the_context_as_for_build(tmp_path, monkeypatch):
    from escha_deploy.launch.compose import build_context, source_checkout

    fork = tmp_path / "fork"
    fork.mkdir()
    (fork / "Dockerfile.hicache").write_text("FROM scratch\n")
    assert source_checkout(fork) == fork.resolve()
    assert source_checkout(tmp_path) == ROOT  # none here: the package's checkout
    monkeypatch.chdir(fork)
    assert build_context(None, source_checkout()) == "."  # stdout: relative to the current folder
    assert build_context("/dev/stdout", fork) == "."  # a device: where the text lands is unknown
    assert build_context(tmp_path / "x" / "c.yaml", fork) == "../fork"
    assert build_context(ROOT / "compose.yaml", ROOT) == "."


def test_from_an_installed_package_without_a_checkout_there_is_no_build_section(tmp_path):
    # The wheel's layout (pyproject: packages = escha_deploy, profiles/ and runtime_patches/
    # force-included under escha_deploy/_data), copied from this checkout so it is the code
    # under test; no Dockerfile.hicache beside it, as after `pip install escha-deploy`.
    site = tmp_path / "site"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "escha_deploy", site / "escha_deploy", ignore=ignore)
    for name in ("profiles", "runtime_patches"):
        shutil.copytree(ROOT / name, site / "escha_deploy" / "_data" / name, ignore=ignore)
    out = tmp_path / "compose.yaml"
    env = {**os.environ, "PYTHONPATH": str(site), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", "from escha_deploy.cli.main import main; main()", "compose",
                        "-p", DEFAULT_PROFILE, "-o", str(out)], capture_output=True, text=True, cwd=tmp_path,
                       env=env)
    assert r.returncode == 0, r.stderr
    svc = yaml.safe_load(out.read_text())["services"]["sglang"]
    assert "build" not in svc and svc["image"] == "escha-sglang:0.5.19-hicache"
    assert ("compose: warning: no escha-deploy checkout here (no Dockerfile.hicache in the current folder or "
            "beside the installed package), so the file has no `build:` section; build the image from a "
            "checkout first: `escha-deploy build --hicache --context CHECKOUT --tag escha-sglang:0.5.19-hicache`"
            ) in r.stderr.splitlines()
    assert "builds Dockerfile.hicache" not in out.read_text()
    if shutil.which("docker-compose"):
        c = _docker_compose_config(out)
        assert c.returncode == 0, c.stderr


def test_a_box_without_room_for_hicache_renders_with_a_warning(cli, tmp_path):
    facts = tmp_path / "small.json"
    assert cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "12GiB", "--write-facts", str(facts)).code == 0
    out = tmp_path / "compose.yaml"
    r = cli("compose", "-p", "rtx5060ti-tp2", "--facts", str(facts), "-o", str(out))
    assert r.code == 0, r.err
    lines = r.err.splitlines()
    assert lines[0].startswith("compose: warning: plan: HiCache is off (")
    assert "MemTotal 12.00 GiB (facts file)" in lines[0] and "launchable without it" in lines[0]
    assert lines[1].startswith("compose: warning: rtx5060ti-tp2 needs int2-kv, w2-weights, which escha-deploy's")
    assert lines[2:] == [f"compose: wrote {out}"] and out.is_file()


def test_a_model_folder_this_machine_cannot_plan_is_warned_not_refused(cli, tmp_path):
    empty = tmp_path / "model"
    empty.mkdir()
    r = cli("compose", "-p", "rtx5060ti-tp2", "--set", f"model.host_dir={empty}")
    assert r.code == 0 and r.out.startswith("# Rendered by"), r.err
    lines = r.err.splitlines()
    assert lines[0].startswith("compose: warning: rtx5060ti-tp2 needs int2-kv, w2-weights")  # the fork's
    assert lines[1:] == [f"compose: warning: cannot plan on this machine: model.host_dir: {empty} has no "
                         "config.json and no weights (*.safetensors, *.bin, *.pt)"]


# --- compose's plan of this machine is `plan`'s: same call (pipeline.plan_here), same verdict ---

PLAN_HERE = "compose: warning: on this machine the plan is "


def _compose_vs_plan(cli, tmp_path, profile: str):
    out = tmp_path / "c.yaml"
    c = cli("compose", "-p", profile, "-o", str(out))
    assert c.code == 0, c.err
    p = cli("plan", "--profile", profile, "--format", "json")
    plan = json.loads(p.out)
    said = [ln.removeprefix(PLAN_HERE) for ln in c.err.splitlines() if ln.startswith(PLAN_HERE)]
    return plan, said, p.code


def test_compose_plans_this_machine_as_plan_does(cli, tmp_path):
    """rtx5060ti-tp2 on this machine: compose's warnings are `plan --format json`'s reasons."""
    plan, said, _ = _compose_vs_plan(cli, tmp_path, "rtx5060ti-tp2")
    if plan["verdict"] == "ok":
        assert said == []
    else:
        assert said == [f"{plan['verdict']}: {r}" for r in plan["reasons"]]


def test_compose_and_plan_agree_on_a_runtime_lacking_a_capability(cli, tmp_path, monkeypatch):
    """A machine with a runtime description (``runtime apply``) lacking int2-kv: `plan` says
    unsafe (exit 3) and compose warns with the same reasons; without one both plan the
    profile's needs (declared, not verified)."""
    from escha_deploy.sglang import capabilities as caps

    desc = {"sglang_version": "0.5.19", "base": "wheel:test", "base_inventory_digest": "0",
            "base_inventory_committed": True, "python": "3.11.2", "sglang_dir": str(tmp_path),  # a folder that exists: a description of a gone one is stale
            "capabilities": ["hicache-host-reserve-env", "hicache-host-allocator", "transfer-geometry-check",
                             "hicache-host-mamba-slots"],
            "inventory_digest": "0"}
    path = tmp_path / "runtime.json"
    path.write_text(json.dumps(desc))
    monkeypatch.setattr(caps, "RUNTIME_DESCRIPTION_PATH", str(path))
    plan, said, code = _compose_vs_plan(cli, tmp_path, "rtx5060ti-tp2")
    assert code == 3 and plan["verdict"] == "unsafe"
    assert any("int2-kv" in r for r in plan["reasons"])
    assert said == [f"unsafe: {r}" for r in plan["reasons"]]
