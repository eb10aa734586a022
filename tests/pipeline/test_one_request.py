"""One request: every command plans through ``pipeline.plan_request`` with its choice of a facts
source and a runtime source.

- the runtime is chosen in one place: ``releases.choose_release`` is called only by
  ``pipeline.resolve_runtime``, which is called at one site outside the tests (``plan_request``);
- the gathered value is frozen: nothing changes it after ``gather``;
- the server argv is rendered once per command (``flags.server_args`` counted), and the flag
  check reads that argv: a launch's check is of the argv the spec runs.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tests.inproc import run_main

PKG = Path(__file__).resolve().parents[2] / "escha_deploy"
GiB = 2**30


def _calls(name: str) -> list[tuple[str, str]]:
    """``(module, enclosing function)`` of every call of ``name`` (a plain or attribute call)
    in the package's source."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None) != name:
                continue
            up: ast.AST | None = node
            while up is not None and not isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
                up = parents.get(up)
            found.append((str(path.relative_to(PKG.parent)), up.name if up is not None else "<module>"))
    return found


def test_the_runtime_is_chosen_at_one_call_site():
    assert _calls("choose_release") == [("escha_deploy/pipeline/runtime.py", "resolve_runtime")]
    assert _calls("resolve_runtime") == [("escha_deploy/pipeline/request.py", "plan_request")]


def test_the_launch_spec_is_rendered_at_one_call_site():
    """Every command's launch spec comes from the one request (``pipeline.render``, called by
    ``plan_request`` and, for a plan's digest, ``decide``): fleet compose and diagnose included."""
    assert _calls("build_launch_spec") == [("escha_deploy/pipeline/rendering.py", "render")]


def test_the_gathered_value_is_frozen():
    from escha_deploy.pipeline import DescribedHost, gather
    from escha_deploy.profile import load_profile

    prof = load_profile("rtx5060ti-tp2")
    g = gather(prof, DescribedHost(64 * GiB, "linux"))
    for field, value in (("runtime", None), ("host", g.host), ("facts", ())):
        with pytest.raises(AttributeError):
            setattr(g, field, value)
    assert isinstance(g.facts, tuple) and isinstance(g.gpus, tuple) and isinstance(g.l3_refusals, tuple)
    # gathering twice from one source gives one value: no helper added to it in between
    assert gather(prof, DescribedHost(64 * GiB, "linux")) == g


@pytest.fixture
def renders(monkeypatch):
    """The argv renders (``flags.server_args`` calls) of what runs next."""
    from escha_deploy.pipeline import argv as flags

    real = flags.server_args
    seen: list[list[str]] = []

    def counted(*a, **k):
        argv = real(*a, **k)
        seen.append(argv)
        return argv

    monkeypatch.setattr(flags, "server_args", counted)
    return seen


def _facts(tmp_path) -> Path:
    from escha_deploy.facts.factsfile import FactsFile, GpuRecord, HostSection

    facts = tmp_path / "box.json"
    facts.write_text(FactsFile(host=HostSection(platform="linux", mem_total_bytes=128 * GiB), gpus=[
        GpuRecord(index=i, name="NVIDIA GeForce RTX 5060 Ti", memory_total_bytes=16 * GiB,
                  compute_capability="12.0") for i in range(2)]).model_dump_json())
    return facts


@pytest.mark.parametrize("argv", [
    ("plan", "-p", "rtx5060ti-tp2", "--host-ram", "64GiB"),
    ("plan", "-p", "rtx5060ti-tp2", "--host-ram", "64GiB", "--format", "json"),
    ("compose", "-p", "rtx5060ti-tp2", "--facts", "{facts}"),
    ("serve", "--profile", "rtx5060ti-tp2", "--facts", "{facts}", "--print"),
    ("up", "-p", "rtx5060ti-tp2", "--facts", "{facts}", "--dry-run", "--format", "json"),
], ids=["plan", "plan-json", "compose-facts", "serve-print", "up-dry-run"])
def test_the_argv_is_rendered_once(tmp_path, renders, argv):
    facts = _facts(tmp_path)
    # no Docker daemon answers: `up --dry-run` plans without it (and starts nothing)
    r = run_main(*(a.format(facts=facts) for a in argv), env={"XDG_CACHE_HOME": str(tmp_path / "cache"),
                                                             "DOCKER_HOST": f"unix://{tmp_path / 'no-daemon.sock'}"})
    assert r.code in (0, 3), r.err
    assert len(renders) == 1, [a[:4] for a in renders]


def test_up_renders_once_and_checks_the_argv_that_runs(tmp_path, renders, monkeypatch):
    from escha_deploy.launch.prepare import prepare

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    p = prepare("rtx5060ti-tp2", [], facts_path=str(_facts(tmp_path)))
    assert len(renders) == 1
    assert ["python3", "-m", "sglang.launch_server", *renders[0]] == p.launch.argv == p.argv
    assert p.plan.argv_check is not None and p.plan.argv_check.errors == []


def test_a_native_serve_checks_its_own_argv(tmp_path, renders):
    # natively the server binds loopback and loads model.host_dir: the check reads that argv
    r = run_main("serve", "--profile", "rtx5060ti-tp2", "--facts", str(_facts(tmp_path)), "--print",
                 env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert r.code in (0, 3), r.err
    printed = json.loads(r.out)
    assert len(renders) == 1 and printed["argv"][3:] == renders[0]
    assert printed["argv"][printed["argv"].index("--host") + 1] == "127.0.0.1"


def _node_flag_unknown(monkeypatch):
    """A multi-node render that adds a flag no SGLang release knows (a STAND-IN for a node flag
    the release's parser refuses): the single-node argv the fleet plan checked stays good."""
    from escha_deploy.pipeline import argv as flags

    real = flags.server_args

    def with_bad_node_flag(*a, **k):
        argv = real(*a, **k)
        return argv + ["--not-an-sglang-flag"] if k.get("multinode") is not None else argv

    monkeypatch.setattr(flags, "server_args", with_bad_node_flag)


def test_every_multi_node_argv_is_checked_against_the_flag_catalog(tmp_path, monkeypatch):
    from escha_deploy.fleet.model import load_fleet
    from escha_deploy.fleet.multinode import render_nodes
    from escha_deploy.fleet.plan import plan_fleet
    from escha_deploy.pipeline import BadArgv
    from tests.fleet.test_fleet_k8s import fleet_file

    loaded = load_fleet(fleet_file(tmp_path))
    fp = plan_fleet(loaded)
    inst = next(i for i in loaded.fleet.instances() if i.multi_node)
    args = (inst, [fp.box_plan(b).plan for b in inst.boxes], [fp.profile(b) for b in inst.boxes],
            [loaded.fleet.box(b).address for b in inst.boxes], [loaded.fleet.box(b).nic for b in inst.boxes])
    assert len(render_nodes(*args)) == 2  # the real render passes its own check
    _node_flag_unknown(monkeypatch)
    with pytest.raises(BadArgv) as e:
        render_nodes(*args)
    assert any("--not-an-sglang-flag" in p for p in e.value.problems), e.value.problems


def test_the_k8s_node_argv_is_checked_with_the_values_leaderworkerset_fills(tmp_path, monkeypatch):
    pytest.importorskip("jsonschema")
    from escha_deploy.fleet.k8s import render_k8s
    from escha_deploy.fleet.model import load_fleet
    from escha_deploy.fleet.plan import plan_fleet
    from escha_deploy.pipeline import BadArgv
    from tests.fleet.test_fleet_k8s import fleet_file

    loaded = load_fleet(fleet_file(tmp_path))
    fp = plan_fleet(loaded)
    # the real render passes: $(LWS_GROUP_SIZE) and friends are checked as the numbers LWS fills
    assert any(o["kind"] == "LeaderWorkerSet" for o in render_k8s(loaded, fp))
    _node_flag_unknown(monkeypatch)
    with pytest.raises(BadArgv) as e:
        render_k8s(loaded, fp)
    assert any("--not-an-sglang-flag" in p for p in e.value.problems), e.value.problems


def test_the_l3_directory_is_checked_where_the_server_runs(tmp_path):
    """A plan of this machine checks the file L3 directory here; a plan of a facts file does not
    (that box's directory is not this machine's); `up --facts` runs the server here, so it does."""
    from escha_deploy.pipeline import BoxRuntime, RuntimeClaim, facts_source, plan_here, plan_request
    from escha_deploy.profile import load_profile

    missing = tmp_path / "no-such-l3"
    prof = load_profile("linux-tp2-l3", [f"hicache.l3.dir={missing}"])
    facts = str(_facts(tmp_path))
    here = plan_here(prof, facts_source(), BoxRuntime())
    assert here.gathered.l3_refusals and str(missing) in here.plan.reasons[0] and here.plan.verdict == "unsafe"
    box = plan_here(prof, facts_source(facts), BoxRuntime())
    assert box.gathered.l3_refusals == () and not any(str(missing) in r for r in box.plan.reasons)
    up = plan_request(prof, facts_source(facts, launch=True), RuntimeClaim(None, "the image", None))
    assert any(str(missing) in r for r in up.refusals)
