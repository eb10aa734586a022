"""The launch values the planner decides beyond the pools (its ``launch_values`` step, and the
patched runtime's reserve in ``host_pools``) reach the argv and env exactly as the plan's
decision lines say: ``flags.py`` renders them and decides none of them.

Before, ``--set runtime.disable_custom_all_reduce=false`` left a decision line for
``--disable-custom-all-reduce`` while the argv had no such flag (the planner and ``flags.py``
each decided it). The matrix below covers every shipped profile, both settings of each key and
unset, on Linux and WSL2 (WSL2: NCCL's P2P transport off, microsoft/WSL#12467; no NVML facts:
custom all-reduce off at TP 2, sgl-project/sglang#4814).
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from escha_deploy.pipeline import argv as flags
from escha_deploy.facts.host import HostFacts
from escha_deploy.pipeline.argv import server_args, server_env
from escha_deploy.planner import STEPS, plan
from escha_deploy.profile import list_profiles, load_profile
from escha_deploy.utils.units import GiB

SETTINGS = [(), ("true",), ("false",)]


def _decided(p, value: str) -> bool:
    return any(d.value == value for d in p.decisions)


@pytest.mark.parametrize("profile", list_profiles())
def test_decision_lines_match_the_argv_and_env(profile):
    seen = set()
    for car, p2p, platform in itertools.product(SETTINGS, SETTINGS, ("linux", "wsl2")):
        sets = [f"runtime.disable_custom_all_reduce={v}" for v in car] + [f"container.nccl_p2p_disable={v}" for v in p2p]
        prof = load_profile(profile, sets)
        p = plan(prof, HostFacts(source="described", platform=platform, mem_total_bytes=64 * GiB))
        argv, env = server_args(p, prof), server_env(p, prof)
        assert ("--disable-custom-all-reduce" in argv) == _decided(p, "--disable-custom-all-reduce") \
            == p.custom_all_reduce_disabled, (sets, platform)
        assert ("NCCL_P2P_DISABLE" in env) == _decided(p, "NCCL_P2P_DISABLE=1") == p.nccl_p2p_disabled, (sets, platform)
        if car == ("false",):
            assert "--disable-custom-all-reduce" not in argv
        if p2p:
            assert p.nccl_p2p_disabled == (p2p == ("true",))
        strategy = p.mamba_radix_cache_strategy
        assert (strategy is not None) == ("--mamba-radix-cache-strategy" in argv)
        if strategy:
            assert argv[argv.index("--mamba-radix-cache-strategy") + 1] == strategy
        reserve = p.hicache.host_reserve_bytes
        assert env.get("ESCHA_HICACHE_HOST_RESERVE_BYTES") == (None if reserve is None else str(reserve))
        seen.add((p.custom_all_reduce_disabled, p.nccl_p2p_disabled))
    assert len(seen) >= 3  # the matrix reaches both values of both decisions


def test_the_reserve_is_set_only_for_the_patched_runtime():
    prof = load_profile("rtx5060ti-tp2")
    host = HostFacts(source="described", platform="linux", mem_total_bytes=64 * GiB)
    patched, stock = plan(prof, host), plan(prof, host, capabilities=frozenset())
    assert patched.hicache.host_reserve_bytes == patched.runtime_check.patched_reserve_bytes > 0
    assert stock.hicache.enabled and stock.hicache.host_reserve_bytes is None
    assert "ESCHA_HICACHE_HOST_RESERVE_BYTES" not in server_env(stock, prof)


def test_the_launch_values_are_a_step():
    assert [name for name, _ in STEPS][-1] == "launch_values"


def test_flags_reads_no_profile_key_the_planner_decides():
    """``flags.py`` reads the plan, not the profile keys the planner turns into a decision nor
    the runtime's capabilities (which decide the reserve env)."""
    tree = ast.parse(Path(flags.__file__).read_text())
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    decided = {"disable_custom_all_reduce", "nccl_p2p_disable", "capabilities", "needs", "hicache_ratio",
               "hicache_size", "max_total_tokens", "max_mamba_cache_size", "patched_reserve_bytes"}
    assert names & decided == set()


def test_a_step_run_before_the_step_it_reads_from_says_which():
    """Each step's outputs are typed as set; a step list out of order fails naming the step
    whose output was read too early, not with an AttributeError on None."""
    from escha_deploy.planner import PlanInputs, StepOrderError, _Ctx

    prof = load_profile("rtx5060ti-tp2")
    c = _Ctx(PlanInputs(profile=prof, host=HostFacts(source="described", platform="linux", mem_total_bytes=64 * GiB),
                        arch=prof.model.architecture, weights_bytes=0, weights_source="", capabilities=frozenset(),
                        ratio_override=None, size_override=None))
    steps = dict(STEPS)
    with pytest.raises(StepOrderError, match="before the model_shapes step"):
        steps["device_pools"](c)
