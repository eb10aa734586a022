"""SGLang's own pre-flight (escha_deploy/launch/sglang_preflight.py) inside the SGLang image, on the
real Docker daemon: the container's `escha-deploy serve --spec` (this checkout's, bind-mounted over
the image's copy) asks the image's own patched SGLang 0.5.19 before the server starts. It refuses,
at each of the five stages (argument resolution, model config, attention backend, and the two
sizing stages, KV cache configurator and host pools, which take the device figures and host budget
the plan recorded in the launch spec), a spec SGLang's own code refuses, with SGLang's message,
file:function and the profile key, and lets through what the shipped profile rtx5060ti-tp2-fp8
renders. The other shipped profiles (linux-tp2-l3 with its file store capped to fit the CI disk;
rtx5060ti-tp2 with its overlay flags as the oracle's stock stand-ins) and argparse's refusal go
through all five stages in one SGLang process of one throw-away container as `up`'s check
``sglang pre-flight`` makes it (``image_preflight.in_image_many``), at the same time as the
`serve --spec` runs (three at a time in one container); there the host-pool check's budget is the
named ``HOST_BUDGET`` stand-in, as this CI machine is not the box those profiles describe.

CI's images install SGLang without its dependencies, so SGLang's interpreter here is a TEST-ONLY
wrapper (written below) that puts, after the image's own site-packages (its patched SGLang wins),
the flag-catalog venv's CPU import closure (.ci/check-flag-catalog.sh: CPU torch 2.13, transformers,
the flag-catalog requirements; same CPython 3.11 ABI) and the test-only site hook
tests/launch/preflight_cpu_site (the oracle's GPU stand-ins, named there), all mounted read-only.
escha-deploy's own interpreter in the container never sees them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import docker.errors
from pathlib import Path

import pytest

from escha_deploy.pipeline.spec import PreflightFigures, launch_digest
from escha_deploy.profile import load_profile
from escha_deploy.launch.image_preflight import in_image_many, refusal
from escha_deploy.launch.sglang_preflight import PreflightResult, device_figures, server_flags_of
from tests.oracle.cases import config_json, stock_argv

from .conftest import RUN
from .sglang_preflight_cases import HOST_BUDGET, HOST_REFUSAL, KV_REFUSAL

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


def _model_folder(tmp_path: Path, name: str) -> Path:
    """A model folder for profile ``name``: its config.json, and a sparse safetensors file of its
    weight size (the plan counts the weights; no disk is used, no weight is read)."""
    d = tmp_path / f"model-{name}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config_json(load_profile(name).model.architecture)))
    with open(d / "model.safetensors", "wb") as f:
        f.truncate(load_profile(name).model.weights_total or 64)
    return d


def _spec_variant(spec: dict, *, add: tuple[str, ...] = (), replace: dict[str, str] | None = None) -> dict:
    """The spec with its argv changed (flags appended or values replaced) and its digest recomputed,
    as `up` would have written it for that argv."""
    from escha_deploy.pipeline.spec import LaunchFacts

    argv = list(spec["argv"])
    for flag, value in (replace or {}).items():
        argv[argv.index(flag) + 1] = value
    argv += list(add)
    pre = PreflightFigures.model_validate(spec["preflight"]) if spec.get("preflight") else None
    digest = launch_digest(spec["profile_data"], LaunchFacts.model_validate(spec["facts"]), argv, spec["env"], pre)
    return {**spec, "argv": argv, "plan_digest": digest}


#: How many `serve --spec` runs go at once in the test container (each is an SGLang process)
AT_ONCE = 3


def test_serve_spec_in_the_image_refuses_at_each_stage_before_the_server_starts(docker_client, tmp_path, capsys):
    from docker.errors import ImageNotFound
    from docker.types import Mount

    from escha_deploy.launch.prepare import prepare
    from escha_deploy.pipeline.spec import spec_json

    image = os.environ.get("ESCHA_TEST_HICACHE_IMAGE") or pytest.skip("ESCHA_TEST_HICACHE_IMAGE is not set")
    try:
        docker_client.images.get(image)
    except ImageNotFound:
        pytest.fail(f"no image {image} (scripts/make-base-image.sh and Dockerfile.hicache make it)")
    closure = FLAGCAT / "lib" / "python3.11" / "site-packages"
    if not (closure / "torch").is_dir():
        pytest.fail(f"no flag-catalog venv at {FLAGCAT} (.ci/check-flag-catalog.sh makes it)")

    name = "rtx5060ti-tp2-fp8"
    model = _model_folder(tmp_path, name)
    prep = prepare(name, [f"container.image={image}", f"model.host_dir={model}"], client=docker_client,
                   spec_file=str(tmp_path / "spec.json"))
    assert not prep.refusals, prep.refusals
    base = json.loads(spec_json(prep.launch))
    container_model = base["argv"][base["argv"].index("--model-path") + 1]
    # the spec records the plan's pre-flight figures: `serve --spec` runs the two sizing stages on them
    assert base["preflight"]["weights_bytes"] > 0 and base["preflight"]["host_budget_bytes"] > 0, base["preflight"]
    # the other shipped profiles through all five stages as `up`'s check asks them (the plan's
    # figures): their argv as prepare renders it for this image (the overlay's flags as the
    # oracle's stock stand-ins), each model folder mounted where it reads
    sized: dict[str, tuple[list[str], dict]] = {}
    model_mounts = [(model, container_model)]
    l3 = tmp_path / "l3"
    l3.mkdir()
    for other, sets in (("linux-tp2-l3", [f"hicache.storage_dir={l3}", "hicache.storage_max_size=1GB"]),
                        ("rtx5060ti-tp2", [])):  # linux-tp2-l3's store capped to fit the CI disk
        folder = _model_folder(tmp_path, other)
        p = prepare(other, [f"container.image={image}", f"model.host_dir={folder}", *sets], client=docker_client,
                    spec_file=str(tmp_path / f"{other}.json"), image_files=False)
        argv = stock_argv(server_flags_of(p.argv))
        model_mounts.append((folder, argv[argv.index("--model-path") + 1]))
        sized[other] = (argv, {**device_figures(p.plan), "host_budget": HOST_BUDGET})
    # argparse's refusal, in the same process
    sized["parse"] = ([*server_flags_of(prep.argv), "--attention-backend", "nonsense"], device_figures(prep.plan))
    specs = tmp_path / "specs"
    specs.mkdir()
    cases = {
        "accepted": base,
        "resolution": _spec_variant(base, add=("--attention-backend", "dual_chunk_flash_attn")),
        "model config": _spec_variant(base, replace={"--context-length": "300000"}),  # config.json: 262144
        "attention": _spec_variant(base, add=("--attention-backend", "trtllm_mha")),
        "kv": _spec_variant(base, replace={"--mem-fraction-static": "0.3"}),
        "host pools": _spec_variant(base, add=("--hicache-size", "100000")),  # 100 TB per rank
    }
    for case, spec in cases.items():
        (specs / f"{case.replace(' ', '-')}.json").write_text(json.dumps(spec))
    (tmp_path / "sglang-python").write_text(WRAPPER)
    (tmp_path / "sglang-python").chmod(0o755)
    site_packages = "/opt/escha/venv/lib/python3.11/site-packages/escha_deploy"  # the image's escha-deploy
    mounts = [(closure, f"{TEST}/closure"), (ROOT / "tests" / "launch" / "preflight_cpu_site", f"{TEST}/site"),
              (ROOT / "scripts" / "sglang_oracle.py", f"{TEST}/sglang_oracle.py"),
              (tmp_path / "sglang-python", f"{TEST}/sglang-python"), (specs, f"{TEST}/specs"),
              (ROOT / "escha_deploy", site_packages), *model_mounts]
    env = {"ESCHA_SERVE_MODE": "container", "ESCHA_SGLANG_PYTHON": f"{TEST}/sglang-python",
           "ESCHA_SGLANG_PREFLIGHT": "1", "ESCHA_SKIP_GPU_PREFLIGHT": "1", "ESCHA_TEST_CARD": json.dumps(CARD),
           "ESCHA_ORACLE_SCRIPT": f"{TEST}/sglang_oracle.py",
           # three `serve --spec` pre-flights and up's check import torch and SGLang at once: on a
           # 2-core machine running another copy of the suite that can pass serve's default 240 s
           "ESCHA_SGLANG_PREFLIGHT_TIMEOUT": "600"}
    c = docker_client.containers.run(
        image, ["infinity"], entrypoint="sleep", name=f"escha-test-sglang-preflight-{RUN}", detach=True,
        labels={"io.escha.test": f"sglang-preflight-{RUN}"}, network_mode="none", cap_add=["IPC_LOCK"],
        mounts=[Mount(t, str(s), type="bind", read_only=True) for s, t in mounts])
    try:
        # the `serve --spec` runs, AT_ONCE at a time, detached; `up`'s check runs meanwhile (below).
        # Once `serve` says it starts SGLang (the pre-flight passed), it is stopped (SIGTERM, which
        # `timeout` and `serve` forward): what the server does next is not this test's question
        script = ("mkdir -p /tmp/out && for c in \"$@\"; do echo \"$c\"; done | xargs -P " + str(AT_ONCE)
                  + " -I{} sh -c 't0=$(date +%s.%N); timeout -s INT 700 /opt/escha/venv/bin/escha-deploy serve "
                  f"--spec {TEST}/specs/{{}}.json > /tmp/out/{{}}.log 2>&1 & p=$!; while kill -0 $p 2>/dev/null; "
                  "do grep -q \"starting SGLang\" /tmp/out/{}.log && kill -TERM $p; sleep 0.2; done; wait $p; "
                  "echo $? $t0 $(date +%s.%N) > /tmp/out/{}.rc'; touch /tmp/out/done")
        slugs = [case.replace(" ", "-") for case in cases]
        t0 = time.monotonic()
        c.exec_run(["sh", "-c", script, "serve-spec", *slugs], environment=env, detach=True)
        results_many, many_s = _up_check(docker_client, prep, env, mounts, sized)
        while c.exec_run(["test", "-e", "/tmp/out/done"]).exit_code != 0:
            assert time.monotonic() - t0 < 1800, "the `serve --spec` runs did not finish"
            time.sleep(1)
        serve_s = time.monotonic() - t0
        results = {}
        for case, slug in zip(cases, slugs):
            code, start, end = c.exec_run(["cat", f"/tmp/out/{slug}.rc"]).output.decode().split()
            log = c.exec_run(["cat", f"/tmp/out/{slug}.log"]).output.decode(errors="replace")
            results[case] = (int(code), log, float(end) - float(start))
    finally:
        try:
            c.remove(force=True)
        except docker.errors.APIError as e:  # already being removed: keep the test's own error
            if e.status_code not in (404, 409):
                raise
    answers = {case: dataclasses.asdict(r) for case, r in zip(sized, results_many)}
    with capsys.disabled():
        print(f"\n[sglang pre-flight in {image}] {len(cases)} `serve --spec` runs in one container, {AT_ONCE} at "
              f"a time, beside up's check: {serve_s:.1f} s in all; "
              + ", ".join(f"{k} {v[2]:.1f} s" for k, v in results.items())
              + f"; {len(sized)} argvs through all six stages in one throw-away container (up's check): "
              f"{many_s:.1f} s, SGLang's own stages {results_many[0].seconds.get('total')} s for the first")

    for profile in ("linux-tp2-l3", "rtx5060ti-tp2"):
        a = answers[profile]
        assert a["ok"] is True and a["stage"] == "model runner", (profile, a["not_run"], a)
        assert a["answers"]["max_total_num_tokens"] > 0 and a["answers"]["host_kv_bytes"] > 0, (profile, a)
        assert a["answers"]["architecture"] == "Qwen3_5ForCausalLM", (profile, a)
    a = answers["parse"]
    assert (a["ok"], a["stage"], a["type"], a["site"]) == (False, "argument resolution", "SystemExit",
                                                          "srt/server_args.py:prepare_server_args"), a
    assert "invalid choice: 'nonsense'" in a["message"] and "--attention-backend" in a["flags"], a
    line = refusal(PreflightResult(**a), prep.launch.profile_data).problems[0]
    assert "set by runtime.attention_backend" in line and "(srt/server_args.py:prepare_server_args)" in line, line

    code, log, _ = results["accepted"]
    passed = [ln for ln in log.splitlines() if "serve: SGLang's pre-flight passed" in ln]
    assert len(passed) == 1 and "attention backend" in passed[0], log[-3000:]
    # all five stages on the spec's figures: the KV pool SGLang sized is the plan's --max-total-tokens
    fp8 = base["argv"]
    assert f"KV pool {fp8[fp8.index('--max-total-tokens') + 1]} tokens" in passed[0], passed[0]
    assert "; host pools " in passed[0] and "skipped" not in log, log[-3000:]
    assert "starting SGLang" in log, log[-3000:]
    want = {
        "resolution": ("argument resolution", "ValueError: ", "enable-hierarchical-cache and disable-radix-cache "
                       "are mutually exclusive", "srt/arg_groups/kv_cache_hook.py:handle_cache_compatibility"),
        "model config": ("model config", "ValueError: ", "User-specified context_length (300000) is greater than "
                         "the derived context_length (262144)", "srt/configs/model_config.py:_derive_context_length"),
        "attention": ("attention backend", "ValueError: ", "TRTLLM FMHAv2 prefill on SM120 does not support fp8_e4m3",
                      "srt/arg_groups/attention_hook.py:handle_attention_backend_compatibility"),
        "kv": (KV_REFUSAL[0], f"{KV_REFUSAL[1]}: ", KV_REFUSAL[2], KV_REFUSAL[3]),
        "host pools": (HOST_REFUSAL[0], f"{HOST_REFUSAL[1]}: ", HOST_REFUSAL[2], HOST_REFUSAL[3]),
    }
    keys = {"resolution": "hicache.enabled", "model config": "runtime.context_length",
            "attention": "runtime.attention_backend", "kv": "runtime.mem_fraction_static",
            "host pools": "hicache.hicache_size"}
    for case, (stage, typ, message, site) in want.items():
        code, log, _ = results[case]
        assert code == 3, (case, log[-3000:])
        err = [ln for ln in log.splitlines() if ln.startswith("error:")]
        assert len(err) == 1, (case, log[-3000:])
        assert f"SGLang's pre-flight refused at {stage}: {typ}" in err[0] and message in err[0], (case, err[0])
        assert f"({site})" in err[0] and f"set by {keys[case]}" in err[0], (case, err[0])
        assert "starting SGLang" not in log, (case, log[-3000:])


def _up_check(client, prep, env: dict, mounts: list, sized: dict) -> tuple[list[PreflightResult], float]:
    """`up`'s check ``sglang pre-flight`` for each of ``sized`` (argv, device figures): a throw-away
    container of the image (``image_preflight.in_image_many``), all in one SGLang process; the
    launch's own container settings plus the test-only mounts and the wrapper as SGLang's
    interpreter. Returns the answers and the seconds it took."""
    t = time.monotonic()
    test_prep = dataclasses.replace(prep, args={  # no GPU request: this daemon has no NVIDIA runtime (the card stands in)
        **prep.args, "device_requests": [], "environment": {**prep.args["environment"], **{k: v for k, v in env.items() if k != "ESCHA_SERVE_MODE"}},
        "mounts": [*prep.args["mounts"], *({"type": "bind", "source": str(src), "target": tgt, "read_only": True}
                                           for src, tgt in mounts
                                           if tgt not in {m["target"] for m in prep.args["mounts"]})]})
    return in_image_many(client, test_prep, list(sized.values()), timeout_s=600), time.monotonic() - t
