"""The figures the planner must reproduce (the reference box (16 GiB WSL2, two 12 GiB RTX 5060 Ti, TP 2, INT2 KV, ratio 2)), with their derivation.

The reference report quotes rounded figures: host KV "2.58 GB" and host mamba
"2.55 GB" per rank at ratio 2, "10.3 GB" pinned at ratio 2 (it summed rounded figures),
"5.2 GB" at ratio 1. The exact bytes follow from SGLang 0.5.19's formulas.
"""

import pytest

from escha_deploy.facts.machine import described_host
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile
from escha_deploy.utils.units import GiB, MiB

# Per rank at TP 2: 16 full-attention layers x K,V x (2 heads x 256/4 codes + 2 heads x 2 x 4
# groups x 4 B scales/zeros) = 16 x 2 x (128 + 64)
HOST_BYTES_PER_TOKEN = 16 * 2 * (128 + 64)
MAMBA_SLOT = 48 * (5120 * 3 * 2 + 24 * 128 * 128 * 4)


@pytest.fixture(scope="module")
def ref():
    return load_profile("rtx5060ti-tp2")


@pytest.fixture(scope="module")
def wsl2_box():
    return described_host(16 * GiB, "wsl2")


def test_derivation_constants():
    assert HOST_BYTES_PER_TOKEN == 6_144
    assert MAMBA_SLOT == 76_972_032


def test_ratio_2_matches_the_seed(ref, wsl2_box):
    p = plan(ref, wsl2_box, ratio=2)
    # host tokens: int(210000 x 2) floored to the page of 8, plus one page = 420,008
    assert p.per_rank.host_kv_tokens == (int(210_000 * 2) // 8 + 1) * 8 == 420_008
    assert p.per_rank.host_kv_bytes == 420_008 * HOST_BYTES_PER_TOKEN == 2_580_529_152  # seed "2.58 GB"
    # host slots: int(16 x 2) + 1 = 33
    assert p.per_rank.host_mamba_slots == 33
    assert p.per_rank.host_mamba_bytes == 33 * MAMBA_SLOT == 2_540_077_056  # seed "2.55 GB"
    assert p.pinned_total_bytes == 2 * (2_580_529_152 + 2_540_077_056) == 10_241_212_416  # seed "10.3 GB"


def test_ratio_1_matches_the_seed(ref, wsl2_box):
    p = plan(ref, wsl2_box, ratio=1)
    assert p.pinned_total_bytes == 2 * (210_008 * 6_144 + 17 * MAMBA_SLOT) == 5_197_627_392  # seed "5.2 GB"


def test_device_pools_of_the_seed(ref, wsl2_box):
    p = plan(ref, wsl2_box, ratio=1)
    assert p.per_rank.device_kv_tokens == 210_000
    assert p.per_rank.device_kv_bytes == (210_000 + 8) * 6_144  # one padding page of rows
    assert p.per_rank.device_mamba_bytes == 17 * MAMBA_SLOT  # 16 slots + the padding slot


def test_reference_box_verdicts(ref, wsl2_box):
    budget = 16 * GiB - 2 * 3 * GiB - 1 * GiB - 2 * GiB  # the default safety policy (docs/planner.md)
    assert budget == 7_516_192_768
    two, one = plan(ref, wsl2_box, ratio=2), plan(ref, wsl2_box, ratio=1)
    assert two.budget.pinned_budget_bytes == one.budget.pinned_budget_bytes == budget
    assert (two.verdict, one.verdict) == ("unsafe", "ok")
    assert any("10.24 GB" in r and "7.52 GB" in r for r in two.reasons)
    # The patched runtime agrees with the budget; the stock one refuses both: about 9 GiB is
    # available when the pools are built (16 - 1 - 2 x 3), less than its 10 GiB reserve.
    assert (two.runtime_check.patched, one.runtime_check.patched) == ("refuse", "accept")
    assert (two.runtime_check.stock, one.runtime_check.stock) == ("refuse", "refuse")
    assert one.runtime_check.available_bytes == 9 * GiB
    assert one.runtime_check.patched_reserve_bytes == 2 * GiB


def pinned(ratio):
    kv = (int(210_000 * ratio) // 8 + 1) * 8 * 6_144
    mamba = (int(16 * ratio) + 1) * MAMBA_SLOT
    return 2 * (kv + mamba)


def test_largest_safe_and_recommended_ratio(ref, wsl2_box):
    p = plan(ref, wsl2_box)
    budget = p.budget.pinned_budget_bytes
    # just under 1.481: 1.48 leaves 2.3 MB, 1.481 does not fit
    assert budget - pinned(1.48) == 2_326_528
    assert pinned(1.481) > budget
    assert p.max_safe_ratio == 1.48
    # recommended: the largest on the 0.05 grid with >= 64 MiB headroom: 1.45 (76 MiB); 1.50 no
    assert budget - pinned(1.45) == 79_790_080 >= 64 * MiB
    assert pinned(1.50) > budget
    assert p.recommended_ratio == 1.45
    # auto picks it, and says why
    assert (p.verdict, p.hicache.ratio) == ("ok", 1.45)
    assert any(d.rule == "recommended ratio" and d.value == 1.45 for d in p.decisions)
    assert p.pinned_total_bytes == pinned(1.45)


# --- one unit per formula -----------------------------------------------------------------------

_FIGURE = r"(\d+(?:\.\d+)?) (GiB|GB|MiB)"


def _formula_units(text: str) -> list[tuple[str, set[str]]]:
    """Every ``... = N UNIT`` in ``text``: the result's unit and the units of the formula's terms,
    the last figure before the '=' and those chained to it by arithmetic (' - ', ' + ', ' x ',
    ' / '). A GiB
    figure followed by its GB figure in parentheses, ``7.00 GiB (7.52 GB)``, counts as GiB: the
    GB figure is a companion, not a term."""
    import re

    text = re.sub(r"(\d+\.\d+ GiB) \(\d+\.\d+ GB\)", r"\1", text)
    out = []
    for m in re.finditer(rf"= {_FIGURE}", text):
        figures = list(re.finditer(_FIGURE, text[:m.start()]))
        terms, end = set(), m.start()
        for f in reversed(figures):
            if terms and not re.search(r" [-+x/] ", text[f.end():end]):
                break
            terms.add(f.group(2))
            end = f.start()
        out.append((m.group(2), terms))
    return out


def _plan_texts(p) -> list[str]:
    texts = [d.reason for d in p.decisions] + list(p.reasons) + list(p.warnings) + [p.budget.binding_detail]
    if p.runtime_check is not None:
        texts += [p.runtime_check.stock_detail, p.runtime_check.patched_detail]
    return texts


@pytest.mark.parametrize("name, host, caps", [
    ("rtx5060ti-tp2", described_host(16 * GiB, "wsl2"), None),          # ok, patched check
    ("rtx5060ti-tp2", described_host(16 * GiB, "wsl2"), frozenset()),   # stock check refuses
    ("rtx5060ti-tp2", described_host(8 * GiB, "wsl2"), None),           # reserves exceed the base
    ("rtx5060ti-tp2-fp8", described_host(24 * GiB, "linux"), None),
])
def test_every_formula_keeps_one_unit(name, host, caps):
    """A new user read "(16.54 GiB - 2.00 GiB reserve) / 2 = 7.81 GB per rank": GiB terms, a GB
    result. Every formula's terms and result share a unit; the GB figure follows in parentheses."""
    p = plan(load_profile(name), host, capabilities=caps)
    found = [(t, unit, terms) for t in _plan_texts(p) for unit, terms in _formula_units(t)]
    assert sum(bool(terms) for _, _, terms in found) >= 3  # the formulas are there to check
    for text, unit, terms in found:
        assert terms <= {unit}, (text, unit, terms)


def test_patched_check_reads_in_gib_with_gb_after():
    p = plan(load_profile("rtx5060ti-tp2"), described_host(16 * GiB, "wsl2"))
    # A0 = 16 GiB - 2 x 3 GiB - 1 GiB = 9 GiB; R' = A0 - pinned budget (7 GiB) = 2 GiB; share 3.5 GiB
    assert p.runtime_check.patched_detail.startswith(
        "one reading for the TP group: (9.00 GiB - 2.00 GiB reserve) / 2 = 3.50 GiB (3.76 GB) per rank; pools ")
    assert p.budget.binding_detail.endswith("page-cache floor = 7.00 GiB (7.52 GB)")
    small = plan(load_profile("rtx5060ti-tp2"), described_host(8 * GiB, "wsl2"))
    over = next(r for r in small.reasons if "exceed the memory" in r)
    assert "page-cache floor = 9.00 GiB (9.66 GB)) exceed the memory the server can have, MemTotal 8.00 GiB" in over


def test_static_budget_names_wsl2_only_on_wsl2():
    """A plain Linux host hides no VRAM: the formula leaves the WSL2 term out instead of "- 0.00 GiB"."""
    prof = load_profile("rtx5060ti-tp2-fp8")
    linux = next(d.reason for d in plan(prof, described_host(24 * GiB, "linux")).decisions
                 if d.rule == "static budget")
    wsl2 = next(d.reason for d in plan(prof, described_host(24 * GiB, "wsl2")).decisions
                if d.rule == "static budget")
    assert linux.startswith("(12.00 GiB VRAM - 0.50 GiB CUDA context) x mem_fraction_static "), linux
    assert "hidden by WSL2" in wsl2 and "0.00 GiB hidden" not in wsl2, wsl2


# --- a model folder whose config.json is another model ------------------------------------------

#: Llama-3.1-8B's config.json fields the planner reads (meta-llama/Llama-3.1-8B on the Hub).
LLAMA_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "head_dim": 128}


def _folder(tmp_path, config):
    import json

    from escha_deploy.sglang.arch import read_model_dir

    (tmp_path / "config.json").write_text(json.dumps(config))
    return read_model_dir(tmp_path)


def test_a_dense_config_json_in_a_hybrid_profile_is_named(tmp_path):
    """A Llama folder silently replaced the profile's hybrid GDN model: the plan now says where
    the architecture came from and names both models."""
    folder = _folder(tmp_path, LLAMA_CONFIG)
    p = plan(load_profile("rtx5060ti-tp2-fp8"), described_host(24 * GiB, "linux"), model_dir=folder)
    assert not p.hybrid  # the folder's config.json still wins: it is what SGLang loads
    w = [x for x in p.warnings if x.startswith("model: ")]
    assert len(w) == 1, p.warnings
    assert f"config.json ({tmp_path / 'config.json'})" in w[0]
    assert "llama (dense: 32 layers, 8 KV heads of 128)" in w[0]
    assert "not the profile's model.architecture qwen3_5_text (hybrid GDN: 64 layers, full attention every 4, 4 KV heads of 256)" in w[0]


def test_a_matching_config_json_adds_no_warning_and_a_differing_field_is_named(tmp_path):
    prof = load_profile("rtx5060ti-tp2-fp8")
    same = prof.model.architecture.model_dump(exclude_none=True)
    p = plan(prof, described_host(24 * GiB, "linux"), model_dir=_folder(tmp_path, same))
    assert not [x for x in p.warnings if x.startswith("model: ")], p.warnings
    other = dict(same, num_key_value_heads=8)
    p = plan(prof, described_host(24 * GiB, "linux"), model_dir=_folder(tmp_path, other))
    w = [x for x in p.warnings if x.startswith("model: ")]
    assert len(w) == 1 and "qwen3_5_text with num_key_value_heads 8 (model.architecture: 4)" in w[0], w
