"""Results of ``bench`` and ``canary``: the pydantic models behind the table, JSON and chart.

One model renders three ways: ``render.table`` for people,
``model_dump(mode="json")`` for ``--format json``, ``render.chart`` for the PNG. Times are
seconds (float, ``time.perf_counter`` on the client), rates are tokens per second, token
counts are ``int`` as the server reports them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: Bumped when a field changes meaning or goes away.
SCHEMA_VERSION = 1

CachedSource = Literal[
    "usage.prompt_tokens_details.cached_tokens",
    "sglext.cached_tokens_details",
    "metrics:sglang:cached_tokens_total",
]
HostSource = Literal[
    "sglext.cached_tokens_details.host",
    "metrics:sglang:cached_tokens_total{cache_source=host}",
]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServerFacts(_Model):
    """What the server says about itself before the run (all optional but ``url``).

    Sources (SGLang 0.5.19 ``entrypoints/http_server.py``): ``/server_info`` (server args after
    resolution plus scheduler info: ``enable_hierarchical_cache``, ``enable_cache_report``,
    ``enable_deterministic_inference``, ``max_total_num_tokens``, ``hicache_*``, ``version``),
    ``/model_info`` (``served_model_name``, ``model_type``, ``architectures``), ``/v1/tokenize``
    answering, ``/metrics`` answering (``--enable-metrics``).
    """

    url: str
    version: str | None = None
    model: str = Field(description="served model name sent as `model` in requests")
    model_type: str | None = None
    architectures: list[str] | None = None
    hybrid: bool | None = Field(None, description="hybrid (mamba/GDN) model; None when unknown")
    hicache: bool | None = Field(None, description="--enable-hierarchical-cache, from /server_info")
    cache_report: bool | None = Field(None, description="--enable-cache-report, from /server_info")
    deterministic: bool | None = Field(None, description="--enable-deterministic-inference")
    metrics: bool = Field(False, description="/metrics answered (server has --enable-metrics)")
    tokenizer: bool = Field(False, description="/v1/tokenize answered")
    max_total_num_tokens: int | None = Field(None, description="device KV pool, tokens")
    max_req_input_len: int | None = Field(None, description="longest prompt the server takes")
    host_pool_tokens: int | None = Field(
        None, description="host KV pool, tokens (gauge sglang:hicache_host_total_tokens)"
    )
    hicache_ratio: float | None = None
    hicache_write_policy: str | None = None
    max_mamba_cache_size: int | None = Field(None, description="device mamba slots, if set")
    page_size: int | None = Field(None, description="tokens per KV page (/server_info page_size)")
    eviction_policy: str | None = Field(
        None, description="/server_info radix_eviction_policy: lru, lfu, slru, priority (0.5.19)")
    tp_size: int | None = Field(None, description="/server_info tp_size")

    @property
    def label(self) -> str:
        """``"on"``/``"off"`` when /server_info told the HiCache state, else the URL."""
        if self.hicache is None:
            return self.url
        return "on" if self.hicache else "off"


class CachedFigure(_Model):
    """The cached-token share of a set of requests, and where the number came from.

    ``source`` is the first that was available, in this order: the response's
    ``usage.prompt_tokens_details.cached_tokens`` (needs ``--enable-cache-report``; SGLang
    0.5.19 ``entrypoints/openai/usage_processor.py`` emits it only when the count is above 0,
    so once the server is known to report, a missing field means 0), the response's
    ``sglext.cached_tokens_details`` (asked per request with ``return_cached_tokens_details``;
    splits device and host), then the delta of the server counter
    ``sglang:cached_tokens_total`` over the pass (``--enable-metrics``; counts every request
    that finished meanwhile, not only ours). ``None`` when none was available.
    """

    prompt_tokens: int
    cached_tokens: int | None
    share: float | None = Field(description="cached_tokens / prompt_tokens, 0..1")
    source: CachedSource | None
    host_tokens: int | None = Field(None, description="cached tokens that came from the host tier")
    host_source: HostSource | None = None
    load_back_tokens: dict[str, int] | None = Field(
        None, description="delta of sglang:load_back_tokens_total by pool over the pass"
    )
    note: str | None = None


class PrefillResult(_Model):
    """Cold prefill: one long prompt nothing has seen, time to its first token."""

    prompt_tokens: int
    cached_tokens: int | None
    ttft_s: float
    tokens_per_s: float = Field(description="(prompt_tokens - cached) / ttft_s")


class DecodeResult(_Model):
    """Decode at batch 1: a short prompt, ``ignore_eos``, tokens after the first over time."""

    completion_tokens: int
    decode_s: float = Field(description="first streamed token to last")
    tokens_per_s: float


class PassResult(_Model):
    """N concurrent requests, each a distinct long prefix plus a question: wall time."""

    requests: int
    wall_s: float = Field(description="first request sent to last response done")
    prompt_tokens: int
    cached: CachedFigure


class WorkloadSpec(_Model):
    """The workload, the same for every server of a run."""

    seed: int = 0
    prefixes: int = Field(8, ge=1, le=256, description="concurrent distinct prefixes (seed: 8)")
    prefix_tokens: int = Field(18_000, ge=16, description="tokens per prefix (seed: 18K)")
    prefill_tokens: int = Field(18_000, ge=16, description="tokens of the cold-prefill prompt")
    decode_tokens: int = Field(256, ge=2, description="tokens generated at batch 1")
    answer_tokens: int = Field(16, ge=1, description="tokens generated per prefix request")


class ServerRun(_Model):
    """Everything measured on one server."""

    facts: ServerFacts
    prefill: PrefillResult
    decode: DecodeResult
    first_pass: PassResult
    second_pass: PassResult
    token_counts: Literal["server tokenizer", "estimate"]
    warnings: list[str] = Field(default_factory=list)


class BenchReport(_Model):
    """``escha-deploy bench`` output: one run per server, side by side in the table."""

    schema_version: int = SCHEMA_VERSION
    workload: WorkloadSpec
    runs: list[ServerRun]
    mode: Literal["single", "compare", "hicache-ab"] = "single"
    box: str | None = Field(None, description="where it ran, as the user named it (--box)")


class Answer(_Model):
    """One canary ask: the text, token ids if the server returned them, and the cache report."""

    label: Literal["cold", "device", "host"]
    text: str
    token_ids: list[int] | None = None
    prompt_tokens: int
    cached_tokens: int | None = Field(None, description="usage or sglext total, None if unknown")
    device_tokens: int | None = None
    host_tokens: int | None = None
    load_back_tokens: dict[str, int] | None = None
    host_metric_tokens: int | None = Field(
        None, description="delta of sglang:cached_tokens_total{cache_source=host} over the ask"
    )


class CanaryResult(_Model):
    """The canary's verdict and its evidence.

    ``verdict``: ``pass`` (host-tier hit proven, same answer), ``mismatch`` (exit 3),
    ``inconclusive`` (no proof of a host-tier hit; exit 5).
    """

    schema_version: int = SCHEMA_VERSION
    url: str
    verdict: Literal["pass", "mismatch", "inconclusive"]
    reason: str
    evidence: list[str]
    answers: list[Answer]
    fill_requests: int
    fill_tokens: int
    hybrid: bool | None
    deterministic: bool | None
    upstream: str | None = Field(None, description="the upstream issue the verdict points at")
