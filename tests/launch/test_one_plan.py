"""One plan from host to container, on a real Docker daemon with the STAND-IN serve image
(tests/launch/standin/serve.Dockerfile: the REAL escha-deploy of this checkout as entrypoint,
a STAND-IN for SGLang's interpreter that logs the argv and env it received) and the STAND-IN
test profile, which needs no GPU.

- `up --dry-run`'s argv, the container's plan-digest label and the child's argv are one;
- `serve --spec` refuses a container whose memory limit is below what the plan assumed;
- saved doctor findings with a pinned ceiling change the plan that runs;
- a flag the runtime would refuse in runtime.extra_args is refused on every path (exit 2);
- `up --facts` and the compose container's `serve` (ESCHA_FACTS) reach the same digest and argv.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import resource
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import STANDIN_PROFILE, run_cli, STANDIN_CONTAINER, STANDIN_LABEL, RUN

pytestmark = pytest.mark.docker
P = str(STANDIN_PROFILE)
CONTAINER = STANDIN_CONTAINER
GiB = 2**30


def _env(tmp_path: Path, name: str = "cache") -> dict:
    """The CLI's environment with its own cache folder (doctor findings, spec files)."""
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / name)}


def _dry(image: str, env: dict, *extra: str) -> dict:
    r = run_cli("up", "--profile", P, "--set", f"container.image={image}", *extra, "--dry-run",
                "--format", "json", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _child(container, timeout: float = 60) -> dict:
    """The STANDIN-CHILD record the stand-in SGLang interpreter logged."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        for line in container.logs().decode().splitlines():
            if line.startswith("STANDIN-CHILD "):
                return json.loads(line[len("STANDIN-CHILD "):])
        time.sleep(0.5)
    raise AssertionError("no STANDIN-CHILD line:\n" + container.logs().decode()[-3000:])


def _up_and_check(docker_client, image: str, env: dict, *extra: str) -> dict:
    """`up --dry-run`, then `up`: the label digest and the child's argv equal the dry run's."""
    dry = _dry(image, env, *extra)
    r = run_cli("up", "--profile", P, "--set", f"container.image={image}", *extra, "--detach", env=env,
                timeout=180)
    try:
        assert r.returncode == 0, r.stderr
        c = docker_client.containers.get(CONTAINER)
        assert c.labels["io.escha.plan-digest"] == dry["plan_digest"]
        assert c.attrs["Config"]["Cmd"] == ["--spec", "/etc/escha/launch-spec.json"]
        child = _child(c)
        # argv[0] is `python3`; the image names SGLang's interpreter (ESCHA_SGLANG_PYTHON)
        assert dry["argv"][0] == "python3"
        assert child["argv"] == dry["argv"][1:]
        spec = json.loads((Path(env["XDG_CACHE_HOME"]) / "escha-deploy" / "launch" / f"{CONTAINER}.json").read_text())
        assert spec["plan_digest"] == dry["plan_digest"] and spec["argv"] == dry["argv"]
        assert {k: child["env"].get(k) for k in spec["env"]} == spec["env"]
        assert f"plan digest {dry['plan_digest']}" in c.logs().decode()  # serve --spec named the plan it ran
        return {"dry": dry, "child": child, "spec": spec}
    finally:
        d = run_cli("down", "--profile", P, env=env)
        assert d.returncode == 0, d.stderr


def test_dry_run_argv_label_digest_and_child_argv_are_one(docker_client, serve_image, tmp_path, no_leaks):
    got = _up_and_check(docker_client, serve_image, _env(tmp_path))
    from escha_deploy.pipeline.spec import LAUNCH_SPEC_SCHEMA_VERSION

    assert got["spec"]["schema_version"] == LAUNCH_SPEC_SCHEMA_VERSION and got["spec"]["escha_version"]
    assert "--enable-hierarchical-cache" in got["child"]["argv"]


def _save_findings(cache: Path, ceiling: int) -> None:
    from escha_deploy.facts.saved import DoctorFindings, save_findings
    from escha_deploy.facts.machine import host_id

    save_findings(DoctorFindings(created_at=dt.datetime.now(dt.timezone.utc).isoformat(), host_id=host_id(),
                                 platform="linux", pinned_ceiling_bytes=ceiling, pinned_ceiling_reached=True,
                                 host_allocator="pinned"),
                  cache / "escha-deploy" / "doctor.json")


def test_saved_findings_with_a_pinned_ceiling_change_the_plan_that_runs(docker_client, serve_image, tmp_path,
                                                                         no_leaks):
    auto = ("--set", "hicache.hicache_ratio=auto")
    without = _dry(serve_image, _env(tmp_path, "empty"), *auto)
    env = _env(tmp_path)
    _save_findings(tmp_path / "cache", 5 * GiB)
    got = _up_and_check(docker_client, serve_image, env, *auto)
    ratio = lambda argv: float(argv[argv.index("--hicache-ratio") + 1])  # noqa: E731
    assert ratio(got["child"]["argv"]) < ratio(without["argv"][1:])  # the ceiling lowered the ratio that runs
    assert got["dry"]["plan_digest"] != without["plan_digest"]
    ceiling = next(f for f in got["dry"]["facts"] if f["fact"] == "pinned ceiling per process")
    assert ceiling["value"].startswith(f"{5 * GiB:,} B") and "saved doctor findings" in ceiling["source"]
    unmeasured = next(f for f in without["facts"] if f["fact"] == "pinned ceiling per process")
    assert unmeasured["value"] == "unmeasured" and "`escha-deploy doctor`" in unmeasured["source"]


def _run_serve(docker_client, image: str, command: list[str], *, mounts=(), **kw):
    """Run the image's `escha-deploy serve` to its end; returns (exit code, log)."""
    from docker.types import Mount

    c = docker_client.containers.create(
        image, command, name=f"escha-test-one-plan-{RUN}", labels={"io.escha.test": f"one-plan-{RUN}"},
        environment={"ESCHA_SERVE_MODE": "container"}, cap_drop=["ALL"], cap_add=["IPC_LOCK"],
        mounts=[Mount(t, s, type="bind", read_only=True) for s, t in mounts], **kw)
    try:
        c.start()
        code = c.wait(timeout=120)["StatusCode"]
        return code, c.logs().decode()
    finally:
        c.remove(force=True)


def test_serve_spec_refuses_a_memory_limit_below_the_plan(docker_client, serve_image, tmp_path, no_leaks):
    from escha_deploy.launch.prepare import prepare
    from escha_deploy.launch.up import write_spec

    spec_file = tmp_path / "spec.json"
    prep = prepare(P, [f"container.image={serve_image}"], client=docker_client, spec_file=str(spec_file))
    assert not prep.refusals
    write_spec(prep.launch, spec_file)
    want = prep.launch.facts.memory_base_bytes
    limit = 2 * GiB
    assert limit < want
    code, log = _run_serve(docker_client, serve_image, ["--spec", "/etc/escha/launch-spec.json"],
                           mounts=[(str(spec_file), "/etc/escha/launch-spec.json")], mem_limit=limit)
    assert code == 3, log
    assert f"memory: this environment can have {limit:,} B" in log and f"below the {want:,} B" in log
    assert "STANDIN-CHILD" not in log  # nothing started

    # the same spec under no limit runs (the refusal above is the limit's doing)
    code, log = _run_serve(docker_client, serve_image, ["--spec", "/etc/escha/launch-spec.json", "--print"],
                           mounts=[(str(spec_file), "/etc/escha/launch-spec.json")])
    assert code == 0, log
    assert json.loads(log[log.index("{"):log.rindex("}") + 1])["argv"] == prep.launch.argv


def test_serve_spec_refuses_another_schema_version_naming_both(docker_client, serve_image, tmp_path, no_leaks):
    from escha_deploy.launch.prepare import prepare
    from escha_deploy.launch.up import write_spec

    spec_file = tmp_path / "spec.json"
    prep = prepare(P, [f"container.image={serve_image}"], client=docker_client, spec_file=str(spec_file))
    write_spec(prep.launch, spec_file)
    data = json.loads(spec_file.read_text())
    data["schema_version"] = 99
    spec_file.write_text(json.dumps(data))
    code, log = _run_serve(docker_client, serve_image, ["--spec", "/etc/escha/launch-spec.json"],
                           mounts=[(str(spec_file), "/etc/escha/launch-spec.json")])
    assert code == 3, log
    from escha_deploy.pipeline.spec import LAUNCH_SPEC_SCHEMA_VERSION

    assert "launch spec schema version 99" in log and f"reads schema version {LAUNCH_SPEC_SCHEMA_VERSION}" in log

    data["schema_version"] = LAUNCH_SPEC_SCHEMA_VERSION
    data["argv"] = [*data["argv"], "--disable-radix-cache"]  # edited after planning
    spec_file.write_text(json.dumps(data))
    code, log = _run_serve(docker_client, serve_image, ["--spec", "/etc/escha/launch-spec.json"],
                           mounts=[(str(spec_file), "/etc/escha/launch-spec.json")])
    assert code == 3 and "plan_digest does not match" in log, log


BAD = "runtime.extra_args=[--no-such-flag, '1']"


def test_unknown_flag_in_extra_args_is_refused_on_every_path(docker_client, serve_image, tmp_path, no_leaks):
    env = _env(tmp_path)
    image = f"container.image={serve_image}"
    runs = {
        "plan": run_cli("plan", "--profile", P, "--set", BAD, env=env),
        "up --dry-run": run_cli("up", "--profile", P, "--set", image, "--set", BAD, "--dry-run", env=env),
        "up": run_cli("up", "--profile", P, "--set", image, "--set", BAD, "--detach", env=env),
        "compose": run_cli("compose", "--profile", P, "--set", BAD, env=env),
        "serve --print": run_cli("serve", "--profile", P, "--set", BAD, "--print", env=env),
    }
    for path, r in runs.items():
        assert r.returncode == 2, (path, r.stderr)
        assert "runtime.extra_args or rendered argv: --no-such-flag" in r.stderr, (path, r.stderr)
        assert "Traceback" not in r.stderr
    assert runs["compose"].stdout == ""  # nothing rendered
    assert not docker_client.containers.list(all=True, filters={"label": STANDIN_LABEL})
    assert not (tmp_path / "cache" / "escha-deploy" / "launch").exists()  # up wrote no spec either
    # a compose container's serve (plans for itself) exits 2 before SGLang starts
    code, log = _run_serve(docker_client, serve_image, ["--profile", "/etc/escha/profile.yaml", "--set", BAD],
                           mounts=[(P, "/etc/escha/profile.yaml")])
    assert code == 2, log
    assert "--no-such-flag" in log and "STANDIN-CHILD" not in log


def _facts_file(path: Path) -> Path:
    from escha_deploy.facts.factsfile import FactsFile, GpuRecord, HostSection

    doc = FactsFile(host=HostSection(platform="linux", mem_total_bytes=16 * GiB),
                    gpus=[GpuRecord(index=0, name="NVIDIA GeForce RTX 5060 Ti", memory_total_bytes=16 * GiB,
                                    compute_capability="12.0"),
                          GpuRecord(index=1, name="NVIDIA GeForce RTX 5060 Ti", memory_total_bytes=16 * GiB,
                                    compute_capability="12.0")])
    path.write_text(doc.model_dump_json(indent=2))
    return path


def test_compose_and_up_reach_the_same_digest_and_argv_from_one_facts_file(docker_client, serve_image, tmp_path,
                                                                            no_leaks):
    import shutil

    import yaml

    if shutil.which("docker-compose") is None:
        pytest.skip("no docker-compose (CI installs Debian's 1.29)")
    facts = _facts_file(tmp_path / "box.json")
    env = _env(tmp_path)
    dry = _dry(serve_image, env, "--facts", str(facts))
    assert any(f["source"] == f"facts file {facts}" for f in dry["facts"])
    r = run_cli("compose", "--profile", P, "--set", f"container.image={serve_image}", "--facts", str(facts), env=env)
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(r.stdout)
    svc = doc["services"]["sglang"]
    assert svc["environment"]["ESCHA_FACTS"] == "/etc/escha/facts.json"
    # test adaptations, not product settings: the image is built already, and this sandbox's
    # Docker cannot raise RLIMIT_MEMLOCK (the container keeps CAP_IPC_LOCK, so pinning is allowed)
    del svc["build"]
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    svc["ulimits"]["memlock"] = {"soft": hard, "hard": hard}
    del svc["healthcheck"]
    compose_file = tmp_path / "compose.yaml"
    compose_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    cmd = ["docker-compose", "--project-name", f"escha-onetest-{RUN.lower()}", "--file", str(compose_file)]
    up = subprocess.run([*cmd, "up", "--detach", "--no-build"], capture_output=True, text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stderr
        c = docker_client.containers.get(CONTAINER)
        child = _child(c)
        log = c.logs().decode()
        assert f"plan digest {dry['plan_digest']}" in log, log[-2000:]  # serve planned here, to the same digest
        assert child["argv"] == dry["argv"][1:]
    finally:
        down = subprocess.run([*cmd, "down", "--timeout", "10"], capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr
