"""Start-up cost as a module graph, not a timing: what ``plan`` and ``--help`` import in a fresh
interpreter, and that ``main`` builds only the verb it runs (docs/performance.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from escha_deploy.cli import app as cli_app

#: Never imported by plan or --help: docker-py and the HTTP stack (up, bench), the chart library.
HEAVY = ("docker", "requests", "urllib3", "httpx", "matplotlib")

PROBE = """
import json, sys
from escha_deploy.cli.main import main
code = 0
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
built = []
if "pydantic.main" in sys.modules:  # the models whose validator was built (not deferred)
    todo = list(sys.modules["pydantic.main"].BaseModel.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__dict__.get("__pydantic_complete__"):
            built.append(f"{cls.__module__}.{cls.__qualname__}")
print(json.dumps({"code": code, "modules": sorted(sys.modules), "built": sorted(built)}), file=sys.stderr)
"""


def run_probe(*args: str, env: dict[str, str] | None = None) -> dict:
    """Run the real entry point in a fresh interpreter (``env`` added to this one's); return its
    exit code, the modules it imported and the pydantic models it built."""
    r = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **(env or {})})
    return json.loads(r.stderr.strip().splitlines()[-1])


def modules_after(*args: str, env: dict[str, str] | None = None) -> tuple[int, set[str]]:
    """Run the real entry point in a fresh interpreter; return its exit code and the top-level
    names of every module it imported."""
    last = run_probe(*args, env=env)
    return last["code"], {m.split(".")[0] for m in last["modules"]} | set(last["modules"])


PLAN = ("plan", "--profile", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2", "--format", "json")


@pytest.mark.parametrize("args", [PLAN, ("plan", "--profile", "rtx5060ti-tp2", "--host-ram", "16GiB"),
                                  ("--help",), ("plan", "--help"), ()])
def test_plan_and_help_import_no_heavy_module(args):
    code, mods = modules_after(*args)
    assert code in (0, 2), code  # no arguments prints help and exits 2, as click does
    assert not mods & set(HEAVY), sorted(mods & set(HEAVY))


def test_help_and_json_plan_skip_rich_and_the_verbs_not_run():
    code, mods = modules_after("--help")
    assert code == 0
    # plain help: none of typer's rich renderer, and no pydantic model is built for it
    assert not mods & {"rich", "typer.rich_utils", "markdown_it", "pygments", "pydantic"}, \
        sorted(mods & {"rich", "typer.rich_utils", "markdown_it", "pygments", "pydantic"})
    code, mods = modules_after(*PLAN)
    assert code == 0
    assert "rich" not in mods  # --format json prints json.dumps, no table
    others = {f"escha_deploy.cli.{m}" for m in cli_app.VERB_MODULES if m != "plan"}
    assert not mods & others, sorted(mods & others)
    assert "escha_deploy.cli.plan" in mods


#: Data a plan of a described host neither reads nor writes: the launch spec (up, serve,
#: compose), facts files, doctor's findings, an image's runtime description, the redaction of
#: a dry run, NVML, and the model folder's lock file (no folder here: `plan` says "unpinned").
NOT_FOR_A_DESCRIBED_PLAN = ("escha_deploy.pipeline.spec", "escha_deploy.facts.factsfile", "escha_deploy.facts.saved",
                            "escha_deploy.facts.file", "escha_deploy.facts.findings",
                            "escha_deploy.runtime.description", "escha_deploy.utils.redact", "pynvml",
                            "escha_deploy.checkpoint.lock")
STANDIN = str(Path(__file__).resolve().parents[1] / "launch" / "standin" / "profile.yaml")


def test_described_plan_imports_no_spec_facts_findings_or_nvml(tmp_path):
    # the table plan; `--format json` also carries the plan digest, which needs the launch spec
    code, mods = modules_after(*PLAN[:-2], env={"XDG_CACHE_HOME": str(tmp_path)})
    assert code == 0
    assert not mods & set(NOT_FOR_A_DESCRIBED_PLAN), sorted(mods & set(NOT_FOR_A_DESCRIBED_PLAN))
    # what it does import it needs: the profile, the planner and the flag check
    assert {"escha_deploy.profile", "escha_deploy.planner", "escha_deploy.sglang.flagcheck"} <= mods


def test_json_plan_renders_its_spec_without_the_facts_file_models(tmp_path):
    """`plan --format json` renders the launch spec (its digest) but reads no facts file: the
    spec's GPU records are ``facts.gpus``'s, its facts mount path is ``paths``'s."""
    code, mods = modules_after(*PLAN, env={"XDG_CACHE_HOME": str(tmp_path)})
    assert code == 0 and "escha_deploy.pipeline.spec" in mods
    unused = {"escha_deploy.facts.factsfile", "escha_deploy.facts.file", "escha_deploy.facts.saved",
              "escha_deploy.facts.findings", "escha_deploy.facts.runtime"}
    assert not mods & unused, sorted(mods & unused)


def test_status_with_nothing_running_imports_neither_up_nor_the_diagnosis(tmp_path):
    """`status` reads the containers and native servers; it runs none of `up`'s preflight and
    diagnoses nothing, so those modules stay out (no daemon here: it answers 3 or 4)."""
    code, mods = modules_after("status", env={"XDG_CACHE_HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path),
                                              "DOCKER_HOST": f"unix://{tmp_path / 'no-daemon.sock'}"})
    assert code in (3, 4), code
    assert "escha_deploy.watch.session" in mods
    # the pipeline's stages: its package is there (the launch spec's models are pipeline/spec.py's)
    stages = {f"escha_deploy.pipeline.{s}" for s in ("sources", "gathering", "runtime", "decision", "rendering", "request")}
    unused = {"escha_deploy.launch.up", "escha_deploy.launch.diagnose", "escha_deploy.launch.sglang_preflight",
              "escha_deploy.launch.guard", "escha_deploy.planner", *stages}
    assert not mods & unused, sorted(mods & unused)


def test_live_plan_without_findings_builds_no_findings_model_and_a_gpuless_profile_skips_nvml(tmp_path):
    # this host, no saved doctor findings (an empty cache folder): the findings module is read
    # for the file's path, but its models are built only when there is a file to validate
    last = run_probe("plan", "--profile", STANDIN, env={"XDG_CACHE_HOME": str(tmp_path)})  # the table plan
    assert last["code"] in (0, 3), last["code"]
    mods = set(last["modules"])
    assert "escha_deploy.facts.saved" in mods  # it looked for findings
    assert not {m for m in last["built"] if m.startswith(("escha_deploy.facts.saved.", "escha_deploy.facts.findings."))}, \
        last["built"]
    assert not mods & {"escha_deploy.pipeline.spec", "escha_deploy.facts.factsfile", "escha_deploy.runtime.description"}
    # container.gpus: [] asks for no GPU, so NVML is not read and pynvml not imported
    assert "pynvml" not in mods
    assert "escha_deploy.planner.result.Plan" in last["built"]  # the probe sees built models


def test_findings_models_build_when_findings_are_read(tmp_path):
    from escha_deploy.facts.saved import DoctorFindings, load_findings

    p = tmp_path / "findings.json"
    p.write_text(json.dumps({"created_at": "2026-11-30T00:00:00+00:00", "host_id": "h", "pinned_ceiling_bytes": 5}))
    f = load_findings(p, host_id="h")
    assert isinstance(f, DoctorFindings) and f.pinned_ceiling_bytes == 5
    p.write_text(json.dumps({"created_at": "2026-11-30T00:00:00+00:00", "host_id": "h", "pinned_ceiling_bytes": "x"}))
    assert load_findings(p, host_id="h") is None  # still validated: a bad file is no findings


def _registered(module: str) -> list[str]:
    import importlib

    app = typer.Typer()
    importlib.import_module(f"escha_deploy.cli.{module}").register(app)
    names = [c.name for c in app.registered_commands]
    names += [g.name or g.typer_instance.info.name for g in app.registered_groups]
    return names


def test_command_map_matches_what_each_module_registers():
    seen: dict[str, str] = {}
    for module in cli_app.VERB_MODULES:
        for name in _registered(module):
            assert name not in seen, f"{name} registered by {seen[name]} and {module}"
            seen[name] = module
    assert seen == cli_app.COMMANDS


def test_one_verb_app_still_parses_its_command(cli):
    r = cli("plan", "--profile", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2", "--format", "json")
    assert r.code == 0 and json.loads(r.out)["profile"] == "rtx5060ti-tp2"
    r = cli("nope")
    assert r.code == 2 and "No such command 'nope'" in r.err
    r = cli("plan", "--bogus")
    assert r.code == 2 and "No such option: --bogus" in r.err


def test_help_lists_every_command_under_its_panel(cli):
    r = cli("--help")
    assert r.code == 0
    panels = {}
    current = None
    for line in r.out.splitlines():
        if line and not line.startswith(" ") and line.endswith(":") and line != "Options:":
            current = line[:-1]
        elif current and line.startswith("  ") and line.strip():
            panels.setdefault(current, []).append(line.split()[0])
    group = typer.main.get_group(cli_app.build_app())
    expected: dict[str, list[str]] = {}
    for name, cmd in group.commands.items():
        expected.setdefault(cmd.rich_help_panel or "Commands", []).append(name)
    assert panels == expected
    assert {"Lifecycle", "Runtime", "Planning", "Measure"} <= panels.keys()
    assert panels["Lifecycle"][:2] == ["up", "down"] and "plan" in panels["Planning"]
