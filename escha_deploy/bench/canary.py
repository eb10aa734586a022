"""The host-tier restore canary: does a prefix restored from host RAM give the same answer?

The point: a reused prefix must give the same result as its
first computation. sglang#39830 is the failure this
catches: on hybrid GDN models a prefix evicted from the device pool and loaded back from the
host pool gives a fluent, wrong answer, with ``cached_tokens`` at full length and no warning.

Steps (one server, temperature 0, a fixed ``seed``; the server's deterministic mode,
``--enable-deterministic-inference``, where it has it):

1. ``cold``: ask a fresh ledger prompt (``prompts``); nothing cached.
2. ``device``: ask it again at once; the prefix comes from the device pool. A different
   answer here is not the host tier (device-path bugs such as sglang#39342, or numerics when
   deterministic mode is off).
3. fill: push the prefix out of the device pool by asking other, distinct prompts of
   ``fill_tokens`` tokens in total, one at a time. Not ``/flush_cache``: SGLang's flush clears
   the host tier too (0.5.19 ``managers/scheduler.py`` ``flush_cache`` calls
   ``tree_cache.reset()``; ``mem_cache/hiradix_cache.py`` ``reset`` clears the host pool), and
   there would be nothing left to restore.
   The fill is sized from what the server reports (``/server_info``): the whole device pool
   plus 10 % (``max_total_num_tokens``; not "pool less the canary": a radix node the canary
   shares or one the scheduler holds is not the LRU leaf the arithmetic assumes), in whole
   pages (``page_size``), in more prompts than the device has mamba slots
   (``max_mamba_cache_size``: each finished filler keeps a mamba state, so the canary's state
   leaves too), each asked as often as ``radix_eviction_policy`` needs to rank it above the
   canary (``mem_cache/evict_policy.py``: ``lfu`` orders by ``hit_count``, ``slru`` protects a
   node hit twice; the canary was asked twice). The ``sglang:evicted_tokens_total`` counter then
   says whether the device pool let go of the canary's tokens; when it did not, the fill goes on
   (up to ``max_fill_requests``), and the verdict names the figures when it never does.
   On a hybrid model the second (device-hit) ask is also what lets a later hit reach the
   canary at all: the radix cache matches only up to a node holding a mamba state, a request's
   state is kept at the end of its own sequence, and a request matching KV beyond the last
   state makes SGLang keep one at the branching point (the last ``mamba_cache_chunk_size``-
   aligned position of the hit: ``mem_cache/unified_cache/components/mamba_component.py``,
   ``mamba_branching_seqlen``); that state is what the host tier backs up.
   Under ``write_through`` every filler is also written to the host pool, so the host pool must
   hold canary + fill or it drops the canary too; that is checked and said up front.
4. ``host``: ask the canary again, with ``/metrics`` scraped before and after.

Proof that step 4 came from the host tier, any of: the response's
``sglext.cached_tokens_details.host > 0`` (asked with ``return_cached_tokens_details``), a rise
of ``sglang:cached_tokens_total{cache_source="host"}``, or a rise of
``sglang:load_back_tokens_total`` (SGLang 0.5.19 ``observability/metrics_collector.py``).
Without proof the verdict is ``inconclusive`` (exit 5), never ``pass``. A different answer is
``mismatch`` (exit 3). Zero host hits on a hybrid model point at sglang#33713 (the unified
cache prunes mamba nodes on eviction instead of demoting them, so load-back never happens).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from escha_deploy.utils.errors import BadInput, Inconclusive, Refused

from .client import Completion, ServerClient
from .metrics import (CACHED_TOKENS, EVICTED_TOKENS, LOAD_BACK_TOKENS, SPEC_ACCEPT_LENGTH, Snapshot,
                      acceptance_fell, acceptance_text, delta)
from .models import Answer, CanaryResult, ServerFacts
from .prompts import make_prompt
from .workload import COLD_SLACK_TOKENS

ISSUE_39830 = "https://github.com/sgl-project/sglang/issues/39830"
ISSUE_33713 = "https://github.com/sgl-project/sglang/issues/33713"
ISSUE_39342 = "https://github.com/sgl-project/sglang/issues/39342"

EXPLAIN_39830 = (
    "the answer from a prefix restored from the host tier differs from its first computation: "
    "this is sglang#39830 (HiCache host-tier restore gives wrong output on hybrid GDN models; "
    "no upstream fix as of 0.5.19). Turn HiCache off for this model "
    "(hicache.enabled: false in the profile) until the runtime carries a fix"
)
EXPLAIN_33713 = (
    "zero host-tier hits on a hybrid model after the prefix left the device pool: this is "
    "sglang#33713 (on device eviction the unified cache prunes the mamba nodes instead of "
    "keeping them in host memory, so host load-back is never tried); HiCache holds pinned host "
    "RAM for nothing here"
)
EXPLAIN_DEVICE = (
    "the device-hit answer already differs from the cold one, before any host restore: not "
    "the host tier but the device path (e.g. sglang#39342 with --enable-mixed-chunk, fixed by "
    "#39526) or a server without deterministic mode"
)

#: Share of the device pool added to the fill beyond the whole pool, for page rounding and
#: tokens the scheduler holds back.
FILL_MARGIN = 0.10

#: Asks per filler under each ``radix_eviction_policy`` (SGLang 0.5.19
#: ``mem_cache/evict_policy.py``) so that fillers are evicted after the canary, which was asked
#: twice: ``lfu`` evicts the lowest ``hit_count`` first, ``slru`` keeps a node hit twice
#: (``protected_threshold`` 2) behind every node hit once; ``lru`` and ``priority`` (equal
#: priorities) go by last access, and the canary was touched before every filler.
ASKS_PER_FILLER = {"lru": 1, "priority": 1, "lfu": 3, "slru": 3}

Step = Callable[[str], None]


@dataclass(frozen=True)
class CanaryOptions:
    """Sizes of the canary. Tokens are the server's tokens.

    ``prompt_tokens``: ``None`` takes ``DEFAULT_PROMPT_TOKENS``, or half the device pool when
    that is smaller (``canary_tokens``).
    ``fill_tokens``: ``None`` derives it from ``/server_info`` (see the module docstring).
    ``hybrid``: ``None`` takes the server's model type (``ServerFacts.hybrid``).
    """

    seed: int = 0
    prompt_tokens: int | None = None
    answer_tokens: int = 32
    fill_tokens: int | None = None
    fill_prompt_tokens: int = 16_384
    max_fill_requests: int = 64
    hybrid: bool | None = None


#: The canary prefix when neither the options nor the server's pool say otherwise, tokens.
DEFAULT_PROMPT_TOKENS = 4096


def canary_tokens(facts: ServerFacts, opts: CanaryOptions) -> int:
    """The canary prefix in tokens: ``opts.prompt_tokens`` when given, else
    ``DEFAULT_PROMPT_TOKENS`` capped at half the device pool (``max_total_num_tokens // 2``: the
    fill must fit beside it in the host pool) and at ``max_req_input_len - answer_tokens - 16``,
    in whole pages, at least 64."""
    if opts.prompt_tokens is not None:
        return opts.prompt_tokens
    n = DEFAULT_PROMPT_TOKENS
    if facts.max_total_num_tokens is not None:
        n = min(n, facts.max_total_num_tokens // 2)
    if facts.max_req_input_len is not None:
        n = min(n, facts.max_req_input_len - opts.answer_tokens - 16)
    page = max(1, facts.page_size or 1)
    return max(64, n // page * page)


@dataclass(frozen=True)
class FillPlan:
    """How many filler prompts of how many tokens, asked how many times each, and the
    warnings that go with it. ``host_short``: why the host pool cannot hold the canary through
    this fill (None: it can, or its size is unknown)."""

    requests: int
    prompt_tokens: int
    total_tokens: int
    notes: tuple[str, ...]
    asks: int = 1
    host_short: str | None = None


def plan_fill(facts: ServerFacts, opts: CanaryOptions) -> FillPlan:
    """Size the fill that pushes the canary out of the device pool (pure).

    ``total = fill_tokens`` if given, else ``max_total_num_tokens +
    ceil(FILL_MARGIN * max_total_num_tokens)``, in the fewest prompts of at most
    ``min(fill_prompt_tokens, max_req_input_len - answer_tokens - 16, max_total_num_tokens // 2)``
    tokens, split evenly and rounded up to whole
    ``page_size`` pages; more fillers than ``max_mamba_cache_size``; ``asks`` from
    ``ASKS_PER_FILLER`` for the server's ``eviction_policy``. Raises ``BadInput``
    when the pool size is unknown and no ``fill_tokens`` is given, or when the fill needs more
    than ``max_fill_requests`` prompts.
    """
    notes: list[str] = []
    pool = facts.max_total_num_tokens
    if opts.fill_tokens is not None:
        total = opts.fill_tokens
    elif pool is None:
        raise BadInput(
            "--fill-tokens: the server does not say its device pool size "
            "(/server_info max_total_num_tokens); give --fill-tokens"
        )
    else:
        total = pool + math.ceil(FILL_MARGIN * pool)
    page = max(1, facts.page_size or 1)
    cap = opts.fill_prompt_tokens
    if facts.max_req_input_len is not None:
        cap = min(cap, facts.max_req_input_len - opts.answer_tokens - 16)
    if pool is not None:
        cap = min(cap, pool // 2)  # no filler as large as the pool it is to churn
    requests = math.ceil(total / max(16, cap))
    per = max(16, math.ceil(total / requests))
    if facts.max_mamba_cache_size is not None and requests <= facts.max_mamba_cache_size:
        requests = facts.max_mamba_cache_size + 1
        per = max(16, math.ceil(total / requests))
        notes.append(f"{requests} fillers, one more than the {facts.max_mamba_cache_size} "
                     "device mamba slots")
    per = math.ceil(per / page) * page  # whole pages: a partial page is not cached
    policy_name = facts.eviction_policy or "lru"
    asks = ASKS_PER_FILLER.get(policy_name)
    if asks is None:
        asks = 3
        notes.append(f"radix_eviction_policy {policy_name!r} is not one the canary knows; "
                     "each filler is asked 3 times")
    elif asks > 1:
        notes.append(f"each filler asked {asks} times: radix_eviction_policy {policy_name} keeps "
                     "the canary (asked twice) ahead of nodes hit less often")
    if requests > opts.max_fill_requests:
        raise BadInput(
            f"--fill-tokens: {total} tokens need {requests} prompts of {per} tokens, more than "
            f"--max-fill-requests {opts.max_fill_requests}"
        )
    host = facts.host_pool_tokens
    if host is None and facts.hicache_ratio is not None and pool is not None:
        host = int(facts.hicache_ratio * pool)
    policy = facts.hicache_write_policy or "write_through"
    short = None
    canary = canary_tokens(facts, opts)
    if host is not None and policy.startswith("write_through") and (
        canary + requests * per > host
    ):
        short = (f"host pool {host} tokens < canary {canary} + fill {requests * per} "
                 f"under {policy}: the host tier drops the canary too (a hicache_ratio above "
                 f"{1 + FILL_MARGIN:.2f} plus the canary's share of the pool avoids it)")
        notes.append(short)
    return FillPlan(requests=requests, prompt_tokens=per, total_tokens=requests * per,
                    notes=tuple(notes), asks=asks, host_short=short)


def evicted_per_rank(after: Snapshot, before: Snapshot, facts: ServerFacts) -> float:
    """Device KV tokens evicted between two scrapes, per rank. A labelled counter has no series
    before its first increment (``prometheus_client``), so an absent one counts 0.
    SGLang 0.5.19 exports ``sglang:evicted_tokens_total`` labelled ``cache_type`` only, every
    rank's count summed into it by the multiprocess registry (``BasePrefixCache.
    init_metrics_collector``), so the sum is divided by ``tp_size``; 0.5.23 labels it per
    ``tp_rank`` and ``Snapshot.total`` keeps rank 0."""
    if not after.has(EVICTED_TOKENS):
        return 0.0
    d = delta(after, before, EVICTED_TOKENS)
    per_rank_labelled = bool(after.labels_of(EVICTED_TOKENS, "tp_rank"))
    return d if per_rank_labelled else d / max(1, facts.tp_size or 1)


def _same(a: Completion, b: Completion) -> bool:
    if a.token_ids is not None and b.token_ids is not None:
        return a.token_ids == b.token_ids
    return a.text == b.text


def _answer(label: str, c: Completion, before: Snapshot | None = None,
            after: Snapshot | None = None) -> Answer:
    d = c.details or {}
    lb = hm = None
    if before is not None and after is not None:
        hm = int(delta(after, before, CACHED_TOKENS, cache_source="host"))
        if after.has(LOAD_BACK_TOKENS):
            lb = {p: int(delta(after, before, LOAD_BACK_TOKENS, pool=p))
                  for p in sorted(after.labels_of(LOAD_BACK_TOKENS, "pool"))}
    return Answer(
        label=label, text=c.text, token_ids=c.token_ids, prompt_tokens=c.prompt_tokens,
        cached_tokens=c.cached_total(),
        device_tokens=int(d.get("device") or 0) if c.details is not None else None,
        host_tokens=int(d.get("host") or 0) if c.details is not None else None,
        load_back_tokens=lb, host_metric_tokens=hm,
    )


def acceptance_evidence(before: Snapshot | None, after: Snapshot | None) -> list[str]:
    """The speculative acceptance length before the fill (before any host hit) and after the
    host-tier ask, with the load-backs between, as evidence lines; a second line when it fell by
    more than ``SPEC_ACCEPT_FALL`` after load-backs (sglang#32176). None without speculative
    decoding (the gauge is 0.0) or without both scrapes."""
    if before is None or after is None or not after.has(SPEC_ACCEPT_LENGTH):
        return []
    b, a = before.total(SPEC_ACCEPT_LENGTH), after.total(SPEC_ACCEPT_LENGTH)
    if not a:
        return []
    loaded = delta(after, before, LOAD_BACK_TOKENS) if after.has(LOAD_BACK_TOKENS) else 0.0
    out = ["speculative acceptance before the fill and after the host-tier ask: " + acceptance_text(b or None, a, loaded)]
    if loaded > 0 and acceptance_fell(b, a):
        out.append("speculative acceptance fell after host load-backs, as in sglang#32176 (EAGLE 4.49 -> 1.59 "
                   "after HiCache load-back, no error; flushing the cache restored it)")
    return out


async def run_canary(
    client: ServerClient, facts: ServerFacts, opts: CanaryOptions, step: Step = lambda _: None
) -> CanaryResult:
    """Run the canary on a probed server; returns the verdict (does not raise for it).

    Raises ``Refused`` when the server runs without HiCache (nothing to test), ``BadInput``
    from ``plan_fill``, ``Failed`` from the client. Sends ``3 + fill.requests`` completions
    (up to 2 more if a "cold" prompt turns out cached) and 2 to 4 metrics scrapes.
    """
    if facts.hicache is False:
        raise Refused(
            f"{facts.url}: the canary tests HiCache's host tier, and this server runs without "
            "--enable-hierarchical-cache",
            hint="start the profile with HiCache on (`escha-deploy up`) and run the canary again",
        )
    opts = replace(opts, prompt_tokens=canary_tokens(facts, opts))
    assert opts.prompt_tokens is not None
    fill = plan_fill(facts, opts)
    hybrid = opts.hybrid if opts.hybrid is not None else facts.hybrid
    tok = client.tokenize if facts.tokenizer else None
    evidence: list[str] = list(fill.notes)
    if facts.hicache is None:
        evidence.append("the server did not say whether HiCache is on (/server_info absent)")
    if facts.deterministic is not True:
        evidence.append("server not in deterministic mode (--enable-deterministic-inference): "
                        "temperature 0 and a fixed seed only")

    cold = prompt = None
    for attempt in range(3):
        step(f"cold ask ({opts.prompt_tokens} tokens)")
        prompt = await make_prompt(opts.seed, "canary", attempt, opts.prompt_tokens, tok,
                                   "canary")
        cold = await client.complete(prompt.payload, opts.answer_tokens, seed=opts.seed)
        if (cold.cached_total() or 0) <= COLD_SLACK_TOKENS:
            break
        evidence.append(f"canary prompt {attempt} was already cached; took another")
    assert cold is not None and prompt is not None

    step("device-hit ask")
    dev = await client.complete(prompt.payload, opts.answer_tokens, seed=opts.seed)

    before_fill = await client.metrics() if facts.metrics else None
    sent = 0
    evicted: float | None = None
    target = opts.prompt_tokens  # the canary's prompt must leave the device pool
    while True:
        for i in range(sent, sent + fill.requests):
            step(f"filling the device pool ({i + 1}/{fill.requests}, "
                 f"{fill.prompt_tokens} tokens each)")
            fp = await make_prompt(opts.seed, f"fill-{attempt}", i, fill.prompt_tokens, tok)
            for _ in range(fill.asks):
                await client.complete(fp.payload, 1, seed=opts.seed)
        sent += fill.requests
        if before_fill is None:
            break
        evicted = evicted_per_rank(await client.metrics(), before_fill, facts)
        if evicted >= target or sent + fill.requests > opts.max_fill_requests:
            break
        evidence.append(f"after {sent} fillers the device pool had evicted {evicted:.0f} tokens "
                        f"per rank, fewer than the canary's {target}: filling again")

    step("host-tier ask")
    before = await client.metrics() if facts.metrics else None
    host = await client.complete(prompt.payload, opts.answer_tokens, seed=opts.seed)
    after = await client.metrics() if facts.metrics else None

    answers = [_answer("cold", cold), _answer("device", dev), _answer("host", host, before, after)]
    h = answers[2]
    shown = []
    if h.host_tokens:
        shown.append(f"response sglext.cached_tokens_details.host = {h.host_tokens}")
    if h.host_metric_tokens:
        shown.append(f"sglang:cached_tokens_total{{cache_source=host}} +{h.host_metric_tokens}")
    if h.load_back_tokens and sum(h.load_back_tokens.values()) > 0:
        shown.append("sglang:load_back_tokens_total +" + ", ".join(
            f"{v} ({p})" for p, v in h.load_back_tokens.items() if v))
    evidence += shown
    evidence += acceptance_evidence(before_fill, after)
    evidence += client.warnings  # what the server's answers made the client leave out
    evidence.append(f"filled {sent * fill.prompt_tokens} tokens in {sent} prompts"
                    + (f", each asked {fill.asks} times" if fill.asks > 1 else "")
                    + (f"; sglang:evicted_tokens_total +{evicted:.0f} per rank" if evicted is not None else ""))
    proven = bool(shown)
    can_see = (cold.details is not None or dev.details is not None or host.details is not None
               or before is not None)

    def result(verdict: str, reason: str, upstream: str | None = None) -> CanaryResult:
        return CanaryResult(
            url=facts.url, verdict=verdict, reason=reason, evidence=evidence, answers=answers,
            fill_requests=sent, fill_tokens=sent * fill.prompt_tokens, hybrid=hybrid,
            deterministic=facts.deterministic, upstream=upstream,
        )

    if not _same(cold, dev):
        return result("mismatch", EXPLAIN_DEVICE, ISSUE_39342)
    if proven and not _same(cold, host):
        return result("mismatch", EXPLAIN_39830, ISSUE_39830)
    if proven:
        return result("pass", "the host-tier restore gave the same answer as the first "
                      "computation")
    if not _same(cold, host):
        return result("mismatch", "the answers differ, but no host-tier hit was shown: the "
                      "prefix was recomputed or came from the device; see the evidence")
    if not can_see:
        return result("inconclusive", "no way to see which tier answered: the server gave no "
                      "cache breakdown and has no /metrics (start it with --enable-metrics)")
    if evicted is not None and evicted < target:
        return result("inconclusive", f"the device pool evicted {evicted:.0f} tokens per rank "
                      f"while {sent * fill.prompt_tokens} filler tokens went through it "
                      f"(pool {facts.max_total_num_tokens}, radix_eviction_policy "
                      f"{facts.eviction_policy or 'unknown'}), fewer than the canary's {target}: "
                      "the canary never left the device pool; raise --max-fill-requests or --fill-tokens")
    if (h.device_tokens or 0) * 2 >= opts.prompt_tokens:
        return result("inconclusive", f"the prefix was still in the device pool after filling "
                      f"{sent * fill.prompt_tokens} tokens: raise --fill-tokens")
    if fill.host_short is not None:
        return result("inconclusive", fill.host_short)
    if hybrid:
        return result("inconclusive", EXPLAIN_33713, ISSUE_33713)
    return result("inconclusive", "no host-tier hit: the prefix was recomputed (the host pool "
                  "dropped it, or HiCache did not back it up); see the evidence")


def raise_for(result: CanaryResult) -> None:
    """Raise for a verdict other than ``pass``: ``Refused`` (exit 3) for ``mismatch``,
    ``Inconclusive`` (exit 5) for ``inconclusive``."""
    if result.verdict == "mismatch":
        raise Refused(f"canary mismatch: {result.reason}",
                      hint=f"see {result.upstream}" if result.upstream else None)
    if result.verdict == "inconclusive":
        raise Inconclusive(f"canary inconclusive: {result.reason}",
                           hint=f"see {result.upstream}" if result.upstream else None)


async def canary_endpoint(url: str, opts: CanaryOptions, step: Step = lambda _: None,
                          **client_kw) -> CanaryResult:
    """Probe ``url`` and run the canary on it (one ``ServerClient`` for both)."""
    async with ServerClient(url, **client_kw) as client:
        step(f"probing {url}")
        facts = await client.probe()
        return await run_canary(client, facts, opts, step)


def canary_check(url: str, opts: CanaryOptions | None = None, step: Step = lambda _: None,
                 **client_kw) -> CanaryResult:
    """Synchronous entry for ``up --canary``: run the canary on a ready server, print its
    verdict and evidence on stderr (``render.canary_lines``), and raise for a verdict other
    than ``pass`` (``raise_for``: ``Refused`` exit 3, ``Inconclusive`` exit 5). Returns the
    result on ``pass``."""
    import sys

    from .render import canary_lines

    result = asyncio.run(canary_endpoint(url, opts or CanaryOptions(), step, **client_kw))
    for line in canary_lines(result):
        print(line, file=sys.stderr)
    raise_for(result)
    return result
