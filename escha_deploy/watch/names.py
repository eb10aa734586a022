"""The SGLang 0.5.19 ``/metrics`` names ``status`` reads, in one place.

Every name is defined in SGLang 0.5.19 ``python/sglang/srt/observability/metrics_collector.py``
(``SchedulerMetricsCollector``, ``TokenizerMetricsCollector``, ``RadixCacheMetricsCollector``).
Each release's names live in its data folder, ``catalog/releases/VERSION/metrics.json``
(``scripts/gen_metric_names.py`` writes it from the wheel); ``release_metrics`` reads it, and
tests/watch/test_names.py fails when a name here (or one the stand-in server exports) is not
in it, or when the file is stale against the wheel.
The ``/metrics`` route is a ``prometheus_client`` multiprocess registry
(``srt/utils/common.py`` ``add_prometheus_middleware``): it carries no process or host figure,
so RSS, MemAvailable, page cache and swap come from the host (``watch.procfs``).

Scheduler-side series carry ``tp_rank`` (``SchedulerMetricsCollector.init_new``: exported
by attention-TP rank 0 unless ``--enable-metrics-for-all-schedulers``); tokenizer-side series
(cached and prompt tokens, requests) carry none; radix-cache series carry ``cache_type`` and, in
0.5.19, no ``tp_rank``: every rank records them and ``/metrics`` exports their sum over the ranks
(``reading.ALL_RANKS``); 0.5.23 labels them per rank.
"""

from __future__ import annotations

# tokenizer side (TokenizerMetricsCollector): no tp_rank
CACHED_TOKENS = "sglang:cached_tokens_total"  # counter, label cache_source: device|host|storage_<b>|total
PROMPT_TOKENS = "sglang:prompt_tokens_total"  # counter
NUM_REQUESTS = "sglang:num_requests_total"  # counter, one per finished request

# scheduler side (SchedulerMetricsCollector): per tp_rank
NUM_RUNNING = "sglang:num_running_reqs"  # gauge
NUM_QUEUED = "sglang:num_queue_reqs"  # gauge
TOKEN_USAGE = "sglang:token_usage"  # gauge, max over the device pools (0..1)
MAMBA_USAGE = "sglang:mamba_usage"  # gauge, hybrid models (0..1)
HOST_USED_TOKENS = "sglang:hicache_host_used_tokens"  # gauge, HiCache only
HOST_TOTAL_TOKENS = "sglang:hicache_host_total_tokens"  # gauge, HiCache only

# radix cache side (RadixCacheMetricsCollector): label cache_type; 0.5.19: summed over ranks, 0.5.23: per tp_rank
EVICTED_TOKENS = "sglang:evicted_tokens_total"  # counter: device slots freed by eviction
LOAD_BACK_TOKENS = "sglang:load_back_tokens_total"  # counter, label pool: host -> device
LOAD_BACK_BYTES = "sglang:load_back_bytes_total"  # counter, all pools
LOAD_BACK_SECONDS = "sglang:load_back_duration_seconds"  # histogram (_sum, _count)
BACKUP_TOKENS = "sglang:hicache_backup_tokens_total"  # counter, label pool: device -> host
BACKUP_BYTES = "sglang:hicache_backup_bytes_total"  # counter
DROPPED_TOKENS = "sglang:hicache_dropped_tokens_total"  # counter, labels reason, pool

SPEC_ACCEPT_LENGTH = "sglang:spec_accept_length"  # gauge: mean accepted drafts + bonus per forward (0: no spec)
# added in 0.5.23 (SchedulerMetricsCollector): the host mamba pool, states (one per request slot)
HOST_MAMBA_USED_STATES = "sglang:hicache_host_mamba_used_states"  # gauge
HOST_MAMBA_TOTAL_STATES = "sglang:hicache_host_mamba_total_states"  # gauge

#: Names read when the server exports them: not in every supported release (``first_release``
#: says which release's ``metrics.json`` defines each first).
LATER = (HOST_MAMBA_USED_STATES, HOST_MAMBA_TOTAL_STATES)


def first_release(name: str) -> str | None:
    """The first supported release whose metric catalog (``metrics.json``) defines ``name``."""
    from escha_deploy.sglang.releases import supported_releases

    return next((v for v in supported_releases() if name in release_metrics(v)), None)

#: Names ``status`` reads (the test checks each against the wheel).
ALL = (CACHED_TOKENS, PROMPT_TOKENS, NUM_REQUESTS, NUM_RUNNING, NUM_QUEUED, TOKEN_USAGE,
       MAMBA_USAGE, HOST_USED_TOKENS, HOST_TOTAL_TOKENS, EVICTED_TOKENS, LOAD_BACK_TOKENS,
       LOAD_BACK_BYTES, LOAD_BACK_SECONDS, BACKUP_TOKENS, BACKUP_BYTES, DROPPED_TOKENS, SPEC_ACCEPT_LENGTH)

#: Label names ``status`` filters on, per metric (checked against the wheel too).
LABELS = {CACHED_TOKENS: "cache_source", LOAD_BACK_TOKENS: "pool", BACKUP_TOKENS: "pool",
          DROPPED_TOKENS: "reason"}


def release_metrics(version: str | None = None) -> dict[str, dict]:
    """The release's metric catalog (``metrics.json``): name -> ``{"type", "collector",
    "extra_labels"}``. Raises ``ValueError`` when the release folder has none (a packaging bug)."""
    import json

    from escha_deploy.sglang.releases import release_file

    path = release_file(version, "metrics.json")
    if not path.is_file():
        raise ValueError(f"{path}: no metric catalog for this release (scripts/gen_metric_names.py)")
    return json.loads(path.read_text(encoding="utf-8"))["metrics"]


def known_metric_names() -> frozenset[str]:
    """Every ``sglang:`` name some supported release's catalog defines (cached per process)."""
    global _KNOWN
    if _KNOWN is None:
        from escha_deploy.sglang.releases import supported_releases

        _KNOWN = frozenset(m for v in supported_releases() for m in release_metrics(v))
    return _KNOWN


_KNOWN: frozenset[str] | None = None


def missing_in_release(version: str | None = None) -> list[str]:
    """The names ``status`` reads that the release does not define (empty: all there)."""
    from escha_deploy.sglang.releases import default_release, release_key

    have = release_metrics(version)
    v = release_key(version or default_release())
    later = [n for n in LATER if (since := first_release(n)) is not None and v >= release_key(since)]
    return [m for m in (*ALL, *later) if m not in have]
