"""Property tests (Hypothesis): generated profiles, ``--set`` values, sizes and URLs fed to the
real CLI entry point of the commands that start nothing. Whatever the input: exit 0, 2 or 3,
no traceback (any exception but SystemExit fails the example), every stderr line a clean one,
within 10 s and 1 GiB of address space (``inproc.run_bounded``).

Fixed seed (``derandomize``), no example database, a bounded number of examples per test, so
a CI run is the same run every time; the time they add is printed by ``--durations``.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from escha_deploy.profile import load_profile, profile_to_data
from inproc import CLEAN_LINE, OverBudget, run_bounded

BASE = profile_to_data(load_profile("rtx5060ti-tp2-fp8"))
EXAMPLES = 150
SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ENV = {"COLUMNS": "200", "ESCHA_SERVE_MODE": "", "ESCHA_API_KEY": "", "NO_COLOR": "1"}
#: unreachable: port 9 (discard) on loopback refuses at once
DEAD = "http://127.0.0.1:9"


def leaf_paths(data, prefix=()):
    for k, v in data.items():
        if isinstance(v, dict):
            yield from leaf_paths(v, prefix + (k,))
        else:
            yield prefix + (k,)


PATHS = sorted(leaf_paths(BASE))

numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 10**400, 1e-9, 1e308, -0.0]),
)
size_texts = st.one_of(
    st.builds(lambda n, u: f"{n}{u}", st.one_of(st.integers(-5, 10**20), st.floats(0, 1e30, allow_nan=False)),
              st.sampled_from(["B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB", "Gi", "PiB", "", " GiB", "gib"])),
    st.text(alphabet="0123456789.eE+-GiBKMT ", max_size=30),
)
scalars = st.one_of(numbers, size_texts, st.booleans(), st.none(),
                    st.text(max_size=40), st.sampled_from(["auto", "all", ".inf", ".nan", "[]", "{}"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                      max_leaves=12)


def run(*args: str, cwd: Path):
    try:
        r, took = run_bounded(*args, env={**ENV, "XDG_CACHE_HOME": str(cwd / "xdg")}, cwd=str(cwd))
    except OverBudget as exc:
        pytest.fail(f"{exc}: escha-deploy {' '.join(a[:80] for a in args)}")
    assert r.code in (0, 2, 3), (args, r.code, r.err[-800:])
    event(f"exit {r.code}")  # the spread shows with --hypothesis-show-statistics
    bad = [ln for ln in r.err.splitlines() if ln.strip() and not CLEAN_LINE.match(ln)]
    assert not bad, (args, bad[:5])
    if r.code == 2:
        assert "error: " in r.err, (args, r.err[-800:])
    return r


def with_changes(changes: list[tuple[tuple, object]]) -> dict:
    import copy

    data = copy.deepcopy(BASE)
    for path, value in changes:
        node = data
        for k in path[:-1]:
            if not isinstance(node.get(k), dict):
                node[k] = {}
            node = node[k]
        node[path[-1]] = value
    return data


def base_value(path: tuple):
    node = BASE
    for k in path:
        node = node[k]
    return node


def plausible(path: tuple):
    """A value of the type the field has, near and past its bounds: reaches the planner,
    the flag renderer and compose, not only the validator."""
    v = base_value(path)
    if isinstance(v, bool):
        return st.booleans()
    if isinstance(v, int):
        return st.one_of(st.integers(-2, 2 * max(v, 1) + 2), st.integers(-(2**40), 2**40))
    if isinstance(v, float):
        return st.one_of(st.floats(0, 2 * max(v, 1.0)), st.floats(allow_nan=True, allow_infinity=True))
    if isinstance(v, str) and v and v[0].isdigit():  # a size
        return st.one_of(size_texts, st.integers(0, 4096).map(lambda n: f"{n}GiB"))
    if isinstance(v, list):
        return st.lists(st.one_of(st.integers(-1, 9), st.text(max_size=12)), max_size=4)
    return values


random_change = st.tuples(
    st.one_of(st.sampled_from(PATHS), st.lists(st.text(max_size=8), min_size=1, max_size=3).map(tuple)), values)
typed_change = st.sampled_from(PATHS).flatmap(lambda p: st.tuples(st.just(p), plausible(p)))
profile_changes = st.lists(st.one_of(typed_change, typed_change, random_change), min_size=1, max_size=4)

PROFILE_COMMANDS = [
    ["plan", "-p", "{p}", "--host-ram", "64GiB", "--linux", "--format", "json"],
    ["profiles", "validate", "{p}"],
    ["profiles", "show", "{p}"],
    ["compose", "-p", "{p}"],
    ["up", "-p", "{p}", "--dry-run"],
    ["serve", "-p", "{p}", "--print"],
]


@SETTINGS
@given(changes=profile_changes, which=st.integers(0, len(PROFILE_COMMANDS) - 1))
def test_generated_profiles(changes, which):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        p = d / "gen.yaml"
        p.write_text(yaml.safe_dump(with_changes(changes), sort_keys=False))
        run(*[a.replace("{p}", str(p)) for a in PROFILE_COMMANDS[which]], cwd=d)


set_values = st.one_of(scalars.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()),
                       st.text(max_size=60))


@SETTINGS
@given(path=st.one_of(st.sampled_from(PATHS).map(".".join), st.text(max_size=30)), value=set_values,
       which=st.sampled_from([["plan", "--host-ram", "64GiB", "--linux"], ["up", "-p", "rtx5060ti-tp2-fp8", "--dry-run"],
                              ["serve", "-p", "rtx5060ti-tp2-fp8", "--print"]]))
def test_generated_set_values(path, value, which):
    with tempfile.TemporaryDirectory() as d:
        run(*which, "--set", f"{path}={value}", cwd=Path(d))


@SETTINGS
@given(ratio=st.one_of(st.floats().map(repr), st.text(max_size=12), st.just("auto")),
       host_ram=size_texts, size=st.one_of(st.integers(-10, 10**15).map(str), st.text(max_size=12)),
       pick=st.integers(0, 2))
def test_generated_sizes_and_ratios(ratio, host_ram, size, pick):
    opts = [["--ratio", ratio], ["--hicache-size", size], []][pick]
    with tempfile.TemporaryDirectory() as d:
        r = run("plan", "--host-ram", host_ram, "--linux", *opts, cwd=Path(d))
        if r.code == 0:  # accepted: then it was a finite, positive size and a plan was printed
            from escha_deploy.utils.units import parse_size

            assert parse_size(host_ram) > 0
            if pick == 0 and ratio != "auto":
                assert 0 < float(ratio) <= 100 and math.isfinite(float(ratio))


hosts = st.one_of(st.sampled_from(["127.0.0.1", "localhost", "[::1]", "", "[::1", "a b", "user:pw@127.0.0.1"]),
                  st.text(alphabet="[]:@/?#% .", max_size=8))
urls = st.builds(lambda scheme, host, port, path: f"{scheme}{host}{port}{path}",
                 st.sampled_from(["http://", "https://", "ftp://", "", "http:/", "HTTP://"]), hosts,
                 st.one_of(st.just(":9"), st.integers(-5, 10**6).map(lambda n: f":{n}"), st.just(""),
                           st.text(alphabet=":0123456789", max_size=7)),
                 st.sampled_from(["", "/", "/v1", "?x=1", "#f"]))


@SETTINGS
@given(url=urls, verb=st.sampled_from(["bench", "canary"]),
       tokens=st.one_of(st.just([]), st.tuples(st.sampled_from(["--prefix-tokens", "--prompt-tokens", "--fill-tokens"]),
                                                st.one_of(st.text(max_size=10), st.integers(-5, 10**12).map(str),
                                                          st.floats().map(lambda f: f"{f}k"))).map(list)))
def test_generated_urls_against_an_unreachable_endpoint(url, verb, tokens):
    """Argument parsing of bench and canary: a URL that can be used points at nothing (port 9),
    so no request is ever answered; every outcome is 2 (bad input) or 3 (cannot connect)."""
    if ":9" not in url or "127.0.0.1" not in url and "[::1]" not in url and "localhost" not in url:
        url = url if not url.startswith(("http://", "https://")) or "@" in url else DEAD + "/" + url
    if verb == "bench" and tokens and tokens[0] != "--prefix-tokens":
        tokens = []
    if verb == "canary" and tokens and tokens[0] == "--prefix-tokens":
        tokens = []
    with tempfile.TemporaryDirectory() as d:
        r = run(verb, "-e", url, "--request-timeout", "2", "--max-requests", "3", *tokens, cwd=Path(d))
        assert r.code in (2, 3), (url, r.code, r.err[-500:])
