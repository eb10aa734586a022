"""A fork's image for real: the synthetic fork (``synthetic_fork.py``, real git, the real wheel's
files) imported with ``escha-deploy runtime import`` and built by ``escha-deploy build --hicache``
on the real dockerd, on the local Debian base with the real sglang 0.5.19 wheel.

Three images, one build each per run: ``.ci/test`` builds the main one (our 0001-0004 kept, the
fork's reserve commit dropped, ``int2-kv`` and ``w2-weights`` declared); this module's session
fixture builds two variants from the same export with the Docker layer cache (only the layer
that applies the patches differs): ``undeclared`` (no capability declared) and ``noours`` (our
0001 dropped, the fork's reserve commit kept). Run under ``flock /tmp/escha-docker.lock``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from escha_deploy.sglang.capabilities import ENV_HOST_RESERVE

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_fork import SUBJECT_JP, declaration, make_fork  # noqa: E402
from synthetic_fork import hand_made_mail as mail  # noqa: E402
from test_build_docker import BASE, _client, _need_image, _run  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.wheel]
REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("ESCHA_TEST_FORK_IMAGE", "escha-sglang:ci-fork")
PROFILE = "rtx5060ti-tp2"
GiB = 2**30


def _build(src: Path, decl: str, name: str, tag: str) -> None:
    """Import ``src`` with ``decl`` into build/fork-test-NAME and build ``tag`` from it."""
    (src / "escha-fork.yaml").write_text(decl, encoding="utf-8")
    out = REPO / "build" / f"fork-test-{name}"
    shutil.rmtree(out, ignore_errors=True)
    for argv in (["escha-deploy", "runtime", "import", str(src), "-o", str(out)],
                 ["escha-deploy", "build", "--base-image", BASE, "--python-version", "3.11",
                  "--fork-dir", f"build/fork-test-{name}", "--tag", tag]):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO)
        assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="session")
def images(sglang_wheel, tmp_path_factory):
    client = _client()
    _need_image(client, BASE)
    if not any((REPO / "build" / "wheelhouse-py3.11").glob("escha_deploy-*.whl")):
        pytest.skip("no build/wheelhouse-py3.11 (.ci/test runs scripts/build-wheelhouse.sh 3.11)")
    out = tmp_path_factory.mktemp("fork-docker")
    h = make_fork(sglang_wheel, out)
    made = []
    import docker

    try:
        client.images.get(IMAGE)  # .ci/test built it from the same export
    except docker.errors.ImageNotFound:
        _build(out / "good", declaration(h, "drop-fork"), "main", IMAGE)
        made.append(IMAGE)
    tags = {"main": IMAGE, "undeclared": IMAGE + "-undeclared", "noours": IMAGE + "-noours"}
    _build(out / "good", declaration(h, "drop-fork", None), "undeclared", tags["undeclared"])
    _build(out / "good", declaration(h, "drop-ours"), "noours", tags["noours"])
    made += [tags["undeclared"], tags["noours"]]
    yield tags, h
    for t in made:
        subprocess.run(["docker", "rmi", "-f", t], capture_output=True)
    for name in ("main", "undeclared", "noours"):
        shutil.rmtree(REPO / "build" / f"fork-test-{name}", ignore_errors=True)


def _model_setup() -> str:
    """A shell line that makes /tmp/model pass ``serve``'s model-folder check (it refuses a
    folder without config.json or weights, exit 2, before it prints): the profile's architecture
    as config.json (the oracle's writer) and an empty weights file; nothing here loads them."""
    import shlex

    from escha_deploy.profile import load_profile
    from tests.oracle.cases import config_json

    cfg = json.dumps(config_json(load_profile(PROFILE).model.architecture))
    return (f"mkdir -p /tmp/model && printf %s {shlex.quote(cfg)} > /tmp/model/config.json"
            " && : > /tmp/model/model.safetensors")


def _serve_print(image: str, *extra: str) -> tuple[int, dict, str]:
    argv = ["escha-deploy", "serve", "--print", "--profile", PROFILE,
            "--set", "model.host_dir=/tmp/model", "--set", "model.path=/tmp/model", *extra]
    # serve checks memlock against the pinned pools unless it holds CAP_IPC_LOCK (as `up` gives)
    cmd = ["docker", "run", "--rm", "--cap-add", "IPC_LOCK", "--entrypoint", "sh", image,
           "-c", _model_setup() + ' && exec "$@"', "sh", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def _plan(image: str, *extra: str) -> dict:
    proc = _run(image, "escha-deploy", "plan", "--profile", PROFILE, "--format", "json", *extra)
    assert proc.returncode in (0, 3), proc.stderr
    return json.loads(proc.stdout)


def test_fork_image_verifies_and_describes_its_commits(images):
    tags, h = images
    verify = _run(tags["main"], "escha-deploy", "runtime", "verify", "--format", "json")
    assert verify.returncode == 0, verify.stderr
    v = json.loads(verify.stdout)
    assert v["ok"] and v["files"] == 4371 + 4 + 2  # + our 4 hooks + the fork's 2 new modules
    desc = json.loads(_run(tags["main"], "cat", "/etc/escha/runtime.json").stdout)
    fork = [e for e in desc["series"] if e["source"] == "fork"]
    assert [e["commit"] for e in fork] == [h["int2"], h["jp"], h["tools"]]
    assert fork[1]["subject"] == SUBJECT_JP and fork[2]["left_out"] == ["tools/x.py"]
    assert [e["name"] for e in desc["series"]][:4] == [
        "0001-hicache-host-reserve.patch", "0002-hicache-host-allocator.patch",
        "0003-transfer-geometry-check.patch", "0004-hicache-host-mamba-slots.patch"]
    assert len(desc["dropped"]) == 1 and h["rsv"][:12] in desc["dropped"][0]
    labels = _client().images.get(tags["main"]).labels
    assert [c["commit"] for c in json.loads(labels["io.escha.runtime.fork"])] == [
        h["int2"], h["jp"], h["tools"]]
    assert json.loads(labels["io.escha.runtime.fork"])[1]["subject"] == SUBJECT_JP
    assert labels["io.escha.runtime.capabilities"].split(",") == desc["capabilities"]
    layers = [x for x in _client().images.get(tags["main"]).history()
              if "runtime apply" in (x.get("CreatedBy") or "")]
    assert len(layers) == 1 and layers[0]["Size"] < 2_000_000, layers  # 803 kB measured


def test_one_changed_byte_in_a_fork_file_is_named(images):
    tags, _ = images
    script = ("set -e; f=$(ls -d /opt/sglang/venv/lib/python3*/site-packages/sglang)/srt/mem_cache/"
              "int2_kv.py; printf '#' >> \"$f\"; escha-deploy runtime verify")
    proc = _run(tags["main"], "sh", "-c", script)
    assert proc.returncode == 3
    assert "error: changed: sglang/srt/mem_cache/int2_kv.py" in proc.stderr
    assert proc.stderr.count("error:") == 1


def test_declared_capabilities_pass_serve_and_plan_is_patched(images):
    tags, _ = images
    rc, out, err = _serve_print(tags["main"])
    assert rc == 0, err
    assert out["missing_capabilities"] == []
    assert ENV_HOST_RESERVE in out["env"]
    plan = _plan(tags["main"])
    assert plan["runtime_check"]["applies"] == "patched"
    assert out["env"][ENV_HOST_RESERVE] == str(plan["runtime_check"]["patched_reserve_bytes"])


def test_undeclared_capabilities_exit_3_naming_both(images):
    tags, _ = images
    rc, out, err = _serve_print(tags["undeclared"])
    assert rc == 3
    assert out["missing_capabilities"] == ["int2-kv", "w2-weights"]
    lacks = [ln for ln in err.splitlines() if "runtime lacks capability" in ln]
    assert len(lacks) == 2
    assert "'int2-kv'" in lacks[0] and "'w2-weights'" in lacks[1]


def test_without_our_0001_plan_is_stock_and_env_has_no_reserve(images):
    tags, _ = images
    rc, out, err = _serve_print(tags["noours"])
    assert rc == 3  # the profile needs our host-reserve capability, and the image lacks it
    assert out["missing_capabilities"] == ["hicache-host-reserve-env"]
    assert ENV_HOST_RESERVE not in out["env"]
    # with the profile's needs reduced to what the image has, serve plans the same runtime
    rc, out, err = _serve_print(tags["noours"], "--set", "runtime.needs=[int2-kv, w2-weights]")
    assert out["missing_capabilities"] == [] and ENV_HOST_RESERVE not in out["env"]
    assert not [k for k in out["env"] if k.startswith("ESCHA_") and k != "ESCHA_HICACHE_HOST_ALLOCATOR"]
    plan = _plan(tags["noours"])
    assert plan["runtime_check"]["applies"] == "stock"
    assert plan["runtime_check"]["stock_reserve_bytes"] == 10 * GiB


def test_up_preflight_reads_the_same_description(images, tmp_path):
    """`up`'s preflight (``launch.prepare.prepare`` with the real daemon) reads the image's
    capabilities and plans that runtime: refused naming both for the undeclared image; the
    main image plans the patched check, the noours image the stock one without the reserve."""
    from escha_deploy.utils.errors import Refused
    from escha_deploy.launch import prepare as prep_mod

    tags, _ = images
    client = _client()
    sets = [f"container.model_dir={tmp_path}"]
    prep = prep_mod.prepare(PROFILE, sets + [f"container.image={tags['undeclared']}"], client=client)
    assert prep.missing_capabilities == ["int2-kv", "w2-weights"]
    with pytest.raises(Refused) as exc:  # what `up` and `up --dry-run` raise after showing the plan
        prep.refuse()
    assert [p for p in exc.value.problems if "lacks capability" in p] == [
        f"{tags['undeclared']}: runtime lacks capability 'int2-kv'",
        f"{tags['undeclared']}: runtime lacks capability 'w2-weights'"]
    desc_caps = json.loads(_run(tags["main"], "cat", "/etc/escha/runtime.json").stdout)["capabilities"]
    assert sorted(prep_mod.image_capabilities(client, tags["main"])) == sorted(desc_caps)
    for name, applies in (("main", "patched"), ("noours", "stock")):
        prep = prep_mod.prepare(PROFILE, sets + [f"container.image={tags[name]}",
                                                  "runtime.needs=[int2-kv, w2-weights]",
                                                  "hicache.hicache_ratio=0.5", "hicache.min_ratio=0.5"],
                                    client=client)
        assert prep.plan.runtime_check.applies == applies
        assert (ENV_HOST_RESERVE in prep.launch.env) == (name == "main")


def test_a_patch_with_dotdot_fails_the_image_build_before_any_write(sglang_wheel, tmp_path):
    """A fork folder with one more commit whose path climbs out of the sglang tree (``..``;
    made by hand: git refuses to commit such a path). ``escha-deploy build`` refuses it on the
    host (exit 2, the patch and line named, no build started); a plain ``docker build`` of
    ``Dockerfile.hicache`` (no host check) fails at the image's ``runtime apply`` with the same
    line, and the failed step's container (kept for this: ``forcerm=False``) shows nothing
    written: no file outside the package, none in the package, no ``/etc/escha`` state."""
    client = _client()
    _need_image(client, BASE)
    if not any((REPO / "build" / "wheelhouse-py3.11").glob("escha_deploy-*.whl")):
        pytest.skip("no build/wheelhouse-py3.11 (.ci/test runs scripts/build-wheelhouse.sh 3.11)")
    h = make_fork(sglang_wheel, tmp_path)
    run_id = os.environ.get("ESCHA_TEST_RUN") or str(os.getpid())
    rel = f"build/fork-test-dotdot-{run_id}"
    out = REPO / rel
    shutil.rmtree(out, ignore_errors=True)
    (tmp_path / "good" / "escha-fork.yaml").write_text(declaration(h, "drop-fork"), encoding="utf-8")
    proc = subprocess.run(["escha-deploy", "runtime", "import", str(tmp_path / "good"), "-o", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    evil = "python/sglang/" + "../" * 8 + "tmp/PWNED.py"
    (out / "0099-pwned.patch").write_bytes(mail(f"diff --git a/{evil} b/{evil}".encode(),
                                                 f"+++ b/{evil}".encode()))
    line = f"0099-pwned.patch:7: path '{evil}' has a '..' part and would leave the repository"
    try:
        proc = subprocess.run(["escha-deploy", "build", "--base-image", BASE, "--python-version",
                               "3.11", "--fork-dir", rel, "--tag", f"escha-sglang:ci-dotdot-{run_id}"],
                              capture_output=True, text=True, timeout=600, cwd=REPO)
        assert proc.returncode == 2, proc.stderr
        assert [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")] == [f"error: {line}"]
        assert "Step 1/" not in proc.stderr  # refused before the build started

        import docker

        from escha_deploy.cli.build import build_args

        api = docker.APIClient(version="auto")
        args = build_args(BASE, "3.11", "build/wheelhouse-py3.11", "runtime_overlays", [])
        args["FORK_DIR"] = rel
        log, failed_in, last_layer = [], None, None
        for chunk in api.build(path=str(REPO), dockerfile="Dockerfile.hicache", buildargs=args,
                               rm=True, forcerm=False, decode=True):
            text = chunk.get("stream", "") + chunk.get("error", "")
            log.append(text)
            if "Running in " in text:
                failed_in = text.split("Running in ", 1)[1].split()[0]
            if text.startswith(" ---> ") and text[6:].strip() and " " not in text[6:].strip():
                last_layer = text[6:].strip()  # this run's COPY of its own fork folder
        log_text = "".join(log)
        try:
            assert f"error: {line}" in log_text, log_text[-3000:]
            assert failed_in is not None
            written = [c["Path"] for c in api.diff(failed_in) or []]
            # the same build before the paths were confined: "A /tmp/PWNED.py" (2026-12-01)
            assert not [p for p in written if "PWNED" in p or p.startswith("/etc/escha")
                        or "/site-packages/sglang/" in p], written
        finally:
            if failed_in is not None:  # kept by forcerm=False; this run's own container
                try:
                    api.remove_container(failed_in, force=True)
                except docker.errors.NotFound:  # the step succeeded: rm=True removed it
                    pass
            if last_layer is not None:  # untagged; a layer another image uses stays (conflict)
                try:
                    api.remove_image(last_layer)
                except docker.errors.APIError:
                    pass
    finally:
        shutil.rmtree(out, ignore_errors=True)
