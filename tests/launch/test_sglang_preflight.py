"""SGLang's own pre-flight (escha_deploy/launch/sglang_preflight.py) against the real SGLang
wheels: it accepts what the shipped profiles render and refuses, at each stage, what SGLang's own
code refuses, with SGLang's message and file:function; its sizing stages, on 0.5.19 and 0.5.23
(each release's own configurator and host pools), land on the figures ``plan`` computes for that
release; native `serve` refuses before the server starts and names the profile key.

Runs in the flag-catalog venvs (.ci/check-flag-catalog.sh [VERSION]: sglang --no-deps, CPU torch
2.13, the import chain) with the test-only site hook in tests/launch/preflight_cpu_site (the
oracle's stand-ins for the GPU: platform plugin, torchvision, platform facts; named there).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from escha_deploy.launch import sglang_preflight as pf
from escha_deploy.profile import load_profile
from tests.oracle.cases import config_json, stock_argv

ROOT = Path(__file__).resolve().parents[2]
VENV_PY = Path(os.environ.get("ESCHA_FLAGCAT_VENV", ROOT / ".cache" / "flagcat-venv")) / "bin" / "python"
SITE = ROOT / "tests" / "launch" / "preflight_cpu_site"
#: An RTX 5060 Ti 16 GB as NVML reports it (the shipped profiles' card class; sm_120)
CARD = {"vram_bytes": 16 * 2**30 - 2**28, "name": "NVIDIA GeForce RTX 5060 Ti", "capability": "12.0"}

pytestmark = pytest.mark.wheel


def site_env(**extra: str) -> dict[str, str]:
    """The environment of SGLang's interpreter for the pre-flight on this GPU-less machine."""
    if not VENV_PY.exists():
        pytest.fail(f"no flag-catalog venv at {VENV_PY} (.ci/check-flag-catalog.sh makes it)")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SITE)]), "ESCHA_TEST_CARD": json.dumps(CARD),
            "ESCHA_ORACLE_SCRIPT": str(ROOT / "scripts" / "sglang_oracle.py"), **extra}


#: The host-pool stage's memory budget in these tests (bytes, the whole box): room for the shipped
#: profiles' pools, as on the boxes they describe; this CI machine is not one of them.
HOST_BUDGET = 2**40


def rendered(cli, name: str, model: Path, *sets: str) -> tuple[list[str], dict[str, int]]:
    """What native `serve --print` renders for a shipped profile with ``model`` as its folder, and
    the plan's device figures it gives SGLang's pre-flight (``preflight_device``), with
    ``HOST_BUDGET`` as the host-pool stage's budget."""
    out = json.loads(cli("serve", "--print", "-p", name, "--set", f"model.host_dir={model}",
                         *[a for s in sets for a in ("--set", s)]).out)
    argv = pf.server_flags_of(out["argv"])
    assert argv[argv.index("--model-path") + 1] == str(model)
    # the overlays' own flags replaced by their stock stand-ins
    return stock_argv(argv), {**out["preflight_device"], "host_budget": HOST_BUDGET}


def model_folder(tmp_path: Path, name: str, **config) -> Path:
    d = tmp_path / f"model-{name}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**config_json(load_profile(name).model.architecture), **config}))
    with open(d / "model.safetensors", "wb") as f:  # sparse: the plan counts the profile's weights, no disk
        f.truncate(load_profile(name).model.weights_total or 64)
    return d


def test_pre_flight_accepts_the_shipped_profiles_and_refuses_at_each_stage(cli, tmp_path, capsys):
    cases: dict[str, list[str]] = {}
    devices: dict[str, dict[str, int]] = {}
    l3 = tmp_path / "l3"
    l3.mkdir()
    sets = {"linux-tp2-l3": (f"hicache.storage_dir={l3}", "hicache.storage_max_size=1GB")}  # fits the CI disk
    for name in ("rtx5060ti-tp2-fp8", "linux-tp2-l3", "rtx5060ti-tp2"):
        cases[name], devices[name] = rendered(cli, name, model_folder(tmp_path, name), *sets.get(name, ()))
    base, dev = cases["rtx5060ti-tp2-fp8"], devices["rtx5060ti-tp2-fp8"]
    cases["parse"] = [*base, "--attention-backend", "nonsense"]
    cases["resolution"] = [*base, "--attention-backend", "dual_chunk_flash_attn"]
    cases["model config"] = [*base, "--context-length", "300000"]  # config.json: 262144
    cases["attention"] = [*base, "--attention-backend", "trtllm_mha"]
    # the weights leave nothing for the KV pool at this fraction of the card
    cases["kv"] = [a if a != base[base.index("--mem-fraction-static") + 1] else "0.3" for a in base]
    cases["host pools"] = [*base, "--hicache-size", "100000"]  # 100 TB per rank: more than the budget
    cases["pp"] = [*base, "--pp-size", "2"]  # resolution accepts it; the stand-in sizing has no PP group
    # one process, several argvs: the host-pool stage's stand-ins end with it. 500 GB per rank fits
    # the described 1 TiB box; the same argv with no described budget meets this machine's own
    # free memory (SGLang's check), not the budget an earlier argv described
    cases["described box"] = [*base, "--hicache-size", "500"]
    cases["this machine"] = cases["described box"]
    devices["this machine"] = {k: v for k, v in dev.items() if k != "host_budget"}
    for case in cases:
        devices.setdefault(case, dev)
    results = dict(zip(cases, pf.run_many(str(VENV_PY), list(cases.values()), site_env(),
                                          devices=[devices[c] for c in cases])))
    with capsys.disabled():
        r0 = results["rtx5060ti-tp2-fp8"]
        print(f"\n[sglang pre-flight] {len(cases)} argvs in one SGLang process: {r0.wall_s:.1f} s wall, "
              f"SGLang import {r0.seconds.get('import')} s, first case {r0.seconds.get('total')} s")
    for name in ("rtx5060ti-tp2-fp8", "linux-tp2-l3", "rtx5060ti-tp2"):
        r = results[name]
        assert r.ok is True, (name, r)
        assert r.stage == "model runner" and r.answers["attention_backend"], r
        assert r.answers["model_runner_backend"].startswith("HybridLinearAttnBackend("), r.answers
        assert r.answers["architecture"] == "Qwen3_5ForCausalLM"
        a = r.answers  # SGLang's sizing: a KV pool, mamba slots, and host pools larger than the device's
        assert a["max_total_num_tokens"] > 0 and a["kv_pool_bytes"] == a["max_total_num_tokens"] * a["kv_bytes_per_token"]
        assert a["mamba_slots"] > 0 and a["host_kv_tokens"] > a["max_total_num_tokens"], a
        assert a["host_kv_bytes"] > a["kv_pool_bytes"] and a["host_mamba_bytes"] > 0, a
    # where the profile sets the device pool, SGLang's configurator lands on the plan's figure
    fp8 = results["rtx5060ti-tp2-fp8"].answers
    assert fp8["max_total_num_tokens"] == int(base[base.index("--max-total-tokens") + 1]), fp8
    want = {
        "parse": ("argument resolution", "SystemExit", "invalid choice: 'nonsense'", "srt/server_args.py:prepare_server_args",
                  "--attention-backend"),
        "resolution": ("argument resolution", "ValueError", "enable-hierarchical-cache and disable-radix-cache are "
                       "mutually exclusive", "srt/arg_groups/kv_cache_hook.py:handle_cache_compatibility",
                       "--enable-hierarchical-cache"),
        "model config": ("model config", "ValueError", "User-specified context_length (300000) is greater than the "
                         "derived context_length (262144)", "srt/configs/model_config.py:_derive_context_length",
                         "--context-length"),
        "attention": ("attention backend", "ValueError", "TRTLLM FMHAv2 prefill on SM120 does not support fp8_e4m3",
                      "srt/arg_groups/attention_hook.py:handle_attention_backend_compatibility", "--attention-backend"),
        "kv": KV_REFUSAL,
        "host pools": HOST_REFUSAL,
    }
    # a stage the stand-in cannot run is said and skipped, not passed off as SGLang's refusal
    assert results["described box"].ok is True, results["described box"]
    mine = results["this machine"]
    assert (mine.ok, mine.stage, mine.site) == (False, "host pools", HOST_REFUSAL[3]), mine
    pp = results["pp"]
    assert (pp.ok, pp.stage) == (True, "model runner") and "--pp-size 2" in pp.skipped, pp
    for case, (stage, typ, message, site, flag) in want.items():
        r = results[case]
        assert (r.ok, r.stage, r.type, r.site) == (False, stage, typ, site), (case, r)
        assert message in r.message and flag in r.flags, (case, r)


#: SGLang 0.5.19's refusals at the sizing stages: (stage, type, message, file:function, flag)
KV_REFUSAL = ("KV cache configurator", "ValueError", "Loaded weights leave no GPU memory for the KV cache under "
              "--mem-fraction-static=0.3", "srt/mem_cache/kv_cache_configurator.py:_profile_available_bytes",
              "--mem-fraction-static")
HOST_REFUSAL = ("host pools", "ValueError", "Not enough host memory available. Requesting",
                "srt/mem_cache/pool_host/base.py:__init__", "--hicache-size")


def test_native_serve_refuses_before_the_server_starts_naming_the_key(tmp_path):
    """SGLang refuses ``--linear-attn-decode-backend flashkda`` (a prefill-only kernel); plan does not
    model that extra_args flag. serve exits 3 with SGLang's message, its file:function and the
    profile key, and starts nothing."""
    model = model_folder(tmp_path, "rtx5060ti-tp2-fp8")
    with socket.socket() as sock:  # a free port: another suite may run beside this one
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = site_env(ESCHA_SGLANG_PYTHON=str(VENV_PY), ESCHA_SKIP_GPU_PREFLIGHT="1", ESCHA_SGLANG_PREFLIGHT="1",
                   XDG_CACHE_HOME=str(tmp_path / "xdg"))
    proc = subprocess.run(
        [sys.executable, "-m", "escha_deploy.cli.main", "serve", "-p", "rtx5060ti-tp2-fp8",
         "--set", f"model.host_dir={model}", "--set", "runtime.needs=[]", "--set", "runtime.extra_args=[--linear-attn-decode-backend,flashkda]",
         "--set", f"container.port={port}"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 3, proc.stderr
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1, proc.stderr
    assert "SGLang's pre-flight refused at attention backend: ValueError: --linear-attn-decode-backend flashkda " \
        "is not supported" in err[0]
    assert "(srt/arg_groups/attention_hook.py:handle_linear_attn_backend)" in err[0]
    assert "set by runtime.extra_args item '--linear-attn-decode-backend'" in err[0]
    assert "starting SGLang" not in proc.stderr


def test_an_interpreter_without_sglang_is_not_run_and_says_why():
    r = pf.run(sys.executable, ["--model-path", "/nonexistent"], {**os.environ, "PYTHONPATH": ""})
    assert r.ok is None and "does not import" in r.not_run


def test_a_release_function_gets_only_the_keywords_it_names():
    """0.5.21's ``kv_pool_runtime.py: is_post_capture_kv_active`` takes ``server_args`` and
    ``is_draft_worker`` only, 0.5.23's also ``spec_algorithm`` and ``token_to_kv_pool_allocator``
    (the two wheels' signatures, written out here): each gets what it names; a keyword it
    requires and is not given is still a TypeError."""
    def of_0_5_21(*, server_args, is_draft_worker):
        return (server_args, is_draft_worker)

    def of_0_5_23(*, server_args, is_draft_worker, spec_algorithm, token_to_kv_pool_allocator):
        return (server_args, is_draft_worker, spec_algorithm, token_to_kv_pool_allocator)

    given = {"server_args": "sa", "is_draft_worker": False, "spec_algorithm": "NONE", "token_to_kv_pool_allocator": None}
    assert pf._with_its_keywords(of_0_5_21, **given) == ("sa", False)
    assert pf._with_its_keywords(of_0_5_23, **given) == ("sa", False, "NONE", None)
    with pytest.raises(TypeError, match="spec_algorithm"):
        pf._with_its_keywords(of_0_5_23, server_args="sa", is_draft_worker=False, token_to_kv_pool_allocator=None)


def test_keys_come_from_the_profile_metadata_and_extra_args():
    keys = pf.profile_keys_for(["--attention-backend", "--max-total-tokens", "--speculative-num-draft-tokens",
                                "--enable-torch-compile"], ["--enable-torch-compile"])
    assert keys == ["runtime.attention_backend", "runtime.max_total_tokens", "runtime.speculative.num_draft_tokens",
                    "runtime.extra_args item '--enable-torch-compile'"]


VENV_0523 = ROOT / ".cache" / "flagcat-venv-0.5.23" / "bin" / "python"

#: The plan's figures the sizing stages answer, as ``plan --format json``'s ``per_rank`` names
#: them, by the pre-flight's answer key (bytes, tokens, slots per rank)
PLAN_KEYS = {"max_total_num_tokens": "device_kv_tokens", "kv_bytes_per_token": "device_kv_bytes_per_token",
             "mamba_slots": "device_mamba_slots", "mamba_pool_bytes": "device_mamba_bytes",
             "host_kv_tokens": "host_kv_tokens", "host_kv_bytes": "host_kv_bytes",
             "host_mamba_slots": "host_mamba_slots", "host_mamba_bytes": "host_mamba_bytes"}


#: Per release: its flag-catalog venv and its host-pool refusal's site (0.5.23 moved the check
#: into ``HostKVCache._allocate_host_buffer``)
RELEASE_SIZING = {"0.5.19": (VENV_PY, HOST_REFUSAL),
                  "0.5.23": (VENV_0523, (*HOST_REFUSAL[:3], "srt/mem_cache/pool_host/base.py:_allocate_host_buffer",
                                         HOST_REFUSAL[4]))}


@pytest.mark.parametrize("release", sorted(RELEASE_SIZING))
def test_sizing_stages_give_the_plans_figures_and_the_releases_refusals(cli, tmp_path, capsys, release):
    """Each release's own KV cache configurator (0.5.19's shape, with ``ps``; 0.5.23's, the
    widths as fields: ``_kv_configurator_fields``) and host pools (0.5.23: built over buffer
    descriptions) size the shipped profiles' pools at exactly the figures ``plan`` computes
    for ``runtime.sglang_version=RELEASE`` (device tokens, mamba slots and bytes, host KV and
    mamba pools, the ``--hicache-size`` split over the device pools' bytes included); the argvs
    run in one process, so the mamba state's dtype an earlier argv's ``--mamba-ssm-dtype``
    wrote to the environment must not reach a later one. Too little memory for the KV pool,
    or more host pool than the box has, is refused with that release's message and site;
    ``--pp-size 2`` is skipped."""
    python, host_refusal = RELEASE_SIZING[release]
    if not python.exists():
        pytest.fail(f"no flag-catalog venv at {python} (.ci/check-flag-catalog.sh {release} makes it)")
    l3 = tmp_path / "l3"
    l3.mkdir()
    version = f"runtime.sglang_version={release}"
    sets = {"rtx5060ti-tp2-fp8": (version,),
            "linux-tp2-l3": (version, f"hicache.storage_dir={l3}", "hicache.storage_max_size=1GB")}  # fits the CI disk
    cases: dict[str, list[str]] = {}
    devices: dict[str, dict[str, int]] = {}
    planned: dict[str, dict] = {}
    for name, overrides in sets.items():
        model = model_folder(tmp_path, name)
        cases[name], devices[name] = rendered(cli, name, model, *overrides)
        out = cli("plan", "-p", name, "--set", f"model.host_dir={model}", *[a for s in overrides for a in ("--set", s)],
                  "--host-ram", "1TiB", "--linux", "-f", "json")
        planned[name] = json.loads(out.out)
        assert planned[name]["sglang_release"] == release, planned[name]["sglang_release"]
    base, dev = cases["rtx5060ti-tp2-fp8"], devices["rtx5060ti-tp2-fp8"]
    cases["kv"] = [a if a != base[base.index("--mem-fraction-static") + 1] else "0.3" for a in base]
    cases["host pools"] = [*base, "--hicache-size", "100000"]  # 100 TB per rank: more than the budget
    cases["pp"] = [*base, "--pp-size", "2"]
    for case in cases:
        devices.setdefault(case, dev)
    results = dict(zip(cases, pf.run_many(str(python), list(cases.values()), site_env(),
                                          devices=[devices[c] for c in cases])))
    for name in sets:
        r, per_rank = results[name], planned[name]["per_rank"]
        assert r.ok is True and r.stage == "model runner" and not r.skipped, (name, r)
        got = {k: r.answers[k] for k in PLAN_KEYS}
        want = {k: per_rank[v] for k, v in PLAN_KEYS.items()}
        with capsys.disabled():
            print(f"\n[sglang {release} sizing] {name}: {got}")
        assert got == want, (name, got, want)
        argv = cases[name]
        assert r.answers["max_running_requests"] == int(argv[argv.index("--max-running-requests") + 1]), r.answers
        assert r.answers["kv_pool_bytes"] == r.answers["max_total_num_tokens"] * r.answers["kv_bytes_per_token"]
    for case, (stage, typ, message, site, flag) in {"kv": KV_REFUSAL, "host pools": host_refusal}.items():
        r = results[case]
        assert (r.ok, r.stage, r.type, r.site) == (False, stage, typ, site), (case, r)
        assert message in r.message and flag in r.flags, (case, r)
    pp = results["pp"]
    assert (pp.ok, pp.stage) == (True, "model runner") and "--pp-size 2" in pp.skipped, pp


FAULT_RUNNER = ROOT / "tests" / "launch" / "preflight_fault.py"


def planted_python(tmp_path: Path) -> Path:
    """SGLang's interpreter (the flag-catalog venv's) running the pre-flight through the TEST-ONLY
    fault runner (tests/launch/preflight_fault.py: the function ``$ESCHA_TEST_PREFLIGHT_FAULT``
    names raises); a shell wrapper, as ``ESCHA_SGLANG_PYTHON`` and ``run``'s ``python`` take one."""
    wrapper = tmp_path / "python-planted"
    wrapper.write_text(f'#!/bin/sh\nexec "{VENV_PY}" "{FAULT_RUNNER}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


#: Where the planted fault in ``_sized`` surfaces (the 0.5.19 configurator's function calls it)
PLANTED = ("KV cache configurator", "KeyError", "'planted harness fault'", "launch/sglang_preflight.py:_kv_configurator_ps")


def test_a_planted_harness_fault_is_ours_and_sglangs_refusal_stays_sglangs(cli, tmp_path):
    """With the pre-flight's own ``_sized`` (called once SGLang's sizing has answered) made to
    raise, the argv SGLang accepts comes back as a harness fault (stage, our function, the
    traceback; no flags), while the argv SGLang's ``_profile_available_bytes`` refuses, in the
    same process, is still SGLang's refusal. Both as ``serve`` runs the pre-flight (a script) and
    as `up`'s throw-away container does (its source given to ``python -c``: ``image_preflight``)."""
    base, dev = rendered(cli, "rtx5060ti-tp2-fp8", model_folder(tmp_path, "rtx5060ti-tp2-fp8"))
    kv = [a if a != base[base.index("--mem-fraction-static") + 1] else "0.3" for a in base]
    env = site_env(ESCHA_TEST_PREFLIGHT_FAULT="_sized")
    planted, refused = pf.run_many(str(planted_python(tmp_path)), [base, kv], env, devices=[dev, dev])
    # the same fault planted in the source `up` hands to `python -c`
    source = Path(pf.__file__).read_text()
    tail = '\nif __name__ == "__main__":'
    assert source.count(tail) == 1
    source = source.replace(tail, "\ndef _sized(*a, **k):\n    raise KeyError('planted harness fault')\n" + tail)
    proc = subprocess.run([str(VENV_PY), "-c", source], input=json.dumps({"argvs": [base, kv], "devices": [dev, dev]}),
                          capture_output=True, text=True, env=site_env(), timeout=300)
    by_c = pf.parse_answers(proc.stdout, 2, 0.0, "python -c", proc.returncode, proc.stderr)
    # the site is the innermost function of the pre-flight's file: in the source given to
    # `python -c` the planted function is one of them
    for (fault, refusal), how, site in (((planted, refused), "script", PLANTED[3]),
                                        (by_c, "python -c", "launch/sglang_preflight.py:_sized")):
        assert fault.internal and fault.ok is False, (how, fault)
        assert (fault.stage, fault.type, fault.message, fault.site) == (*PLANTED[:3], site), (how, fault)
        assert fault.flags == [] and "KeyError: 'planted harness fault'" in fault.traceback, (how, fault)
        assert not refusal.internal and (refusal.ok, refusal.stage, refusal.type, refusal.site) == (
            False, *KV_REFUSAL[:2], KV_REFUSAL[3]), (how, refusal)
        assert KV_REFUSAL[4] in refusal.flags, (how, refusal)


def test_native_serve_exits_1_on_a_harness_fault_and_names_no_profile_key(tmp_path):
    """The fault planted in the pre-flight's own ``_sized``: native ``serve`` exits 1 with one
    line, "internal error in the pre-flight (please report)", our function and the stage, and the
    log file holding the traceback; no profile key, no "change the key" hint, nothing started.
    (The same ``serve`` with SGLang's own refusal exits 3 naming the key:
    ``test_native_serve_refuses_before_the_server_starts_naming_the_key``.)"""
    model = model_folder(tmp_path, "rtx5060ti-tp2-fp8")
    with socket.socket() as sock:  # a free port: another suite may run beside this one
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    xdg = tmp_path / "xdg"
    env = site_env(ESCHA_SGLANG_PYTHON=str(planted_python(tmp_path)), ESCHA_TEST_PREFLIGHT_FAULT="_sized",
                   ESCHA_SKIP_GPU_PREFLIGHT="1", ESCHA_SGLANG_PREFLIGHT="1", XDG_CACHE_HOME=str(xdg))
    env.pop("ESCHA_SERVE_MODE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "escha_deploy.cli.main", "serve", "-p", "rtx5060ti-tp2-fp8",
         "--set", f"model.host_dir={model}", "--set", "runtime.needs=[]", "--set", f"container.port={port}"],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1, proc.stderr
    stage, typ, message, site = PLANTED
    assert err[0].startswith(f"error: internal error in the pre-flight (please report): {typ}: {message} in {site} "
                             f"(stage {stage}); the traceback is in {xdg}/escha-deploy/preflight/"), err[0]
    assert "set by" not in proc.stderr and "change the key" not in proc.stderr and "refused" not in err[0]
    assert "Traceback" not in proc.stderr and "starting SGLang" not in proc.stderr
    log = Path(err[0].rsplit("the traceback is in ", 1)[1])
    assert "KeyError: 'planted harness fault'" in log.read_text()


#: SGLang's refusals when its model runner builds the attention backend for the fp8 profile's
#: hybrid GDN model on its sm_120 card (``layers/attention/attention_registry.py``; the same code in
#: 0.5.19 and 0.5.23), by ``--attention-backend``: (type, message, file:function). fa3's factory
#: refuses before the wrapper is reached; fa4's factory builds, and the wrapper refuses it.
RUNNER_REFUSALS = {
    "fa3": ("AssertionError", "FlashAttention v3 Backend requires SM>=80 and SM<=90",
            "srt/layers/attention/attention_registry.py:create_flashattention_v3_backend"),
    "fa4": ("AssertionError", "backends are supported on Blackwell GPUs for hybrid GDN models. Got prefill=fa4, "
            "decode=fa4", "srt/layers/attention/attention_registry.py:attn_backend_wrapper"),
}


@pytest.mark.parametrize("release", sorted(RELEASE_SIZING))
def test_model_runner_stage_refuses_the_attention_backend_sglang_refuses_on_the_card(cli, tmp_path, release):
    """Stage 6 (``_model_runner``) runs SGLang's own attention-backend construction checks without
    weights, on the plan's compute capability (``hardware.compute_capability`` 12.0 for
    ``rtx5060ti-tp2-fp8``): fa3 and fa4 are refused with SGLang's message and site, naming
    ``--attention-backend``; triton and flashinfer build the hybrid linear-attention backend over
    the model's 16 full-attention layers; on an sm_89 card (the capability alone changed) fa3 and
    fa4 pass the same checks, so the card's capability is what refuses them."""
    python = RELEASE_SIZING[release][0]
    if not python.exists():
        pytest.fail(f"no flag-catalog venv at {python} (.ci/check-flag-catalog.sh {release} makes it)")
    base, dev = rendered(cli, "rtx5060ti-tp2-fp8", model_folder(tmp_path, "rtx5060ti-tp2-fp8"),
                         f"runtime.sglang_version={release}")
    assert dev["capability"] == "12.0", dev
    backends = ("fa3", "fa4", "triton", "flashinfer")
    cases = {b: [*base, "--attention-backend", b] for b in backends}
    devices = {b: dev for b in backends}
    for b in ("fa3", "fa4"):
        cases[f"{b} on sm_89"] = cases[b]
        devices[f"{b} on sm_89"] = {**dev, "capability": "8.9"}
    results = dict(zip(cases, pf.run_many(str(python), list(cases.values()), site_env(),
                                          devices=[devices[c] for c in cases])))
    for b, (typ, message, site) in RUNNER_REFUSALS.items():
        r = results[b]
        assert (r.ok, r.stage, r.type, r.site, r.fault) == (False, "model runner", typ, site, ""), (b, r)
        assert message in r.message and r.flags == ["--attention-backend"], (b, r)
        assert "attention_registry.py" in pf.refusal_line(r, pf.profile_keys_for(r.flags, []))
    for b in ("triton", "flashinfer"):
        r = results[b]
        assert r.ok is True and r.stage == "model runner", (b, r)
        built = {"triton": "TritonAttnBackend", "flashinfer": "FlashInferAttnBackend"}[b]
        assert r.answers["model_runner_backend"] == f"HybridLinearAttnBackend({built}, GDNAttnBackend, " \
                                                    "16 full-attention layers)", r.answers
    for b in ("fa3", "fa4"):
        r = results[f"{b} on sm_89"]
        assert r.ok is True and r.stage == "model runner", (b, r)
        assert r.answers["model_runner_backend"].startswith("HybridLinearAttnBackend(FlashAttentionBackend, "), r.answers


@pytest.mark.parametrize("release", sorted(RELEASE_SIZING))
def test_model_runner_stage_gives_the_gdn_prefill_default_the_mamba_pools_dtype(cli, tmp_path, release):
    """On sm_90 and sm_100 SGLang's choice of the GDN prefill kernel
    (``linear/gdn_backend.py: flashinfer_gdn_prefill_default``) reads the device mamba pool's
    state dtype off the model runner (``req_to_token_pool.mamba_pool.mamba_cache.temporal``) for a
    model with 128-wide linear heads, as the fp8 profile's is. Stage 6 stands the card in for that
    function too and gives its runner the pool's states in the dtypes SGLang allocates
    (``_mamba_pool_states``): both cards build the hybrid backend. Without the states the stage
    failed on an H200 ('SimpleNamespace' object has no attribute 'req_to_token_pool', reported as
    SGLang refusing the attention backend); on this CPU machine the function never got that far,
    because it read the missing CUDA device itself."""
    python = RELEASE_SIZING[release][0]
    if not python.exists():
        pytest.fail(f"no flag-catalog venv at {python} (.ci/check-flag-catalog.sh {release} makes it)")
    folder = model_folder(tmp_path, "rtx5060ti-tp2-fp8")
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config", config)
    assert (text["linear_key_head_dim"], text["linear_value_head_dim"]) == (128, 128), text
    base, dev = rendered(cli, "rtx5060ti-tp2-fp8", folder, f"runtime.sglang_version={release}",
                         "runtime.attention_backend=triton")
    cards = ("9.0", "10.0")
    results = pf.run_many(str(python), [base] * len(cards), site_env(),
                          devices=[{**dev, "capability": c} for c in cards])
    for card, r in zip(cards, results):
        assert r.ok is True and r.stage == "model runner" and not r.fault, (card, r)
        assert r.answers["model_runner_backend"].startswith("HybridLinearAttnBackend(TritonAttnBackend, "
                                                            "GDNAttnBackend, "), (card, r.answers)


@pytest.mark.parametrize("release", sorted(RELEASE_SIZING))
def test_model_runner_stage_runs_trtllm_mhas_page_check_on_the_model_config(cli, tmp_path, release):
    """Stage 6 runs ``TRTLLMHAAttnBackend.__init__``'s own page-size statements (compiled from
    SGLang's file; the constructor itself takes the device pools) on the resolved page size, the
    model folder's config.json and the card: page 128 with trtllm_mha on sm_100 (no XQA kernels)
    and 4 query heads over 4 KV heads at TP 2 is refused with SGLang's message, at its file and
    function, naming --page-size; 24 query heads, page 64, or an sm_90 card (XQA) build it."""
    python = RELEASE_SIZING[release][0]
    if not python.exists():
        pytest.fail(f"no flag-catalog venv at {python} (.ci/check-flag-catalog.sh {release} makes it)")
    folders = {}
    for heads in (4, 24):
        (tmp_path / str(heads)).mkdir()
        folders[heads] = model_folder(tmp_path / str(heads), "rtx5060ti-tp2-fp8", num_attention_heads=heads)

    def case(heads: int, page: int, capability: str) -> tuple[list[str], dict[str, int]]:
        """What serve --print renders with 24 query heads (a plan that passes), on ``heads``'s folder."""
        base, dev = rendered(cli, "rtx5060ti-tp2-fp8", folders[24], f"runtime.sglang_version={release}",
                             "runtime.attention_backend=trtllm_mha", f"runtime.page_size={page}",
                             f"hardware.compute_capability=\"{capability}\"", "runtime.kv_cache.dtype=bf16")
        assert dev["capability"] == capability and base[base.index("--page-size") + 1] == str(page), (base, dev)
        return [str(folders[heads]) if x == str(folders[24]) else x for x in base], dev

    cases = {"gqa 2/2 on sm_100": case(4, 128, "10.0"), "gqa 12/2 on sm_100": case(24, 128, "10.0"),
             "page 64 on sm_100": case(4, 64, "10.0"), "xqa on sm_90": case(4, 128, "9.0")}
    results = dict(zip(cases, pf.run_many(str(python), [c[0] for c in cases.values()], site_env(),
                                          devices=[c[1] for c in cases.values()])))
    r = results["gqa 2/2 on sm_100"]
    assert (r.ok, r.stage, r.type, r.site, r.fault) == (
        False, "model runner", "ValueError", "srt/layers/attention/trtllm_mha_backend.py:__init__", ""), r
    assert "trtllm_mha with page_size=128 requires trtllm-gen's dynamic tokens-per-page kernels" in r.message, r
    assert "got 2/2" in r.message and r.flags == ["--page-size"], r
    assert "runtime.page_size" in pf.refusal_line(r, pf.profile_keys_for(r.flags, []))
    for case in ("gqa 12/2 on sm_100", "page 64 on sm_100", "xqa on sm_90"):
        r = results[case]
        assert r.ok is True and r.stage == "model runner", (case, r)
        assert r.answers["model_runner_backend"].startswith("HybridLinearAttnBackend(TRTLLMHAAttnBackend, "), r.answers


NEXTN = ("runtime.speculative.algorithm=NEXTN", "runtime.speculative.num_steps=3", "runtime.speculative.eagle_topk=1",
         "runtime.speculative.num_draft_tokens=4")
#: The plan's figures the sizing stages answer under speculation (``per_rank`` names): the scaled
#: cell (target + draft layers), the host pool with a packed draft layer, a sidecar's pool
SPEC_KEYS = {**PLAN_KEYS, "host_kv_bytes_per_token": "host_kv_bytes_per_token",
             "host_draft_kv_tokens": "host_draft_kv_tokens", "host_draft_kv_bytes": "host_draft_kv_bytes"}


def own_mtp_folder(tmp_path: Path) -> Path:
    """The fp8 profile's model folder with one MTP layer: ``mtp_num_hidden_layers: 1`` and an
    ``mtp.*`` tensor in the safetensors header (the rest sparse), 16.2 GB in all."""
    import struct

    d = model_folder(tmp_path, "rtx5060ti-tp2-fp8", mtp_num_hidden_layers=1)
    total, mtp = 16_200_000_000, 2 * 10**8
    header = json.dumps({"mtp.fc.weight": {"dtype": "BF16", "shape": [mtp // 2], "data_offsets": [0, mtp]},
                         "model.norm.weight": {"dtype": "BF16", "shape": [(total - 4096 - mtp) // 2],
                                               "data_offsets": [mtp, total - 4096]}})
    with open(d / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header.encode())
        f.truncate(total)
    return d


@pytest.mark.parametrize("release", sorted(RELEASE_SIZING))
def test_sizing_stages_run_with_the_speculative_configuration(cli, tmp_path, capsys, release):
    """The argv's speculative configuration reaches SGLang's own sizing on each release: the
    configurator gets ``--speculative-algorithm`` (``SpeculativeAlgorithm.from_string``) and the
    draft's layers (``resolve_spec_aux_hidden_state_config``), the host pools the draft's KV as
    SGLang's ``_build_hicache_draft_plan`` decides by its ``_can_pack_hicache_mtp``. NEXTN on the
    model's own folder packs one layer (17,408 B per token per rank), an EAGLE3 draft gets a sidecar
    pool, both exactly as ``plan`` counts them; NEXTN with 30 mamba slots and 6 requests is refused
    with SGLang's own message, the intermediate states per draft token leaving no KV budget."""
    python, _ = RELEASE_SIZING[release]
    if not python.exists():
        pytest.fail(f"no flag-catalog venv at {python} (.ci/check-flag-catalog.sh {release} makes it)")
    model = own_mtp_folder(tmp_path)
    e3 = tmp_path / "eagle3"
    e3.mkdir()
    (e3 / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "hidden_size": 4096,
        "intermediate_size": 12288, "vocab_size": 248320, "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}))
    with open(e3 / "model.safetensors", "wb") as f:
        f.truncate(10**8)
    # a sibling MTP folder: the model's own config.json and one 200 MB mtp.* tensor (the folder
    # users pair with STANDALONE); SGLang builds its draft runner over the hybrid config
    sibling = tmp_path / "sibling-mtp"
    sibling.mkdir()
    (sibling / "config.json").write_text((model / "config.json").read_text())
    header = json.dumps({"mtp.fc.weight": {"dtype": "BF16", "shape": [10**8], "data_offsets": [0, 2 * 10**8]}})
    with open(sibling / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header.encode())
        f.truncate(8 + len(header) + 2 * 10**8)
    version = f"runtime.sglang_version={release}"
    sets = {"nextn": (version, *NEXTN, "model.draft.path=/models/own", f"model.draft.host_dir={model}"),
            "standalone": (version, "runtime.speculative.algorithm=STANDALONE", "model.draft.path=/drafts/mtp",
                           f"model.draft.host_dir={sibling}"),
            "eagle3": (version, "runtime.speculative.algorithm=EAGLE3", "model.draft.path=/drafts/e3",
                       f"model.draft.host_dir={e3}"),
            "refused": (version, *NEXTN, "runtime.max_mamba_cache_size=30", "runtime.max_running_requests=6")}
    cases, devices, planned = {}, {}, {}
    for name, overrides in sets.items():
        cases[name], devices[name] = rendered(cli, "rtx5060ti-tp2-fp8", model, *overrides)
        out = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--set", f"model.host_dir={model}",
                  *[a for s in overrides for a in ("--set", s)], "--host-ram", "1TiB", "--linux", "-f", "json")
        planned[name] = json.loads(out.out)
    results = dict(zip(cases, pf.run_many(str(python), list(cases.values()), site_env(),
                                          devices=[devices[c] for c in cases])))
    for name, mode in (("nextn", "packed"), ("eagle3", "sidecar"), ("standalone", "sidecar")):
        r, per_rank = results[name], planned[name]["per_rank"]
        # every stage ran: the sizing stages (host pools last) and then the model runner's (stage 6)
        assert r.ok is True and r.stage == "model runner" and not r.skipped and "host pools" in r.seconds, (name, r)
        assert r.answers["host_draft_mode"] == mode, r.answers
        got = {k: r.answers.get(k, 0) for k in SPEC_KEYS}
        want = {k: per_rank[v] for k, v in SPEC_KEYS.items()}
        want["kv_bytes_per_token"] = per_rank["device_kv_bytes_per_token"] + per_rank["draft_kv_bytes_per_token"]
        with capsys.disabled():
            print(f"\n[sglang {release} speculative sizing] {name}: {got}")
        assert got == want, (name, got, want)
    assert results["nextn"].answers["host_kv_bytes_per_token"] == 17_408
    # STANDALONE on the sibling MTP folder: a hybrid draft, so SGLang's draft worker builds its
    # full-attention pool over one layer (_build_hybrid_linear_kv_pool: [0] for a draft worker) and
    # the sidecar mirrors that one layer: 2 heads per rank x 256 x K,V x 1 B (fp8) per token
    side = results["standalone"].answers
    assert side["host_draft_kv_bytes"] == side["host_draft_kv_tokens"] * 1_024, side
    refused = results["refused"]
    assert (refused.ok, refused.stage, refused.type) == (False, "KV cache configurator", "ValueError"), refused
    assert refused.message.startswith("Loaded weights leave no GPU memory for the KV cache")
    assert refused.site == "srt/mem_cache/kv_cache_configurator.py:_profile_available_bytes"
    assert planned["refused"]["verdict"] == "unsafe"
    assert any("1,098,252,288 B" in x and "Loaded weights leave no GPU memory" in x
               for x in planned["refused"]["reasons"])
