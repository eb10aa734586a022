"""Patch 0004 (``hicache-host-mamba-slots``): the hook's parse, and SGLang 0.5.19's real
``pool_host/mamba.py: MambaPoolHost`` built on the CPU from the patched tree and from the stock one.

The pool tests (marked ``wheel``) run ``tests/runtime/host_mamba_pool_size.py`` in a subprocess
with the flag-catalog venv's interpreter (sglang 0.5.19's dependencies and a CPU torch; built by
``.ci/check-flag-catalog.sh`` as ``.cache/flagcat-venv``, or ``ESCHA_FLAGCAT_VENV``; skipped
without it, as ``tests/replay/test_tree_replay.py``'s are), with ``PYTHONPATH`` on the unpacked
real wheel: once with ``runtime apply``'s whole series, once stock. Bytecode goes to a folder of
the test's own (``PYTHONPYCACHEPREFIX``), so neither tree changes (the fixtures check it).

Stock size rule (``MambaPoolHost.__init__``, no ``--hicache-size``): ``size = int(device_slots *
ratio)``, then ``page_num = size // 1 + 1`` and ``size = page_num``: one extra slot.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from escha_deploy.runtime.hooks import host_mamba_slots as hms
from escha_deploy.sglang.capabilities import ENV_HOST_MAMBA_SLOTS

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "tests" / "runtime" / "host_mamba_pool_size.py"


# --------------------------------------------------------------------------- the hook's parse


def test_variable_name_matches_capabilities():
    assert hms.ENV_HOST_MAMBA_SLOTS == ENV_HOST_MAMBA_SLOTS == "ESCHA_HICACHE_HOST_MAMBA_SLOTS"


@pytest.mark.parametrize("text, expected", [
    (None, None), ("", None), ("   ", None),
    ("72", 72), (" 72 ", 72), ("1", 1), ("1_000", 1000),
])
def test_parse_slots(text, expected):
    assert hms.parse_slots(text) == expected


@pytest.mark.parametrize("text", ["0", "-3", "2.5", "5GB", "abc", "0x10", "1e3"])
def test_parse_slots_refuses_naming_the_variable(text):
    with pytest.raises(hms.HostMambaSlotsError, match=ENV_HOST_MAMBA_SLOTS) as e:
        hms.parse_slots(text)
    assert repr(text) in str(e.value)
    assert isinstance(e.value, ValueError)


def test_host_mamba_size_reads_the_environment(monkeypatch):
    monkeypatch.delenv(ENV_HOST_MAMBA_SLOTS, raising=False)
    assert hms.host_mamba_size(16) == 16
    monkeypatch.setenv(ENV_HOST_MAMBA_SLOTS, "72")
    assert hms.host_mamba_size(16) == 72
    assert hms.host_mamba_size(16, environ={}) == 16
    assert hms.host_mamba_size(16, environ={ENV_HOST_MAMBA_SLOTS: ""}) == 16
    assert hms.host_mamba_size(16, environ={ENV_HOST_MAMBA_SLOTS: "5"}) == 5
    with pytest.raises(hms.HostMambaSlotsError, match=ENV_HOST_MAMBA_SLOTS):
        hms.host_mamba_size(16, environ={ENV_HOST_MAMBA_SLOTS: "-3"})


# --------------------------------------------------------------------------- the real pool


def _venv_python() -> Path:
    """The default release's flag-catalog venv (as ``tests/replay/test_tree_replay.py``)."""
    venv = Path(os.environ.get("ESCHA_FLAGCAT_VENV") or REPO / ".cache" / "flagcat-venv")
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no flag-catalog venv at {venv}; .ci/check-flag-catalog.sh builds it")
    return python


#: (device slots, --hicache-ratio): ratios below 1, whole and fractional, on 1 to 48 slots
GRID = [(d, r) for d in (1, 7, 16, 48) for r in (0.5, 1.0, 1.7, 2.0, 2.5, 3.3, 8.0)]


def _sizes(site: Path, cases: list, pycache: Path) -> dict:
    """The harness's answer for ``cases`` on the tree under ``site`` (its site-packages)."""
    env = {k: v for k, v in os.environ.items() if k != ENV_HOST_MAMBA_SLOTS}
    env.update(PYTHONPATH=str(site), PYTHONPYCACHEPREFIX=str(pycache))
    proc = subprocess.run([str(_venv_python()), str(HARNESS), json.dumps(cases)],
                          capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(doc["sglang_file"]).is_relative_to(site), doc["sglang_file"]
    assert len(doc["results"]) == len(cases)
    return doc


@pytest.fixture(scope="module")
def stock_doc(_pristine, tmp_path_factory) -> dict:
    cases = [[d, r, None] for d, r in GRID]
    return _sizes(_pristine.root, cases, tmp_path_factory.mktemp("pycache-stock"))


@pytest.fixture(scope="module")
def patched_doc(_applied_shared, tmp_path_factory) -> dict:
    pkg, _, _ = _applied_shared
    cases = [[16, 1.0, None], [16, 1.0, ""], [16, 1.0, "72"], [16, 1.0, "0"], [16, 8.0, "1_000"],
             [16, 1.0, "5GB"], *([d, r, None] for d, r in GRID)]
    return _sizes(pkg.parent, cases, tmp_path_factory.mktemp("pycache-patched"))


@pytest.mark.wheel
def test_the_patched_tree_is_what_runs(patched_doc, applied_shared):
    pkg, _ = applied_shared
    source = Path(patched_doc["sglang_file"])
    assert source == pkg / "srt" / "mem_cache" / "pool_host" / "mamba.py"
    assert b"_escha_host_mamba_slots.host_mamba_size(self.size)" in source.read_bytes()


@pytest.mark.wheel
def test_unset_or_empty_is_the_stock_size(patched_doc):
    unset, empty = patched_doc["results"][:2]
    assert unset["size"] == empty["size"] == int(16 * 1.0) + 1 == 17
    assert unset["allocations"] == empty["allocations"] > 0


@pytest.mark.wheel
def test_set_the_pool_holds_that_many_states_plus_sglangs_extra_slot(patched_doc):
    r = patched_doc["results"]
    assert r[2]["size"] == 73  # "72"
    assert r[4]["size"] == 1001  # "1_000", whatever the ratio (8.0 x 16 would give 129)
    assert r[2]["allocations"] == r[0]["allocations"] and r[2]["budget_reads"] == 1


@pytest.mark.wheel
@pytest.mark.parametrize("index, value", [(3, "0"), (5, "5GB")])
def test_a_bad_value_stops_the_constructor_before_anything_is_allocated(patched_doc, index, value):
    row = patched_doc["results"][index]
    assert "size" not in row
    assert row["error"].startswith(f"HostMambaSlotsError: {ENV_HOST_MAMBA_SLOTS}={value!r}")
    assert row["allocations"] == 0 and row["budget_reads"] == 0


@pytest.mark.wheel
def test_unset_the_patched_pool_sizes_as_the_stock_file_does(patched_doc, stock_doc):
    """The same grid of device slots and ratios on both trees, the variable unset: the same
    sizes, each SGLang's ``int(device_slots * ratio) + 1``, and the same host-memory requests."""
    patched = patched_doc["results"][6:]
    stock = stock_doc["results"]
    assert Path(stock_doc["sglang_file"]).read_bytes() != Path(patched_doc["sglang_file"]).read_bytes()
    assert [(r["device_slots"], r["size"]) for r in patched] == [(r["device_slots"], r["size"]) for r in stock]
    assert [r["size"] for r in stock] == [int(d * r) + 1 for d, r in GRID]
    assert [(r["allocations"], r["budget_reads"]) for r in patched] == [
        (r["allocations"], r["budget_reads"]) for r in stock]
