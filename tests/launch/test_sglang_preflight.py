"""SGLang's own pre-flight (escha_deploy/launch/sglang_preflight.py) against the real SGLang
wheels: it accepts what the shipped profiles render and refuses, at each stage, what SGLang's own
code refuses, with SGLang's message and file:function; its sizing stages, on 0.5.19 and 0.5.23
(each release's own configurator and host pools), land on the figures ``plan`` computes for that
release, with and without a speculative configuration.

Runs in the flag-catalog venvs (.ci/check-flag-catalog.sh [VERSION]: sglang --no-deps, CPU torch
2.13, the import chain) with the test-only site hook in tests/launch/preflight_cpu_site (the
oracle's stand-ins for the GPU: platform plugin, torchvision, platform facts; named there). The
argvs of this file's tests run in one SGLang process per release (tests/launch/
sglang_preflight_cases.py: ``SharedPreflight``); the model-runner stage's tests are in
test_sglang_preflight_model_runner.py, what needs a process of its own (native ``serve``, a
planted harness fault) in test_sglang_preflight_own_process.py.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import pytest

from escha_deploy.launch import sglang_preflight as pf

from .sglang_preflight_cases import (HOST_REFUSAL, KV_REFUSAL, PLAN_KEYS, RELEASE_SIZING, Cases, model_folder,
                                     rendered, shares_process, with_value)

pytestmark = pytest.mark.wheel


def shipped_and_refused_cases(cli, tmp_path: Path, release: str) -> Cases:
    """The three shipped profiles as rendered, and the fp8 profile's argv changed so that each
    stage refuses it; ``--pp-size 2``; the same large host pool with and without a described box."""
    c = Cases()
    l3 = tmp_path / "l3"
    l3.mkdir()
    sets = {"linux-tp2-l3": (f"hicache.storage_dir={l3}", "hicache.storage_max_size=1GB")}  # fits the CI disk
    for name in ("rtx5060ti-tp2-fp8", "linux-tp2-l3", "rtx5060ti-tp2"):
        c.add(name, *rendered(cli, name, model_folder(tmp_path, name), *sets.get(name, ())))
    base, dev = c.argvs["rtx5060ti-tp2-fp8"]
    c.add("parse", [*base, "--attention-backend", "nonsense"], dev)
    c.add("resolution", [*base, "--attention-backend", "dual_chunk_flash_attn"], dev)
    c.add("model config", [*base, "--context-length", "300000"], dev)  # config.json: 262144
    c.add("attention", [*base, "--attention-backend", "trtllm_mha"], dev)
    # the weights leave nothing for the KV pool at this fraction of the card
    c.add("kv", with_value(base, "--mem-fraction-static", "0.3"), dev)
    c.add("host pools", [*base, "--hicache-size", "100000"], dev)  # 100 TB per rank: more than the budget
    c.add("pp", [*base, "--pp-size", "2"], dev)  # resolution accepts it; the stand-in sizing has no PP group
    # one process, several argvs: the host-pool stage's stand-ins end with each. 500 GB per rank
    # fits the described 1 TiB box; the same argv with no described budget meets this machine's
    # own free memory (SGLang's check), not the budget an earlier argv described
    c.add("described box", [*base, "--hicache-size", "500"], dev)
    c.add("this machine", c.argvs["described box"][0], {k: v for k, v in dev.items() if k != "host_budget"})
    c.extra["base"] = base
    return c


@shares_process(shipped_and_refused_cases)
def test_pre_flight_accepts_the_shipped_profiles_and_refuses_at_each_stage(preflight, capsys):
    results, base = preflight.results, preflight.extra["base"]
    with capsys.disabled():
        p = preflight.process
        print(f"\n[sglang pre-flight] {p['argvs']} argvs of {Path(__file__).name} in one SGLang {p['release']} "
              f"process: {p['wall_s']:.1f} s wall, SGLang import {p['import_s']} s, first case {p['first_s']} s")
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


def sizing_cases(cli, tmp_path: Path, release: str) -> Cases:
    """The fp8 and L3 profiles on ``release`` (with what ``plan`` computes for each), the fp8
    argv with too little memory for the KV pool, with more host pool than the box, with PP 2."""
    l3 = tmp_path / "l3"
    l3.mkdir()
    version = f"runtime.sglang_version={release}"
    sets = {"rtx5060ti-tp2-fp8": (version,),
            "linux-tp2-l3": (version, f"hicache.storage_dir={l3}", "hicache.storage_max_size=1GB")}  # fits the CI disk
    c = Cases(extra={"planned": {}, "profiles": list(sets)})
    for name, overrides in sets.items():
        model = model_folder(tmp_path, name)
        c.add(name, *rendered(cli, name, model, *overrides))
        out = cli("plan", "-p", name, "--set", f"model.host_dir={model}", *[a for s in overrides for a in ("--set", s)],
                  "--host-ram", "1TiB", "--linux", "-f", "json")
        c.extra["planned"][name] = json.loads(out.out)
    base, dev = c.argvs["rtx5060ti-tp2-fp8"]
    c.add("kv", with_value(base, "--mem-fraction-static", "0.3"), dev)
    c.add("host pools", [*base, "--hicache-size", "100000"], dev)  # 100 TB per rank: more than the budget
    c.add("pp", [*base, "--pp-size", "2"], dev)
    return c


@shares_process(sizing_cases)
@pytest.mark.parametrize("release", sorted(RELEASE_SIZING))
def test_sizing_stages_give_the_plans_figures_and_the_releases_refusals(preflight, capsys, release):
    """Each release's own KV cache configurator (0.5.19's shape, with ``ps``; 0.5.23's, the
    widths as fields: ``_kv_configurator_fields``) and host pools (0.5.23: built over buffer
    descriptions) size the shipped profiles' pools at exactly the figures ``plan`` computes
    for ``runtime.sglang_version=RELEASE`` (device tokens, mamba slots and bytes, host KV and
    mamba pools, the ``--hicache-size`` split over the device pools' bytes included); the argvs
    run in one process, so the mamba state's dtype an earlier argv's ``--mamba-ssm-dtype``
    wrote to the environment must not reach a later one. Too little memory for the KV pool,
    or more host pool than the box has, is refused with that release's message and site;
    ``--pp-size 2`` is skipped."""
    host_refusal = RELEASE_SIZING[release][1]
    results, planned = preflight.results, preflight.extra["planned"]
    for name in preflight.extra["profiles"]:
        assert planned[name]["sglang_release"] == release, planned[name]["sglang_release"]
        r, per_rank = results[name], planned[name]["per_rank"]
        assert r.ok is True and r.stage == "model runner" and not r.skipped, (name, r)
        got = {k: r.answers[k] for k in PLAN_KEYS}
        want = {k: per_rank[v] for k, v in PLAN_KEYS.items()}
        with capsys.disabled():
            print(f"\n[sglang {release} sizing] {name}: {got}")
        assert got == want, (name, got, want)
        argv = preflight.argvs[name][0]
        assert r.answers["max_running_requests"] == int(argv[argv.index("--max-running-requests") + 1]), r.answers
        assert r.answers["kv_pool_bytes"] == r.answers["max_total_num_tokens"] * r.answers["kv_bytes_per_token"]
    for case, (stage, typ, message, site, flag) in {"kv": KV_REFUSAL, "host pools": host_refusal}.items():
        r = results[case]
        assert (r.ok, r.stage, r.type, r.site) == (False, stage, typ, site), (case, r)
        assert message in r.message and flag in r.flags, (case, r)
    pp = results["pp"]
    assert (pp.ok, pp.stage) == (True, "model runner") and "--pp-size 2" in pp.skipped, pp


NEXTN = ("runtime.speculative.algorithm=NEXTN", "runtime.speculative.num_steps=3", "runtime.speculative.eagle_topk=1",
         "runtime.speculative.num_draft_tokens=4")
#: The plan's figures the sizing stages answer under speculation (``per_rank`` names): the scaled
#: cell (target + draft layers), the host pool with a packed draft layer, a sidecar's pool
SPEC_KEYS = {**PLAN_KEYS, "host_kv_bytes_per_token": "host_kv_bytes_per_token",
             "host_draft_kv_tokens": "host_draft_kv_tokens", "host_draft_kv_bytes": "host_draft_kv_bytes"}


def own_mtp_folder(tmp_path: Path) -> Path:
    """The fp8 profile's model folder with one MTP layer: ``mtp_num_hidden_layers: 1`` and an
    ``mtp.*`` tensor in the safetensors header (the rest sparse), 16.2 GB in all."""
    d = model_folder(tmp_path, "rtx5060ti-tp2-fp8", mtp_num_hidden_layers=1)
    total, mtp = 16_200_000_000, 2 * 10**8
    header = json.dumps({"mtp.fc.weight": {"dtype": "BF16", "shape": [mtp // 2], "data_offsets": [0, mtp]},
                         "model.norm.weight": {"dtype": "BF16", "shape": [(total - 4096 - mtp) // 2],
                                               "data_offsets": [mtp, total - 4096]}})
    with open(d / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header.encode())
        f.truncate(total)
    return d


def speculative_cases(cli, tmp_path: Path, release: str) -> Cases:
    """The fp8 profile on ``release`` with NEXTN on its own MTP layer, STANDALONE on a sibling MTP
    folder, an EAGLE3 draft, and NEXTN with too few mamba slots (with what ``plan`` says of each)."""
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
    c = Cases(extra={"planned": {}})
    for name, overrides in sets.items():
        c.add(name, *rendered(cli, "rtx5060ti-tp2-fp8", model, *overrides))
        out = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--set", f"model.host_dir={model}",
                  *[a for s in overrides for a in ("--set", s)], "--host-ram", "1TiB", "--linux", "-f", "json")
        c.extra["planned"][name] = json.loads(out.out)
    return c


@shares_process(speculative_cases)
@pytest.mark.parametrize("release", sorted(RELEASE_SIZING))
def test_sizing_stages_run_with_the_speculative_configuration(preflight, capsys, release):
    """The argv's speculative configuration reaches SGLang's own sizing on each release: the
    configurator gets ``--speculative-algorithm`` (``SpeculativeAlgorithm.from_string``) and the
    draft's layers (``resolve_spec_aux_hidden_state_config``), the host pools the draft's KV as
    SGLang's ``_build_hicache_draft_plan`` decides by its ``_can_pack_hicache_mtp``. NEXTN on the
    model's own folder packs one layer (17,408 B per token per rank), an EAGLE3 draft gets a sidecar
    pool, both exactly as ``plan`` counts them; NEXTN with 30 mamba slots and 6 requests is refused
    with SGLang's own message, the intermediate states per draft token leaving no KV budget."""
    results, planned = preflight.results, preflight.extra["planned"]
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
