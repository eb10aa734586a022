"""Numbers in a profile are finite and bounded where they are declared; the ratio search is
bounded in steps whatever the profile says; container.gpus must hold tp_size ranks."""

from __future__ import annotations

import time

import pytest

from escha_deploy.utils.errors import BadInput
from escha_deploy.profile import load_profile
from escha_deploy.utils.units import MAX_SIZE, parse_size

BASE = "rtx5060ti-tp2-fp8"


@pytest.mark.parametrize("override, needle", [
    ("hicache.hicache_ratio=.inf", "finite number"),
    ("hicache.hicache_ratio=.nan", "finite number"),
    ("hicache.hicache_ratio=1e9", "less than or equal to 100"),
    ("hicache.max_ratio=.inf", "finite number"),
    ("hicache.min_ratio=-.inf", "finite number"),
    ("safety.ratio_step=1e-9", "greater than or equal to 0.001"),
    ("safety.ratio_step=.nan", "finite number"),
    ("runtime.mem_fraction_static=.nan", "finite number"),
    ("runtime.tp_size=100000", "less than or equal to 64"),
    ("hardware.gpu_count=1000000", "less than or equal to 64"),
    ("runtime.context_length=99999999999999", "less than or equal to 2147483647"),
    ("runtime.chunked_prefill_size=-5", "greater than or equal to -1"),
    ("hicache.hicache_size=99999999999", "less than or equal to 1000000"),
    ("hardware.gpu_vram=" + "9" * 400 + "GiB", "larger than 1 PiB"),
    ("safety.os_reserve=2000TiB", "larger than 1 PiB"),
    ("container.ready_timeout_s=99999999999", "less than or equal to 604800"),
    ("container.gpus=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 63]", "at most 64 items"),
    ("container.gpus=[-1, 0]", "greater than or equal to 0"),
    # a bool is not a number (pydantic's lax float read true as 1.0), nor is text
    ("hicache.hicache_ratio=true", "a valid number (got True)"),
    ("hicache.max_ratio=false", "valid number (got False)"),
    ("hicache.min_ratio='1.5'", "valid number (got '1.5')"),
    ("runtime.mem_fraction_static=true", "valid number (got True)"),
    ("safety.wsl2_mem_fraction_drop=true", "valid number (got True)"),
    ("watch.psi_some_avg10=true", "valid number (got True)"),
    # physical bounds: a model has weights; a prefill rate has a floor (1e-320 is a subnormal float)
    ("model.weights_total=0GB", "greater than 0"),
    ("model.weights_per_rank=0B", "greater than 0"),
    ("hicache.prefill_tokens_per_s=1e-320", "greater than or equal to 1"),
    ("hicache.prefill_tokens_per_s=0.5", "greater than or equal to 1"),
    # YAML 1.1's number spellings: one line, the number never silently read
    ("runtime.max_total_tokens=0b1010", "0b1010 is a binary number, which YAML 1.1 reads as 10"),
    ("runtime.max_total_tokens=1:30", "base-60 (sexagesimal)"),
    ("hicache.hicache_ratio=1_5", "written with '_' separators, which YAML 1.1 reads as 15"),
    ("runtime.max_total_tokens=010", "octal number"),
])
def test_absurd_numbers_are_one_line_naming_the_key(override, needle):
    with pytest.raises(BadInput) as exc:
        load_profile(BASE, [override])
    assert len(exc.value.problems) == 1, exc.value.problems
    line = exc.value.problems[0]
    assert line.startswith(f"--set {override.split('=')[0]}") and needle in line, line


def test_container_gpus_must_hold_tp_size_ranks(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(f"extends: {BASE}\nruntime:\n  tp_size: 2\ncontainer:\n  gpus: [1]\n")
    with pytest.raises(BadInput) as exc:
        load_profile(str(f))
    assert exc.value.problems == (f"{f}:5: container.gpus: 1 GPU(s) [1] cannot hold runtime.tp_size 2 ranks",)
    f.write_text(f"extends: {BASE}\ncontainer:\n  gpus: [0, 0]\n")
    with pytest.raises(BadInput) as exc:
        load_profile(str(f))
    assert exc.value.problems == (f"{f}:3: container.gpus: device ids repeat: [0, 0]",)
    f.write_text(f"extends: {BASE}\ncontainer:\n  gpus: [0, 5]\n")
    with pytest.raises(BadInput) as exc:
        load_profile(str(f))
    assert exc.value.problems == (f"{f}:3: container.gpus: device id 5 but hardware.gpu_count is 2",)
    f.write_text(f"extends: {BASE}\ncontainer:\n  gpus: [1, 0]\n")
    assert load_profile(str(f)).container.gpus == [1, 0]


def test_parse_size_bounds_exactly():
    assert parse_size("1024TiB") == MAX_SIZE
    with pytest.raises(ValueError, match="larger than 1 PiB"):
        parse_size("1025TiB")
    assert parse_size("1.31GiB") == 1406601789  # exact arithmetic rounds as before


def test_ratio_search_is_bounded_whatever_the_profile_says(monkeypatch):
    """The finest grid and the largest cap the model allows: the search evaluates pools
    O(log n) times, not n = 100 / 0.001 = 100,000 times."""
    from escha_deploy import planner
    from escha_deploy.pipeline import BoxRuntime, DescribedHost, plan_here
    from escha_deploy.profile import load_profile

    calls = []
    real = planner.host_pools_at_ratio
    monkeypatch.setattr(planner, "host_pools_at_ratio", lambda dev, r: calls.append(r) or real(dev, r))
    t0 = time.perf_counter()
    host = DescribedHost(parse_size("64GiB"), "linux")
    fine = plan_here(load_profile(BASE, ["hicache.max_ratio=100", "safety.ratio_step=0.001"]), host, BoxRuntime()).plan
    assert time.perf_counter() - t0 < 2
    assert len(calls) < 200, len(calls)
    coarse = plan_here(load_profile(BASE, ["hicache.max_ratio=100"]), host, BoxRuntime()).plan
    # the same answer as a linear scan would give: the largest grid point that leaves headroom
    assert fine.recommended_ratio >= coarse.recommended_ratio
    assert fine.recommended_ratio - coarse.recommended_ratio < 0.05


def test_numbers_read_as_written_in_a_profile_file(tmp_path):
    """YAML 1.1 reads ``0b1010`` as 10 tokens; YAML 1.2's ``2e9`` is a number here too."""
    f = tmp_path / "p.yaml"
    f.write_text(f"extends: {BASE}\nruntime:\n  max_total_tokens: 0b1010\n")
    with pytest.raises(BadInput) as exc:
        load_profile(str(f))
    assert exc.value.problems == (f"{f}:3: 0b1010 is a binary number, which YAML 1.1 reads as 10: write "
                                  "the number in plain decimal (or quote it if it is text)",)
    f.write_text(f"extends: {BASE}\nhicache:\n  prefill_tokens_per_s: 2e3\n  hicache_ratio: 1\n")
    hc = load_profile(str(f)).hicache
    assert (hc.prefill_tokens_per_s, hc.hicache_ratio) == (2000.0, 1.0)


def test_min_ratio_above_max_ratio_names_both(tmp_path):
    """It planned HiCache off with "no ratio >= hicache.min_ratio 5.0 fits", though ratio 5 fits:
    the cause is the cap."""
    f = tmp_path / "p.yaml"
    f.write_text(f"extends: {BASE}\nhicache:\n  max_ratio: 4\n  min_ratio: 5\n")
    with pytest.raises(BadInput) as exc:
        load_profile(str(f))
    assert exc.value.problems == (
        f"{f}:4: hicache.min_ratio: 5 is above hicache.max_ratio 4: no ratio can be recommended between "
        "them; lower hicache.min_ratio or raise hicache.max_ratio",)
    assert load_profile(BASE, ["hicache.min_ratio=4", "hicache.max_ratio=4"]).hicache.min_ratio == 4


@pytest.mark.parametrize("argv, needle", [
    (["plan", "-p", BASE, "--host-ram", "64GiB", "--linux", "--ratio", "1_5"], "--ratio: expected a number > 0 or auto, in plain decimal"),
    (["plan", "-p", BASE, "--host-ram", "64GiB", "--linux", "--ratio", "0x2"], "--ratio: expected a number > 0 or auto, in plain decimal"),
    (["up", "--dry-run", "--timeout", "1_5"], "'--timeout': expected a number in decimal (no '_' separators)"),
    (["up", "--dry-run", "--timeout", "nan"], "'--timeout': expected a number in decimal (got the string 'nan')"),
    (["up", "--dry-run", "--timeout", "0"], "'--timeout': 0 is not in the range 1<=x<=604800"),
    (["down", "--timeout", "2.5"], "'--timeout': expected a whole number in decimal"),
    (["down", "--timeout", "1_0"], "'--timeout': expected a whole number in decimal (no '_' separators)"),
    (["diagnose", "-", "--exit-code", "1_37"], "'--exit-code': expected a whole number in decimal"),
    (["status", "--interval", "1_5"], "'--interval': expected a number in decimal (no '_' separators)"),
    (["status", "--window", "inf"], "'--window': expected a number in decimal (got the string 'inf')"),
    (["status", "--http-timeout", "0x10"], "'--http-timeout': expected a number in decimal"),
    (["status", "--count", "0b1010"], "'--count': expected a whole number in decimal (got the string '0b1010')"),
    (["status", "--count", "1_0"], "'--count': expected a whole number in decimal (no '_' separators)"),
    (["status", "--prefill-tps", "1e-320"], "'--prefill-tps': 1e-320 is not in the range 1<=x<=1e+09"),
    (["status", "--prefill-tps", "nan"], "'--prefill-tps': expected a number in decimal (got the string 'nan')"),
    (["bench", "-e", "http://127.0.0.1:9", "--request-timeout", "1_0"], "'--request-timeout': expected a number in decimal"),
    (["bench", "-e", "http://127.0.0.1:9", "--prefixes", "0x10"], "'--prefixes': expected a whole number in decimal"),
    (["bench", "-e", "http://127.0.0.1:9", "--seed", "1_0"], "'--seed': expected a whole number in decimal"),
    (["bench", "-e", "http://127.0.0.1:9", "--decode-tokens", "2_56"], "'--decode-tokens': expected a whole number"),
    (["bench", "-e", "http://127.0.0.1:9", "--answer-tokens", "1.0"], "'--answer-tokens': expected a whole number"),
    (["bench", "-e", "http://127.0.0.1:9", "--max-requests", "0b11"], "'--max-requests': expected a whole number"),
    (["bench", "-e", "http://127.0.0.1:9", "--prefix-tokens", "1_8K"], "--prefix-tokens: expected a token count such as 18K"),
    (["bench", "-e", "http://127.0.0.1:9", "--prefill-tokens", "0x800"], "--prefill-tokens: expected a token count such as 18K"),
    (["canary", "-e", "http://127.0.0.1:9", "--fill-tokens", "1_000"], "--fill-tokens: expected a token count such as 18K"),
    (["canary", "-e", "http://127.0.0.1:9", "--max-fill-requests", "6_4"], "'--max-fill-requests': expected a whole number"),
    (["ask", "hello", "-e", "http://127.0.0.1:9", "--max-tokens", "2_56"], "'--max-tokens': expected a whole number"),
    (["fleet", "status", "fleet.yaml", "--http-timeout", "1_0"], "'--http-timeout': expected a number in decimal"),
])
def test_numeric_options_take_one_spelling(cli, argv, needle):
    """Python's ``float("1_5")`` is 15 and ``int("1_0")`` 10: the options read numbers as the
    profile keys do (``units.parse_number``)."""
    r = cli(*argv)
    assert r.code == 2, r.err
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], r.err
    assert "Traceback" not in r.err


@pytest.mark.parametrize("value, integer, expected", [
    ("1.5", False, 1.5), (" 2e3 ", False, 2000.0), (".5", False, 0.5), (3, False, 3.0), ("-7", True, -7),
    (12, True, 12),
])
def test_parse_number_reads(value, integer, expected):
    from escha_deploy.utils.units import parse_number

    assert parse_number(value, integer=integer) == expected


@pytest.mark.parametrize("value, integer, needle", [
    (True, False, "expected a number (got true)"), ("1_5", False, "no '_' separators"),
    ("inf", False, "in decimal"), ("1e999", False, "finite"), (float("nan"), False, "finite"),
    ("0x10", True, "whole number in decimal"), (1.0, True, "whole number"), ("1.0", True, "whole number"),
    (None, False, "expected a number"),
])
def test_parse_number_refuses(value, integer, needle):
    from escha_deploy.utils.units import parse_number

    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_number(value, integer=integer)
