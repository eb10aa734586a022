"""SGLang 0.5.19's real host pools, patched by our series, on a CUDA GPU (marked ``gpu``).

From the repo plus the serving closure (``scripts/gpu-closure.sh`` builds it, ``scripts/gpu-run.sh
pools`` installs it and sets ``$ESCHA_RUNTIME_DESCRIPTION``): SGLang 0.5.19's tree patched by
``escha-deploy runtime apply`` at build time, with the real sgl_kernel (0.4.5, sm90 ops); then,
one fresh process per job (``tests/runtime/gpu_host_pools.py``, which names its stand-ins, used
only for a module the closure does not carry):

- device pools of the wheel's classes at the per-rank shapes of ``rtx5060ti-tp2-fp8`` (at the
  ratio ``plan`` recommends for the seed's 16 GiB WSL2 box) and ``linux-tp2-l3`` (ratio 1), host
  pools with each allocator, and bytes round-tripped for MHA page_first, MHA layer_first and
  mamba page_first on the ``kernel`` io backend, with 0 stray writes;
- pinned bytes read from the kernel (the MemAvailable drop around one allocation, median of
  three, one buffer alive at a time in a fresh process per allocator, buffers of 256 MiB and more) equal the plan's figure per buffer within 3% or 32 MiB:
  the five ``rtx5060ti-tp2`` buffers at ratio 2 and the ``rtx5060ti-tp2-fp8`` pools, both
  allocators; torch's caching allocator, read the same way, pins about twice (the control that
  shows the reading tells 1x from 2x);
- the 4 GiB cap refuses one pinned buffer before allocating, ``register`` takes it; the geometry
  check refuses a real ``MHATokenToKVPoolFP4`` behind a full-width host pool.

``$ESCHA_GPU_REPORT``: a JSON file the figures are appended to (docs/runtime.md quotes them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("gpu_host_pools.py")
MiB = 2**20
#: Buffers below this are not read from MemAvailable (its noise is about 2% of a GiB).
MIN_READ_BYTES = 256 * MiB


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _closure_site() -> Path | None:
    """The folder holding the closure's patched ``sglang`` package (its description's
    ``sglang_dir``), or ``None`` when no closure is installed."""
    path = os.environ.get("ESCHA_RUNTIME_DESCRIPTION")
    if not path or not Path(path).is_file():
        return None
    desc = json.loads(Path(path).read_text())
    if desc.get("kind") != "closure" or not Path(desc.get("sglang_dir", "")).is_dir():
        return None
    return Path(desc["sglang_dir"]).parent


@pytest.fixture(scope="module")
def site() -> Path:
    if not _cuda():
        pytest.skip("no CUDA device")
    root = _closure_site()
    if root is None:
        pytest.skip("no serving closure installed: run `bash scripts/gpu-run.sh pools` (it installs .closure/, "
                    "built by scripts/gpu-closure.sh, and sets ESCHA_RUNTIME_DESCRIPTION)")
    return root


def _report(key: str, value) -> None:
    path = os.environ.get("ESCHA_GPU_REPORT")
    if not path:
        return
    p = Path(path)
    doc = json.loads(p.read_text()) if p.is_file() else {}
    doc[key] = value
    p.write_text(json.dumps(doc, indent=1))


def _job(site: Path, *args: str, timeout: float = 400) -> dict:
    r = subprocess.run([sys.executable, str(WORKER), *args, "--site", str(site)], capture_output=True,
                       text=True, cwd=REPO, timeout=timeout)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"exit {r.returncode}: {r.stderr[-3000:]}"
    out = json.loads(lines[-1])
    assert out["ok"], out.get("trace") or out
    assert out["standin_calls"] == [], f"stand-ins called on the kernel path: {out['standin_calls']}"
    assert out["device_notes"] == [], out["device_notes"]
    return out


def _plan(profile: str, ratio: float | None = None):
    from escha_deploy.facts.machine import described_host
    from escha_deploy.planner import plan
    from escha_deploy.profile import load_profile
    from escha_deploy.utils.units import GiB

    prof = load_profile(profile)
    if ratio is not None:  # the ratio decides, as SGLang's --hicache-ratio does once --hicache-size is 0
        prof = prof.model_copy(update={"hicache": prof.hicache.model_copy(update={"hicache_size": 0})})
    return plan(prof, described_host(16 * GiB, "wsl2"), ratio=ratio)


def _fp8_ratio() -> float:
    return _plan("rtx5060ti-tp2-fp8").recommended_ratio


@pytest.mark.parametrize("allocator", ["pinned", "register"])
@pytest.mark.parametrize("profile", ["rtx5060ti-tp2-fp8", "linux-tp2-l3"])
def test_host_pools_round_trip(site, profile, allocator):
    ratio = _fp8_ratio() if profile == "rtx5060ti-tp2-fp8" else 1.0
    out = _job(site, "roundtrip", "--profile", profile, "--ratio", str(ratio), "--allocator", allocator)
    _report(f"roundtrip/{profile}/{allocator}", out)
    p = _plan(profile, ratio)
    planned = {b.name: b.requested_bytes for b in p.per_rank.host_buffers}
    assert set(out["layouts"]) == {"mha_page_first", "mha_layer_first", "mamba_page_first"}
    for layout, row in out["layouts"].items():
        assert row["pinned_by_hook"] is (allocator == "pinned"), layout
        for name in ("one_page", "1gib", "one_slot", "all_slots"):
            if name in row:
                r = row[name]
                assert (r["host_equal"], r["device_equal"], r["stray_bytes"]) == (True, True, 0), (layout, name, r)
    for layout in ("mha_page_first", "mha_layer_first"):
        row = out["layouts"][layout]
        assert row["host_tokens"] == p.per_rank.host_kv_tokens
        assert row["buffer_bytes"] == planned["host KV buffer (K and V)"]
    m = out["layouts"]["mamba_page_first"]
    assert m["host_slots"] == p.per_rank.host_mamba_slots
    assert m["temporal_bytes"] == planned["host mamba temporal buffer"]
    assert m["conv_bytes"] == [planned["host mamba conv buffer"]]


def _readings(site, buffers, allocator):
    """One fresh process per allocator; each buffer allocated alone (``gpu_host_pools.py reading``)."""
    big = [b for b in buffers if b.requested_bytes >= MIN_READ_BYTES]
    out = _job(site, "reading", "--bytes", ",".join(str(b.requested_bytes) for b in big), "--allocator", allocator)
    return [{"buffer": b.name, "requested": b.requested_bytes, "planned_pinned": b.pinned_bytes,
             "drop": r["drop"], "drops": r["drops"], "by_hook": r.get("by_hook")}
            for b, r in zip(big, out["readings"], strict=True)]


def _within(drop: int, planned: int) -> bool:
    return abs(drop - planned) <= max(0.03 * planned, 32 * MiB)


@pytest.mark.parametrize("allocator", ["pinned", "register"])
def test_pinned_bytes_equal_the_plan(site, allocator):
    seed = _plan("rtx5060ti-tp2", 2.0).per_rank.host_buffers
    fp8 = _plan("rtx5060ti-tp2-fp8", _fp8_ratio()).per_rank.host_buffers
    assert len(seed) == 5
    rows = _readings(site, seed, allocator) + _readings(site, fp8, allocator)
    _report(f"readings/{allocator}", rows)
    assert len(rows) == 6  # codes, K and V scales, temporal (seed); KV, temporal (fp8)
    bad = [r for r in rows if not _within(r["drop"], r["planned_pinned"])]
    assert not bad, bad
    assert all(r["by_hook"] is (allocator == "pinned") for r in rows)


def test_torch_caching_allocator_reads_as_the_next_power_of_two(site):
    """The control: the same reading sees torch's rounding (2,147,745,792 B -> 4 GiB)."""
    [out] = _job(site, "reading", "--bytes", "2147745792", "--allocator", "torch")["readings"]
    _report("readings/torch", out)
    assert out["drop"] > 1.5 * 2_147_745_792, out


def test_cap_and_geometry_refusals(site):
    out = _job(site, "refusals")
    _report("refusals", out)
    assert out["cap_pinned"] == "refused: PinnedAllocationTooLarge"
    assert out["cap_pinned_drop"] < 32 * MiB  # refused before anything was allocated
    assert out["cap_register"] == "accepted"
    assert out["geometry"].startswith("refused: TransferGeometryError"), out["geometry"]
