"""A differential fuzz of ``plan`` against SGLang 0.5.19's own argument resolution.

Hypothesis draws cases over the shipped profiles: ``--set`` overrides on profile keys (values
from each key's type and choices and from the values the shipped profiles use) and a few
catalog flags in ``runtime.extra_args``. Each case is planned in-process
(``tests/oracle/cases.build_case``: ``load_profile``, ``plan``, the argv ``serve`` renders) and,
all cases batched in ONE SGLang process (``escha_deploy/launch/sglang_preflight.run_many``), put
to SGLang's ``prepare_server_args`` + ``ServerArgs.resolve_once``, ``ModelConfig.from_server_args``
and its attention-backend choice, on a model folder holding the architecture's config.json.

Asserted: a case that differs from a shipped profile only in profile keys and that SGLang
refuses, ``plan`` refuses too (every miss is printed with its input). ``extra_args`` cases are
counted, not asserted: a refusal there may be SGLang's pre-flight's alone.

Fixed seed (``derandomize=True``); ``ESCHA_FUZZ_CASES`` cases drawn (default 400, about 340 distinct:
one SGLang process per GPU the profiles name, about 0.1 s a case after a 10-15 s import on a loaded
2-core machine).

The issue's bounds (SGLang refuses at least 20% of the cases; plan refuses at most 10% of what
SGLang accepts) are printed as reported figures, not asserted: this strategy does not reach
them yet. Runs in the flag-catalog venv with the
test-only site hook of tests/launch/preflight_cpu_site (the stand-ins named there).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from escha_deploy.arch import read_model_dir
from escha_deploy.errors import BadInput, Refused
from escha_deploy.flags import server_args
from escha_deploy.host import described_host
from escha_deploy.launch import sglang_preflight as pf
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile
from escha_deploy.units import GiB
from tests.launch.test_sglang_preflight import VENV_PY, site_env
from tests.oracle.cases import _load_unchecked, config_json, stock_argv

pytestmark = pytest.mark.wheel

CASES = int(os.environ.get("ESCHA_FUZZ_CASES", "400"))

PROFILES = ("rtx5060ti-tp2-fp8", "rtx5060ti-tp2", "linux-tp2-l3")

#: Profile keys and the values drawn for each: the type's choices (Literal keys), the values
#: the shipped profiles use, SGLang's defaults, and odd ones (edges of the profile's bounds).
KEYS: dict[str, tuple[str, ...]] = {
    "runtime.tp_size": ("1", "2", "3", "4"),
    "runtime.context_length": ("null", "4096", "28672", "131072", "262144", "300000"),
    "runtime.max_total_tokens": ("null", "8192", "28672", "210000"),
    "runtime.max_mamba_cache_size": ("null", "1", "10", "16"),
    "runtime.max_running_requests": ("null", "1", "2", "3", "64"),
    "runtime.page_size": ("null", "1", "8", "16", "64", "3"),
    "runtime.mem_fraction_static": ("null", "0.5", "0.8", "0.825", "0.95"),
    "runtime.chunked_prefill_size": ("null", "-1", "1024", "2048", "8192"),
    "runtime.cuda_graph_max_bs": ("null", "1", "4", "8", "256"),
    "runtime.disable_prefill_cuda_graph": ("true", "false"),
    "runtime.kv_cache.dtype": ("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "mxfp8", "nvfp4", "fp4_mx_block16"),
    "runtime.mamba_ssm_dtype": ("null", "float32", "bfloat16", "float16"),
    "runtime.mamba_radix_cache_strategy": ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"),
    "runtime.enable_mixed_chunk": ("true", "false"),
    "runtime.disable_radix_cache": ("true", "false"),
    "runtime.enable_int8_mamba_checkpoint": ("true", "false"),
    "runtime.attention_backend": ("null", "triton", "flashinfer", "fa3", "torch_native", "trtllm_mha",
                                  "flex_attention", "dual_chunk_flash_attn"),
    "runtime.disable_custom_all_reduce": ("null", "true", "false"),
    "hicache.enabled": ("true", "false"),
    "hicache.hicache_ratio": ("auto", "1.5", "2"),
    "hicache.hicache_mem_layout": ("layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"),
    "hicache.hicache_io_backend": ("direct", "kernel", "kernel_ascend"),
    "hicache.hicache_host_memory_mode": ("cache", "buffer_only"),
    "hicache.hicache_write_policy": ("write_back", "write_through", "write_through_selective"),
}

#: A few catalog flags a profile can put in ``runtime.extra_args`` (none a profile key owns).
EXTRA_ARGS: tuple[tuple[str, ...], ...] = (
    ("--disable-overlap-schedule",),
    ("--enable-dp-attention",),
    ("--schedule-policy", "fcfs"),
    ("--schedule-policy", "lpm"),
    ("--dtype", "float16"),
    ("--speculative-algorithm", "NEXTN"),
    ("--enable-torch-compile",),
    ("--disable-cuda-graph",),
    ("--prefill-attention-backend", "trtllm_mha"),
    ("--decode-attention-backend", "trtllm_mha"),
    ("--linear-attn-decode-backend", "flashkda"),
    ("--enable-linear-replayssm",),
    ("--speculative-algorithm", "EAGLE"),
)

case_strategy = st.fixed_dictionaries({
    "profile": st.sampled_from(PROFILES),
    "sets": st.dictionaries(st.sampled_from(sorted(KEYS)), st.none(), min_size=1, max_size=4).flatmap(
        lambda keys: st.fixed_dictionaries({k: st.sampled_from(KEYS[k]) for k in keys})),
    "extra": st.one_of(st.just(()), st.sampled_from(EXTRA_ARGS)),
}).map(lambda d: {**d, "extra": d["extra"] if len(d["sets"]) % 3 == 0 else ()})  # about a third carry a flag


def draw_cases(n: int) -> list[dict]:
    """``n`` cases (fewer when Hypothesis repeats one), drawn with a fixed seed."""
    out: list[dict] = []

    @settings(max_examples=n, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case_strategy)
    def collect(case):
        out.append(case)

    collect()
    seen, unique = set(), []
    for c in out:
        key = json.dumps(c, sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return unique


def overrides_of(case: dict, l3: Path) -> tuple[str, ...]:
    sets = [f"{k}={v}" for k, v in sorted(case["sets"].items())]
    if case["profile"] == "linux-tp2-l3":  # the L3 directory on this disk, a cap that fits it
        sets += [f"hicache.storage_dir={l3}", "hicache.storage_max_size=1GB"]
    if case["extra"]:
        sets.append(f"runtime.extra_args=[{','.join(case['extra'])}]")
    return tuple(sets)


def plan_case(profile: str, overrides: tuple[str, ...], model: Path) -> tuple[list[str], list[str]]:
    """``(reasons plan refuses for, the argv serve renders)``, as native ``plan`` and ``serve
    --print`` do with ``model.host_dir`` at ``model``: the profile refused at load (exit 2 or 3)
    or an unsafe plan refuses; the argv is rendered either way. The folder's config.json is read
    (architecture, derived context length); its weight bytes are not (the folder holds no real
    weights: the profile's ``weights_total`` stays the budget's input)."""
    overrides = (*overrides, f"model.host_dir={model}")
    reasons: list[str] = []
    try:
        prof = load_profile(profile, list(overrides))
    except (BadInput, Refused) as exc:
        reasons = [f"{line}" for line in str(exc).splitlines() if line.strip()][:1] or [type(exc).__name__]
        prof = _load_unchecked(profile, overrides)
    facts = read_model_dir(model)
    facts = facts.model_copy(update={"safetensors_bytes": None}) if facts else None
    result = plan(prof, described_host((128 if "l3" in profile else 32) * GiB, "linux"), model_dir=facts)
    if not reasons and result.verdict == "unsafe":
        reasons = list(result.reasons) or ["unsafe"]
    argv = stock_argv(pf.server_flags_of(server_args(result, prof)))
    argv[argv.index("--model-path") + 1] = str(model)
    return reasons, argv


def rule_of(reason: str) -> str:
    """The safety rule a plan refusal names: its reason's first clause."""
    return reason.removeprefix("--set ").split(":", 1)[0].strip()[:90]


def miss_line(case: dict, overrides: tuple[str, ...], r) -> str:
    return (f"{case['profile']} --set {' --set '.join(overrides)}: SGLang {r.stage}: {r.type}: {r.message[:200]} "
            f"({r.site})")


def removed_rule_misses(planned: list, results: list, models: dict[str, Path], field: str) -> list[str]:
    """The misses when ``plan`` loses the mirror rule that names ``field`` (SGLang's answers are
    the same: only the plan side is planned again)."""
    import escha_deploy.planner as planner_pkg

    real = planner_pkg.validate

    def without_rule(*args, **kwargs):
        return [f for f in real(*args, **kwargs) if not (f.severity == "error" and f.field == field)]

    out = []
    planner_pkg.validate = without_rule
    try:
        for (case, ov, _reasons, _argv), r in zip(planned, results):
            if r.ok is False and not case["extra"] and not plan_case(case["profile"], ov, models[case["profile"]])[0]:
                out.append(miss_line(case, ov, r))
    finally:
        planner_pkg.validate = real
    return out


def test_sglang_refuses_means_plan_refuses(tmp_path, capsys):
    t0 = time.monotonic()
    l3 = tmp_path / "l3"
    l3.mkdir()
    models: dict[str, Path] = {}
    for name in PROFILES:
        d = tmp_path / f"model-{name}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config_json(load_profile(name).model.architecture)))
        (d / "model.safetensors").write_bytes(b"\0" * 64)
        models[name] = d
    cases = draw_cases(CASES)
    planned: list[tuple[dict, tuple[str, ...], dict, list[str]]] = []
    no_argv = Counter()
    for case in cases:
        ov = overrides_of(case, l3)
        try:
            reasons, argv = plan_case(case["profile"], ov, models[case["profile"]])
        except Exception as exc:  # noqa: BLE001  refused before an argv exists: plan refuses it
            no_argv[f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"] += 1
            continue
        planned.append((case, ov, reasons, argv))
    t_plan = time.monotonic() - t0
    # One SGLang process per GPU the profiles name (the site hook's card is one per process).
    by_card: dict[str, list[int]] = {}
    for i, (case, *_rest) in enumerate(planned):
        hw = load_profile(case["profile"]).hardware
        card = {"vram_bytes": hw.gpu_vram, "name": "NVIDIA " + hw.gpu_name, "capability": hw.compute_capability}
        by_card.setdefault(json.dumps(card), []).append(i)
    results: list = [None] * len(planned)
    walls = []
    for card, idx in by_card.items():
        got = pf.run_many(str(VENV_PY), [planned[i][3] for i in idx], site_env(ESCHA_TEST_CARD=card), timeout_s=900)
        assert all(r.ok is not None for r in got), got[0].not_run
        walls.append(got[0].wall_s if got else 0.0)
        for i, r in zip(idx, got):
            results[i] = r
    misses, extra_only, refused_dims = [], Counter(), Counter()
    sglang_sites, plan_rules = Counter(), Counter()
    s_refused = p_refused = accepted = plan_refuses_accepted = 0
    for (case, ov, reasons, argv), r in zip(planned, results):
        p = bool(reasons)
        p_refused += p
        if r.ok is False:
            s_refused += 1
            refused_dims.update(list(case["sets"]))
            refused_dims.update(list(case["extra"][:1]))
            sglang_sites[r.site] += 1
            if not p:
                if case["extra"]:
                    extra_only[f"{case['extra'][0]}: {r.site}: {r.message[:120]}"] += 1
                else:
                    misses.append(miss_line(case, ov, r))
        else:
            accepted += 1
            if p:
                plan_refuses_accepted += 1
                plan_rules[rule_of(reasons[0])] += 1
    n = len(planned)
    with capsys.disabled():
        print(f"\n[fuzz] {len(cases)} cases ({CASES} drawn, seed fixed): {n} to SGLang, "
              f"{sum(no_argv.values())} refused before an argv (plan side); planning {t_plan:.1f} s, "
              f"SGLang {sum(walls):.1f} s in {len(walls)} processes (one per GPU), total {time.monotonic() - t0:.1f} s")
        print(f"[fuzz] SGLang refused {s_refused}/{n} ({s_refused / max(n, 1):.0%}); plan refused {p_refused}/{n} "
              f"({p_refused / max(n, 1):.0%}); plan refused {plan_refuses_accepted} of {accepted} SGLang accepts "
              f"({plan_refuses_accepted / max(accepted, 1):.0%}); profile-key misses: {len(misses)}")
        print(f"[fuzz] reported figures (bounds not asserted): SGLang-refused share {s_refused / max(n, 1):.0%} "
              f"(bound >= 20%), plan refuses of SGLang accepts {plan_refuses_accepted / max(accepted, 1):.0%} (bound <= 10%)")
        never = [k for k in [*KEYS, *{e[0] for e in EXTRA_ARGS}] if k not in refused_dims]
        print(f"[fuzz] dimensions in no SGLang-refused case ({len(never)} of {len(KEYS) + len({e[0] for e in EXTRA_ARGS})}): "
              f"{', '.join(never) or '-'}")
        for site, k in sglang_sites.most_common():
            print(f"[fuzz]   SGLang refused at {site}: {k}")
        for rule, k in plan_rules.most_common():
            print(f"[fuzz]   plan refused what SGLang accepts, rule '{rule}': {k}")
        for flag, k in extra_only.most_common():
            print(f"[fuzz]   pre-flight only (SGLang refused, plan did not), extra_args {flag}: {k}")
        for why, k in no_argv.most_common():
            print(f"[fuzz]   refused before an argv: {why}: {k}")
        for m in misses:
            print(f"[fuzz] MISS {m}")
    assert n >= CASES // 2, f"only {n} of {CASES} cases reached SGLang"
    assert not misses, f"{len(misses)} cases SGLang refuses that plan accepts:\n" + "\n".join(misses)
    # The fuzz can fail: without the rule that mirrors SGLang's "HiCache needs the radix cache"
    # (kv_cache_hook.py: handle_cache_compatibility), it names the cases and their input.
    removed = removed_rule_misses(planned, results, models, "runtime.disable_radix_cache")
    with capsys.disabled():
        print(f"[fuzz] with plan's runtime.disable_radix_cache rule removed: {len(removed)} misses, first: "
              f"{removed[0] if removed else '-'}")
    assert removed and all("runtime.disable_radix_cache=true" in m and "kv_cache_hook.py" in m for m in removed)
