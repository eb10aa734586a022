"""Each release's host pool classes in the plan: which flags reach them, read in the release's
wheel and parser catalog.

- ``pool_host/page_unified.py`` (0.5.23's unified L3 grid layout, ``PageUnifiedLayout``) is
  built only when a host pool's ``layout`` is ``page_unified`` (``pool_host/mha.py:
  MHATokenToKVPoolHost.init_kv_buffer``, ``pool_host/mla.py``); the layout comes from
  ``--hicache-mem-layout``, whose choices do not hold it (``arg_groups/fields/memory.py``), no
  resolution hook writes it, and ``mem_cache/hicache_key_scheme.py``, its other user, is imported
  by nothing. So no flag reaches it: nothing to plan, and a profile asking for it is refused by
  the catalog's choices.
- ``pool_host/page_interleave.py`` (``PageInterleaveHostPool``) wraps the KV host pool when the
  device pool is page-interleaved, which ``--enable-kv-cache-sharding`` selects
  (``hybrid_pool_assembler.py: build_kv_host_pool``; ``arg_groups/kv_shard_hook.py:
  handle_kv_cache_sharding``): the release's facts.yaml ``flags_not_planned`` lists it, and the
  plan refuses it (exit 3) with one line naming the flag. So is ``--enable-unified-memory`` on
  every release (one byte buffer split between the device pools at run time, ``UnifiedKVPool``).

The wheel tests read ``.cache/wheels/sglang-VERSION-*.whl`` (CI downloads every supported
release's) and skip without it.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from escha_deploy.sglang import releases
from escha_deploy.sglang.flagcheck import load_catalog

REPO = Path(__file__).resolve().parents[2]
LAYOUT_FLAG = "--hicache-mem-layout"
#: The wheel's files that may name the page_unified layout without making it reachable: the
#: layout itself, the two host pools that branch on it, and the unified key scheme (imported by
#: no other module, checked below).
PAGE_UNIFIED_USERS = {"sglang/srt/mem_cache/pool_host/page_unified.py", "sglang/srt/mem_cache/pool_host/mha.py",
                      "sglang/srt/mem_cache/pool_host/mla.py", "sglang/srt/mem_cache/hicache_key_scheme.py"}


def _wheel(version: str) -> Path:
    found = sorted((REPO / ".cache" / "wheels").glob(f"sglang-{version}-*.whl"))
    if not found:
        pytest.skip(f"no sglang {version} wheel under .cache/wheels")
    return found[0]


def _layout_choices(version: str) -> tuple[str, ...]:
    cat = load_catalog(version)
    return tuple(next(a for a in cat.actions if LAYOUT_FLAG in a.flags).choices or ())


@pytest.mark.parametrize("version", releases.supported_releases())
def test_no_flag_reaches_the_page_unified_host_layout(version):
    """The parser's layout choices (the release's catalog, made from its real parser) lack
    page_unified, and in the wheel's Python only the files that branch on it or define it name
    it, none assigning it as a layout, and the unified key scheme is imported by no module."""
    assert "page_unified" not in _layout_choices(version)
    assert "page_first" in _layout_choices(version)  # the choices were read
    naming: set[str] = set()
    importers: set[str] = set()
    with zipfile.ZipFile(_wheel(version)) as z:
        has_layout = "sglang/srt/mem_cache/pool_host/page_unified.py" in z.namelist()
        for name in z.namelist():
            if not (name.startswith("sglang/srt/") and name.endswith(".py")):
                continue
            text = z.read(name).decode("utf-8", "replace")
            if re.search(r"page_unified|PAGE_UNIFIED|PageUnified", text):
                naming.add(name)
                assert not re.search(r"""hicache_mem_layout\s*=\s*["']page_unified["']""", text), name
            if re.search(r"(from|import)\s+sglang\.srt\.mem_cache(\.| import )hicache_key_scheme", text):
                importers.add(name)
    assert naming <= PAGE_UNIFIED_USERS, sorted(naming - PAGE_UNIFIED_USERS)
    assert has_layout == ("sglang/srt/mem_cache/pool_host/page_unified.py" in naming)  # the scan read it
    assert not importers, sorted(importers)


def test_a_profile_asking_for_the_page_unified_layout_is_refused(cli):
    """hicache.hicache_mem_layout takes the parser's choices only (exit 2 naming the key)."""
    r = cli("plan", "--profile", "rtx5060ti-tp2-fp8", "--host-ram", "64GiB",
            "--set", "hicache.hicache_mem_layout=page_unified")
    assert r.code == 2, (r.out, r.err)
    assert "hicache.hicache_mem_layout" in r.err and "\n" not in r.err.strip()


@pytest.mark.parametrize("version", releases.supported_releases())
def test_each_flag_not_planned_is_a_switch_of_that_releases_parser(version):
    """A ``flags_not_planned`` entry names a flag its release's parser has (else the rule is dead
    data) and the pool class its source file defines."""
    cat = load_catalog(version)
    known = {f for a in cat.actions for f in a.flags}
    for rule in releases.load_release(version).flags_not_planned:
        assert rule.flag in known, rule.flag
        path = re.search(r"\((srt/[\w/]+\.py)\)", rule.pool)
        assert path, rule.pool
        with zipfile.ZipFile(_wheel(version)) as z:
            text = z.read(f"sglang/{path.group(1)}").decode()
        assert f"class {rule.pool.split()[0]}" in text, rule.pool


@pytest.mark.parametrize(("version", "flag", "pool"), [
    (v, r.flag, r.pool.split()[0]) for v in releases.supported_releases() for r in releases.load_release(v).flags_not_planned])
def test_a_flag_not_planned_is_refused_before_anything_starts_naming_it(cli, version, flag, pool):
    """Every ``flags_not_planned`` entry of every release (``--enable-kv-cache-sharding`` on 0.5.23,
    ``--enable-unified-memory`` on each: one byte buffer for every device pool, ``UnifiedKVPool``):
    exit 3, one line naming the flag, its pool class and the release."""
    r = cli("plan", "--profile", "rtx5060ti-tp2-fp8", "--sglang-version", version, "--host-ram", "64GiB",
            "--set", "runtime.needs=[]", "--set", f'runtime.extra_args=["{flag}"]')
    assert r.code == 3, (r.out, r.err)
    lines = [x for x in r.out.splitlines() if flag in x]
    assert len(lines) == 1, lines
    assert "runtime.extra_args" in lines[0] and pool in lines[0]
    assert f"SGLang {version}" in lines[0]


def test_unified_memory_is_not_planned_on_any_release():
    """SGLang's ``--enable-unified-memory`` replaces the partitioned device pools on every release
    we plan (``arg_groups/kv_cache_hook.py: handle_unified_memory_pool`` in each wheel)."""
    assert all(any(r.flag == "--enable-unified-memory" for r in releases.load_release(v).flags_not_planned)
               for v in releases.supported_releases())


def test_a_release_without_the_flag_refuses_it_as_unknown(cli):
    """Where the parser has no such flag (0.5.19), the flag check refuses it (exit 2)."""
    old = next(v for v in releases.supported_releases()
               if "--enable-kv-cache-sharding" not in {f for a in load_catalog(v).actions for f in a.flags})
    r = cli("plan", "--profile", "rtx5060ti-tp2-fp8", "--sglang-version", old, "--host-ram", "64GiB",
            "--set", 'runtime.extra_args=["--enable-kv-cache-sharding"]')
    assert r.code == 2, (r.out, r.err)
    assert "--enable-kv-cache-sharding: unknown to sglang" in r.err
