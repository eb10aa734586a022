"""What a host-tier hit costs: loading a cached prefix back from host RAM, against recomputing it.

Pure. For a prefix of ``n`` tokens (capped at the context length), per rank:

- load-back bytes = ``n x host KV bytes per token`` (what ``load_to_device_per_layer`` moves: the
  host pool's rows, INT2 codes and scales included) ``+ one mamba slot`` on a hybrid model (the
  request's GDN state, ``MambaPoolHost``); the ranks load in parallel, each over its own link;
- load-back seconds = bytes / doctor's measured host -> device GB/s (1e9 B/s): the one-page
  figure when the prefix is no larger than that page, else the large-copy figure;
- recompute seconds = ``n / prefill tokens per second``: ``bench``'s last cold prefill on this
  box when it measured the profile's model (``planner.served_model``), else the profile's
  ``hicache.prefill_tokens_per_s``, else not known.

Without a measured bandwidth the load-back time is "not measured: run `escha-deploy doctor`".
"""

from __future__ import annotations

from ..facts.restore_bandwidth import RestoreBandwidth
from .result import HostHitCost, HostHitRow

#: Prefix lengths the plan shows (tokens): a short chat turn, a long document, a code base.
PREFIX_TOKENS = (1_000, 8_000, 32_000)
NOT_MEASURED = "not measured: run `escha-deploy doctor`"
NOT_KNOWN = ("not known: run `escha-deploy bench` against this box's server, or set "
             "hicache.prefill_tokens_per_s in the profile")


def host_hit_cost(*, host_kv_bytes_per_token: int, mamba_slot_bytes: int, context_length: int | None,
                  bandwidth: RestoreBandwidth | None, bandwidth_origin: str,
                  prefill_tokens_per_s: float | None, prefill_source: str | None,
                  prefill_note: str | None = None) -> HostHitCost:
    """The rows for ``PREFIX_TOKENS`` (deduplicated once capped at ``context_length``).

    ``bandwidth_origin``: where the bandwidth was read (doctor's findings on this host, a facts
    file). ``prefill_note``: why a measured rate was passed over (bench measured another
    model), appended to the rate's source. Bytes per rank; seconds; GB/s = 1e9 B/s."""
    sizes = sorted({min(n, context_length) if context_length else n for n in PREFIX_TOKENS})
    rows = []
    for n in sizes:
        nbytes = n * host_kv_bytes_per_token + mamba_slot_bytes
        load_s = gbps = None
        if bandwidth is not None:
            page_gbps = bandwidth.page_load_gbps
            small = bool(bandwidth.page_bytes and nbytes <= bandwidth.page_bytes)
            gbps = page_gbps if small and page_gbps else bandwidth.load_gbps
            load_s = nbytes / (gbps * 1e9)
        recompute = n / prefill_tokens_per_s if prefill_tokens_per_s else None
        rows.append(HostHitRow(prefix_tokens=n, load_bytes_per_rank=nbytes, load_gbps=gbps, load_s=load_s,
                               recompute_s=recompute))
    if bandwidth is not None:
        load_src = (f"doctor's restore probe ({bandwidth.method}): {bandwidth.load_gbps:g} GB/s host -> device at "
                    f"{bandwidth.bytes:,} B" + (f", {bandwidth.page_load_gbps:g} GB/s at one {bandwidth.page_bytes:,} B "
                                                f"page" if bandwidth.page_load_gbps else "") + f" ({bandwidth_origin})")
    else:
        load_src = NOT_MEASURED
    rate_src = prefill_source if prefill_tokens_per_s else NOT_KNOWN
    return HostHitCost(rows=rows, load_source=load_src, prefill_tokens_per_s=prefill_tokens_per_s,
                       prefill_source=f"{rate_src} ({prefill_note})" if prefill_note else rate_src,
                       bytes_rule=(f"tokens x {host_kv_bytes_per_token:,} B host KV per token"
                                   + (f" + one mamba slot {mamba_slot_bytes:,} B" if mamba_slot_bytes else "")
                                   + " per rank"))
