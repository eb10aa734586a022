"""More boxes than the seed's. Each expected verdict is derived in the test from the stated
policy (pinned budget = memory base - ranks x 3 GiB - 1 GiB - 2 GiB) and SGLang's formulas,
not copied from the planner's output."""

import pytest

from escha_deploy.facts.host import HostFacts
from escha_deploy.facts.machine import described_host
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile
from escha_deploy.utils.units import GB, GiB, MiB


def policy_budget(base, ranks):
    return base - ranks * 3 * GiB - 1 * GiB - 2 * GiB


def fp8_pinned(profile, ratio, ranks):
    tokens = profile.runtime.max_total_tokens
    slots = profile.runtime.max_mamba_cache_size
    per_token = 16 * 2 * 2 * 256  # fp8: 16 layers x K,V x 2 heads x 256 x 1 B
    per_slot = 48 * (5120 * 3 * 2 + 24 * 128 * 128 * 2)  # bf16 SSM
    return ranks * ((int(tokens * ratio) + 1) * per_token + (int(slots * ratio) + 1) * per_slot)


def test_64gib_linux_host_takes_the_ratio_cap():
    prof = load_profile("rtx5060ti-tp2-fp8")
    host = described_host(64 * GiB, "linux")
    p = plan(prof, host)
    budget = policy_budget(64 * GiB, 2)
    assert p.budget.pinned_budget_bytes == budget
    # even the cap (hicache.max_ratio 4) fits with room: the recommendation is the cap
    assert fp8_pinned(prof, 4.0, 2) + 64 * MiB <= budget
    assert (p.verdict, p.recommended_ratio, p.hicache.ratio) == ("ok", 4.0, 4.0)
    assert p.pinned_total_bytes == fp8_pinned(prof, 4.0, 2)
    # the stock check: A = 64 - 1 - 6 = 57 GiB, reserve 10 GiB, worst ordering needs 3P + M
    P = (int(prof.runtime.max_total_tokens * 4.0) + 1) * 16_384
    M = (int(10 * 4.0) + 1) * 48 * (5120 * 3 * 2 + 24 * 128 * 128 * 2)
    assert 57 * GiB - 10 * GiB >= max(3 * P + M, 2 * P + 3 * M)
    assert p.runtime_check.stock == "accept"


def test_256gib_tp4_host():
    prof = load_profile("linux-tp2-l3", ["runtime.tp_size=4", "hardware.gpu_count=4",
                                          "hicache.hicache_storage_backend=null", "hicache.hicache_size=40"])
    host = described_host(256 * GiB, "linux")
    p = plan(prof, host)
    budget = policy_budget(256 * GiB, 4)
    assert p.budget.pinned_budget_bytes == budget
    # 4 ranks x 40 GB per rank (field report B02: --hicache-size is per rank)
    assert p.per_rank.pinned_bytes == pytest.approx(40 * GB, rel=0.001)
    assert p.pinned_total_bytes == 4 * p.per_rank.pinned_bytes
    expected = "ok" if p.pinned_total_bytes <= budget else "unsafe"
    assert p.verdict == expected == "ok"
    # 256 GiB - 4 x 3 - 1 - 2 GiB = 258.7 GB: 4 x 70 GB = 280 GB does not fit
    assert plan(prof, host, hicache_size_gb=70).verdict == ("ok" if 4 * 70 * GB <= budget else "unsafe") == "unsafe"


def test_container_cgroup_limit_below_host_ram_is_the_base():
    prof = load_profile("rtx5060ti-tp2-fp8")
    host = HostFacts(source="live", platform="linux", mem_total_bytes=128 * GiB, mem_available_bytes=120 * GiB,
                     cgroup_limit_bytes=16 * GiB, cgroup_usage_bytes=1 * GiB, in_container=True)
    p = plan(prof, host)
    budget = policy_budget(16 * GiB, 2)  # field report B05: the cgroup limit, not host RAM
    assert (p.budget.memory_base_bytes, p.budget.memory_base_source) == (16 * GiB, "cgroup memory limit 16.00 GiB (the server's cgroup)")
    assert p.budget.pinned_budget_bytes == budget
    assert p.pinned_total_bytes <= budget - 64 * MiB
    # a ratio that fits 128 GiB but not the cgroup is refused
    big = 6.0
    assert fp8_pinned(prof, big, 2) > budget
    assert plan(prof, host, ratio=big).verdict == "unsafe"


def test_wsl2_pinned_ceiling_caps_each_rank():
    prof = load_profile("rtx5060ti-tp2-fp8")
    ceiling = 1 * GB
    host = described_host(32 * GiB, "wsl2").model_copy(update={"pinned_ceiling_bytes": ceiling, "pinned_ceiling_reached": True})
    p = plan(prof, host)
    assert p.per_rank.pinned_bytes <= ceiling
    assert p.budget.pinned_ceiling_bytes == ceiling
    unbounded = plan(prof, described_host(32 * GiB, "wsl2"))
    assert unbounded.per_rank.pinned_bytes > ceiling  # the ceiling, not RAM, decided
    assert any("unmeasured" in w for w in unbounded.warnings)


#: The fp8 profile sized to fit WSL2's hidden VRAM (1.31 GiB) with SGLang's device floor
#: (docs/planner.md, "Warnings the shipped profiles print").
FP8_ON_WSL2 = ("runtime.mem_fraction_static=0.82", "runtime.max_total_tokens=24576", "runtime.context_length=24576")


def test_fp8_profile_keeps_sglangs_device_floor_on_wsl2():
    """Under WSL2 (1.31 GiB of VRAM hidden) the fp8 profile still leaves SGLang's 1.88 GB floor;
    its former 0.88 did not."""
    p = plan(load_profile("rtx5060ti-tp2-fp8"), described_host(32 * GiB, "wsl2"))
    assert p.verdict == "ok" and p.device.fits and p.device.activation_room_bytes >= 1792 * 2**20
    old = plan(load_profile("rtx5060ti-tp2-fp8", ("runtime.mem_fraction_static=0.88",)), described_host(32 * GiB, "wsl2"))
    assert old.verdict == "unsafe" and any("1.88 GB SGLang keeps" in r for r in old.reasons)


def test_small_wsl2_vm_turns_hicache_off_under_auto():
    prof = load_profile("rtx5060ti-tp2-fp8", FP8_ON_WSL2)
    host = described_host(10 * GiB, "wsl2")  # budget 10 - 6 - 1 - 2 = 1 GiB: the reserves fit, ratio 1 does not
    assert 0 < policy_budget(10 * GiB, 2) < fp8_pinned(prof, 1.0, 2)
    p = plan(prof, host)
    assert p.verdict == "hicache_off" and not p.hicache.enabled
    assert p.pinned_total_bytes == 0
    assert p.recommended_ratio is None  # nothing to recommend below hicache.min_ratio with HiCache off
    assert "launchable without it" in p.reasons[0]
    assert "the RAM budget" in p.reasons[0] and ".wslconfig" in p.reasons[0]
    assert plan(prof, host, ratio=1).verdict == "unsafe"  # an explicit ratio is not silently dropped


def test_stock_runtime_on_wsl2_cannot_use_hicache():
    prof = load_profile("rtx5060ti-tp2-fp8", FP8_ON_WSL2)
    p = plan(prof, described_host(32 * GiB, "wsl2"), capabilities=frozenset())
    assert p.verdict == "hicache_off"
    assert "cudaHostRegister" in p.reasons[0]
    assert plan(prof, described_host(32 * GiB, "linux"), capabilities=frozenset()).hicache.enabled


def test_stock_runtime_check_decides_on_a_stock_image():
    """With no reserve patch the stock check (worst ordering, 10 GiB reserve) bounds the ratio."""
    prof = load_profile("rtx5060ti-tp2-fp8")
    host = described_host(24 * GiB, "linux")
    p = plan(prof, host, capabilities=frozenset({"hicache-host-allocator"}))
    assert p.runtime_check.applies == "stock"
    A = 24 * GiB - 1 * GiB - 6 * GiB
    r = p.hicache.ratio
    P = (int(prof.runtime.max_total_tokens * r) + 1) * 16_384
    M = (int(10 * r) + 1) * 48 * (5120 * 3 * 2 + 24 * 128 * 128 * 2)
    assert A - 10 * GiB >= max(3 * P + M, 2 * P + 3 * M)
    assert p.runtime_check.stock == "accept"
    patched = plan(prof, host)
    assert patched.hicache.ratio > r  # the patched runtime's budget allows more


def test_facts_file_cgroup_limit_reason_names_the_figure_and_source(cli, tmp_path):
    """A facts file's cgroup limit is named with its figure and where it came from, as a live
    reading names its file (the reason said only "cgroup memory limit")."""
    import json

    f = tmp_path / "facts.json"
    f.write_text(json.dumps({"schema_version": 1, "host": {"platform": "linux", "mem_total_bytes": 128 * GiB,
                                                           "cgroup_limit_bytes": 32 * GiB}}))
    d = json.loads(cli("plan", "-p", "rtx5060ti-tp2", "--facts", str(f), "-f", "json").out)
    src = "cgroup memory limit 32.00 GiB (facts file host.cgroup_limit_bytes)"
    assert d["budget"]["memory_base_source"] == src
    assert f"the pinned budget {src} - 2 x 3.00 GiB server processes" in d["reasons"][0]


def test_live_host_short_of_memory_now_says_so_in_the_verdict_line():
    """A live host whose MemAvailable now is below what the plan needs: the verdict stays ok
    (planning is against MemTotal; the room may be freed before start) but the verdict line
    and JSON say how short it is."""
    import contextlib
    import io

    from escha_deploy.cli.render_plan import render_plan

    prof = load_profile("rtx5060ti-tp2")
    host = HostFacts(source="live", platform="linux", mem_total_bytes=32 * GiB, mem_available_bytes=4 * GiB)
    p = plan(prof, host)
    assert p.verdict == "ok" and any("available now" in w for w in p.warnings)
    need = p.pinned_total_bytes + p.budget.server_processes_bytes + p.budget.os_reserve_bytes
    assert p.short_now_bytes == need - 4 * GiB > 0
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        render_plan(p)
    first, line = [ln for ln in buf.getvalue().splitlines() if ln.startswith("verdict:")]  # the answer, the reasons
    short = f"verdict: ok but {p.short_now_bytes / GB:.2f} GB short of memory available now (warning below)"
    assert line == short and first == f"{short}: HiCache --hicache-ratio {p.hicache.ratio:g}"
    enough = plan(prof, HostFacts(source="live", platform="linux", mem_total_bytes=32 * GiB,
                                  mem_available_bytes=30 * GiB))
    assert enough.short_now_bytes is None
    assert plan(prof, described_host(32 * GiB)).short_now_bytes is None
