"""The HiCache host mamba pool sized on its own, by a slot count from the environment.

escha-deploy runtime hook (capability ``hicache-host-mamba-slots``). Patch
``runtime_patches/0004-hicache-host-mamba-slots.patch`` copies this file byte for byte into
``sglang/srt/mem_cache/pool_host/escha_host_mamba_slots.py``; SGLang's ``pool_host/mamba.py:
MambaPoolHost.__init__`` calls ``host_mamba_size`` once, after its own size rule. It imports
the standard library only, so it is importable (and tested) without SGLang.

What it changes, against SGLang 0.5.19 ``pool_host/mamba.py: MambaPoolHost.__init__``:

- stock: the host mamba pool holds ``int(device_slots * hicache_ratio)`` states (or, with
  ``--hicache-size G``, ``G * 1e9 // bytes_per_state``), plus the one extra slot its page count
  adds. A hybrid (GDN/mamba) prefix comes back from the host tier only from a node whose mamba
  state is on the host (``unified_cache/components/mamba_component.py:
  create_match_validator``), and with ``--mamba-radix-cache-strategy extra_buffer`` every
  prefill chunk's end leaves one state that write_through backs up (one host slot each). So a
  workload of N distinct prefixes of T tokens at chunk C wants about ``N * T / C`` host states,
  while the ratio gives ``device_slots * ratio``: on a 12 GB card with 16 device slots the ratio
  buys KV the workload does not need to get the states it does (a prefix's KV is ~6 KB a token,
  a state ~77 MB a rank on a Qwen3.5-27B-class model at TP 2).
- patched: ``ESCHA_HICACHE_HOST_MAMBA_SLOTS=N`` (a whole number >= 1) replaces that count by N;
  the extra slot, the host-memory check and the allocation are SGLang's as before. Unset or
  empty: the stock count, byte for byte.

Units: slots (one mamba state of every GDN layer of the rank each). Errors: ``HostMambaSlotsError``
(a ``ValueError``) naming the variable for anything but a whole number >= 1; the pool
constructor raises it at start, before any host memory is pinned.
"""

from __future__ import annotations

import os
from typing import Optional

ENV_HOST_MAMBA_SLOTS = "ESCHA_HICACHE_HOST_MAMBA_SLOTS"


class HostMambaSlotsError(ValueError):
    """``ESCHA_HICACHE_HOST_MAMBA_SLOTS`` is not a whole number of slots >= 1."""


def parse_slots(value: Optional[str]) -> Optional[int]:
    """The host mamba slot count from the variable's text; ``None`` when unset or empty (stock).

    Accepts a decimal integer >= 1 (``_`` separators allowed, as Python's int). Raises
    ``HostMambaSlotsError`` naming the variable for anything else (``0``, a negative or
    fractional number, a unit such as ``5GB``), so a typo never silently keeps the stock size.
    """
    if value is None or value.strip() == "":
        return None
    text = value.strip()
    try:
        slots = int(text, 10)
    except ValueError:
        raise HostMambaSlotsError(
            f"{ENV_HOST_MAMBA_SLOTS}={value!r} is not a whole number of host mamba slots "
            f"(write e.g. 72; unset keeps SGLang's device slots x --hicache-ratio)"
        ) from None
    if slots < 1:
        raise HostMambaSlotsError(
            f"{ENV_HOST_MAMBA_SLOTS}={value!r}: the host mamba pool needs at least 1 slot "
            f"(unset keeps SGLang's device slots x --hicache-ratio)"
        )
    return slots


def host_mamba_size(stock_size: int, environ: Optional[dict] = None) -> int:
    """The host mamba pool's state count before SGLang adds its extra slot: the variable's
    count when set, else ``stock_size`` (what ``MambaPoolHost.__init__`` computed) unchanged.

    ``environ`` defaults to ``os.environ`` (read when called). Raises ``HostMambaSlotsError``.
    """
    env = os.environ if environ is None else environ
    slots = parse_slots(env.get(ENV_HOST_MAMBA_SLOTS))
    return stock_size if slots is None else slots
