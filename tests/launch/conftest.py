"""Fixtures for the launch tests: a real Docker daemon, the local Debian base image, the
STAND-IN server image (tests/launch/standin/, built per behaviour), and a leak check that fails
a test leaving any container, network or volume behind."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
STANDIN_DIR = HERE / "standin"
BASE_IMAGE = "escha-test-base:bookworm"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: This test run's own names, so two runs of the suite on one machine (one Docker daemon, one
#: /dev/shm) never meet: ``ESCHA_TEST_RUN`` (default: this process's pid) is in the stand-in
#: profile's name (hence its container name ``escha-<name>`` and label), its images' tags, and
#: the names of containers the tests make; the stand-in's port is a free one.
RUN = os.environ.get("ESCHA_TEST_RUN") or f"r{os.getpid()}"
STANDIN_NAME = f"standin-tp2-{RUN}"
STANDIN_CONTAINER = f"escha-{STANDIN_NAME}"
STANDIN_LABEL = f"io.escha.profile={STANDIN_NAME}"
STANDIN_PORT = int(os.environ.get("ESCHA_TEST_STANDIN_PORT") or _free_port())


def _run_profile() -> Path:
    """The stand-in profile (tests/launch/standin/profile.yaml) under this run's name and port,
    written once per run to a folder of its own (removed at exit)."""
    import atexit
    import tempfile

    text = (STANDIN_DIR / "profile.yaml").read_text()
    assert "\nname: standin-tp2\n" in text and "  port: 30123\n" in text
    text = text.replace("\nname: standin-tp2\n", f"\nname: {STANDIN_NAME}\n").replace(
        "  port: 30123\n", f"  port: {STANDIN_PORT}\n")
    d = Path(tempfile.mkdtemp(prefix=f"escha-test-{RUN}-"))
    atexit.register(shutil.rmtree, d, True)
    (d / "profile.yaml").write_text(text)
    return d / "profile.yaml"


STANDIN_PROFILE = _run_profile()


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the real CLI in a fresh process (exit codes and streams as a user sees them)."""
    env = dict(env if env is not None else os.environ)
    env.setdefault("ESCHA_TEST_CLAMP_MEMLOCK", "1")  # this sandbox's Docker cannot raise memlock
    return subprocess.run([sys.executable, "-m", "escha_deploy.cli.main", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


@pytest.fixture(scope="session")
def docker_client():
    if shutil.which("dockerd") is None and shutil.which("docker") is None:
        pytest.skip("no docker installed")
    r = subprocess.run([str(HERE / "dockerd.sh")], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"no Docker daemon: {r.stderr.strip()[:200]}")
    import docker

    return docker.from_env()


@pytest.fixture(scope="session")
def base_image(docker_client):
    """A Debian image with python3: CI's test base (ESCHA_TEST_BASE_IMAGE, made by
    scripts/make-base-image.sh) when present, else a plain one from base_image.sh."""
    from docker.errors import ImageNotFound

    ci_base = os.environ.get("ESCHA_TEST_BASE_IMAGE")
    if ci_base:
        try:
            docker_client.images.get(ci_base)
            return ci_base
        except ImageNotFound:
            pass
    r = subprocess.run([str(HERE / "base_image.sh"), BASE_IMAGE], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot make the Debian base image: {r.stderr.strip()[-300:]}")
    return BASE_IMAGE


def planned_sizes_for(profile_ref: str = str(STANDIN_PROFILE), overrides=()) -> dict:
    """The stand-in profile's planned per-rank figures on this host (what `up` compares)."""
    from escha_deploy.facts.machine import gather_host_facts
    from escha_deploy.launch.prepare import planned_sizes
    from escha_deploy.planner import plan
    from escha_deploy.profile import load_profile

    p = load_profile(profile_ref, overrides)
    pl = plan(p, gather_host_facts(platform="linux"), capabilities=frozenset(p.runtime.needs))
    return planned_sizes(pl).model_dump()


@pytest.fixture(scope="session")
def standin_image(docker_client, base_image, tmp_path_factory):
    """Factory: build the stand-in image with a behaviour; returns its tag. One image per tag
    and behaviour: two test files of one worker asking for the same tag with different
    behaviours (e.g. another ``server_key``) get two images, the second tag suffixed with its
    behaviour's digest, never the first file's image."""
    built: dict[str, str] = {}  # "tag asked for" + config.json text -> the tag built

    def make(tag: str, *, mode: str = "ok", startup_s: float = 0.0, sizes: dict | None = None,
             port: int = STANDIN_PORT, server_key: str | None = None) -> str:
        tag = f"{tag}-{RUN}" if ":" in tag else f"{tag}:{RUN}"  # this run's tag
        cfg = {"mode": mode, "startup_s": startup_s, "port": port,
               "sizes": sizes if sizes is not None else planned_sizes_for(), "server_key": server_key}
        text = json.dumps(cfg, sort_keys=True)
        key = f"{tag}\n{text}"
        if key in built:
            return built[key]
        if tag in built.values():  # the tag holds another behaviour
            tag = f"{tag}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
        ctx = tmp_path_factory.mktemp(f"standin-{tag.replace(':', '-')}")
        shutil.copy(STANDIN_DIR / "server.py", ctx / "server.py")
        shutil.copy(STANDIN_DIR / "Dockerfile", ctx / "Dockerfile")
        (ctx / "config.json").write_text(text)
        docker_client.images.build(path=str(ctx), tag=tag, buildargs={"BASE": base_image}, rm=True,
                                   forcerm=True)
        built[key] = tag
        return tag

    yield make
    for tag in built.values():  # images are not containers, but leave the daemon as found
        try:
            docker_client.images.remove(tag, force=True)
        except Exception:
            pass


#: The capabilities the stand-in images declare (label and runtime description).
STANDIN_CAPS = ["hicache-host-reserve-env", "hicache-host-allocator", "transfer-geometry-check"]
REPO = HERE.parents[1]
SERVE_IMAGE = f"escha-standin-serve:test-{RUN}"


@pytest.fixture(scope="session")
def serve_image(docker_client, base_image, tmp_path_factory):
    """The STAND-IN image with the REAL escha-deploy of this checkout as its entrypoint
    (tests/launch/standin/serve.Dockerfile): `serve --spec` and `serve --profile` run for real,
    and SGLang's interpreter is record_child.py, which logs the argv and env it received.
    Needs the offline wheelhouse for Python 3.11 (scripts/build-wheelhouse.sh 3.11; CI makes it):
    $ESCHA_TEST_WHEELHOUSE, else build/wheelhouse-py3.11 in this checkout."""
    wheelhouse = Path(os.environ.get("ESCHA_TEST_WHEELHOUSE") or REPO / "build" / "wheelhouse-py3.11")
    wheels = [w for w in wheelhouse.glob("*.whl") if not w.name.startswith("escha_deploy-")]
    if not wheels:
        pytest.skip(f"no wheelhouse at {wheelhouse} (scripts/build-wheelhouse.sh 3.11)")
    ctx = tmp_path_factory.mktemp("standin-serve")
    (ctx / "wheels").mkdir()
    for w in wheels:
        shutil.copy(w, ctx / "wheels" / w.name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_data")
    shutil.copytree(REPO / "escha_deploy", ctx / "src" / "escha_deploy", ignore=ignore)
    shutil.copytree(REPO / "profiles", ctx / "src" / "profiles", ignore=ignore)
    for f in ("server.py", "record_child.py"):
        shutil.copy(STANDIN_DIR / f, ctx / f)
    shutil.copy(STANDIN_DIR / "serve.Dockerfile", ctx / "Dockerfile")
    (ctx / "config.json").write_text(json.dumps({"mode": "ok", "port": STANDIN_PORT, "sizes": planned_sizes_for()}))
    (ctx / "runtime.json").write_text(json.dumps({
        "schema_version": 1, "sglang_version": "0.5.19", "base": "image:stand-in", "python": "3.11",
        "base_inventory_digest": "stand-in", "base_inventory_committed": False, "sglang_dir": "/nonexistent",
        "capabilities": STANDIN_CAPS, "inventory_digest": "stand-in", "escha_version": "stand-in"}))
    docker_client.images.build(path=str(ctx), tag=SERVE_IMAGE, buildargs={"BASE": base_image}, rm=True,
                               forcerm=True)
    yield SERVE_IMAGE
    try:
        docker_client.images.remove(SERVE_IMAGE, force=True)
    except Exception:
        pass


def _ours(labels: dict | None, name: str = "") -> bool:
    """Things this run's tests create: escha-labelled or named escha-*, and carrying this run's
    id (``RUN``) in the name or a label value (the daemon is shared with other runs of the suite
    and other suites at the same time, whose objects are not ours to judge)."""
    labels = labels or {}
    escha = any(k.startswith("io.escha.") for k in labels) or name.lstrip("/").startswith("escha-")
    return escha and (RUN in name or any(RUN in str(v) for v in labels.values()))


def _inventory(client) -> tuple[set, set, set]:
    return ({c.id for c in client.containers.list(all=True, ignore_removed=True) if _ours(c.labels, c.name)},
            {n.id for n in client.networks.list() if _ours(n.attrs.get("Labels"), n.name)},
            {v.id for v in client.volumes.list() if _ours(v.attrs.get("Labels"), v.name)})


@pytest.fixture
def no_leaks(docker_client):
    """Fail when a test leaves a container, network or volume behind (cleaning up after)."""
    before = _inventory(docker_client)
    yield
    after = _inventory(docker_client)
    leaked = [ids - b for ids, b in zip(after, before)]
    for cid in leaked[0]:
        try:
            docker_client.containers.get(cid).remove(force=True)
        except Exception:
            pass
    # the JIT cache volume `up` mounts (launch_spec.jit_cache_volume) is kept across `down` by
    # design, as the L3 folder is: removed here, not a leak
    for vid in list(leaked[2]):
        try:
            vol = docker_client.volumes.get(vid)
            if vol.name.endswith("-jit"):
                vol.remove(force=True)
                leaked[2].discard(vid)
        except Exception:
            pass
    assert not any(leaked), f"left behind: containers {leaked[0]}, networks {leaked[1]}, volumes {leaked[2]}"


@pytest.fixture(scope="module")
def shared_preflight(request, tmp_path_factory):
    """The module's shared SGLang pre-flight processes, one per release (tests/launch/
    sglang_preflight_cases.py: ``SharedPreflight``; its tests are marked ``@shares_process``)."""
    from .sglang_preflight_cases import SharedPreflight

    return SharedPreflight(request.module, request.session.items, tmp_path_factory)


@pytest.fixture
def preflight(request, shared_preflight):
    """This test's ``Cases`` (its argvs, what its builder noted, SGLang's answers), run in its
    module's shared pre-flight process of the test's release."""
    return shared_preflight.cases_of(request.node)
