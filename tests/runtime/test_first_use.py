"""The first-use check (``escha_deploy/runtime/first_use.py``): what SGLang builds after "ready".

- Here: SGLang's own ``native_hash.py`` and ``hash_binding.cpp`` from the 0.5.19 wheel, under a
  package tree whose ``__init__.py`` files are empty stand-ins (the wheel's own would import
  SGLang's GPU stack, which this machine lacks), built and loaded by SGLang's own
  ``_load_native_hash_module`` with this machine's torch, compiler and OpenSSL; a cache folder
  the server's user cannot write is named.
- On the real dockerd: CI's bare base image (Debian + the SGLang wheel, no compiler, no
  OpenSSL headers) is refused naming ``<openssl/sha.h>``, the check running as `up` runs it (this
  file's source through the image's Python); the image CI builds from Dockerfile.hicache
  (``$ESCHA_TEST_HICACHE_IMAGE``) passes ``runtime verify --first-use`` and `up`'s check for
  linux-tp2-l3's file L3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

from escha_deploy.runtime import first_use

REPO = Path(__file__).resolve().parents[2]
SOURCE = Path(first_use.__file__).read_text()
RUN = os.environ.get("ESCHA_TEST_RUN", "") + uuid.uuid4().hex[:6]


def _mini_sglang(root: Path, wheel: Path) -> Path:
    """SGLang's cpp_utils from ``wheel`` under ``root``, with empty package ``__init__`` stand-ins."""
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("sglang/srt/mem_cache/cpp_utils/"):
                z.extract(name, root)
    for pkg in ("sglang", "sglang/srt", "sglang/srt/mem_cache"):
        (root / pkg / "__init__.py").touch()
    return root


@pytest.mark.wheel
def test_sglangs_own_loader_builds_the_extension_where_the_check_says(tmp_path, sglang_wheel):
    pytest.importorskip("torch")
    mini = _mini_sglang(tmp_path / "site", sglang_wheel)
    ext = tmp_path / "ext"
    env = {**os.environ, "PYTHONPATH": str(mini), "TORCH_EXTENSIONS_DIR": str(ext), first_use.L3_ENV: "1"}
    r = subprocess.run([sys.executable, "-c", SOURCE], capture_output=True, text=True, env=env, timeout=900)
    result = json.loads(r.stdout.splitlines()[-1])
    assert r.returncode == 0 and result["ok"], r.stdout + r.stderr[-2000:]
    row = next(c for c in result["checks"] if c["name"] == "hash extension")
    assert "<openssl/sha.h> and -lcrypto" in row["detail"] and "_load_native_hash_module built and loaded" in row["detail"]
    built = list(ext.rglob("hicache_hash_cpp*.so"))
    assert built, sorted(p.name for p in ext.rglob("*"))  # the server's first use finds it built
    assert not list(ext.glob("escha-first-use-*"))  # the one-line unit's folder is gone


def test_no_sglang_means_nothing_to_build(tmp_path):
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    result = first_use.check(l3=True, python=sys.executable, environ=env)
    assert result["ok"] and "not needed" in result["checks"][1]["detail"]  # type: ignore[index]


def test_a_cache_folder_the_user_cannot_write_is_named(tmp_path):
    """An ordinary user (root without its override capabilities, util-linux setpriv)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o555)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(locked / "torch_extensions"),
           "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    r = subprocess.run(["setpriv", "--inh-caps=-dac_override,-dac_read_search",
                        "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-c", SOURCE],
                       capture_output=True, text=True, env=env, timeout=120)
    result = json.loads(r.stdout.splitlines()[-1])
    assert r.returncode == 3 and not result["ok"]
    (problem,) = result["checks"][0]["problems"]
    assert f"{locked / 'torch_extensions'} is not writable" in problem
    ok = first_use.check(l3=False, environ={"TRITON_CACHE_DIR": str(tmp_path / "t2"),
                                            "TORCH_EXTENSIONS_DIR": str(tmp_path / "t3")})
    assert ok["ok"]


# --- on the real dockerd -----------------------------------------------------------------------------


def _client():
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - no daemon here: skip, never fake
        pytest.skip(f"no Docker daemon ({exc}); .ci/test starts one")
    return client


def _in_image(client, image: str, *, l3: bool) -> tuple[int, dict]:
    """This file's source run as `up`'s check runs it (image_preflight's entrypoint: the image's
    SGLang Python), no network, a per-run name and label."""
    from escha_deploy.launch.image_preflight import ENTRYPOINT

    name = f"escha-test-first-use-{RUN}"
    c = client.containers.create(image, entrypoint=ENTRYPOINT, command=["python3", SOURCE], name=name,
                                 environment={first_use.L3_ENV: "1" if l3 else "0"}, network_mode="none",
                                 labels={"io.escha.test": name})
    try:
        c.start()
        code = c.wait(timeout=900)["StatusCode"]
        out = c.logs(stdout=True, stderr=False).decode(errors="replace")
    finally:
        c.remove(force=True)
    return code, json.loads(out.splitlines()[-1])


@pytest.mark.docker
def test_the_bare_base_is_refused_naming_the_header():
    docker_client = _client()
    image = os.environ.get("ESCHA_TEST_BASE_IMAGE")
    if not image:
        pytest.skip("no ESCHA_TEST_BASE_IMAGE (CI's Debian base with the SGLang wheel, scripts/make-base-image.sh)")
    code, result = _in_image(docker_client, image, l3=True)
    problems = result["checks"][1]["problems"]
    assert code == 3 and any(p.startswith("<openssl/sha.h> is missing") for p in problems), result
    assert any("no C++ compiler" in p for p in problems) and any("libcrypto.so" in p for p in problems)
    assert "SGLang at" in result["checks"][1]["detail"]  # the wheel's SGLang builds it on first use


@pytest.mark.docker
def test_the_hicache_image_passes_for_linux_tp2_l3(tmp_path):
    """The image built from Dockerfile.hicache: `runtime verify --first-use` inside it, and
    `up`'s check (first_use_check.in_image) for linux-tp2-l3's file L3 with the launch's JIT
    cache volume (a per-run name, removed after)."""
    from docker.errors import ImageNotFound

    from escha_deploy.launch import first_use_check
    from escha_deploy.launch.docker import create_args
    from escha_deploy.launch.prepare import Prepared
    from escha_deploy.pipeline.spec import CONTAINER_JIT_CACHE, build_launch_spec
    from escha_deploy.facts.machine import described_host
    from escha_deploy.planner import plan
    from escha_deploy.profile import load_profile

    docker_client = _client()
    image = os.environ.get("ESCHA_TEST_HICACHE_IMAGE")
    if not image:
        pytest.skip("no ESCHA_TEST_HICACHE_IMAGE (.ci/test builds Dockerfile.hicache)")
    try:
        docker_client.images.get(image)
    except ImageNotFound:
        pytest.skip(f"{image} is not built here")
    name = f"escha-test-first-use-{RUN}"
    out = docker_client.containers.run(image, ["runtime", "verify", "--first-use"], entrypoint="escha-deploy",
                                       name=name, labels={"io.escha.test": name}, network_mode="none", remove=True)
    text = out.decode()
    assert "first use: hash extension: SGLang at" in text and "<openssl/sha.h> and -lcrypto" in text, text
    prof = load_profile("linux-tp2-l3", [f"container.image={image}", f"name=fr-{RUN}"])
    p = plan(prof, described_host(128 * 2**30, "linux"))
    launch = build_launch_spec(p, prof)
    args = create_args(launch.container)
    volume = next(m["source"] for m in args["mounts"] if m["target"] == CONTAINER_JIT_CACHE)
    prep = Prepared(profile=prof, plan=p, launch=launch, spec=launch.container, args=args, argv=list(launch.argv),
                    image_present=True)
    try:
        state, detail = first_use_check.check(docker_client, prep, dry=False)
    finally:
        try:
            docker_client.volumes.get(volume).remove(force=True)
        except Exception:  # noqa: BLE001 - the volume was not made
            pass
    assert state == "ok" and "hash extension" in detail and CONTAINER_JIT_CACHE in detail, detail
