"""SGLang's own pre-flight (escha_deploy/launch/sglang_preflight.py) against the real SGLang 0.5.19
wheel: it accepts what the shipped profiles render and refuses, at each stage, what SGLang's own
code refuses, with SGLang's message and file:function; native `serve` refuses before the server
starts and names the profile key.

Runs in the flag-catalog venv (.ci/check-flag-catalog.sh: sglang 0.5.19 --no-deps, CPU torch
2.13, the import chain) with the test-only site hook in tests/launch/preflight_cpu_site (the
oracle's stand-ins for the GPU: platform plugin, torchvision, platform facts; named there).
"""

from __future__ import annotations

import json
import os
import socket
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


def rendered(cli, name: str, model: Path, *sets: str) -> list[str]:
    """What native `serve --print` renders for a shipped profile with ``model`` as its folder."""
    out = cli("serve", "--print", "-p", name, "--set", f"model.host_dir={model}",
              *[a for s in sets for a in ("--set", s)]).out
    argv = pf.server_flags_of(json.loads(out)["argv"])
    assert argv[argv.index("--model-path") + 1] == str(model)
    return stock_argv(argv)  # the overlays' own flags replaced by their stock stand-ins  # the overlays' own flags replaced by their stock stand-ins




def model_folder(tmp_path: Path, name: str, **config) -> Path:
    d = tmp_path / f"model-{name}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**config_json(load_profile(name).model.architecture), **config}))
    (d / "model.safetensors").write_bytes(b"\0" * 64)
    return d


def test_pre_flight_accepts_the_shipped_profiles_and_refuses_at_each_stage(cli, tmp_path, capsys):
    cases: dict[str, list[str]] = {}
    l3 = tmp_path / "l3"
    l3.mkdir()
    sets = {"linux-tp2-l3": (f"hicache.storage_dir={l3}", "hicache.storage_max_size=1GB")}  # fits the CI disk
    for name in ("rtx5060ti-tp2-fp8", "linux-tp2-l3", "rtx5060ti-tp2"):
        cases[name] = rendered(cli, name, model_folder(tmp_path, name), *sets.get(name, ()))
    base = cases["rtx5060ti-tp2-fp8"]
    cases["parse"] = [*base, "--attention-backend", "nonsense"]
    cases["resolution"] = [*base, "--attention-backend", "dual_chunk_flash_attn"]
    cases["model config"] = [*base, "--context-length", "300000"]  # config.json: 262144
    cases["attention"] = [*base, "--attention-backend", "trtllm_mha"]
    results = dict(zip(cases, pf.run_many(str(VENV_PY), list(cases.values()), site_env())))
    with capsys.disabled():
        r0 = results["rtx5060ti-tp2-fp8"]
        print(f"\n[sglang pre-flight] {len(cases)} argvs in one SGLang process: {r0.wall_s:.1f} s wall, "
              f"SGLang import {r0.seconds.get('import')} s, first case {r0.seconds.get('total')} s")
    for name in ("rtx5060ti-tp2-fp8", "linux-tp2-l3", "rtx5060ti-tp2"):
        r = results[name]
        assert r.ok is True, (name, r)
        assert r.stage == "attention backend" and r.answers["attention_backend"], r
        assert r.answers["architecture"] == "Qwen3_5ForCausalLM"
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
    }
    for case, (stage, typ, message, site, flag) in want.items():
        r = results[case]
        assert (r.ok, r.stage, r.type, r.site) == (False, stage, typ, site), (case, r)
        assert message in r.message and flag in r.flags, (case, r)


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


def test_keys_come_from_the_profile_metadata_and_extra_args():
    keys = pf.profile_keys_for(["--attention-backend", "--max-total-tokens", "--speculative-algorithm"],
                               ["--speculative-algorithm", "NEXTN"])
    assert keys == ["runtime.attention_backend", "runtime.max_total_tokens",
                    "runtime.extra_args item '--speculative-algorithm'"]
