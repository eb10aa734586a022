"""The fork's mixed HP+INT2 KV window, as its report describes it.

The fork behind ``rtx5060ti-tp2`` (OSCAR INT2 KV, sgl-project#32129 / FutureMLS-Lab/OSCAR) carries
a "mixed HP+INT2 KV window" (a high-precision sink and recent-window arena beside the INT2 pool)
but never constructs it on a hybrid GDN model, and OSCAR-derived SGLang builds it only with
``SGLANG_ENABLE_MIXED_KV_WINDOWS`` set and no speculative decoding
(``model_executor/pool_configurator.py: _compute_cell_size``). So the plan counts the arena and
renders the window's variables only where ``runtime.kv_cache.int2.mixed_windows`` turns it on;
on a hybrid model turning it on is refused, naming the key. Before, every INT2 plan counted
27,951,104 B per rank of "device INT2 bf16 arena: sink + recent windows" on ``rtx5060ti-tp2`` and
rendered ``SGLANG_MIXED_KV_HP_DTYPE``, ``_PREFIX_TOKENS`` and ``_RECENT_TOKENS`` for a window that
is never built.
"""

from __future__ import annotations

import json

from escha_deploy.facts.machine import described_host
from escha_deploy.pipeline.argv import server_env
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile
from tests.oracle.cases import DENSE_ARCH

GiB = 2**30
WINDOW_ENV = {"SGLANG_ENABLE_MIXED_KV_WINDOWS", "SGLANG_MIXED_KV_HP_DTYPE", "SGLANG_MIXED_KV_PREFIX_TOKENS",
              "SGLANG_MIXED_KV_RECENT_TOKENS"}


def _plan(sets=(), ram=64 * GiB):
    prof = load_profile("rtx5060ti-tp2", list(sets))
    p = plan(prof, described_host(ram, "linux"))
    return p, server_env(p, prof)


def test_the_shipped_int2_profile_counts_no_window_and_renders_none(cli):
    p, env = _plan()
    assert p.verdict == "ok", p.reasons
    assert p.per_rank.device_int2_hp_bytes == 0
    assert not WINDOW_ENV & set(env)
    assert env["SGLANG_MIXED_KV_SCALE_DTYPE"] == "float32"  # the INT2 layout's, read with or without the window
    assert not any(d.rule == "INT2 high-precision arena" for d in p.decisions)
    r = cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "64GiB")
    assert r.code == 0, r.err
    assert "INT2 bf16 arena" not in r.out


def test_turning_the_window_on_a_hybrid_model_is_refused_naming_the_key(cli):
    r = cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "64GiB", "--set", "runtime.kv_cache.int2.mixed_windows=true",
            "-f", "json")
    assert r.code == 3 and "Traceback" not in r.err
    reasons = json.loads(r.out)["reasons"]
    assert [x for x in reasons if x.startswith("runtime.kv_cache.int2.mixed_windows: true on a hybrid (GDN) model")]


def test_on_a_dense_model_the_window_is_counted_and_rendered_when_turned_on():
    dense = [f"model.architecture={DENSE_ARCH}", "runtime.max_total_tokens=100000", "runtime.max_running_requests=2"]
    off, off_env = _plan(dense)
    on, on_env = _plan(dense + ["runtime.kv_cache.int2.mixed_windows=true"])
    assert off.per_rank.device_int2_hp_bytes == 0 and not WINDOW_ENV & set(off_env)
    # (64 sink + 2 requests x (256 + 8 - 1)) slots x 64 layers x K,V x 4 heads x 128 x bf16
    assert on.per_rank.device_int2_hp_bytes == (64 + 2 * (256 + 8 - 1)) * 64 * 2 * 4 * 128 * 2
    assert WINDOW_ENV <= set(on_env) and on_env["SGLANG_ENABLE_MIXED_KV_WINDOWS"] == "1"
