"""The oracle's cases and its comparison: what ``plan`` says, next to what SGLang 0.5.19's own
code says for the same input (``scripts/sglang_oracle.py`` runs that side in the flag-catalog
venv).

A case is a profile (shipped, or shipped plus ``--set`` overrides), a described host and a
target card. ``build_case`` plans it, renders the server argv exactly as ``serve`` does
(``flags.server_args``) and writes the config.json SGLang will read; ``compare`` lists every
field where the two sides differ, by name.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from escha_deploy.sglang.arch import ModelArch
from escha_deploy.pipeline.argv import server_args, server_env
from escha_deploy.facts.machine import described_host
from escha_deploy.planner import device as devmod
from escha_deploy.planner import kv as kvmod
from escha_deploy.planner import plan
from escha_deploy.utils.errors import BadInput, Refused
from escha_deploy.profile import Profile, apply_override, list_profiles, load_raw, load_profile, resolve_profile_path
from escha_deploy.utils.units import GiB, MiB

REPO = Path(__file__).resolve().parents[2]
ORACLE = REPO / "scripts" / "sglang_oracle.py"

#: HF ``architectures`` SGLang routes each model_type to (its model registry names).
ARCHITECTURES = {"qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_next": "Qwen3NextForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}

#: Variables of the server's environment SGLang reads while it resolves its arguments and sizes
#: the pools, which the oracle's SGLang gets for the case (the rest concern running, not sizing).
ORACLE_ENV = ("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN",)

#: A dense (non-hybrid) model of the same width, for the dense half of the matrix.
DENSE_ARCH = ("{model_type: qwen3, num_hidden_layers: 64, num_key_value_heads: 8, head_dim: 128, "
              "hidden_size: 5120}")

#: Flags a capability declares (the stock parser does not know them) and how the argument
#: check replaces them: the check runs on stock 0.5.19, so an overlay's own flags and values
#: stay unchecked (docs/planner.md lists them).
OVERLAY_STAND_INS = {
    "--kv-cache-quant-group-size": None,  # int2-kv: dropped
    "--quantization": {"escha_w2": None},  # w2-weights: dropped
    "--kv-cache-dtype": {"int2": "bf16"},  # int2-kv: the pool's high-precision dtype
}


@dataclass
class Case:
    id: str
    profile: str
    overrides: tuple[str, ...] = ()
    host_ram: int = 32 * GiB
    platform: str = "linux"
    gpu_capability: str = "12.0"
    shipped: bool = False
    notes: list[str] = field(default_factory=list)
    #: a speculative draft: its config.json (SGLang reads it at --speculative-draft-model-path)
    #: and its weight bytes (all ranks), the facts ``arch.read_draft_dir`` would read; ``own``:
    #: the draft is the model's own folder (NEXTN on its MTP layers; no config of its own)
    draft: dict | None = None
    #: the model folder's config.json ``architectures`` (both sides): a multimodal one makes
    #: SGLang reserve its bytes out of the KV budget (kv_cache_configurator.py: mm_runtime_reservation_gb)
    architectures: tuple[str, ...] = ()


def config_json(arch: ModelArch) -> dict:
    """A config.json SGLang's config classes accept for ``arch`` (weights are not needed:
    only argument resolution and pool sizing run)."""
    cfg = {
        "architectures": [ARCHITECTURES.get(arch.model_type, "LlamaForCausalLM")],
        "model_type": arch.model_type,
        "num_hidden_layers": arch.num_hidden_layers,
        "num_key_value_heads": arch.num_key_value_heads,
        "head_dim": arch.head_dim,
        "hidden_size": arch.hidden_size or 5120,
        "num_attention_heads": 24 if arch.is_hybrid else 64,
        "intermediate_size": 17408,
        "vocab_size": 248320,
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000000,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    if arch.is_hybrid:
        cfg.update(
            full_attention_interval=arch.full_attention_interval,
            linear_num_key_heads=arch.linear_num_key_heads,
            linear_num_value_heads=arch.linear_num_value_heads,
            linear_key_head_dim=arch.linear_key_head_dim,
            linear_value_head_dim=arch.linear_value_head_dim,
            linear_conv_kernel_dim=arch.linear_conv_kernel_dim,
            mamba_ssm_dtype=arch.mamba_ssm_dtype,
            layer_types=["full_attention" if (i + 1) % arch.full_attention_interval == 0 else "linear_attention"
                         for i in range(arch.num_hidden_layers)],
        )
    return cfg


def stock_argv(argv: list[str]) -> list[str]:
    """The argv with each overlay-declared flag replaced by its stock stand-in."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag in OVERLAY_STAND_INS and i + 1 < len(argv):
            rule = OVERLAY_STAND_INS[flag]
            value = argv[i + 1]
            if rule is None or (isinstance(rule, dict) and value in rule and rule[value] is None):
                i += 2
                continue
            if isinstance(rule, dict) and value in rule:
                out += [flag, rule[value]]
                i += 2
                continue
        out.append(flag)
        i += 1
    return out


def _load_unchecked(ref: str, overrides: tuple[str, ...]) -> Profile:
    """The profile as ``load_profile`` builds it, without the rules it refuses at load (so the
    argv SGLang is asked about can still be rendered for a configuration we refuse there)."""
    path = resolve_profile_path(ref)
    data, pos = load_raw(path, ())
    data.setdefault("name", path.stem)
    for item in overrides:
        apply_override(data, pos, item)
    return Profile.model_validate(data)


def plan_refuses(planner: dict) -> bool:
    """Whether escha-deploy refuses the case before starting: an unsafe plan (exit 3) or a
    profile refused when it loads (exit 2 for SGLang's own argument checks, exit 3 for its late
    refusals)."""
    return planner["verdict"] in ("unsafe", "refused at load")


def _release_overrides(case: Case, release: str | None) -> tuple[str, ...]:
    """For a release our series is not made for, the case without the series' capabilities
    (the profile would be refused for that release; the oracle checks SGLang's arithmetic)."""
    from escha_deploy.sglang.capabilities import SERIES_CAPABILITIES
    from escha_deploy.sglang.releases import series_release

    if release is None or release == series_release():
        return case.overrides
    needs = _load_unchecked(case.profile, case.overrides).runtime.needs
    kept = [n for n in needs if n not in SERIES_CAPABILITIES]
    return (*case.overrides, f"runtime.needs=[{','.join(kept)}]")


def build_case(case: Case, release: str | None = None) -> tuple[dict, dict]:
    """``(oracle input, planner side)`` for one case, planned for ``release`` (default: the
    default release)."""
    refused_at_load: str | None = None
    overrides = _release_overrides(case, release)
    try:
        prof = load_profile(case.profile, list(overrides))
    except (BadInput, Refused) as exc:
        refused_at_load = f"exit {int(exc.exit_code)}: {exc}"
        prof = _load_unchecked(case.profile, overrides)
    host = described_host(case.host_ram, case.platform)
    draft = None
    own = bool(case.draft and case.draft.get("own"))
    if case.draft is not None:
        from escha_deploy.sglang.arch import DraftFacts, draft_kv_geometry, draft_num_layers

        draft_cfg = config_json(prof.model.architecture) if own else case.draft["config"]
        layers = draft_num_layers(draft_cfg)
        heads, head_dim, nextn = draft_kv_geometry(draft_cfg)
        draft = DraftFacts(path="(the oracle's draft folder)", own_folder=own, weights_bytes=case.draft["weights"],
                           weights_source="the case's draft", num_layers=layers[0] if layers else None,
                           layers_source=layers[1] if layers else "", kv_heads=heads, head_dim=head_dim,
                           nextn_layers=nextn)
    model_dir = None
    if case.architectures:
        from escha_deploy.sglang.arch import ModelDirFacts

        model_dir = ModelDirFacts(path="(the oracle's model folder)", architectures=case.architectures)
    result = plan(prof, host, model_dir=model_dir, release=release, draft=draft)
    argv = stock_argv(server_args(result, prof))
    arch = prof.model.architecture
    if prof.runtime.mamba_ssm_dtype:
        arch = arch.model_copy(update={"mamba_ssm_dtype": prof.runtime.mamba_ssm_dtype})
    rt = prof.runtime
    gpu_mib = prof.hardware.gpu_vram // MiB
    chunk_default, _ = devmod.tier_defaults(gpu_mib, rt.tp_size, release)
    chunk = rt.chunked_prefill_size if rt.chunked_prefill_size and rt.chunked_prefill_size > 0 else chunk_default
    planner = {
        "verdict": "refused at load" if refused_at_load else result.verdict,
        "reasons": [refused_at_load] if refused_at_load else result.reasons,
        "findings": [f.model_dump() for f in result.findings],
        "warnings": result.warnings,
        "mem_fraction_static": result.device.mem_fraction_static,
        "default_mem_fraction_static": result.device.sglang_default_mem_fraction_static,
        "reserved_mib": result.device.sglang_reserved_bytes / MiB,
        "chunked_prefill_size": chunk,
        "decode_max_bs": devmod.sglang_decode_max_bs(gpu_mib, rt.tp_size, rt.cuda_graph_max_bs, release=release,
                                                     max_running_requests=rt.max_running_requests),
        "prefill_graph_sizes": 0 if rt.disable_prefill_cuda_graph else len(devmod.prefill_graph_sizes(chunk)),
        "page_size": result.page_size,
        "device_kv_tokens": result.per_rank.device_kv_tokens,
        # SGLang's cell: the target's with the draft's layers (pool_configurator.py)
        "device_kv_cell": result.per_rank.device_kv_bytes_per_token + result.per_rank.draft_kv_bytes_per_token,
        "host_draft_kv_tokens": result.per_rank.host_draft_kv_tokens,
        "host_draft_kv_bytes": result.per_rank.host_draft_kv_bytes,
        "device_mamba_slots": result.per_rank.device_mamba_slots,
        "device_fits": result.device.fits,
        "host_kv_tokens": result.per_rank.host_kv_tokens,
        "host_kv_bytes": result.per_rank.host_kv_bytes,
        "host_mamba_slots": result.per_rank.host_mamba_slots,
        "host_mamba_bytes": result.per_rank.host_mamba_bytes,
        "shipped": case.shipped,
        "needs_overlay": any(n in ("int2-kv", "w2-weights") for n in rt.needs),
    }
    oracle = {
        # target and draft weights: both are loaded before SGLang sizes the pools (planner/draft.py)
        "device": {"free_before_weights": result.device.free_before_weights_bytes,
                   "weights": result.per_rank.weights_bytes + result.per_rank.draft_weights_bytes,
                   # flags the profile left unset: SGLang sizes them itself on the oracle side
                   "sglang_sizes": ([] if rt.max_total_tokens else ["--max-total-tokens"])
                   + ([] if rt.max_mamba_cache_size or not arch.is_hybrid else ["--max-mamba-cache-size"])},
        "id": case.id,
        "argv": argv,
        **({"env": env} if (env := {k: v for k, v in server_env(result, prof).items() if k in ORACLE_ENV}) else {}),
        "config": {**config_json(arch), **({"architectures": list(case.architectures)} if case.architectures else {})},
        **({"draft_own": True} if own else {"draft_config": case.draft["config"]} if case.draft is not None else {}),
        "gpu": {"vram_bytes": prof.hardware.gpu_vram, "name": "NVIDIA " + prof.hardware.gpu_name,
                "capability": prof.hardware.compute_capability or case.gpu_capability, "count": rt.tp_size},
    }
    dtype = kvmod.normalize_kv_dtype(rt.kv_cache.dtype)
    if result.hicache.enabled and dtype in ("bf16", "fp8_e4m3", "fp8_e5m2"):
        from escha_deploy.sglang.arch import rank_shapes

        s = rank_shapes(arch, rt.tp_size)
        oracle["pools"] = {
            "kv_dtype": dtype, "kv_tokens": result.per_rank.device_kv_tokens, "full_layers": s.full_layers,
            "kv_heads": s.kv_heads_per_rank, "head_dim": s.head_dim, "page_size": result.page_size,
            "layout": result.hicache.mem_layout, "ratio": result.hicache.ratio, "size_gb": result.hicache.size_gb,
            "mamba_slots": result.per_rank.device_mamba_slots, "kv_dev_bytes": result.per_rank.device_kv_bytes,
            "mamba_dev_bytes": result.per_rank.device_mamba_bytes, "mamba_arch": config_json(arch) if arch.is_hybrid else None,
            "tp": rt.tp_size,
        }
    return oracle, planner


def shipped_cases() -> list[Case]:
    """Every shipped profile on a described Linux host with room for its pools."""
    return [Case(id=f"shipped-{name}", profile=name, host_ram=(128 if "l3" in name else 32) * GiB, shipped=True,
                 draft=_own_draft(name)) for name in list_profiles()]


def _own_draft(name: str) -> dict | None:
    """A shipped profile that drafts with its model's own MTP layers (NEXTN, ``model.draft.path``
    the model's): the oracle's draft is the model folder, 200 MB of MTP tensors as in the
    speculative cases."""
    prof = load_profile(name)
    d = prof.model.draft
    return {"own": True, "weights": 2 * 10**8} if d is not None and d.path == prof.model.path else None


def matrix_cases() -> list[Case]:
    """The generated matrix: TP 1/2/4, ratios and sizes, page sizes, layouts, 12/16/24/80 GiB
    cards, hybrid and dense models (at least 40 cases)."""
    out: list[Case] = []
    base = "rtx5060ti-tp2-fp8"
    vram = {"12GiB": 12, "16GiB": 16, "24GiB": 24, "80GiB": 80}
    n = 0
    for tp, card, page, (kind, arch) in itertools.product(
            (1, 2, 4), ("12GiB", "16GiB", "24GiB", "80GiB"), (1, 64), (("hybrid", None), ("dense", DENSE_ARCH))):
        n += 1
        ov = [f"hardware.gpu_count={max(tp, 2)}", f"runtime.tp_size={tp}", f"hardware.gpu_vram={card}",
              f"runtime.page_size={page}"]
        if arch:
            ov.append(f"model.architecture={arch}")
        if page > 1 and kind == "hybrid":  # auto resolves to extra_buffer for page > 1
            ov.append(f"runtime.mamba_radix_cache_strategy={('extra_buffer', 'auto')[n % 2]}")
        gib = vram[card]
        # vary what SGLang defaults: chunk and graph bs unset on every other card
        if n % 2:
            ov += ["runtime.chunked_prefill_size=null", "runtime.cuda_graph_max_bs=null"]
        if n % 3 == 0:
            ov.append("runtime.mem_fraction_static=null")
        if n % 4 == 0:
            ov.append("runtime.disable_prefill_cuda_graph=true")
        # HiCache by ratio or by size, several layouts
        if n % 5 == 0:
            ov += ["hicache.hicache_ratio=auto", "hicache.hicache_size=2"]
        else:
            ov.append(f"hicache.hicache_ratio={(1.0, 1.5, 2.0, 3.0)[n % 4]}")
        if kind == "dense" and n % 3 == 1:
            ov.append("hicache.hicache_mem_layout=layer_first")
        elif n % 7 == 0:
            ov += ["hicache.hicache_mem_layout=page_first_direct", "hicache.hicache_io_backend=direct"]
        if n % 6 == 0:
            ov.append("runtime.kv_cache.dtype=bf16")
        if (n + n // 4) % 4 == 1:  # device pools sized by SGLang's rule instead of the profile
            ov += ["runtime.max_total_tokens=null", "runtime.max_mamba_cache_size=null"]
        # weights scaled with the card so the pools fit
        ov += ["model.weights_total=null", f"model.weights_per_rank={max(gib * 0.45, 2.0):.1f}GB"]
        out.append(Case(id=f"m{n:02d}-tp{tp}-{card}-p{page}-{kind}", profile=base, overrides=tuple(ov),
                        host_ram=256 * GiB))
    return out


#: Configurations SGLang refuses late, each of which ``plan`` must refuse (exit 3) too.
REFUSAL_CASES = [
    Case(id="refuse-page64-no-buffer", profile="rtx5060ti-tp2-fp8",
         overrides=("runtime.page_size=64", "runtime.mamba_radix_cache_strategy=no_buffer")),
    Case(id="refuse-slots-below-one-request", profile="rtx5060ti-tp2-fp8",
         overrides=("runtime.max_running_requests=1", "runtime.max_mamba_cache_size=4")),
    Case(id="refuse-mfs-0.98", profile="rtx5060ti-tp2-fp8", overrides=("runtime.mem_fraction_static=0.98",)),
    Case(id="refuse-hicache-no-radix", profile="rtx5060ti-tp2-fp8", overrides=("runtime.disable_radix_cache=true",)),
    Case(id="refuse-int8-mamba-ckpt", profile="rtx5060ti-tp2-fp8",
         overrides=("runtime.enable_int8_mamba_checkpoint=true",)),
    Case(id="refuse-layer-first-hybrid", profile="rtx5060ti-tp2-fp8", overrides=("hicache.hicache_mem_layout=layer_first",)),
    Case(id="refuse-kv-split-dense", profile="rtx5060ti-tp2-fp8",
         overrides=("model.architecture=" + DENSE_ARCH, "model.weights_total=4GB", "runtime.max_total_tokens=16384",
                    "hicache.hicache_mem_layout=page_first_kv_split")),
    Case(id="refuse-buffer-only-hybrid", profile="rtx5060ti-tp2-fp8",
         overrides=("hicache.hicache_host_memory_mode=buffer_only", "hicache.hicache_storage_backend=file",
                    "hicache.storage_dir=/tmp/l3")),
]


#: NEXTN as the issue's case: 3 steps, top-k 1, 4 draft tokens.
NEXTN = ("runtime.speculative.algorithm=NEXTN", "runtime.speculative.num_steps=3", "runtime.speculative.eagle_topk=1",
         "runtime.speculative.num_draft_tokens=4")
#: An EAGLE3 draft for the hybrid model: one Llama layer, 4 KV heads of 128.
EAGLE3_HYBRID_DRAFT = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "hidden_size": 4096,
    "intermediate_size": 12288, "vocab_size": 248320, "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}

#: Speculative decoding: SGLang sizes the device pools with the algorithm set (the pre-flight's
#: configurator gets it: ``sglang_preflight._speculative_fields``), so the plan's token count after
#: the draft's weights and its layers in the cell, the mamba slots after the intermediate states
#: per draft token, and the host pools with the draft's KV (packed or a sidecar, SGLang's own
#: ``_can_pack_hicache_mtp``) are SGLang's.
SPECULATIVE_CASES = [
    # the case: NEXTN on the model's own MTP layer, 15 GiB WSL2: 17,408 B per host token
    Case(id="spec-nextn-own-wsl2-15g", profile="rtx5060ti-tp2-fp8", overrides=NEXTN + (
        "model.draft.path=/models/Qwen3.x-27B-GPTQ-Int4", "model.weights_total=16.0GB"),
         host_ram=15 * GiB, platform="wsl2", draft={"own": True, "weights": 2 * 10**8}),
    Case(id="spec-nextn-own-linux", profile="rtx5060ti-tp2-fp8", overrides=NEXTN + (
        "model.draft.path=/models/Qwen3.x-27B-GPTQ-Int4", "model.weights_total=16.0GB"),
         draft={"own": True, "weights": 2 * 10**8}),
    # SGLang sizes slots and tokens itself, jointly with the intermediate states, 48 requests
    Case(id="spec-nextn-own-auto", profile="rtx5060ti-tp2-fp8", overrides=NEXTN + (
        "model.draft.path=/models/Qwen3.x-27B-GPTQ-Int4", "model.weights_total=16.0GB", "runtime.max_total_tokens=null",
        "runtime.max_mamba_cache_size=null", "runtime.max_running_requests=null", "runtime.context_length=null"),
         draft={"own": True, "weights": 2 * 10**8}),
    # SGLang subtracts 1,098,252,288 B of intermediate states and raises
    Case(id="spec-nextn-refused-30-slots", profile="rtx5060ti-tp2-fp8",
         overrides=NEXTN + ("runtime.max_mamba_cache_size=30", "runtime.max_running_requests=6")),
    Case(id="spec-eagle3-hybrid-sidecar", profile="rtx5060ti-tp2-fp8",
         overrides=("runtime.speculative.algorithm=EAGLE3", "model.draft.path=/drafts/eagle3",
                    "model.weights_total=16.0GB"),
         draft={"weights": 2 * 10**8, "config": EAGLE3_HYBRID_DRAFT}),
    # pages of 64: 0.5.19 gives the sidecar a padding page of its own, 0.5.23 the target's tokens
    # (host_token_capacity; facts.yaml draft_host_pool)
    Case(id="spec-eagle3-hybrid-sidecar-p64", profile="rtx5060ti-tp2-fp8",
         overrides=("runtime.speculative.algorithm=EAGLE3", "model.draft.path=/drafts/eagle3",
                    "model.weights_total=16.0GB", "runtime.page_size=64",
                    "runtime.mamba_radix_cache_strategy=extra_buffer"),
         draft={"weights": 2 * 10**8, "config": EAGLE3_HYBRID_DRAFT}),
    Case(id="spec-eagle3-dense-draft", profile="rtx5060ti-tp2-fp8",
         overrides=(f"model.architecture={DENSE_ARCH}", "runtime.max_total_tokens=null",
                    "runtime.max_mamba_cache_size=null", "hicache.enabled=false",
                    "runtime.speculative.algorithm=EAGLE3", "model.draft.path=/drafts/eagle3"),
         draft={"weights": 10**9, "config": {
             "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
             "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120,
             "intermediate_size": 17408, "vocab_size": 248320, "max_position_embeddings": 262144,
             "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}}),
]


#: A multimodal model folder (the real Qwen3.5 checkpoints' architecture): SGLang reserves
#: SGLANG_VLM_CACHE_SIZE_MB out of the KV budget, and SGLANG_MM_FEATURE_CACHE_MB more with a GPU
#: feature transport; SGLang sizes the pools itself so the reservation shows in its tokens.
MULTIMODAL_CASES = [
    Case(id="multimodal-qwen3_5-auto", profile="rtx5060ti-tp2-fp8", overrides=(
        "runtime.max_total_tokens=null", "runtime.max_mamba_cache_size=null"),
         architectures=("Qwen3_5ForConditionalGeneration",)),
    Case(id="multimodal-qwen3_5-cuda-ipc", profile="rtx5060ti-tp2-fp8", overrides=(
        "runtime.max_total_tokens=null", "runtime.max_mamba_cache_size=null",
        "runtime.extra_args=[--mm-feature-transport,cuda_ipc]"),
         architectures=("Qwen3_5ForConditionalGeneration",)),
]


def all_cases() -> list[Case]:
    return shipped_cases() + matrix_cases() + REFUSAL_CASES + SPECULATIVE_CASES + MULTIMODAL_CASES


def run_oracle(oracle_cases: list[dict], workdir: Path, venv: Path) -> dict:
    """Run ``scripts/sglang_oracle.py`` in the flag-catalog venv; its JSON output."""
    cases_file = workdir / "oracle-cases.json"
    out_file = workdir / "oracle-results.json"
    cases_file.write_text(json.dumps(oracle_cases))
    proc = subprocess.run([str(venv / "bin" / "python"), str(ORACLE), "--cases", str(cases_file), "--out", str(out_file)],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": ""})
    if proc.returncode != 0:
        raise RuntimeError(f"oracle exited {proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(out_file.read_text())


#: Fields compared on an accepted case: oracle path -> planner key.
COMPARED = (
    ("defaults.mem_fraction_static", "default_mem_fraction_static"),
    ("defaults.reserved_mib", "reserved_mib"),
    ("resolve.chunked_prefill_size", "chunked_prefill_size"),
    ("resolve.decode_max_bs", "decode_max_bs"),
    ("resolve.prefill_graph_sizes", "prefill_graph_sizes"),
    ("resolve.page_size", "page_size"),
    ("resolve.mem_fraction_static", "mem_fraction_static"),
    ("pools.kv_tokens", "host_kv_tokens"),
    ("pools.kv_bytes", "host_kv_bytes"),
    ("pools.mamba_slots", "host_mamba_slots"),
    ("pools.mamba_bytes", "host_mamba_bytes"),
    ("pools.draft_kv_tokens", "host_draft_kv_tokens"),
    ("pools.draft_kv_bytes", "host_draft_kv_bytes"),
)


def _get(d: dict, path: str):
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def compare(case_id: str, planner: dict, oracle: dict) -> tuple[list[str], int]:
    """``(differences, fields compared)`` for one case. A difference names the case and the
    field, with both values. SGLang refusing what ``plan`` accepts is a difference; ``plan``
    refusing what SGLang accepts is not (the plan also checks host memory and known runtime
    failures SGLang does not check at argument time)."""
    diffs: list[str] = []
    n = 0
    res = oracle["resolve"]
    n += 1
    if not res["ok"]:
        if not plan_refuses(planner):
            diffs.append(f"{case_id}: verdict: SGLang refuses ({res['type']} at {res.get('site')}: "
                         f"{res['error']}) but plan says {planner['verdict']}")
        return diffs, n
    if planner["shipped"] and not planner["needs_overlay"] and plan_refuses(planner):
        diffs.append(f"{case_id}: verdict: a shipped profile is refused: {planner['reasons']}")
    cannot = oracle.get("cannot") or {}
    dev = {} if "device" in cannot else oracle.get("device") or {}
    if "error" in dev and not str(dev.get("site", "")).startswith("sglang/"):
        diffs.append(f"{case_id}: harness: the oracle failed outside SGLang: {dev['error']} ({dev.get('site')})")
        return diffs, n
    if "error" in dev:  # SGLang's configurator refuses (no slot, slots below one request, ...)
        if not plan_refuses(planner):
            diffs.append(f"{case_id}: verdict: SGLang's KV cache configurator raises {dev['error']} "
                         f"({dev.get('site')}) but plan says {planner['verdict']}")
        return diffs, n
    if dev and planner["device_fits"] and not planner["needs_overlay"]:  # overlays: int2 checked as bf16
        for theirs, key in ((dev["kv_tokens"], "device_kv_tokens"), (dev["mamba_slots"], "device_mamba_slots"),
                            (dev.get("kv_bytes_per_token"), "device_kv_cell")):
            if theirs is None:  # saved results from before the cell was answered
                continue
            n += 1
            if theirs != planner[key]:
                diffs.append(f"{case_id}: {key}: plan {planner[key]!r}, SGLang {theirs!r} (device)")
    pools = {} if "pools" in cannot else oracle.get("pools") or {}
    if "error" in pools:  # a host pool class refuses the configuration: plan must refuse it too
        if not plan_refuses(planner):
            diffs.append(f"{case_id}: verdict: SGLang's host pool classes raise {pools['error']} but plan "
                         f"says {planner['verdict']}")
        return diffs, n
    for path, key in COMPARED:
        theirs = _get(oracle, path)
        if theirs is None or (path.startswith("pools.mamba") and not planner.get("host_mamba_slots") and not theirs):
            continue
        ours = planner[key]
        n += 1
        same = abs(theirs - ours) < 1e-6 if isinstance(theirs, float) or isinstance(ours, float) else theirs == ours
        if not same:
            diffs.append(f"{case_id}: {key}: plan {ours!r}, SGLang {theirs!r} ({path})")
    return diffs, n


def check_all(cases: list[Case], workdir: Path, venv: Path, *, oracle_results: dict | None = None,
              release: str | None = None):
    """Plan every case for ``release``, run SGLang's side once, compare: ``(differences, cases,
    fields, timings)``."""
    t0 = time.perf_counter()
    built = [build_case(c, release) for c in cases]
    t1 = time.perf_counter()
    results = oracle_results or run_oracle([b[0] for b in built], workdir, venv)
    by_id = {r["id"]: r for r in results["results"]}
    diffs: list[str] = []
    fields = 0
    for c, (_, planner) in zip(cases, built):
        d, n = compare(c.id, planner, by_id[c.id])
        diffs += d
        fields += n
    timings = {"plan_s": round(t1 - t0, 2), "import_s": results["import_s"], "sglang_cases_s": results["cases_s"]}
    return diffs, len(cases), fields, timings, results


def main(argv: list[str] | None = None) -> int:
    """CI entry: ``python -m tests.oracle.cases [--venv DIR]``; exit 1 on any difference."""
    import argparse
    import tempfile

    from escha_deploy.sglang.releases import default_release

    ap = argparse.ArgumentParser(description="Cross-check plan against a release's own SGLang code")
    ap.add_argument("--release", default=default_release(), help="the SGLang release (its flag-catalog venv)")
    ap.add_argument("--venv", type=Path, help="default: .cache/flagcat-venv ($ESCHA_FLAGCAT_VENV) for the default "
                    "release, .cache/flagcat-venv-VERSION for another")
    ap.add_argument("--save", type=Path, help="keep SGLang's results here (the pytest harness test reuses them)")
    args = ap.parse_args(argv)
    venv = args.venv or (Path(os.environ.get("ESCHA_FLAGCAT_VENV", REPO / ".cache" / "flagcat-venv"))
                         if args.release == default_release() else REPO / ".cache" / f"flagcat-venv-{args.release}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="escha-oracle-") as tmp:
        diffs, n_cases, n_fields, timings, results = check_all(all_cases(), Path(tmp), venv, release=args.release)
    if args.save:
        args.save.write_text(json.dumps(results))
    refused = sum(1 for r in results["results"]
                  if not r["resolve"]["ok"] or "error" in (r.get("pools") or {}) or "error" in (r.get("device") or {}))
    if results.get("sglang") != args.release:
        print(f"error: the venv runs sglang {results.get('sglang')}, not {args.release}", file=sys.stderr)
        return 2
    cannot: dict[str, int] = {}
    for r in results["results"]:
        for part, why in (r.get("cannot") or {}).items():
            cannot[f"{part} ({why})"] = cannot.get(f"{part} ({why})", 0) + 1
    print(f"sglang oracle {args.release}: {n_cases} cases ({refused} refused by SGLang), {n_fields} fields compared, "
          f"{len(diffs)} differences; {time.perf_counter() - start:.1f} s ({timings})")
    for what, n in cannot.items():
        print(f"sglang oracle {args.release}: cannot run {what}: {n} cases")
    for d in diffs:
        print(f"difference: {d}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
