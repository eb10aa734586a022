"""SGLang's Prometheus counters, read from ``GET /metrics`` into snapshots and deltas.

The server exposes ``/metrics`` only when started with ``--enable-metrics`` (SGLang 0.5.19
``utils/common.py`` ``add_prometheus_middleware``). The text is parsed with
``prometheus_client``'s own parser, the library SGLang writes it with.

Counters the bench and the canary read (names from SGLang 0.5.19
``observability/metrics_collector.py``):

- ``sglang:cached_tokens_total{cache_source=device|host|storage_<backend>|total}``: cached prompt
  tokens by tier, counted when a request finishes (``observe_one_finished_request``); the
  ``total`` label is the fallback when the request had no per-tier breakdown.
- ``sglang:prompt_tokens_total``: prompt tokens of finished requests.
- ``sglang:load_back_tokens_total{pool=kv|mamba|swa|...}``: tokens loaded back from the host
  pool (L2) to the device (``SchedulerMetricsCollector.increment_load_back_num_tokens``,
  called from ``hiradix_cache.py`` and ``unified_radix_cache.py``). Exists only with HiCache.
- ``sglang:hicache_backup_tokens_total{pool}``, ``sglang:evicted_tokens_total``: device to host
  backups and device evictions.
- gauges ``sglang:hicache_host_total_tokens`` / ``sglang:hicache_host_used_tokens`` (host pool
  capacity and use, HiCache only) and ``sglang:mamba_usage`` (hybrid models).

Scheduler-side series carry a ``tp_rank`` label and are exported by TP rank 0 unless
``--enable-metrics-for-all-schedulers``; ``Snapshot.total`` keeps rank 0 when that label is
present so a TP 2 server is not counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CACHED_TOKENS = "sglang:cached_tokens_total"
PROMPT_TOKENS = "sglang:prompt_tokens_total"
LOAD_BACK_TOKENS = "sglang:load_back_tokens_total"
BACKUP_TOKENS = "sglang:hicache_backup_tokens_total"
EVICTED_TOKENS = "sglang:evicted_tokens_total"
HOST_TOTAL_TOKENS = "sglang:hicache_host_total_tokens"
HOST_USED_TOKENS = "sglang:hicache_host_used_tokens"
MAMBA_USAGE = "sglang:mamba_usage"
#: Mean acceptance length of speculative decoding, accepted drafts + the bonus token per forward
#: (a gauge per scheduler, 0.0 without speculative decoding; SchedulerMetricsCollector in every
#: supported release's metrics.json).
SPEC_ACCEPT_LENGTH = "sglang:spec_accept_length"
#: The fall of the acceptance length, as a share of the length before, that counts as a fall
#: after host load-backs: sglang#32176 saw EAGLE's 4.49 fall to 1.59 (65 %) after HiCache filled
#: and loaded back, with no error; batch-to-batch spread of the gauge is far below a quarter.
SPEC_ACCEPT_FALL = 0.25


def acceptance_fell(before: float | None, after: float | None) -> bool:
    """Whether the speculative acceptance length fell by more than ``SPEC_ACCEPT_FALL`` of
    ``before`` (both > 0: speculative decoding ran in both looks)."""
    return bool(before and after and before > 0 and after > 0 and after < before * (1 - SPEC_ACCEPT_FALL))


def acceptance_text(before: float | None, after: float | None, load_back_tokens: float) -> str:
    """The acceptance length before and after, with the load-backs between: the line ``status``
    and the canary print (``sglang:spec_accept_length 4.50 -> 1.60 (-64 %) while
    sglang:load_back_tokens_total +N``)."""
    b = "-" if not before else f"{before:.2f}"
    a = "-" if not after else f"{after:.2f}"
    fall = f" ({(after - before) / before * 100:+.0f} %)" if before and after else ""
    return f"{SPEC_ACCEPT_LENGTH} {b} -> {a}{fall} while {LOAD_BACK_TOKENS} +{load_back_tokens:,.0f}"

_Key = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Snapshot:
    """One scrape: sample name plus sorted labels -> value (float, as Prometheus sends it).

    ``nonfinite``: the series whose value was NaN, +/-Inf or beyond ``httpread.MAX_SAMPLE``,
    kept out of ``samples`` (one summed into a total makes the total NaN or inf;
    ``nonfinite_read`` names those a reader needs)."""

    samples: dict[_Key, float] = field(default_factory=dict)
    nonfinite: dict[_Key, float] = field(default_factory=dict)
    #: series the text gave more than once, and the samples after ``# EOF`` (``MetricSamples``)
    duplicates: list[_Key] = field(default_factory=list)
    after_eof: int = 0

    @classmethod
    def parse(cls, text: str, url: str = "/metrics", policy=None, *, started: float | None = None) -> "Snapshot":
        """Parse Prometheus text exposition under the HTTP reading policy
        (``httpread.metric_samples``: the series cap, the deadline from ``started``). Raises
        ``httpread.ReadFailed`` (``BadAnswer`` for malformed text, ``TooLarge``, ``DeadlinePassed``)."""
        from escha_deploy.utils.httpread import Policy, metric_samples

        got = metric_samples(text, url, policy or Policy(), started=started)
        return cls(got.samples, got.nonfinite, got.duplicates, got.after_eof)

    def nonfinite_read(self, names) -> list[_Key]:
        """The non-finite series among ``names`` (a histogram's name covers its ``_sum``,
        ``_count`` and ``_bucket`` samples), sorted."""
        wanted = set(names)
        return sorted(k for k in self.nonfinite
                      if k[0] in wanted or any(k[0] == n + sfx for n in wanted for sfx in ("_sum", "_count", "_bucket")))

    def has(self, name: str) -> bool:
        """Whether any series of sample ``name`` is present."""
        return any(k[0] == name for k in self.samples)

    def total(self, name: str, **match: str) -> float:
        """Sum of the series of ``name`` whose labels include ``match``.

        Where series carry ``tp_rank``, only ``tp_rank="0"`` counts (each TP rank of one
        scheduler group reports the same tokens).
        """
        total = 0.0
        for (n, labels), v in self.samples.items():
            if n != name:
                continue
            d = dict(labels)
            if "tp_rank" in d and d["tp_rank"] != "0":
                continue
            if all(d.get(k) == val for k, val in match.items()):
                total += v
        return total

    def labels_of(self, name: str, label: str) -> set[str]:
        """The values that ``label`` takes on the series of ``name``."""
        return {dict(lab).get(label, "") for (n, lab) in self.samples if n == name} - {""}


def delta(after: Snapshot, before: Snapshot, name: str, **match: str) -> float:
    """``after.total(name, **match) - before.total(name, **match)`` (counters only grow)."""
    return after.total(name, **match) - before.total(name, **match)
