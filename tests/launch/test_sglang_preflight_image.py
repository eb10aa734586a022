"""SGLang's own pre-flight (escha_deploy/launch/sglang_preflight.py) inside the SGLang image, on the
real Docker daemon: the container's `escha-deploy serve --spec` (this checkout's, bind-mounted over
the image's copy) asks the image's own patched SGLang 0.5.19 before the server starts. It refuses,
at each stage, a spec SGLang's own code refuses, with SGLang's message, file:function and the
profile key, and lets through what the shipped profile renders.

CI's images install SGLang without its dependencies, so SGLang's interpreter here is a TEST-ONLY
wrapper (written below) that puts, after the image's own site-packages (its patched SGLang wins),
the flag-catalog venv's CPU import closure (.ci/check-flag-catalog.sh: CPU torch 2.13, transformers,
the flag-catalog requirements; same CPython 3.11 ABI) and the test-only site hook
tests/launch/preflight_cpu_site (the oracle's GPU stand-ins, named there), all mounted read-only.
escha-deploy's own interpreter in the container never sees them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from escha_deploy.launch_spec import launch_digest
from escha_deploy.profile import load_profile
from tests.oracle.cases import config_json

from .conftest import RUN

pytestmark = [pytest.mark.docker, pytest.mark.wheel]

ROOT = Path(__file__).resolve().parents[2]
FLAGCAT = Path(os.environ.get("ESCHA_FLAGCAT_VENV", ROOT / ".cache" / "flagcat-venv")).resolve()
IMAGE_SITE = "/opt/sglang/venv/lib/python3.11/site-packages"  # the image's SGLang (Dockerfile.hicache)
TEST = "/opt/escha-test"  # every test-only mount lives under here
#: An RTX 5060 Ti 16 GB as NVML reports it (the shipped profiles' card class; sm_120)
CARD = {"vram_bytes": 16 * 2**30 - 2**28, "name": "NVIDIA GeForce RTX 5060 Ti", "capability": "12.0"}
WRAPPER = f"""#!/bin/sh
# TEST-ONLY: SGLang's interpreter with the CPU import closure and the GPU stand-ins behind the image's SGLang
PYTHONPATH={IMAGE_SITE}:{TEST}/closure:{TEST}/site exec /opt/sglang/venv/bin/python "$@"
"""


def _spec_variant(spec: dict, *, add: tuple[str, ...] = (), replace: dict[str, str] | None = None) -> dict:
    """The spec with its argv changed (flags appended or values replaced) and its digest recomputed,
    as `up` would have written it for that argv."""
    from escha_deploy.launch_spec import LaunchFacts

    argv = list(spec["argv"])
    for flag, value in (replace or {}).items():
        argv[argv.index(flag) + 1] = value
    argv += list(add)
    digest = launch_digest(spec["profile_data"], LaunchFacts.model_validate(spec["facts"]), argv, spec["env"])
    return {**spec, "argv": argv, "plan_digest": digest}


def test_serve_spec_in_the_image_refuses_at_each_stage_before_the_server_starts(docker_client, tmp_path, capsys):
    from docker.errors import ImageNotFound
    from docker.types import Mount

    from escha_deploy.launch.prepare import prepare
    from escha_deploy.launch_spec import spec_json

    image = os.environ.get("ESCHA_TEST_HICACHE_IMAGE") or pytest.skip("ESCHA_TEST_HICACHE_IMAGE is not set")
    try:
        docker_client.images.get(image)
    except ImageNotFound:
        pytest.fail(f"no image {image} (scripts/make-base-image.sh and Dockerfile.hicache make it)")
    closure = FLAGCAT / "lib" / "python3.11" / "site-packages"
    if not (closure / "torch").is_dir():
        pytest.fail(f"no flag-catalog venv at {FLAGCAT} (.ci/check-flag-catalog.sh makes it)")

    name = "rtx5060ti-tp2-fp8"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config_json(load_profile(name).model.architecture)))
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    prep = prepare(name, [f"container.image={image}", f"model.host_dir={model}"], client=docker_client,
                   spec_file=str(tmp_path / "spec.json"))
    assert not prep.refusals, prep.refusals
    base = json.loads(spec_json(prep.launch))
    container_model = base["argv"][base["argv"].index("--model-path") + 1]
    specs = tmp_path / "specs"
    specs.mkdir()
    cases = {
        "accepted": base,
        "parse": _spec_variant(base, add=("--attention-backend", "nonsense")),
        "resolution": _spec_variant(base, add=("--attention-backend", "dual_chunk_flash_attn")),
        "model config": _spec_variant(base, replace={"--context-length": "300000"}),  # config.json: 262144
        "attention": _spec_variant(base, add=("--attention-backend", "trtllm_mha")),
    }
    for case, spec in cases.items():
        (specs / f"{case.replace(' ', '-')}.json").write_text(json.dumps(spec))
    (tmp_path / "sglang-python").write_text(WRAPPER)
    (tmp_path / "sglang-python").chmod(0o755)
    site_packages = "/opt/escha/venv/lib/python3.11/site-packages/escha_deploy"  # the image's escha-deploy
    mounts = [(closure, f"{TEST}/closure"), (ROOT / "tests" / "launch" / "preflight_cpu_site", f"{TEST}/site"),
              (ROOT / "scripts" / "sglang_oracle.py", f"{TEST}/sglang_oracle.py"),
              (tmp_path / "sglang-python", f"{TEST}/sglang-python"), (specs, f"{TEST}/specs"),
              (ROOT / "escha_deploy", site_packages), (model, container_model)]
    env = {"ESCHA_SERVE_MODE": "container", "ESCHA_SGLANG_PYTHON": f"{TEST}/sglang-python",
           "ESCHA_SGLANG_PREFLIGHT": "1", "ESCHA_SKIP_GPU_PREFLIGHT": "1", "ESCHA_TEST_CARD": json.dumps(CARD),
           "ESCHA_ORACLE_SCRIPT": f"{TEST}/sglang_oracle.py"}
    c = docker_client.containers.run(
        image, ["infinity"], entrypoint="sleep", name=f"escha-test-sglang-preflight-{RUN}", detach=True,
        labels={"io.escha.test": f"sglang-preflight-{RUN}"}, network_mode="none", cap_add=["IPC_LOCK"],
        mounts=[Mount(t, str(s), type="bind", read_only=True) for s, t in mounts])
    try:
        results = {}
        t0 = time.monotonic()
        for case in cases:
            t = time.monotonic()
            cmd = ["timeout", "-s", "INT", "120", "/opt/escha/venv/bin/escha-deploy", "serve", "--spec",
                   f"{TEST}/specs/{case.replace(' ', '-')}.json"]
            r = c.exec_run(cmd, environment=env)
            results[case] = (r.exit_code, r.output.decode(errors="replace"), time.monotonic() - t)
        with capsys.disabled():
            print(f"\n[sglang pre-flight in {image}] {len(cases)} `serve --spec` runs in one container: "
                  f"{time.monotonic() - t0:.1f} s; " + ", ".join(f"{k} {v[2]:.1f} s" for k, v in results.items()))
    finally:
        c.remove(force=True)

    code, log, _ = results["accepted"]
    assert "serve: SGLang's pre-flight passed" in log and "attention backend" in log, log[-3000:]
    assert "starting SGLang" in log, log[-3000:]
    want = {
        "parse": ("argument resolution", "SystemExit: ", "invalid choice: 'nonsense'",
                  "srt/server_args.py:prepare_server_args"),
        "resolution": ("argument resolution", "ValueError: ", "enable-hierarchical-cache and disable-radix-cache "
                       "are mutually exclusive", "srt/arg_groups/kv_cache_hook.py:handle_cache_compatibility"),
        "model config": ("model config", "ValueError: ", "User-specified context_length (300000) is greater than "
                         "the derived context_length (262144)", "srt/configs/model_config.py:_derive_context_length"),
        "attention": ("attention backend", "ValueError: ", "TRTLLM FMHAv2 prefill on SM120 does not support fp8_e4m3",
                      "srt/arg_groups/attention_hook.py:handle_attention_backend_compatibility"),
    }
    keys = {"parse": "runtime.attention_backend", "resolution": "hicache.enabled",
            "model config": "runtime.context_length", "attention": "runtime.attention_backend"}
    for case, (stage, typ, message, site) in want.items():
        code, log, _ = results[case]
        assert code == 3, (case, log[-3000:])
        err = [ln for ln in log.splitlines() if ln.startswith("error:")]
        assert len(err) == 1, (case, log[-3000:])
        assert f"SGLang's pre-flight refused at {stage}: {typ}" in err[0] and message in err[0], (case, err[0])
        assert f"({site})" in err[0] and f"set by {keys[case]}" in err[0], (case, err[0])
        assert "starting SGLang" not in log, (case, log[-3000:])
