"""Planning the release that will run: its host guard, auto-size, memory defaults and parser,
chosen from the image, ``--sglang-version`` and ``runtime.sglang_version``.

The figures are computed by hand here from each release's wheel:
0.5.19 ``srt/mem_cache/pool_host/base.py: host_memory_budget_bytes`` (psutil available - 10 GiB)
// ranks; 0.5.23 the same with available = min(MemAvailable, cgroup headroom)
(``srt/mem_cache/host_memory.py: available_host_memory_bytes``), and its auto-size
(``srt/mem_cache/hicache_auto_size.py: auto_size_hicache``): budget = int(((available -
10 GiB) // ranks) x 0.8), ratio = min(2.0, budget x 0.95 / device bytes).
"""

from __future__ import annotations

import json

import pytest

from escha_deploy.utils.errors import BadInput, Refused
from escha_deploy.facts.host import HostFacts
from escha_deploy.facts.machine import described_host
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile
from escha_deploy.sglang.releases import choose_release

GiB = 2**30
NO_NEEDS = ["--set", "runtime.needs=[]"]


def _plan_json(cli, version: str, *extra: str) -> dict:
    r = cli("plan", "--profile", "rtx5060ti-tp2-fp8", "--sglang-version", version, "--host-ram", "16GiB", "--wsl2",
            *NO_NEEDS, *extra, "-f", "json")
    assert r.code == 0, r.err
    return json.loads(r.out)


def test_the_16_gib_wsl2_box_on_0_5_23_beside_0_5_19(cli):
    old, new = _plan_json(cli, "0.5.19"), _plan_json(cli, "0.5.23")
    assert (old["sglang_release"], new["sglang_release"]) == ("0.5.19", "0.5.23")
    assert new["sglang_release_source"] == "--sglang-version"
    # MemAvailable when the pools are built: 16 GiB - 1 GiB OS - 2 x 3 GiB server processes
    a = 16 * GiB - 1 * GiB - 2 * 3 * GiB
    g_old, g_new = old["host_guard"], new["host_guard"]
    assert g_old["kind"] == "per-pool-available" and g_new["kind"] == "cgroup-bounded"
    # no cgroup limit on the described VM: 0.5.23's min(MemAvailable, headroom) is MemAvailable
    assert g_old["available_bytes"] == g_new["available_bytes"] == a == 9663676416
    assert g_old["reserve_bytes"] == g_new["reserve_bytes"] == 10 * GiB
    # explicit ratio: one reading per pool and rank, (9 GiB - 10 GiB) // 2 = -0.5 GiB: any pool is refused
    assert g_old["share_per_rank_bytes"] == g_new["share_per_rank_bytes"] == -536870912
    assert g_old["auto_size"] is None
    au = g_new["auto_size"]
    device = new["per_rank"]["device_kv_bytes"] + new["per_rank"]["device_mamba_bytes"]
    assert device == 469778432 + 431456256 == 901234688
    budget = int((-1 * GiB // 2) * 0.8)
    assert au["budget_per_rank_bytes"] == budget == -429496729
    assert au["ratio"] == round(min(2.0, budget * 0.95 / device), 3) == -0.453
    assert au["refused"] and "No host memory is left for HiCache after the 10 GiB reserve" in au["detail"]
    # the same card tier (< 20 GiB: chunked prefill 2048, decode max bs 8) in both: same default fraction
    assert old["device"]["sglang_default_mem_fraction_static"] == new["device"]["sglang_default_mem_fraction_static"] == 0.662
    # WSL2 without the series' host allocator: HiCache off on both (sglang#40232 is open in 0.5.23)
    assert old["verdict"] == new["verdict"] == "hicache_off"


def test_the_table_prints_the_guard_and_what_auto_size_would_pick(cli):
    r = cli("plan", "--profile", "rtx5060ti-tp2-fp8", "--sglang-version", "0.5.23", "--host-ram", "16GiB", "--wsl2",
            *NO_NEEDS)
    assert r.code == 0, r.err
    assert "SGLang 0.5.23 (--sglang-version)" in r.out
    assert "SGLang 0.5.23's host guard (cgroup-bounded): available 9.00 GiB" in r.out
    assert "auto-size (not used: escha renders the ratio) would pick ratio -0.453 and refuse" in r.out
    assert "flags verified against SGLang 0.5.23's parser catalog" in r.out


def test_cgroup_bounded_reading_and_a_positive_auto_size():
    """A 64 GiB host, the server's cgroup limited to 24 GiB: 0.5.19's psutil reading is the
    planner's base model (24 GiB - 1 GiB - 6 GiB = 17 GiB); 0.5.23's is min(MemAvailable
    64 - 1 - 6 = 57 GiB, headroom 24 - 6 = 18 GiB) = 18 GiB."""
    prof = load_profile("rtx5060ti-tp2-fp8", ["runtime.needs=[]"])
    host = HostFacts(source="described", platform="linux", mem_total_bytes=64 * GiB, cgroup_limit_bytes=24 * GiB)
    old, new = plan(prof, host, release="0.5.19"), plan(prof, host, release="0.5.23")
    assert old.host_guard.available_bytes == 17 * GiB
    assert new.host_guard.available_bytes == 18 * GiB
    assert new.host_guard.share_per_rank_bytes == (18 * GiB - 10 * GiB) // 2 == 4 * GiB
    device = new.per_rank.device_kv_bytes + new.per_rank.device_mamba_bytes
    budget = int(4 * GiB * 0.8)
    au = new.host_guard.auto_size
    assert au.budget_per_rank_bytes == budget
    assert au.ratio == round(min(2.0, budget * 0.95 / device), 3) == 2.0  # capped at the default ratio
    assert not au.refused and au.host_kv_bytes + au.host_mamba_bytes <= budget
    assert new.runtime_check.release == "0.5.23" and "cgroup headroom" in new.runtime_check.stock_available_detail


def test_the_release_comes_from_the_image_then_the_flag_then_the_profile():
    assert choose_release().version == "0.5.19"
    assert choose_release(profile="0.5.23").source == "runtime.sglang_version"
    assert choose_release(flag="0.5.23", profile="0.5.23").source == "--sglang-version"
    got = choose_release(image=("0.5.23", "the image x"), flag="0.5.23")
    assert (got.version, got.source) == ("0.5.23", "the image x")
    assert choose_release(image=(None, "the image x"), flag="0.5.23").source == "--sglang-version"
    with pytest.raises(Refused) as e:
        choose_release(image=("0.5.23", "the image x"), profile="0.5.19")
    assert str(e.value) == "SGLang release: the image x says 0.5.23, runtime.sglang_version says 0.5.19"
    with pytest.raises(Refused, match="runs SGLang 0.4.0, not a supported release"):
        choose_release(image=("0.4.0", "the image x"))
    with pytest.raises(BadInput, match="--sglang-version: SGLang 0.4.0 is not a supported release"):
        choose_release(flag="0.4.0")


def test_flag_and_profile_that_disagree_are_exit_3_naming_both(cli):
    r = cli("plan", "--profile", "rtx5060ti-tp2-fp8", "--sglang-version", "0.5.23", "--host-ram", "16GiB",
            "--set", "runtime.sglang_version=0.5.19", *NO_NEEDS)
    assert r.code == 3
    assert "--sglang-version says 0.5.23, runtime.sglang_version says 0.5.19" in r.err


def test_series_capabilities_on_another_release_are_refused_naming_it(cli, series_only_where_made):
    r = cli("plan", "--profile", "rtx5060ti-tp2-fp8", "--sglang-version", "0.5.23", "--host-ram", "32GiB")
    assert r.code == 3
    assert "come from our patch series, which exists for SGLang 0.5.19; the plan is for SGLang 0.5.23" in r.out
    assert "runtime rebase --check 0.5.23" in r.out


def test_the_argv_is_checked_against_the_planned_release(cli):
    args = ("plan", "--profile", "rtx5060ti-tp2-fp8", "--host-ram", "32GiB", *NO_NEEDS,
            "--set", "runtime.extra_args=[--stream-output]")
    assert cli(*args, "--sglang-version", "0.5.19").code == 0
    r = cli(*args, "--sglang-version", "0.5.23")
    assert r.code == 2
    assert "--stream-output: unknown to sglang 0.5.23" in r.err


def test_an_image_tag_of_another_release_warns(cli):
    r = _plan_json(cli, "0.5.19", "--set", "container.image=lmsysorg/sglang:v0.5.21")
    assert any(w.startswith("container.image: lmsysorg/sglang:v0.5.21 is tagged for SGLang 0.5.21, but the plan "
                            "is for SGLang 0.5.19") for w in r["warnings"]), r["warnings"]
    assert not any("is tagged for" in w for w in _plan_json(cli, "0.5.19")["warnings"])
    # left unset, the images are the default release's: the warning says how to get the planned one's
    unset = [w for w in _plan_json(cli, "0.5.23")["warnings"] if "is tagged for" in w]
    assert unset == [
        "container.image: escha-sglang:0.5.19-hicache, the default while the profile names no release, is tagged "
        "for SGLang 0.5.19, but the plan is for SGLang 0.5.23 (--sglang-version); set runtime.sglang_version: "
        "0.5.23 to run and build on that release's images",
        "runtime.base_image: lmsysorg/sglang:v0.5.19, the default while the profile names no release, is tagged "
        "for SGLang 0.5.19, but the plan is for SGLang 0.5.23 (--sglang-version); set runtime.sglang_version: "
        "0.5.23 to run and build on that release's images"], unset
    assert not any("is tagged for" in w for w in _plan_json(cli, "0.5.23", "--set", "runtime.sglang_version=0.5.23")["warnings"])


def test_plan_without_a_release_uses_the_default():
    p = plan(load_profile("rtx5060ti-tp2-fp8"), described_host(32 * GiB, "linux"))
    assert p.sglang_release == "0.5.19" and p.host_guard.kind == "per-pool-available"


def test_a_release_without_our_series_is_described_as_its_stock_runtime(cli, series_only_where_made):
    """rtx5060ti-tp2 needs our series; with none for 0.5.23 (runtime_patches/ without its
    rebased folder) it is refused there (exit 3), and its runtime-check table and warnings
    describe 0.5.23's stock runtime, not 0.5.19's patched one (they said "patched, reserve 2.00
    GiB (applies) | accept" and "on this runtime (SGLang 0.5.19 with this series, ...)")."""
    r = cli("plan", "--profile", "rtx5060ti-tp2", "--sglang-version", "0.5.23", "--host-ram", "32GiB")
    assert r.code == 3, r.err
    rows = [" ".join(x.split("│")[1:3]).split() for x in r.out.splitlines() if x.startswith("│ stock 0.5.23")
            or x.startswith("│ patched")]
    assert rows[0][:3] == ["stock", "0.5.23", "(applies)"], rows
    assert rows[1] == ["patched", "(our", "series)", "-"], rows
    text = " ".join(r.out.split())
    assert "our patch series exists for SGLang 0.5.19; there is none for 0.5.23" in text
    assert "0.5.19 with this series" not in text and "reserve 2.00 GiB" not in text
    assert "on this runtime (stock SGLang 0.5.23: our patch series exists for SGLang 0.5.19" in text
    j = json.loads(cli("plan", "--profile", "rtx5060ti-tp2", "--sglang-version", "0.5.23", "--host-ram", "32GiB",
                       "-f", "json").out)
    assert (j["runtime_check"]["applies"], j["runtime_check"]["patched"]) == ("stock", None)
    # on the series' own release the patched check applies, as before
    j = json.loads(cli("plan", "--profile", "rtx5060ti-tp2", "--host-ram", "32GiB", "-f", "json").out)
    assert (j["runtime_check"]["applies"], j["runtime_check"]["patched"]) == ("patched", "accept")


def test_a_release_with_its_rebased_series_plans_the_patched_runtime(cli):
    """runtime_patches/0.5.23/ holds our series rebased onto 0.5.23: a profile needing it plans
    0.5.23's patched runtime (its check applies), not a refusal."""
    from escha_deploy.sglang.releases import series_releases

    assert {"0.5.19", "0.5.23"} <= set(series_releases())  # a release added as data may bring its own
    r = cli("plan", "--profile", "rtx5060ti-tp2-fp8", "--sglang-version", "0.5.23", "--host-ram", "32GiB",
            "-f", "json")
    assert r.code == 0, r.err
    j = json.loads(r.out)
    assert j["sglang_release"] == "0.5.23" and j["verdict"] == "ok", j["reasons"]
    assert (j["runtime_check"]["applies"], j["runtime_check"]["patched"]) == ("patched", "accept")
    assert not any("patch series" in x for x in j["reasons"] + j["warnings"]), j["reasons"] + j["warnings"]


def test_each_guard_kind_reads_its_own_available_memory(monkeypatch):
    """What each host guard kind reads as available under a cgroup limit, by hand from the
    wheels' ``mem_cache/host_memory.py: available_host_memory_bytes``: 0.5.23 (``cgroup-bounded``)
    takes the cgroup's usage less its page cache, so only the server processes count; 0.5.21
    (``cgroup-bounded-cache-charged``: "charged file cache is not assumed reclaimable") takes the
    usage whole, so the weights the ranks read, left in the page cache, count too;
    ``per-pool-available`` reads psutil's MemAvailable alone. The facts are 0.5.23's with the
    kind replaced (a stand-in release, named as such)."""
    from escha_deploy.sglang import releases
    from escha_deploy.planner import checks

    real = releases.load_release("0.5.23")
    host = dict(mem_total=64 * GiB, hugetlb=0, cgroup_limit=24 * GiB, os_reserve=1 * GiB, server_processes=6 * GiB,
                weights_read=10 * GiB)
    got = {}
    for kind in ("per-pool-available", "cgroup-bounded", "cgroup-bounded-cache-charged"):
        stand_in = real.model_copy(update={"host_guard": real.host_guard.model_copy(update={"kind": kind})})
        monkeypatch.setattr(releases, "load_release", lambda version=None, r=stand_in: r)
        got[kind] = checks.guard_available("0.5.23", 20 * GiB, **host)
    assert got["per-pool-available"][0] == 20 * GiB  # the modelled MemAvailable, as given
    assert got["cgroup-bounded"][0] == min(64 - 1 - 6, 24 - 6) * GiB == 18 * GiB
    assert got["cgroup-bounded-cache-charged"][0] == min(64 - 1 - 6, 24 - 6 - 10) * GiB == 8 * GiB
    assert "10.00 GiB weights read, their page cache charged, not credited" in got["cgroup-bounded-cache-charged"][1]
    no_limit = {**host, "cgroup_limit": None}
    assert checks.guard_available("0.5.23", 20 * GiB, **no_limit)[0] == 57 * GiB  # no cgroup: MemAvailable
