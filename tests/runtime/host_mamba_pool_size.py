"""Construct SGLang's real ``pool_host/mamba.py: MambaPoolHost`` on the CPU and print its size.

Run with the flag-catalog venv's interpreter (sglang 0.5.19 with its dependencies and a CPU
torch: ``.ci/check-flag-catalog.sh`` builds ``.cache/flagcat-venv``) and ``PYTHONPATH`` set to the
site-packages folder of the tree to test (an unpacked wheel, stock or with ``runtime apply``'s
series), so ``import sglang`` takes that tree:

    PYTHONPATH=SITE python tests/runtime/host_mamba_pool_size.py '[[16, 1.0, null], [16, 1.0, "72"]]'

Each case is ``[device_slots, hicache_ratio, ESCHA_HICACHE_HOST_MAMBA_SLOTS or null (unset)]``.
Prints one JSON object: ``sglang_file`` (the ``pool_host/mamba.py`` imported) and, per case,
``size`` (the pool's ``size`` after its constructor: states, the extra slot included) or
``error`` (``"ExceptionType: message"``), with ``budget_reads`` and ``allocations``: how often
the constructor asked for the host-memory budget and for host memory.

Stand-ins, named, for what needs a CUDA device or would pin host memory; the size arithmetic is
SGLang's (as ``tests/replay/sglang_tree_replay.py: _stub_host_allocation``):

- ``pool_host/common.py: ALLOC_MEMORY_FUNCS`` answers a zero-stride view (nothing allocated) and
  counts the calls;
- ``host_memory_budget_bytes`` as ``pool_host/mamba.py`` imported it answers 2**62 and counts the
  calls;
- ``MambaPoolHost._init_write_back_staging_buffers`` (device-side buffers) does nothing;
- ``torchvision``: the oracle's permissive stand-in (``scripts/sglang_oracle.py``).

The device pool is SGLang's own ``memory_pool.py: MambaPool``, made by ``HybridReqToTokenPool``
on ``device="cpu"`` with one tiny Mamba2 layer shape, as the replay makes it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

ENV = "ESCHA_HICACHE_HOST_MAMBA_SLOTS"


def _install_stand_ins(counts: dict[str, int]) -> None:
    scripts = str(Path(__file__).resolve().parents[2] / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import sglang_oracle

    sglang_oracle.install_torchvision_stand_in()
    import torch
    from sglang.srt.mem_cache.pool_host import common, mamba

    def no_allocation(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
        counts["allocations"] += 1
        return torch.empty(1, dtype=dtype).expand(*dims)

    def budget(*_a, **_k) -> int:
        counts["budget_reads"] += 1
        return 1 << 62

    common.ALLOC_MEMORY_FUNCS.default_factory = lambda: no_allocation
    common.ALLOC_MEMORY_FUNCS.clear()
    mamba.MambaPoolHost._init_write_back_staging_buffers = lambda self, *a, **k: None
    mamba.host_memory_budget_bytes = budget


def _device_pool(slots: int):
    import torch  # noqa: F401  (SGLang's pools import it too)
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=1, n_groups=1, num_heads=1, head_dim=1,
                                    state_size=1, conv_kernel=2)
    params = Mamba2CacheParams(shape=shape, layers=[0, 1, 2])
    pool = HybridReqToTokenPool(
        size=2, mamba_size=slots, mamba_spec_state_size=2, max_context_len=1024, device="cpu",
        enable_memory_saver=False, cache_params=params, mamba_layer_ids=[0, 1, 2],
        enable_mamba_extra_buffer=False, enable_overlap_schedule=False)
    return pool.mamba_pool


def main(argv: list[str]) -> int:
    cases = json.loads(argv[0])
    logging.disable(logging.WARNING)
    import warnings

    warnings.filterwarnings("ignore")
    counts = {"allocations": 0, "budget_reads": 0}
    _install_stand_ins(counts)
    from sglang.srt.mem_cache.pool_host import mamba

    results = []
    for slots, ratio, value in cases:
        if value is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = value
        device = _device_pool(slots)
        counts.update(allocations=0, budget_reads=0)
        row: dict = {"device_slots": int(device.size)}
        try:
            host = mamba.MambaPoolHost(device, ratio, 0, pin_memory=False, device="cpu", layout="page_first")
            row["size"] = int(host.size)
        except Exception as exc:  # reported to the test, which decides
            row["error"] = f"{type(exc).__name__}: {exc}"
        row.update(counts)
        results.append(row)
    print(json.dumps({"sglang_file": mamba.__file__, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
