"""SGLang's own pre-flight in each other supported release's image (.ci/test builds one per
release: ESCHA_TEST_RELEASE_IMAGES, tests/runtime/test_release_images_docker.py), on the real
Docker daemon, as tests/launch/test_sglang_preflight_image.py runs it in the default release's:
`up`'s pipeline plans rtx5060ti-tp2-fp8 moved to that release (runtime.sglang_version) for the
image, and the container's `escha-deploy serve --spec` (this checkout's, bind-mounted over the
image's copy) asks the image's own patched SGLang of that release before the server starts. It
lets the rendered spec through all stages (the KV pool SGLang sizes is the plan's) and refuses a
spec that release's host pools refuse (100 TB per rank), with that release's message and
file:function and the profile key.

As in the default release's test, SGLang's dependencies are not in CI's images: SGLang's
interpreter is the same TEST-ONLY wrapper, with that release's flag-catalog venv
(.ci/check-flag-catalog.sh RELEASE: .cache/flagcat-venv-RELEASE, CPU torch) behind the image's
own site-packages and the test-only site hook tests/launch/preflight_cpu_site (the oracle's GPU
stand-ins, named there), mounted read-only.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from escha_deploy.sglang.releases import default_release, series_releases

from .conftest import RUN
from .sglang_preflight_cases import HOST_REFUSAL
from .test_sglang_preflight_image import CARD, TEST, WRAPPER, _model_folder, _spec_variant

pytestmark = [pytest.mark.docker, pytest.mark.wheel]

ROOT = Path(__file__).resolve().parents[2]
OTHER_RELEASES = [v for v in series_releases() if v != default_release()]
#: where each release's host pools refuse a pool larger than the box, where it is not 0.5.19's
#: HostKVCache.__init__ (``HOST_REFUSAL``; 0.5.21's is there too): 0.5.23 moved the check into
#: HostKVCache._allocate_host_buffer (tests/launch/sglang_preflight_cases.py: RELEASE_SIZING). A
#: release added as data that moved it again fails below on its error line, which names the site.
HOST_SITE = {"0.5.23": "srt/mem_cache/pool_host/base.py:_allocate_host_buffer"}


@pytest.mark.parametrize("release", OTHER_RELEASES)
def test_serve_spec_in_the_release_image_runs_that_releases_preflight(docker_client, tmp_path, capsys, release):
    from docker.errors import APIError, ImageNotFound
    from docker.types import Mount

    from escha_deploy.launch.prepare import prepare
    from escha_deploy.pipeline.spec import spec_json

    images = dict(x.split("=", 1) for x in os.environ.get("ESCHA_TEST_RELEASE_IMAGES", "").split())
    image = images.get(release) or pytest.skip("ESCHA_TEST_RELEASE_IMAGES names no image of this release "
                                               "(.ci/test builds one per release)")
    try:
        docker_client.images.get(image)
    except ImageNotFound:
        pytest.fail(f"no image {image} (.ci/test builds it with scripts/make-base-image.sh and Dockerfile.hicache)")
    closure = ROOT / ".cache" / f"flagcat-venv-{release}" / "lib" / "python3.11" / "site-packages"
    if not (closure / "torch").is_dir():
        pytest.fail(f"no flag-catalog venv at {closure.parents[2]} (.ci/check-flag-catalog.sh {release} makes it)")

    name = "rtx5060ti-tp2-fp8"
    model = _model_folder(tmp_path, name)
    prep = prepare(name, [f"runtime.sglang_version={release}", f"container.image={image}", f"model.host_dir={model}"],
                   client=docker_client, spec_file=str(tmp_path / "spec.json"))
    assert not prep.refusals, prep.refusals
    assert prep.plan.sglang_release == release
    base = json.loads(spec_json(prep.launch))
    container_model = base["argv"][base["argv"].index("--model-path") + 1]
    cases = {"accepted": base, "host-pools": _spec_variant(base, add=("--hicache-size", "100000"))}
    specs = tmp_path / "specs"
    specs.mkdir()
    for case, spec in cases.items():
        (specs / f"{case}.json").write_text(json.dumps(spec))
    (tmp_path / "sglang-python").write_text(WRAPPER)
    (tmp_path / "sglang-python").chmod(0o755)
    mounts = [(closure, f"{TEST}/closure"), (ROOT / "tests" / "launch" / "preflight_cpu_site", f"{TEST}/site"),
              (ROOT / "scripts" / "sglang_oracle.py", f"{TEST}/sglang_oracle.py"),
              (tmp_path / "sglang-python", f"{TEST}/sglang-python"), (specs, f"{TEST}/specs"),
              (ROOT / "escha_deploy", "/opt/escha/venv/lib/python3.11/site-packages/escha_deploy"),
              (model, container_model)]
    env = {"ESCHA_SERVE_MODE": "container", "ESCHA_SGLANG_PYTHON": f"{TEST}/sglang-python",
           "ESCHA_SGLANG_PREFLIGHT": "1", "ESCHA_SKIP_GPU_PREFLIGHT": "1", "ESCHA_TEST_CARD": json.dumps(CARD),
           "ESCHA_ORACLE_SCRIPT": f"{TEST}/sglang_oracle.py", "ESCHA_SGLANG_PREFLIGHT_TIMEOUT": "600"}
    c = docker_client.containers.run(
        image, ["infinity"], entrypoint="sleep", name=f"escha-test-sglang-preflight-{release}-{RUN}", detach=True,
        labels={"io.escha.test": f"sglang-preflight-{RUN}"}, network_mode="none", cap_add=["IPC_LOCK"],
        mounts=[Mount(t, str(s), type="bind", read_only=True) for s, t in mounts])
    results: dict[str, tuple[int, str]] = {}
    t0 = time.monotonic()
    try:
        # both `serve --spec` runs at once (each an SGLang process); once `serve` says it starts
        # SGLang (the pre-flight passed) it is stopped: what the server does next is not this
        # test's question
        one = (f"timeout -s INT 700 /opt/escha/venv/bin/escha-deploy serve --spec {TEST}/specs/$c.json "
               "> /tmp/$c.log 2>&1 & p=$!; while kill -0 $p 2>/dev/null; do grep -q 'starting SGLang' /tmp/$c.log "
               "&& kill -TERM $p; sleep 0.2; done; wait $p; echo $? > /tmp/$c.rc")
        script = f"for c in \"$@\"; do (c=$c; {one}) & done; wait"
        c.exec_run(["sh", "-c", script, "serve-spec", *cases], environment=env)
        for case in cases:
            code = c.exec_run(["cat", f"/tmp/{case}.rc"]).output.decode().strip()
            log = c.exec_run(["cat", f"/tmp/{case}.log"]).output.decode(errors="replace")
            results[case] = (int(code), log)
    finally:
        try:
            c.remove(force=True)
        except APIError as e:  # already being removed: keep the test's own error
            if e.status_code not in (404, 409):
                raise
    with capsys.disabled():
        print(f"\n[sglang {release} pre-flight in {image}] {len(cases)} `serve --spec` runs at once: "
              f"{time.monotonic() - t0:.1f} s")

    code, log = results["accepted"]
    passed = [ln for ln in log.splitlines() if "serve: SGLang's pre-flight passed" in ln]
    assert len(passed) == 1, log[-3000:]
    argv = base["argv"]
    assert f"KV pool {argv[argv.index('--max-total-tokens') + 1]} tokens" in passed[0], passed[0]
    assert "; host pools " in passed[0] and "skipped" not in log and "starting SGLang" in log, log[-3000:]
    code, log = results["host-pools"]
    assert code == 3, log[-3000:]
    err = [ln for ln in log.splitlines() if ln.startswith("error:")]
    assert len(err) == 1, log[-3000:]
    stage, typ, message = HOST_REFUSAL[:3]
    assert f"SGLang's pre-flight refused at {stage}: {typ}: " in err[0] and message in err[0], err[0]
    assert f"({HOST_SITE.get(release, HOST_REFUSAL[3])})" in err[0] and "set by hicache.hicache_size" in err[0], err[0]
    assert "starting SGLang" not in log, log[-3000:]
