"""The GPU rig's profiles and models, checked on a CPU machine: the profiles describe the models
``make_model.py`` makes, and they plan like any box; the shape-true rig allocates one TP-2 rank of
``rtx5060ti-tp2-fp8``'s per-token KV and per-slot mamba bytes at TP 1."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

RIG = Path(__file__).resolve().parent
GiB = 2**30


def _make_model():
    spec = importlib.util.spec_from_file_location("rig_make_model", RIG / "make_model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rig_make_model"] = mod
    spec.loader.exec_module(mod)
    return mod


mm = _make_model()


def _plan(profile: str, ratio: float | None = None, host=None):
    from escha_deploy.facts.machine import described_host
    from escha_deploy.planner import plan
    from escha_deploy.profile import load_profile

    return plan(load_profile(profile), host or described_host(128 * GiB, "linux"), ratio=ratio)


def _fp8_ratio() -> float:
    from escha_deploy.facts.machine import described_host

    return _plan("rtx5060ti-tp2-fp8", host=described_host(16 * GiB, "wsl2")).recommended_ratio


@pytest.mark.parametrize("name", ["tiny", "shape-true"])
def test_profile_architecture_is_the_model_made(name):
    from escha_deploy.profile import load_profile

    prof = load_profile(str(RIG / f"h200-{name}.yaml"))
    arch = prof.model.architecture.model_dump(exclude_none=True)
    made = mm.architecture(mm.CONFIGS[name])
    assert {k: arch.get(k) for k in made} == made
    assert prof.model.path == f"/tmp/escha-rig/models/{name}"
    assert (prof.hardware.gpu_count, prof.runtime.tp_size) == (1, 1)


def test_tiny_rig_plans_ok():
    p = _plan(str(RIG / "h200-tiny.yaml"))
    assert p.verdict == "ok", p.reasons
    assert (p.per_rank.device_kv_tokens, p.per_rank.host_kv_tokens, p.page_size) == (2048, 4097, 1)


def test_shape_true_rig_is_one_seed_rank():
    """KV bytes per token (bf16 here, fp8 on the seed: twice) and mamba bytes per slot equal one
    TP-2 rank of rtx5060ti-tp2-fp8's; its device pool; the seed box's recommended ratio (4.0 when
    this was written) gives the host pools SGLang allocated on the H200 (114,689 KV tokens,
    41 mamba slots)."""
    ratio = _fp8_ratio()
    seed = _plan("rtx5060ti-tp2-fp8", ratio).per_rank
    p = _plan(str(RIG / "h200-shape-true.yaml"), ratio)
    assert p.verdict == "ok", p.reasons
    r = p.per_rank
    assert p.kv_cache_dtype in ("auto", "bf16") and r.device_kv_bytes_per_token == 2 * seed.device_kv_bytes_per_token
    assert r.mamba_bytes_per_slot == seed.mamba_bytes_per_slot
    assert (r.device_kv_tokens, r.device_mamba_slots) == (seed.device_kv_tokens, seed.device_mamba_slots) == (28672, 10)
    assert (r.host_kv_tokens, r.host_mamba_slots) == (seed.host_kv_tokens, seed.host_mamba_slots)
    if ratio == 4.0:
        assert (r.host_kv_tokens, r.host_mamba_slots) == (114_689, 41)


def test_the_planned_shape_true_rig_gets_the_plans_host_tier():
    """h200-shape-true-planned.yaml on a runtime with the series' four patches: 56 host mamba states
    (ESCHA_HICACHE_HOST_MAMBA_SLOTS) and ratio 1.95, all 8 of 8 x 6,000 back at 5,120 tokens: what
    the GPU runs compare with the real server (docs/runtime.md)."""
    from escha_deploy.facts.machine import described_host
    from escha_deploy.planner import plan
    from escha_deploy.profile import load_profile
    from escha_deploy.sglang.capabilities import SERIES_CAPABILITIES
    from escha_deploy.utils.units import GiB

    p = plan(load_profile(str(RIG / "h200-shape-true-planned.yaml")), described_host(128 * GiB, "linux"),
             capabilities=frozenset(SERIES_CAPABILITIES))
    assert p.verdict == "ok", p.reasons
    assert (p.hicache.ratio, p.hicache.host_mamba_slots) == (1.95, 56)
    assert (p.per_rank.host_kv_tokens, p.per_rank.host_mamba_slots) == (55_911, 57)
    planned = p.host_tier_reach[0]
    assert (planned.verdict, planned.restored, planned.restore_tokens) == ("all", 8, 5_120)
    # the stock rig keeps SGLang's split: its parents' workload and 0004 count are not the rig's
    stock = plan(load_profile(str(RIG / "h200-shape-true.yaml")), described_host(128 * GiB, "linux"),
                 capabilities=frozenset(SERIES_CAPABILITIES))
    assert stock.hicache.host_mamba_slots is None and stock.host_tier_reach == []


def test_make_model_refuses_an_unknown_config(tmp_path, capsys):
    assert mm.main(["nonesuch", str(tmp_path / "m")]) == 2
    assert "nonesuch: not a config name (tiny, tiny-mtp, shape-true) or JSON file" in capsys.readouterr().err


def test_the_nextn_run_plans_the_drafts_layer_packed(tmp_path):
    """The sets of tests/runtime/test_speculative_gpu.py on a folder of the ``tiny-mtp`` model's
    shape (its architecture, ``mtp_num_hidden_layers: 1``, the ``mtp.*`` tensor names make_model.py
    writes, in a safetensors header): NEXTN packs the draft's one layer into the host KV pool,
    2,048 B per token where the target's one full-attention layer takes 1,024, and the device
    budget carries the draft's KV at the target's tokens."""
    import json
    import struct

    from escha_deploy.facts.machine import described_host, read_draft_inputs
    from escha_deploy.planner import plan
    from escha_deploy.profile import load_profile
    from tests.oracle.cases import config_json
    from tests.runtime.test_speculative_gpu import LAYER_BYTES, SETS

    assert mm.CONFIGS["tiny-mtp"] == {**mm.CONFIGS["tiny"], "mtp_num_hidden_layers": 1}
    d = tmp_path / "tiny-mtp"
    d.mkdir()
    sets = [s.replace("/tmp/escha-rig/models/tiny-mtp", str(d)) for s in SETS]
    prof = load_profile(str(RIG / "h200-tiny.yaml"), sets)
    (d / "config.json").write_text(json.dumps({**config_json(prof.model.architecture), "mtp_num_hidden_layers": 1}))
    header = json.dumps({"mtp.fc.weight": {"dtype": "BF16", "shape": [512, 1024], "data_offsets": [0, 1048576]}})
    (d / "model-mtp.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(1048576))
    p = plan(prof, described_host(128 * GiB, "linux"), draft=read_draft_inputs(prof))
    assert p.verdict == "ok", p.reasons
    r = p.per_rank
    assert (r.device_kv_bytes_per_token, r.host_kv_bytes_per_token) == (LAYER_BYTES, 2 * LAYER_BYTES) == (1024, 2048)
    assert r.host_kv_bytes == r.host_kv_tokens * 2048 and r.host_draft_kv_bytes == 0
    assert r.device_draft_kv_bytes == (r.device_kv_tokens + 1) * 1024
