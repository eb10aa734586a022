"""``plan``'s host_hit_cost: loading a cached prefix back from host RAM against recomputing it.

Formula (``planner/restore_cost.py``): load-back bytes per rank = tokens x host KV bytes per
token + one mamba slot; seconds = bytes / doctor's host -> device GB/s (1e9); recompute =
tokens / the prefill rate (bench's last on this box, else ``hicache.prefill_tokens_per_s``).
``rtx5060ti-tp2``: 6,144 host KV bytes per token, a mamba slot of 76,972,032 B, the profile's
1,010 tok/s. Expected by hand for 8,000 tokens at 20 GB/s: 8,000 x 6,144 + 76,972,032 =
126,124,032 B -> 6.3062 ms; recompute 8,000 / 1,010 = 7.9208 s.
"""

import json
import types

import pytest

from escha_deploy.bench.last import from_report, save_last_prefill
from escha_deploy.facts.prefill import LastPrefill
from escha_deploy.facts.saved import load_last_prefill
from escha_deploy.facts.machine import described_host
from escha_deploy.planner import plan
from escha_deploy.planner.restore_cost import NOT_MEASURED, host_hit_cost
from escha_deploy.facts.saved import RestoreBandwidth
from escha_deploy.profile import load_profile
from escha_deploy.utils.units import GiB

BW = {"method": "pinned copy_ (torch, cudaHostAlloc buffer from the runtime hook)", "bytes": GiB,
      "load_gbps": 20.0, "backup_gbps": 18.0, "page_bytes": 49_152, "page_load_gbps": 2.0, "page_backup_gbps": 1.5}


@pytest.fixture
def facts(tmp_path):
    f = tmp_path / "facts.json"
    f.write_text(json.dumps({
        "schema_version": 1,
        "host": {"platform": "wsl2", "mem_total_bytes": 16 * GiB},
        "findings": {"created_at": "2026-12-01T09:00:00+00:00", "host_id": "wsl-box", "platform": "wsl2",
                     "host_allocator": "pinned", "restore_bandwidth": BW},
    }))
    return str(f)


def test_plan_with_a_measured_bandwidth_prints_both_figures(cli, facts):
    r = cli("plan", "-p", "rtx5060ti-tp2", "--facts", facts, "-f", "json")
    hh = json.loads(r.out)["host_hit_cost"]
    row = {x["prefix_tokens"]: x for x in hh["rows"]}
    assert sorted(row) == [1_000, 8_000, 32_000]
    assert row[8_000]["load_bytes_per_rank"] == 8_000 * 6_144 + 76_972_032 == 126_124_032
    assert row[8_000]["load_s"] == pytest.approx(126_124_032 / 20e9)
    assert row[8_000]["recompute_s"] == pytest.approx(8_000 / 1_010)
    assert hh["load_source"].startswith("doctor's restore probe (pinned copy_") and "the facts file" in hh["load_source"]
    assert hh["prefill_source"] == "hicache.prefill_tokens_per_s (the profile)"
    t = cli("plan", "-p", "rtx5060ti-tp2", "--facts", facts)
    assert "host_hit_cost" in t.out and "6.3 ms at 20 GB/s" in t.out and "7.92 s" in t.out
    assert "doctor's restore probe" in t.out


def test_without_a_measurement_plan_says_so_and_names_doctor(cli):
    r = cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2", "-f", "json")
    hh = json.loads(r.out)["host_hit_cost"]
    assert hh["load_source"] == NOT_MEASURED == "not measured: run `escha-deploy doctor`"
    assert all(x["load_s"] is None and x["recompute_s"] is not None for x in hh["rows"])
    t = cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2")
    assert "not measured: run `escha-deploy doctor`" in t.out


def test_no_rate_anywhere_is_not_known():
    prof = load_profile("linux-tp2-l3")  # another box: the profile leaves the rate null
    hh = plan(prof, described_host(128 * GiB, "linux")).host_hit_cost
    assert hh.prefill_tokens_per_s is None and hh.prefill_source.startswith("not known")
    assert all(x.recompute_s is None for x in hh.rows)


def test_bench_last_measurement_of_the_profiles_model_wins_over_the_profile():
    host = described_host(16 * GiB, "wsl2").model_copy(update={
        "prefill_tokens_per_s": 2_000.0, "prefill_source": "`escha-deploy bench` on this box at 2026-12-01T10:00",
        "prefill_model": "qwen3.8-27b-escha-w2"})  # rtx5060ti-tp2's model.served_model_name
    hh = plan(load_profile("rtx5060ti-tp2"), host).host_hit_cost
    assert hh.prefill_tokens_per_s == 2_000.0 and hh.prefill_source.startswith("`escha-deploy bench`")
    assert hh.rows[0].recompute_s == pytest.approx(1_000 / 2_000)
    # without a served_model_name the server answers to model.path (SGLang's default)
    prof = load_profile("rtx5060ti-tp2", ["model.served_model_name=null"])
    host = host.model_copy(update={"prefill_model": "/models/Qwen3.8-27B-Escha-W2"})
    assert plan(prof, host).host_hit_cost.prefill_tokens_per_s == 2_000.0


def _plant_bench(model: str) -> None:
    from escha_deploy.facts.saved import last_prefill_path

    rec = LastPrefill(created_at="2026-12-01T10:00:00+00:00", url="http://127.0.0.1:54759", model=model,
                      hicache=False, prompt_tokens=2_000, tokens_per_s=275_287.0)
    save_last_prefill(rec, last_prefill_path())


def test_bench_of_another_model_is_not_this_profiles_recompute_rate(cli):
    """A bench of the stand-in model on this box is not the rate of rtx5060ti-tp2's model: plan
    falls back to the profile's hicache.prefill_tokens_per_s and says why on the same line (it
    printed the stand-in's 275,287 tok/s as this profile's recompute rate)."""
    _plant_bench("standin-hybrid-27b")
    r = cli("plan", "-p", "rtx5060ti-tp2", "-f", "json")
    hh = json.loads(r.out)["host_hit_cost"]
    assert hh["prefill_tokens_per_s"] == 1_010.0
    assert hh["prefill_source"] == ("hicache.prefill_tokens_per_s (the profile) (bench's last cold prefill measured "
                                    "standin-hybrid-27b, not this profile's qwen3.8-27b-escha-w2: not used)")
    t = cli("plan", "-p", "rtx5060ti-tp2")
    line = next(x for x in t.out.splitlines() if "recompute:" in x)
    assert "1010 tok/s, hicache.prefill_tokens_per_s" in line and "standin-hybrid-27b, not this profile's" in line
    assert "275287" not in t.out
    # a profile with no rate of its own: not known, and why
    hh = json.loads(cli("plan", "-p", "rtx5060ti-tp2", "--set", "hicache.prefill_tokens_per_s=null",
                        "-f", "json").out)["host_hit_cost"]
    assert hh["prefill_tokens_per_s"] is None and hh["prefill_source"].startswith("not known")
    assert hh["prefill_source"].endswith("(bench's last cold prefill measured standin-hybrid-27b, not this "
                                         "profile's qwen3.8-27b-escha-w2: not used)")
    # the same record of this profile's model is used
    _plant_bench("qwen3.8-27b-escha-w2")
    hh = json.loads(cli("plan", "-p", "rtx5060ti-tp2", "-f", "json").out)["host_hit_cost"]
    assert hh["prefill_tokens_per_s"] == 275_287.0 and hh["prefill_source"].startswith("`escha-deploy bench`")


def test_prefixes_are_capped_at_the_context_length_and_a_small_one_uses_the_page_figure():
    hh = host_hit_cost(host_kv_bytes_per_token=16, mamba_slot_bytes=0, context_length=4_096,
                       bandwidth=RestoreBandwidth(**BW), bandwidth_origin="x", prefill_tokens_per_s=None,
                       prefill_source=None)
    assert [r.prefix_tokens for r in hh.rows] == [1_000, 4_096]
    assert hh.rows[0].load_gbps == 2.0   # 16,000 B <= one 49,152 B page
    assert hh.rows[1].load_gbps == 20.0  # 65,536 B > the page


def test_bench_saves_its_hicache_off_prefill(tmp_path):
    def run(hicache, rate):
        return types.SimpleNamespace(facts=types.SimpleNamespace(hicache=hicache, url="http://127.0.0.1:30000",
                                                                 model="m"),
                                     prefill=types.SimpleNamespace(tokens_per_s=rate, prompt_tokens=18_000))
    rec = from_report(types.SimpleNamespace(runs=[run(True, 900.0), run(False, 1_010.0)]))
    assert isinstance(rec, LastPrefill) and (rec.hicache, rec.tokens_per_s) == (False, 1_010.0)
    path = tmp_path / "bench-last.json"
    save_last_prefill(rec, path)
    back = load_last_prefill(path)
    assert back == rec and "HiCache off" in back.source and "18,000-token cold prefill" in back.source
    assert load_last_prefill(tmp_path / "absent.json") is None
