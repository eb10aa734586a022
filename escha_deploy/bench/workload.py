"""The measurements on one server: cold prefill, decode at batch 1, N concurrent prefixes.

Order (each step's prompts come from ``prompts`` under its own namespace, so steps share no
prefix): a short warm-up (not measured: the first request pays for JIT and graph capture),
the cold prefill, decode at batch 1, the first pass, the second pass. The first seed's
"Measured" table is the shape (the reference box, 2 x RTX 5060 Ti, TP 2): cold prefill 1010 vs
964 tok/s, decode 51.5 vs 50.7 tok/s, 8 concurrent distinct 18K prefixes second pass 5.2 s
vs 1.6 s, HiCache off vs on.

- Cold prefill tokens/s = (prompt_tokens - cached_tokens) / time to the first streamed token.
- Decode tokens/s = (completion_tokens - tokens in the first chunk) / (last chunk - first
  chunk), with ``ignore_eos`` so the length is fixed. Streamed tokens arrive in chunks of
  ``--stream-interval`` tokens; the count per chunk comes from ``token_ids``.
- A pass sends N requests at once (each a distinct prefix plus a question) and takes the wall
  time from the first send to the last ``[DONE]``. The second pass asks a different question
  after the same prefix, so everything but the question can come from the cache; its cached
  share and the source of that figure come from ``cached_figure``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .client import Completion, ServerClient
from .metrics import CACHED_TOKENS, LOAD_BACK_TOKENS, Snapshot, delta
from .models import (
    CachedFigure,
    DecodeResult,
    PassResult,
    PrefillResult,
    ServerFacts,
    ServerRun,
    WorkloadSpec,
)
from .prompts import make_prompt, make_prompts

#: Cached tokens at or below this count still count as cold (a page of a shared first token
#: or two; SGLang's page size is 1 to 64 tokens).
COLD_SLACK_TOKENS = 64

Step = Callable[[str], None]


def cached_figure(
    done: list[Completion],
    facts: ServerFacts,
    before: Snapshot | None,
    after: Snapshot | None,
) -> CachedFigure:
    """The cached share of ``done`` and its source (see ``models.CachedFigure``).

    Response fields are preferred over metrics, because metrics count every request that
    finished during the pass. A missing ``prompt_tokens_details`` reads as 0 only once the
    server is known to report (``/server_info`` says ``enable_cache_report`` or a response of
    this set carried the field), since SGLang 0.5.19 omits it for 0
    (``UsageProcessor._details_if_cached``); the same rule holds for ``sglext``
    (``OutputStreamer.get_cached_tokens_details`` returns ``None`` when nothing was cached).
    """
    prompt = sum(c.prompt_tokens for c in done)
    cached: int | None = None
    source = None
    note = None
    if facts.cache_report or any(c.usage_cached is not None for c in done):
        cached = sum(c.usage_cached or 0 for c in done)
        source = "usage.prompt_tokens_details.cached_tokens"
    elif any(c.details is not None for c in done):
        cached = sum(c.cached_total() or 0 for c in done)
        source = "sglext.cached_tokens_details"
    elif before is not None and after is not None:
        cached = int(delta(after, before, CACHED_TOKENS))
        source = "metrics:sglang:cached_tokens_total"
        note = "from server metrics: counts every request that finished during the pass"
    else:
        note = (
            "no cached-token report: start the server with --enable-cache-report "
            "or --enable-metrics (escha-deploy up sets both)"
        )
    host: int | None = None
    host_source = None
    if any(c.details is not None for c in done):
        host = sum(int((c.details or {}).get("host") or 0) for c in done)
        host_source = "sglext.cached_tokens_details.host"
    elif before is not None and after is not None and facts.hicache is not False:
        host = int(delta(after, before, CACHED_TOKENS, cache_source="host"))
        host_source = "metrics:sglang:cached_tokens_total{cache_source=host}"
    load_back = None
    if before is not None and after is not None and after.has(LOAD_BACK_TOKENS):
        load_back = {
            pool: int(delta(after, before, LOAD_BACK_TOKENS, pool=pool))
            for pool in sorted(after.labels_of(LOAD_BACK_TOKENS, "pool"))
        }
    share = (cached / prompt) if (cached is not None and prompt > 0) else None
    return CachedFigure(
        prompt_tokens=prompt, cached_tokens=cached, share=share, source=source,
        host_tokens=host, host_source=host_source, load_back_tokens=load_back, note=note,
    )


def device_pool_note(spec: WorkloadSpec, facts: ServerFacts, second: PassResult) -> list[str]:
    """A warning when the second pass was served from the device pool, not from host RAM.

    Then the table compares device hits, and HiCache's host tier was not exercised: the
    working set (``prefixes x prefix_tokens``) fit the device pool (``max_total_num_tokens``).
    Said when at least half of the second pass was cached and under a tenth of that came from
    the host tier (or, with HiCache off, whenever half was cached).
    """
    c = second.cached
    if c.share is None or c.share < 0.5 or not c.cached_tokens:
        return []
    if facts.hicache and (c.host_tokens is None or c.host_tokens >= 0.1 * c.cached_tokens):
        return []
    pool = (f" of {facts.max_total_num_tokens} tokens"
            if facts.max_total_num_tokens is not None else "")
    return [
        f"second pass: {c.share:.0%} cached, mostly from the device pool{pool}, so HiCache's "
        f"host tier was not exercised ({spec.prefixes} x {spec.prefix_tokens} tokens fit the "
        "device pool): raise --prefixes or --prefix-tokens past the pool to compare off and on"
    ]


async def _pass(
    client: ServerClient, facts: ServerFacts, prompts: list, answer_tokens: int, seed: int
) -> PassResult:
    before = await client.metrics() if facts.metrics else None
    done = await asyncio.gather(
        *(client.complete(p.payload, answer_tokens, seed=seed) for p in prompts)
    )
    wall = max(c.t_end for c in done) - min(c.t_start for c in done)
    after = await client.metrics() if facts.metrics else None
    return PassResult(
        requests=len(done),
        wall_s=wall,
        prompt_tokens=sum(c.prompt_tokens for c in done),
        cached=cached_figure(list(done), facts, before, after),
    )


def prefill_was_warm(cached_tokens: int | None) -> bool:
    """Whether the cold prefill's prompt was already cached (more than ``COLD_SLACK_TOKENS``
    of it): its tok/s then measures a cache hit, not a prefill."""
    return cached_tokens is not None and cached_tokens > COLD_SLACK_TOKENS


def first_pass_was_warm(first: PassResult, spec: WorkloadSpec) -> bool:
    """Whether the first pass's distinct prefixes were already cached (more than
    ``COLD_SLACK_TOKENS`` per prefix): its wall time then is not a cold pass."""
    c = first.cached
    return c.share is not None and bool(c.cached_tokens) and (c.cached_tokens or 0) > COLD_SLACK_TOKENS * spec.prefixes


def warm_marks(run: ServerRun, spec: WorkloadSpec) -> dict[str, str]:
    """The measurements of ``run`` made on an already-warm cache (a contaminated pass: the same
    ``--seed`` run before on that server), by name (``cold prefill``, ``first pass``), each with
    its evidence; what the table and the chart mark besides the warning on stderr."""
    out = {}
    if prefill_was_warm(run.prefill.cached_tokens):
        out["cold prefill"] = f"{run.prefill.cached_tokens:,} of {run.prefill.prompt_tokens:,} tokens cached"
    if first_pass_was_warm(run.first_pass, spec):
        out["first pass"] = (f"{run.first_pass.cached.cached_tokens:,} of {run.first_pass.prompt_tokens:,} "
                             "tokens cached")
    return out


async def run_workload(
    client: ServerClient, facts: ServerFacts, spec: WorkloadSpec, step: Step = lambda _: None
) -> ServerRun:
    """Run the whole workload on one probed server and return what it measured.

    Sends ``2 * spec.prefixes + 3`` completions plus tokenizer and metrics calls. Raises
    ``Failed`` (from the client) when a request fails or times out. Warnings (a "cold"
    prompt that was cached, a prompt longer than the server takes) go in ``ServerRun.warnings``.
    """
    tok = client.tokenize if facts.tokenizer else None
    warnings: list[str] = []
    longest = max(spec.prefix_tokens + 64, spec.prefill_tokens)
    if facts.max_req_input_len is not None and longest > facts.max_req_input_len:
        warnings.append(
            f"prompts of about {longest} tokens exceed the server's max_req_input_len "
            f"{facts.max_req_input_len}; expect errors (lower --prefix-tokens)"
        )

    step("warm-up")
    warm = await make_prompt(spec.seed, "warmup", 0, 64, tok)
    await client.complete(warm.payload, 8, seed=spec.seed)

    step(f"cold prefill ({spec.prefill_tokens} tokens)")
    cold = await make_prompt(spec.seed, "cold", 0, spec.prefill_tokens, tok)
    c = await client.complete(cold.payload, 1, seed=spec.seed)
    cached = c.cached_total()
    if prefill_was_warm(cached):
        warnings.append(
            f"cold prefill: the server already held {cached} of {c.prompt_tokens} tokens "
            "(same --seed run before on this server?): use another --seed or restart it"
        )
    uncached = c.prompt_tokens - (cached or 0)
    prefill = PrefillResult(
        prompt_tokens=c.prompt_tokens, cached_tokens=cached, ttft_s=c.ttft_s,
        tokens_per_s=uncached / c.ttft_s if c.ttft_s > 0 else 0.0,
    )

    step(f"decode at batch 1 ({spec.decode_tokens} tokens)")
    dp = await make_prompt(spec.seed, "decode", 0, 64, tok)
    d = await client.complete(dp.payload, spec.decode_tokens, seed=spec.seed)
    span = (d.t_last or d.t_end) - (d.t_first or d.t_start)
    after_first = max(0, d.completion_tokens - d.first_chunk_tokens)
    decode = DecodeResult(
        completion_tokens=d.completion_tokens, decode_s=span,
        tokens_per_s=after_first / span if span > 0 else 0.0,
    )
    if d.completion_tokens < spec.decode_tokens:
        warnings.append(
            f"decode: {d.completion_tokens} of {spec.decode_tokens} tokens came back "
            "(server ignored ignore_eos?)"
        )

    step(f"building {spec.prefixes} prefixes of {spec.prefix_tokens} tokens")
    pairs = [await make_prompts(spec.seed, "prefix", i, spec.prefix_tokens, tok, ["q1", "q2"])
             for i in range(spec.prefixes)]
    q1 = [p[0] for p in pairs]
    q2 = [p[1] for p in pairs]

    step(f"first pass: {spec.prefixes} concurrent distinct prefixes")
    first = await _pass(client, facts, q1, spec.answer_tokens, spec.seed)
    if first_pass_was_warm(first, spec):
        assert first.cached.share is not None
        warnings.append(
            f"first pass: {first.cached.share:.0%} of the prompt tokens were already cached "
            "(same --seed run before on this server?): use another --seed or restart it"
        )
    step(f"second pass: same {spec.prefixes} prefixes, new question")
    second = await _pass(client, facts, q2, spec.answer_tokens, spec.seed)
    warnings += device_pool_note(spec, facts, second)
    warnings += client.warnings  # what the server's answers made the client leave out
    return ServerRun(
        facts=facts, prefill=prefill, decode=decode, first_pass=first, second_pass=second,
        token_counts="server tokenizer" if facts.tokenizer else "estimate",
        warnings=warnings,
    )


async def bench_endpoint(
    url: str, spec: WorkloadSpec, step: Step = lambda _: None, **client_kw
) -> ServerRun:
    """Probe ``url`` and run the workload on it (one ``ServerClient`` for both)."""
    async with ServerClient(url, **client_kw) as client:
        step(f"probing {url}")
        facts = await client.probe()
        return await run_workload(client, facts, spec, step)
