"""A facts file's ``runtime`` section is the box's runtime for ``plan --facts``: its SGLang
release is planned (that release's host guard, named with its source), its capabilities are
checked against the profile's needs, and a profile naming another release is refused naming
both, as ``up`` refuses an image whose release label disagrees. ``plan --write-facts`` writes
the runtime it planned when one is described, and no section when none is."""

import json

from escha_deploy.sglang.releases import default_release, load_release, supported_releases

OTHER = next(v for v in supported_releases() if v != default_release())  # 0.5.23
HOST = {"platform": "linux", "mem_total_bytes": 64 * 2**30}
STOCK = ("--set", "runtime.needs=[]")  # a stock image of the release: none of our series' capabilities


def _facts(tmp_path, runtime=None):
    doc = {"schema_version": 1, "host": HOST} | ({"runtime": runtime} if runtime is not None else {})
    path = tmp_path / "box.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _runtime(release, caps=()):
    src = {"kind": "image_labels", "where": f"the image lmsysorg/sglang:v{release}"}
    return {"sglang_release": release, "sglang_release_source": src,
            "capabilities": [{"name": c, "source": src} for c in caps]}


def test_a_facts_files_release_is_planned_with_its_rules_and_source(cli, tmp_path):
    path = _facts(tmp_path, _runtime(OTHER))
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--facts", path, *STOCK, "-f", "json")
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["sglang_release"] == OTHER
    assert d["sglang_release_source"] == f"facts file {path} runtime.sglang_release (the image lmsysorg/sglang:v{OTHER})"
    guard = load_release(OTHER).host_guard
    assert guard.kind != load_release(default_release()).host_guard.kind  # the two releases' rules differ
    assert d["host_guard"]["kind"] == guard.kind
    assert d["capabilities"] == []
    kinds = {s["fact"]: (s["kind"], s["value"]) for s in d["fact_sources"]}
    assert kinds["SGLang release"] == ("facts_file", OTHER) and kinds["capabilities"] == ("facts_file", "none")


def test_a_facts_file_without_runtime_plans_as_before(cli, tmp_path):
    bare = json.loads(cli("plan", "-p", "rtx5060ti-tp2-fp8", "--facts", _facts(tmp_path), "-f", "json").out)
    assert bare["sglang_release"] == default_release()
    assert bare["sglang_release_source"].startswith("the default release")
    described = json.loads(cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "64GiB", "--linux", "-f", "json").out)
    # the profile's needs, as the image built for it provides; the same plan as a described host
    assert bare["capabilities"] == described["capabilities"] != []
    # the same fact values, the same launch: a facts file's host without runtime is a described host
    assert bare["plan_digest"] == described["plan_digest"]
    assert bare["verdict"] == described["verdict"] and bare["per_rank"] == described["per_rank"]
    assert not any(s["fact"] in ("SGLang release", "capabilities") for s in bare["fact_sources"])


def test_the_profiles_release_against_the_facts_files_is_refused_naming_both(cli, tmp_path):
    path = _facts(tmp_path, _runtime(OTHER))
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--facts", path, *STOCK,
            "--set", f"runtime.sglang_version={default_release()}")
    assert r.code == 3 and r.out == ""
    assert r.err.splitlines()[0] == (f"error: SGLang release: facts file {path} runtime.sglang_release (the image "
                                     f"lmsysorg/sglang:v{OTHER}) says {OTHER}, runtime.sglang_version says "
                                     f"{default_release()}")


def test_a_facts_files_capabilities_lacking_a_need_are_refused(cli, tmp_path):
    path = _facts(tmp_path, _runtime(default_release(), caps=["hicache-host-reserve-env"]))
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--facts", path)
    assert r.code == 3
    lacks = [ln for ln in r.err.splitlines() if "runtime lacks" in ln]
    assert lacks == [f"error: facts file {path} runtime.capabilities: runtime lacks capability '{c}'"
                     for c in ("hicache-host-allocator", "transfer-geometry-check")]


def test_write_facts_writes_the_runtime_it_planned_and_none_when_unknown(cli, tmp_path):
    out = tmp_path / "out.json"
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "64GiB", *STOCK, "--sglang-version", OTHER,
            "--write-facts", str(out))
    assert r.code == 0, r.err
    assert json.loads(out.read_text())["runtime"] == {
        "sglang_release": OTHER, "sglang_release_source": {"kind": "command_line", "where": "--sglang-version"},
        "capabilities": None, "image_ref": None, "image_id": None}
    # read back by --facts: the same release, now from the file
    d = json.loads(cli("plan", "-p", "rtx5060ti-tp2-fp8", "--facts", str(out), *STOCK, "-f", "json").out)
    assert d["sglang_release"] == OTHER and d["sglang_release_source"].endswith("(--sglang-version)")
    # a facts file's runtime is written back; none known: no section
    again = tmp_path / "again.json"
    assert cli("plan", "-p", "rtx5060ti-tp2-fp8", "--facts", str(out), *STOCK, "--write-facts", str(again)).code == 0
    assert json.loads(again.read_text())["runtime"] == json.loads(out.read_text())["runtime"]
    assert cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "64GiB", "--write-facts", str(out)).code == 0
    assert "runtime" not in json.loads(out.read_text())


def _one_box_fleet(tmp_path, facts, sets=()):
    import yaml

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"name": "one", "boxes": [
        {"name": "box", "address": "127.0.0.1", "profile": "rtx5060ti-tp2-fp8", "facts": facts, "set": list(sets)}]}))
    return str(fleet)


def test_fleet_plans_a_box_with_its_facts_files_runtime_as_plan_facts_does(cli, tmp_path):
    """A one-box fleet whose facts file names a runtime (another SGLang release, a stock
    runtime's capabilities) gives the digest, release and capabilities of `plan --facts FILE`."""
    path = _facts(tmp_path, _runtime(OTHER))
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--facts", path, *STOCK, "-f", "json")
    assert r.code == 0, r.err
    single = json.loads(r.out)
    r = cli("fleet", "plan", _one_box_fleet(tmp_path, path, [STOCK[1]]), "-f", "json")
    assert r.code == 0, r.err
    box = json.loads(r.out)["boxes"][0]["plan"]
    assert (box["sglang_release"], box["capabilities"]) == (OTHER, []) == (single["sglang_release"],
                                                                             single["capabilities"])
    assert box["plan_digest"] == single["plan_digest"]
    assert box["sglang_release_source"] == single["sglang_release_source"]
    assert box["host_guard"] == single["host_guard"]


def test_fleet_refuses_a_box_whose_facts_runtime_lacks_a_need_as_plan_facts_does(cli, tmp_path):
    path = _facts(tmp_path, _runtime(default_release(), caps=["hicache-host-reserve-env"]))
    single = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--facts", path)
    assert single.code == 3
    lacks = [ln.removeprefix("error: ") for ln in single.err.splitlines() if "runtime lacks" in ln]
    assert len(lacks) == 2
    r = cli("fleet", "plan", _one_box_fleet(tmp_path, path), "-f", "json")
    assert r.code == 3, r.err
    assert json.loads(r.out)["problems"] == [f"box box: {ln}" for ln in lacks]
    # a profile naming another release than the box's runtime: refused naming both, and the box
    other = _facts(tmp_path, _runtime(OTHER))
    r = cli("fleet", "plan", _one_box_fleet(tmp_path, other, [*STOCK[1:], f"runtime.sglang_version={default_release()}"]))
    assert r.code == 3 and r.err.splitlines()[0].startswith(f"error: box box: SGLang release: facts file {other} "), r.err
