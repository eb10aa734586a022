"""Configurations SGLang 0.5.19 refuses only after the weights have loaded (or while resolving
its arguments) are refused by ``plan`` first: exit 3, the profile field named.

Each input is what a new user would type; the SGLang source of each refusal is named in the
rule (``planner/validate.py``, ``planner/__init__.py: step_device_budget``). The sizing and
argument cross-check against SGLang's own code is ``tests/oracle``.
"""

from __future__ import annotations

import json

import pytest

from escha_deploy.facts.machine import described_host
from escha_deploy.planner import plan
from escha_deploy.planner.validate import mamba_slots_per_request
from escha_deploy.profile import load_profile
from escha_deploy.utils.units import GiB

FP8 = "rtx5060ti-tp2-fp8"


def _plan_cli(cli, *sets: str):
    args = ["plan", "-p", FP8, "--host-ram", "32GiB", "--linux", "-f", "json"]
    for s in sets:
        args += ["--set", s]
    r = cli(*args)
    return r, json.loads(r.out)


def test_page_64_with_no_buffer_is_refused(cli):
    """mamba_hook.py: validate_mamba_no_buffer asserts page_size 1 (the oracle sees it refuse)."""
    r, d = _plan_cli(cli, "runtime.page_size=64", "runtime.mamba_radix_cache_strategy=no_buffer")
    assert r.code == 3 and d["verdict"] == "unsafe"
    assert any(reason.startswith("runtime.mamba_radix_cache_strategy: no_buffer needs page_size 1")
               for reason in d["reasons"])


@pytest.mark.parametrize("strategy", ["auto", "extra_buffer"])
def test_page_64_with_extra_buffer_is_not_refused(cli, strategy):
    r, d = _plan_cli(cli, "runtime.page_size=64", f"runtime.mamba_radix_cache_strategy={strategy}")
    assert not any("mamba_radix_cache_strategy" in reason for reason in d["reasons"]), d["reasons"]


@pytest.mark.parametrize("strategy", ["auto", "extra_buffer", "extra_buffer_lazy"])
def test_page_not_dividing_the_mamba_track_interval_is_refused(cli, strategy):
    """mamba_hook.py: validate_mamba_extra_buffer asserts mamba_track_interval (256) % page_size
    == 0; the differential fuzz found page_size 3 passing plan."""
    r, d = _plan_cli(cli, "runtime.page_size=3", f"runtime.mamba_radix_cache_strategy={strategy}")
    assert r.code == 3 and d["verdict"] == "unsafe"
    assert any(reason.startswith("runtime.page_size: page_size 3 does not divide --mamba-track-interval 256")
               for reason in d["reasons"]), d["reasons"]


def test_page_dividing_a_given_mamba_track_interval_is_accepted(cli):
    r, d = _plan_cli(cli, "runtime.page_size=3", "runtime.extra_args=[--mamba-track-interval=300]")
    assert not any("mamba-track-interval" in reason for reason in d["reasons"]), d["reasons"]
    r, d = _plan_cli(cli, "runtime.page_size=3", "runtime.disable_radix_cache=true", "hicache.enabled=false")
    assert not any("mamba-track-interval" in reason for reason in d["reasons"]), d["reasons"]


def test_fewer_mamba_slots_than_one_request_is_refused(cli):
    """kv_cache_configurator.py: resolve_max_num_reqs raises when slots // per-request is 0."""
    r, d = _plan_cli(cli, "runtime.max_running_requests=1", "runtime.max_mamba_cache_size=4")
    assert r.code == 3 and d["verdict"] == "unsafe"
    assert any(reason.startswith("runtime.max_mamba_cache_size: 4 mamba slots are fewer than one request needs (5")
               for reason in d["reasons"])
    assert not any("caps it to 0" in w for w in d["warnings"])


def test_exactly_one_request_of_slots_is_accepted(cli):
    r, d = _plan_cli(cli, "runtime.max_running_requests=1", "runtime.max_mamba_cache_size=5")
    assert r.code == 0 and d["verdict"] == "ok"


def test_mem_fraction_0_98_is_unsafe(cli):
    """0.98 leaves 0.25 GB for activations against SGLang's 1.88 GB floor at TP 2."""
    r, d = _plan_cli(cli, "runtime.mem_fraction_static=0.98")
    assert r.code == 3 and d["verdict"] == "unsafe"
    assert d["device"]["activation_room_bytes"] < 0.25e9
    assert any("mem_fraction_static 0.98 leaves 0.25 GB" in reason and "lower runtime.mem_fraction_static" in reason
               for reason in d["reasons"])


def test_the_device_floor_is_sglangs_post_capture_reserve():
    """1536 + tp/8 x 1024 MiB: at TP 2, 1,792 MiB; a fraction leaving 1 MiB more is not refused
    for the floor."""
    from escha_deploy.planner.device import sglang_min_reserved_mib

    assert sglang_min_reserved_mib(2) == 1792 and sglang_min_reserved_mib(4) == 2048
    prof = load_profile(FP8)
    p = plan(prof, described_host(32 * GiB, "linux"))
    assert p.device.activation_room_bytes >= 1792 * 2**20 and p.verdict == "ok"


@pytest.mark.parametrize("strategy, radix_off, slots", [
    ("auto", False, 5), ("extra_buffer", False, 5), ("extra_buffer_lazy", False, 4), ("no_buffer", False, 3),
    ("auto", True, 1)])
def test_slots_per_request_follow_sglangs_ratio(strategy, radix_off, slots):
    assert mamba_slots_per_request(strategy, radix_off) == slots


@pytest.mark.parametrize("sets", [
    ("runtime.page_size=64", "runtime.mamba_radix_cache_strategy=no_buffer"),
    ("runtime.max_running_requests=1", "runtime.max_mamba_cache_size=4"),
    ("runtime.mem_fraction_static=0.98",),
])
def test_serve_print_refuses_the_same_inputs(cli, sets):
    """``serve`` (native, --print) goes through the same plan: exit 3 before anything starts."""
    args = ["serve", "-p", FP8, "--print"]
    for s in sets:
        args += ["--set", s]
    r = cli(*args)
    assert r.code == 3 and json.loads(r.out)["verdict"] == "unsafe", (r.out, r.err)
    assert json.loads(cli("serve", "-p", FP8, "--print").out)["verdict"] == "ok"


def test_kernel_ascend_io_backend_is_refused_from_the_profile_alone(cli):
    """pool_host/mha.py and pool_host/mamba.py fail at the first host transfer on a CUDA GPU."""
    r = cli("plan", "-p", FP8, "--host-ram", "32GiB", "--linux", "--set", "hicache.hicache_io_backend=kernel_ascend")
    assert r.code == 3
    assert "--set hicache.hicache_io_backend: kernel_ascend moves HiCache pages with Ascend NPU kernels" in r.err
    r = cli("profiles", "validate", FP8)  # the shipped profile itself is fine
    assert r.code == 0


DENSE = "model.architecture={model_type: qwen3, num_hidden_layers: 64, num_key_value_heads: 8, head_dim: 128}"


def test_page_head_with_direct_io_is_refused_and_with_kernel_is_not(cli):
    base = ["plan", "-p", FP8, "--host-ram", "32GiB", "--linux", "--set", DENSE,
            "--set", "hicache.hicache_mem_layout=page_head"]
    r = cli(*base, "--set", "hicache.hicache_io_backend=direct")
    assert r.code == 3 and "hicache.hicache_mem_layout: page_head with hicache_io_backend direct" in r.err
    r = cli(*base, "--set", "hicache.hicache_io_backend=kernel", "-f", "json")
    assert "page_head" not in r.err and json.loads(r.out)["verdict"] in ("ok", "unsafe", "hicache_off")


def test_late_refusal_names_the_yaml_line(tmp_path):
    from escha_deploy.utils.errors import Refused

    f = tmp_path / "p.yaml"
    f.write_text("extends: rtx5060ti-tp2-fp8\nname: x\nhicache:\n  hicache_io_backend: kernel_ascend\n")
    with pytest.raises(Refused) as exc:
        load_profile(str(f))
    assert exc.value.problems[0].startswith(f"{f}:4: hicache.hicache_io_backend: kernel_ascend")


def test_no_auto_sized_mamba_slot_is_refused(cli):
    """kv_cache_configurator.py: _handle_max_mamba_cache raises when it computes no slot."""
    r, d = _plan_cli(cli, "model.weights_total=20.6GB", "runtime.max_mamba_cache_size=null",
                     "runtime.max_total_tokens=null")
    assert r.code == 3 and d["per_rank"]["device_mamba_slots"] == 0
    assert any(reason.startswith("runtime.max_mamba_cache_size: no mamba state slot fits") for reason in d["reasons"])


def test_profiles_validate_reports_a_late_refusal_and_plan_refuses_it(cli, tmp_path):
    """The same file: ``profiles validate`` lists it (its exit 2 covers every problem it finds),
    ``plan`` refuses it before anything starts (exit 3), both naming file:line and key."""
    f = tmp_path / "ascend.yaml"
    f.write_text("extends: rtx5060ti-tp2-fp8\nname: ascend\nhicache:\n  hicache_io_backend: kernel_ascend\n")
    v = cli("profiles", "validate", str(f))
    assert v.code == 2 and f"{f}:4: hicache.hicache_io_backend: kernel_ascend" in v.err
    p = cli("plan", "-p", str(f), "--host-ram", "32GiB", "--linux")
    assert p.code == 3 and f"{f}:4: hicache.hicache_io_backend: kernel_ascend" in p.err


NVFP4_0523 = ("runtime.kv_cache.dtype=nvfp4", "hicache.enabled=false", "runtime.needs=[]", "runtime.sglang_version=0.5.23")


@pytest.mark.parametrize("sets, refused", [
    (("runtime.attention_backend=triton",), "the attention backend triton provides neither"),
    (("runtime.attention_backend=trtllm_mha",), "native NVFP4 prefill needs compute capability 10.0"),
    (("runtime.attention_backend=null", "runtime.extra_args=[--prefill-attention-backend=flashinfer,"
      "--decode-attention-backend=triton]"), "the decode needs --decode-attention-backend trtllm_mha, not triton"),
])
def test_nvfp4_backends_0_5_23_refuses_are_refused(cli, sets, refused):
    """0.5.23's kv_cache_hook.py: handle_nvfp4_prefill_kv_dequant_dtype raises ValueError for an
    NVFP4 KV cache with a backend it cannot resolve (the differential fuzz found triton passing
    plan); 0.5.19 has no such check."""
    r, d = _plan_cli(cli, *NVFP4_0523, *sets)
    assert r.code == 3 and any(reason.startswith("runtime.kv_cache.dtype: nvfp4 on SGLang 0.5.23: ") and refused in reason
                               for reason in d["reasons"]), d["reasons"]
    r, d = _plan_cli(cli, *NVFP4_0523[:-1], *sets)
    assert not any("nvfp4 on SGLang" in reason for reason in d["reasons"]), d["reasons"]


def test_nvfp4_with_flashinfer_on_0_5_23_is_not_refused(cli):
    r, d = _plan_cli(cli, *NVFP4_0523, "runtime.attention_backend=flashinfer")
    assert not any("nvfp4 on SGLang" in reason for reason in d["reasons"]), d["reasons"]


def test_a_head_dim_below_4_plans_without_an_int2_row(cli):
    """INT2 packs 4 codes a byte: head_dim 1 gives 0 INT2 bytes a token, and the KV dtype table's
    tokens per GB divided by it (ZeroDivisionError; found by the differential fuzz)."""
    r, d = _plan_cli(cli, "model.architecture.head_dim=1")
    assert r.code in (0, 3), r.err
    assert [row["dtype"] for row in d["kv_dtype_comparison"]] == ["bf16", "fp8_e4m3"]


@pytest.mark.parametrize("backend", ["tokenspeed_mla", "cutedsl_mla", "trtllm_mla", "flashmla", "cutlass_mla"])
def test_an_mla_backend_on_a_model_without_mla_is_refused(cli, backend):
    """The differential fuzz found tokenspeed_mla passing plan on an sm_89 card, which SGLang
    refuses (arg_groups/overrides.py: _mla_kv_cache_dtype_checks); on no card does a model
    without MLA layers run on an MLA backend."""
    r, d = _plan_cli(cli, f"runtime.attention_backend={backend}")
    assert r.code == 3 and any(reason.startswith(f"runtime.attention_backend: {backend} is an attention backend for MLA")
                               for reason in d["reasons"]), d["reasons"]
    r, d = _plan_cli(cli, f"runtime.extra_args=[--decode-attention-backend={backend}]")
    assert r.code == 3


def test_nvfp4_online_off_sm100_is_refused(cli):
    """overrides.py: _moe_runner_backend_quant_constraints (0.5.19 and 0.5.23) refuses
    nvfp4_online off SM100/SM103; the differential fuzz found it passing plan on sm_120."""
    r, d = _plan_cli(cli, "model.quantization=nvfp4_online")
    assert r.code == 3 and any(reason.startswith("model.quantization: nvfp4_online needs an sm_100 or sm_103 GPU")
                               for reason in d["reasons"]), d["reasons"]
    r, d = _plan_cli(cli, "model.quantization=nvfp4_online", "hardware.compute_capability='10.0'")
    assert not any("nvfp4_online" in reason for reason in d["reasons"]), d["reasons"]


@pytest.mark.parametrize("release, method, refused", [
    ("0.5.23", "mlx_q4", True), ("0.5.23", "gptq", True), ("0.5.19", "marlin", True), ("0.5.19", "gptq", False),
])
def test_a_quantization_the_model_config_does_not_know_is_refused(cli, release, method, refused):
    """The parser's --quantization choices include methods QUANTIZATION_METHODS lacks; SGLang's
    model config refuses them (model_config.py: _verify_quantization); the differential fuzz
    found mlx_q4 passing plan for 0.5.23."""
    r, d = _plan_cli(cli, f"model.quantization={method}", "runtime.needs=[]", f"runtime.sglang_version={release}")
    hit = any(reason.startswith(f"model.quantization: SGLang {release} parses --quantization {method} but has no such")
              for reason in d["reasons"])
    assert hit is refused, d["reasons"]


@pytest.mark.parametrize("release", ["0.5.19", "0.5.23"])
@pytest.mark.parametrize("backend, refused", [
    ("fa3", "runtime.attention_backend: fa3 (FlashAttention v3) needs an SM 8.x or 9.x GPU and this one is sm_120: "
            "SGLang {release} refuses it when the model runner builds the attention backend, after the weights "
            "load (layers/attention/attention_registry.py: create_flashattention_v3_backend"),
    ("fa4", "runtime.attention_backend: a hybrid GDN model on sm_120 takes only the triton, trtllm_mha, flashinfer "
            "attention backends, not fa4: SGLang {release} refuses it when the model runner builds the attention "
            "backend, after the weights load (layers/attention/attention_registry.py: attn_backend_wrapper"),
])
def test_model_runner_attention_backend_on_sm120_hybrid_is_refused(cli, release, backend, refused):
    """attention_registry.py (0.5.19 and 0.5.23): fa3's factory asserts SM 8.x/9.x, and
    attn_backend_wrapper allows a hybrid GDN model only triton, trtllm_mha and flashinfer on
    sm_120; both raise after the weights load, so plan refuses them first (exit 3, the key named).
    SGLang's own refusal: tests/launch/test_sglang_preflight.py (the pre-flight's model-runner stage)."""
    r, d = _plan_cli(cli, f"runtime.attention_backend={backend}", f"runtime.sglang_version={release}")
    assert r.code == 3 and d["verdict"] == "unsafe"
    assert any(reason.startswith(refused.format(release=release)) for reason in d["reasons"]), d["reasons"]


@pytest.mark.parametrize("sets", [
    ("runtime.attention_backend=triton",), ("runtime.attention_backend=flashinfer",),
    ("runtime.attention_backend=trtllm_mha", "runtime.kv_cache.dtype=bf16"),
    ("runtime.attention_backend=fa3", "hardware.compute_capability=\"8.9\""),  # Ada: fa3's factory takes it
    ("runtime.attention_backend=fa4", "hardware.compute_capability=\"9.0\""),  # not Blackwell: no wrapper check
])
def test_model_runner_attention_backends_sglang_builds_are_not_refused(cli, sets):
    r, d = _plan_cli(cli, *sets)
    assert not any("attention_registry.py" in reason for reason in d["reasons"]), d["reasons"]


def test_model_runner_backend_split_names_the_phase(cli):
    """--prefill-attention-backend and --decode-attention-backend each reach the wrapper's check
    (SGLang's attention_backends_of: the phase's flag, else --attention-backend)."""
    r, d = _plan_cli(cli, "runtime.attention_backend=triton",
                     "runtime.extra_args=[--decode-attention-backend=torch_native]")
    assert r.code == 3 and any("not decode torch_native: SGLang" in reason for reason in d["reasons"]), d["reasons"]


def test_max_total_tokens_of_one_leaves_no_request(cli):
    """SGLang 0.5.19's kv_cache_configurator.py: resolve_max_num_reqs caps the running requests at
    max_total_tokens // 2 and, on a hybrid model, raises when that is 0 (found by the differential
    fuzz as a miss: SGLang refused, plan did not); 2 tokens leave one request. A dense model is
    not refused there (linux-tp2-l3 made dense: no full_attention_interval, no mamba slots)."""
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--set", "runtime.max_total_tokens=1", "--host-ram", "64GiB", "--linux")
    assert r.code == 3, r.out + r.err
    assert "max_total_tokens // 2 = 0" in r.out and "resolve_max_num_reqs" in r.out, r.out
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--set", "runtime.max_total_tokens=2", "--host-ram", "64GiB", "--linux")
    assert "max_total_tokens // 2 = 0" not in r.out + r.err, r.out
    r = cli("plan", "-p", "linux-tp2-l3", "--set", "runtime.needs=[]", "--set",
            "model.architecture.full_attention_interval=null", "--set", "runtime.max_mamba_cache_size=null",
            "--set", "runtime.max_total_tokens=1", "--host-ram", "256GiB", "--linux")
    assert "max_total_tokens // 2 = 0" not in r.out + r.err, r.out


def test_hybrid_model_without_a_linear_layer_needs_its_mamba_slots_set(cli):
    """full_attention_interval 1 makes every layer full attention: the mamba state of one request
    is 0 bytes, and SGLang's kv_cache_configurator.py: _handle_max_mamba_cache asserts
    ``stage_per_req > 0`` when it sizes the slots itself (0.5.19 and 0.5.23); plan divided by it
    (ZeroDivisionError: float floor division by zero, found by the differential fuzz). With
    runtime.max_mamba_cache_size set SGLang takes the explicit branch, and so does plan."""
    base = ("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "64GiB", "--linux", "--format", "json",
            "--set", "model.architecture.full_attention_interval=1")
    r = cli(*base, "--set", "runtime.max_mamba_cache_size=null")
    assert r.code == 3 and "Traceback" not in r.err, r.out + r.err
    reasons = json.loads(r.out)["reasons"]
    assert [x for x in reasons if "full_attention_interval" in x] == [
        "model.architecture.full_attention_interval: 1 makes every one of the 64 layers full attention: a hybrid "
        "model with no linear-attention layer has no mamba state to size its slots by, and SGLang stops at startup "
        "(kv_cache_configurator.py: _handle_max_mamba_cache asserts stage_per_req > 0); set "
        "runtime.max_mamba_cache_size, or a full_attention_interval above 1"], reasons
    assert not any("no mamba state slot fits" in x for x in reasons), reasons
    r = cli(*base, "--set", "runtime.max_mamba_cache_size=16")
    assert r.code == 0, r.out + r.err


def test_hybrid_model_without_a_linear_layer_sizes_its_host_pools_by_size(cli):
    """The same model with its slots set (linux-tp2-l3: max_mamba_cache_size 16) and HiCache by
    --hicache-size: the host pools divided the mamba share by 0 B a slot (ZeroDivisionError, the
    differential fuzz's case). SGLang's split (hybrid_pool_assembler.py: _split_hicache_size)
    gives the mamba pool 0 GB, and its bytes are 0; the KV pool takes the whole size."""
    r = cli("plan", "-p", "linux-tp2-l3", "--host-ram", "256GiB", "--linux", "--format", "json",
            "--set", "model.architecture.full_attention_interval=1", "--set", "runtime.max_total_tokens=65536",
            "--set", "hicache.storage_max_size=1GB")
    assert r.code == 0 and "Traceback" not in r.err, r.out + r.err
    per_rank = json.loads(r.out)["per_rank"]
    assert per_rank["mamba_bytes_per_slot"] == 0 and per_rank["host_mamba_bytes"] == 0, per_rank
    assert per_rank["host_kv_bytes"] == per_rank["pinned_bytes"] > 29e9, per_rank  # hicache_size 30 GB, all KV


TRTLLM_128_ON_SM100 = ("runtime.attention_backend=trtllm_mha", "runtime.page_size=128",
                       "hardware.compute_capability=\"10.0\"")


@pytest.mark.parametrize("release", ["0.5.19", "0.5.23"])
def test_trtllm_mha_page_128_off_xqa_without_gqa_is_refused(cli, tmp_path, release):
    """trtllm_mha_backend.py: TRTLLMHAAttnBackend.__init__ (0.5.19 and 0.5.23): page 128 on a card
    without XQA kernels (sm_100) needs more query heads than KV heads per rank; the model folder's
    config.json with 4 query heads over 4 KV heads at TP 2 gives 2/2, which SGLang refuses after
    the weights load, so plan refuses it first (exit 3, runtime.page_size named). 24 query heads
    pass, and so does page 64 or an sm_120 card (XQA). The statements themselves:
    tests/planner/test_model_runner_sites.py."""
    from tests.launch.sglang_preflight_cases import model_folder

    folders = {}
    for heads in (4, 24):
        (tmp_path / str(heads)).mkdir()
        folders[heads] = model_folder(tmp_path / str(heads), FP8, num_attention_heads=heads)

    def reasons(heads: int, *sets: str) -> tuple[int, list[str]]:
        r, d = _plan_cli(cli, f"runtime.sglang_version={release}", f"model.host_dir={folders[heads]}", *sets)
        return r.code, [x for x in d["reasons"] if "TRTLLMHAAttnBackend.__init__" in x]

    code, found = reasons(4, *TRTLLM_128_ON_SM100)
    assert code == 3 and len(found) == 1, found
    assert found[0].startswith("runtime.page_size: trtllm_mha (runtime.attention_backend) with page_size 128 on "
                               "sm_100") and "2/2 query heads per KV head" in found[0] and f"SGLang {release}" in found[0]
    assert reasons(24, *TRTLLM_128_ON_SM100)[1] == []
    assert reasons(4, *TRTLLM_128_ON_SM100[:2], "hardware.compute_capability=\"12.0\"",
                   "runtime.kv_cache.dtype=bf16")[1] == []
    assert reasons(4, TRTLLM_128_ON_SM100[0], "runtime.page_size=64", TRTLLM_128_ON_SM100[2])[1] == []


def test_trtllm_mha_page_128_off_xqa_without_the_model_folder_is_warned(cli):
    """No config.json: the plan does not know the query heads, so it says what SGLang checks
    (fewer than 8 query heads in all, with 4 KV heads at TP 2, are refused) and refuses nothing."""
    r, d = _plan_cli(cli, *TRTLLM_128_ON_SM100)
    warned = [w for w in d["warnings"] if "TRTLLMHAAttnBackend.__init__" in w]
    assert len(warned) == 1 and "if they are fewer than 8 in all" in warned[0], d["warnings"]
    assert not any("TRTLLMHAAttnBackend" in x for x in d["reasons"]), d["reasons"]


DENSE_L3 = ("runtime.needs=[]", "model.architecture.full_attention_interval=null", "runtime.max_mamba_cache_size=null")


@pytest.mark.parametrize("release, backend, refused", [
    ("0.5.19", "full", True), ("0.5.19", "tc_piecewise", True), ("0.5.19", "breakable", False),
    ("0.5.19", "disabled", False), ("0.5.23", "full", False), ("0.5.23", "breakable", False),
])
def test_mixed_chunk_with_a_prefill_graph_backend_sglang_asserts_against_is_refused(cli, release, backend, refused):
    """prefill_cuda_graph_runner.py: PrefillCudaGraphRunner.__init__ asserts, when it captures the
    prefill CUDA graph after the weights load, that mixed chunk runs on the breakable backend
    (0.5.19; 0.5.23: breakable or full): one line naming runtime.enable_mixed_chunk and the flag
    that set the backend, exit 3. A dense model (the hybrid one needs the mixed-chunk overlay)."""
    r = cli("plan", "-p", "linux-tp2-l3", "--host-ram", "256GiB", "--linux", "-f", "json",
            *[a for s in (*DENSE_L3, f"runtime.sglang_version={release}", "runtime.enable_mixed_chunk=true",
                          f"runtime.extra_args=[--cuda-graph-backend-prefill={backend}]") for a in ("--set", s)])
    d = json.loads(r.out)
    found = [x for x in d["reasons"] if "PrefillCudaGraphRunner.__init__" in x]
    if not refused:
        assert found == [], found
        return
    assert r.code == 3 and len(found) == 1, d["reasons"]
    assert found[0].startswith(f"runtime.enable_mixed_chunk: mixed chunk (--enable-mixed-chunk) needs the breakable "
                               f"prefill CUDA graph backend, and runtime.extra_args sets {backend} "
                               f"(--cuda-graph-backend-prefill): SGLang {release} stops"), found
