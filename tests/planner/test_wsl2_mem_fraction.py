"""Under WSL2 on consumer Blackwell (sm_12x) the plan lowers SGLang's default
mem_fraction_static by ``safety.wsl2_mem_fraction_drop`` (default 0.08; microsoft/WSL#40401,
#41176), beyond the hidden VRAM it subtracts, and says why; a fraction the profile sets is kept,
Linux and other architectures get SGLang's default, and the plan still reports SGLang's own
default (what the oracle compares)."""

from __future__ import annotations

import pytest

from escha_deploy.facts.machine import described_host
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile
from escha_deploy.utils.units import GiB


def device(platform: str, *sets: str):
    prof = load_profile("rtx5060ti-tp2", ["runtime.mem_fraction_static=null", *sets])
    return plan(prof, described_host(32 * GiB, platform)).device


def test_wsl2_sm120_lowers_the_default_by_the_profile_field():
    linux, wsl = device("linux"), device("wsl2")
    assert linux.mem_fraction_static == linux.sglang_default_mem_fraction_static
    assert wsl.sglang_default_mem_fraction_static == linux.sglang_default_mem_fraction_static  # SGLang's own
    assert wsl.mem_fraction_static == pytest.approx(wsl.sglang_default_mem_fraction_static - 0.08)
    assert "safety.wsl2_mem_fraction_drop 0.08" in wsl.mem_fraction_static_source
    assert "microsoft/WSL#40401" in wsl.mem_fraction_static_source
    custom = device("wsl2", "safety.wsl2_mem_fraction_drop=0.05")
    assert custom.mem_fraction_static == pytest.approx(custom.sglang_default_mem_fraction_static - 0.05)


def test_a_fraction_the_profile_sets_and_other_architectures_are_kept():
    assert device("wsl2", "runtime.mem_fraction_static=0.7").mem_fraction_static == 0.7
    ada = device("wsl2", 'hardware.compute_capability="8.9"')
    assert ada.mem_fraction_static == ada.sglang_default_mem_fraction_static
