"""The one HTTP edge of ``bench`` and ``canary``: an httpx client for an SGLang 0.5.19 server.

Every request has bounded timeouts (connect ``connect_timeout_s``, read
``request_timeout_s``) and the client refuses to send more than ``max_requests`` requests, so
a mistaken size cannot run away. Endpoints and shapes are SGLang 0.5.19's
(``entrypoints/http_server.py``, ``entrypoints/openai/protocol.py``,
``entrypoints/openai/serving_completions.py``):

- ``GET /health`` 200 when ready (503 while starting);
- ``GET /server_info``: resolved server args, scheduler info (``max_total_num_tokens``,
  ``max_req_input_len``) and ``version``;
- ``GET /model_info``: ``served_model_name``, ``model_type``, ``architectures``;
- ``POST /v1/tokenize`` ``{"prompt": str, "add_special_tokens": bool}`` ->
  ``{"tokens": [int], "count": int, "max_model_len": int}``;
- ``POST /v1/completions`` streamed (SSE ``data: {json}`` lines, ``data: [DONE]`` last), with
  ``stream_options.include_usage`` for the final usage chunk, ``return_cached_tokens_details``
  for the ``sglext.cached_tokens_details`` chunk (``{"device": int, "host": int}``, only when
  something was cached) and ``return_token_ids`` for ``choices[0].token_ids`` per chunk;
- ``GET /metrics`` (``--enable-metrics``), Prometheus text.

Every request is read through ``escha_deploy.utils.httpread`` (the policy for servers we do not
control): a total deadline per request (``request_timeout_s`` for a completion, not per byte;
``PROBE_DEADLINE_S`` at most for the small requests), a size cap on every answer, a series cap
on ``/metrics``, NaN/Inf kept out of the figures (named in ``warnings``), and the server's
strings (model name, version, error text) stripped of control sequences.

Errors: cannot connect, or not ready, at ``probe`` -> ``Refused`` (exit 3); an HTTP error,
a timeout, a broken connection or a stream error during the run -> ``Failed`` (exit 4), one
line each. The API key, if any, goes in the ``Authorization`` header and is never printed.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from escha_deploy.utils import httpread
from escha_deploy.utils.errors import BadInput, EschaError, Failed, Refused
from escha_deploy.utils.termtext import shown

from .metrics import (
    BACKUP_TOKENS,
    CACHED_TOKENS,
    EVICTED_TOKENS,
    HOST_TOTAL_TOKENS,
    HOST_USED_TOKENS,
    LOAD_BACK_TOKENS,
    MAMBA_USAGE,
    PROMPT_TOKENS,
    Snapshot,
)

from .models import ServerFacts

#: The series the bench and the canary read (``bench.metrics``): one of them NaN or +/-Inf makes
#: the scrape unusable (a delta over it means nothing).
READ_SERIES = (CACHED_TOKENS, PROMPT_TOKENS, LOAD_BACK_TOKENS, BACKUP_TOKENS, EVICTED_TOKENS,
               HOST_TOTAL_TOKENS, HOST_USED_TOKENS, MAMBA_USAGE)

#: Default deadline of one completion, seconds, from sending it to its last byte (not per
#: byte): an 18K-token cold prefill at the seed's 1,010 tok/s takes 18 s, and 8 of them queued
#: behind each other about 150 s.
DEFAULT_REQUEST_TIMEOUT_S = 600.0
#: Deadline of each small request (``/health``, ``/server_info``, ``/model_info``,
#: ``/v1/models``, ``/v1/tokenize``, ``/metrics``), seconds, or ``request_timeout_s`` when that
#: is shorter: each answers in milliseconds on a real server (tokenizing is done in SGLang's
#: HTTP process, not queued behind the scheduler: ``entrypoints/openai/serving_tokenize.py``).
PROBE_DEADLINE_S = 30.0
#: Bytes a streamed completion may send per token asked for: one SSE chunk per token is about
#: 300 bytes with ``token_ids``, ``usage`` and ``sglext`` (SGLang 0.5.19
#: ``serving_completions.py``); the cap is ``httpread.MAX_BODY_BYTES`` or this per token,
#: whichever is larger.
STREAM_BYTES_PER_TOKEN = 4096
#: Longest SSE line read, bytes: one chunk is a few hundred bytes.
MAX_SSE_LINE_BYTES = 1 << 20
DEFAULT_CONNECT_TIMEOUT_S = 5.0
#: Default cap on requests per client; a full bench sends about 2 x N + 5, the canary about
#: 4 + the fill (tens).
DEFAULT_MAX_REQUESTS = 500

#: ``model_type`` values of hybrid (mamba / linear-attention) models in SGLang 0.5.19
#: ``configs/hybrid_arch.py`` (``hybrid_gdn_config``, ``mamba2_config``, ``kimi_linear_config``).
HYBRID_MODEL_TYPES = frozenset({
    "qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text",
    "jet_nemotron", "jet_vlm", "falcon_h1", "nemotron_h", "lfm2", "lfm2_moe", "lfm2_vl",
    "zaya", "kimi_linear", "interns2_preview",
})


@dataclass
class Completion:
    """One streamed completion: text, counts, cache report and client-side times.

    Times are ``time.perf_counter()`` seconds: ``t_start`` before sending, ``t_first`` and
    ``t_last`` at the first and last chunk carrying output, ``t_end`` at ``[DONE]``.
    ``usage_cached`` is ``usage.prompt_tokens_details.cached_tokens`` or ``None`` when the
    field was absent; ``details`` is ``sglext.cached_tokens_details`` or ``None``.
    """

    text: str = ""
    token_ids: list[int] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usage_cached: int | None = None
    details: dict[str, Any] | None = None
    first_chunk_tokens: int = 1
    t_start: float = 0.0
    t_first: float | None = None
    t_last: float | None = None
    t_end: float = 0.0
    finish_reason: str | None = None
    chunks: list[float] = field(default_factory=list)

    @property
    def ttft_s(self) -> float:
        return (self.t_first if self.t_first is not None else self.t_end) - self.t_start

    @property
    def wall_s(self) -> float:
        return self.t_end - self.t_start

    def cached_total(self) -> int | None:
        """Cached prompt tokens from usage, else from sglext (device + host + storage)."""
        if self.usage_cached is not None:
            return self.usage_cached
        if self.details is not None:
            return sum(int(self.details.get(k) or 0) for k in ("device", "host", "storage"))
        return None


class ServerClient:
    """Async client for one server. Use as ``async with ServerClient(url) as c:``."""

    def __init__(
        self,
        url: str,
        *,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        max_requests: int = DEFAULT_MAX_REQUESTS,
        api_key: str | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise BadInput(f"--endpoint: expected http://HOST:PORT, got {url!r}")
        self.url = url.rstrip("/")
        self.request_timeout_s = request_timeout_s
        self.max_requests = max_requests
        self.sent = 0
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        from escha_deploy.utils.redact import Redactor

        self._redact = Redactor([api_key] if api_key else [])
        import httpx

        self.policy = httpread.Policy(deadline_s=request_timeout_s)
        self.small = httpread.Policy(deadline_s=min(request_timeout_s, PROBE_DEADLINE_S))
        self._http = httpread.async_client(self.policy, connect_s=connect_timeout_s, base_url=self.url, headers=headers,
                                           limits=httpx.Limits(max_connections=64))
        self.model = "default"
        self.tokenizer = False
        #: Things the run should say about the server's answers (NaN metrics, unusable
        #: /metrics); each once, in the order seen.
        self.warnings: list[str] = []

    def _masked(self, exc: BaseException) -> str:
        """An exception's text with the key masked (h11's LocalProtocolError quotes the whole
        header value, ``Bearer KEY``), one printable line."""
        return shown(self._redact(str(exc)))

    def _warn(self, line: str) -> None:
        if line not in self.warnings:
            self.warnings.append(line)

    async def _read(self, method: str, path: str, policy: httpread.Policy | None = None,
                    **kw: Any) -> httpread.Answer:
        """One whole answer under ``policy`` (``self.small`` by default). Raises
        ``httpread.ReadFailed``."""
        return await httpread.aread(self._http, method, path, policy=policy or self.small,
                                    redact=self._redact, **kw)

    async def __aenter__(self) -> "ServerClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    def _count(self) -> None:
        self.sent += 1
        if self.sent > self.max_requests:
            raise Failed(
                f"{self.url}: more than {self.max_requests} requests; stopping",
                hint="raise --max-requests if the workload really needs more",
            )

    async def _get(self, path: str) -> httpread.Answer | None:
        """GET ``path``; ``None`` on 404/405 (endpoint absent). ``httpread.ReadFailed``
        propagates. Raises ``Refused`` on 401: the server has an API key and refused ours
        (``_refused_key``)."""
        self._count()
        r = await self._read("GET", path)
        if r.status == 401:
            raise self._refused_key(path, Refused)
        if r.status in (404, 405):
            return None
        return r

    def _refused_key(self, path: str, kind: type[EschaError]) -> EschaError:
        """The error for a 401: SGLang's API-key middleware refused the key we sent, or its
        absence (sglang/srt/utils/auth.py ``decide_request_auth``; /health and /metrics are
        exempt, so a server can look ready and still refuse every request)."""
        sent = "the key sent" if "authorization" in self._http.headers else "no key was sent"
        return kind(f"{self.url}{path}: the server refused the API key (HTTP 401; {sent})",
                    hint="pass the key the server was started with: --api-key-file FILE "
                    "(the profile's container.api_key_file) or ESCHA_API_KEY")

    async def probe(self) -> ServerFacts:
        """Health, server and model info, tokenizer and metrics availability.

        Raises ``Refused`` when the server cannot be reached or is not ready (``/health`` not
        200). Missing optional endpoints leave the matching fact ``None``/``False``.
        """
        try:
            return await self._probe()
        except httpread.ReadFailed as exc:
            raise Refused(
                f"{self.url}: cannot probe the server ({self._redact(str(exc))})",
                hint="start the server (`escha-deploy up`) or check --endpoint",
            ) from None

    async def _probe(self) -> ServerFacts:
        try:
            health = await self._get("/health")
        except httpread.Unreachable as exc:
            raise Refused(  # the reason says "cannot connect (...)" already (httpread)
                f"{self.url}: {self._redact(exc.reason)}",
                hint="start the server (`escha-deploy up`) or check --endpoint",
            ) from None
        if health is not None and health.status != 200:
            raise Refused(f"{self.url}/health answered {health.status}: server not ready")
        info: dict[str, Any] = {}
        r = await self._get("/server_info")
        if r is not None and r.status == 200:
            info = _json_or_empty(r)
        minfo: dict[str, Any] = {}
        r = await self._get("/model_info")
        if r is not None and r.status == 200:
            minfo = _json_or_empty(r)
        model = _opt_str(minfo, "served_model_name")
        if not model:
            r = await self._get("/v1/models")
            data = _json_or_empty(r) if r is not None and r.status == 200 else {}
            cards = data.get("data")
            first = cards[0] if isinstance(cards, list) and cards and isinstance(cards[0], dict) else {}
            model = _opt_str(first, "id")
        self.model = model or "default"
        self.tokenizer = True
        self.tokenizer = (await self.tokenize("ping")) is not None
        snap = await self.metrics()
        model_type = _opt_str(minfo, "model_type")
        hybrid = None
        if model_type:
            hybrid = model_type in HYBRID_MODEL_TYPES
        if snap is not None and snap.total(MAMBA_USAGE) > 0:
            hybrid = True
        host_tokens = None
        if snap is not None and snap.has(HOST_TOTAL_TOKENS):
            host_tokens = int(snap.total(HOST_TOTAL_TOKENS))
        return ServerFacts(
            url=self.url,
            version=_opt_str(info, "version"),
            model=self.model,
            model_type=model_type,
            architectures=_opt_strs(minfo, "architectures"),
            hybrid=hybrid,
            hicache=_opt_bool(info, "enable_hierarchical_cache"),
            cache_report=_opt_bool(info, "enable_cache_report"),
            deterministic=_opt_bool(info, "enable_deterministic_inference"),
            metrics=snap is not None,
            tokenizer=self.tokenizer,
            max_total_num_tokens=_opt_int(info, "max_total_num_tokens"),
            max_req_input_len=_opt_int(info, "max_req_input_len"),
            host_pool_tokens=host_tokens,
            hicache_ratio=_opt_float(info, "hicache_ratio"),
            hicache_write_policy=_opt_str(info, "hicache_write_policy"),
            max_mamba_cache_size=_opt_int(info, "max_mamba_cache_size"),
            page_size=_opt_int(info, "page_size"),
            eviction_policy=_opt_str(info, "radix_eviction_policy"),
            tp_size=_opt_int(info, "tp_size"),
        )

    async def tokenize(self, text: str) -> list[int] | None:
        """Token ids of ``text`` from ``POST /v1/tokenize`` (no special tokens), or ``None``
        when the server has no tokenizer endpoint (or it fails)."""
        if not self.tokenizer:
            return None
        self._count()
        # a token is at least one character of UTF-8, and its id at most 11 bytes of JSON
        policy = httpread.Policy(deadline_s=self.small.deadline_s,
                                 max_body_bytes=httpread.MAX_BODY_BYTES + 16 * len(text))
        try:
            r = await self._read("POST", "/v1/tokenize", policy,
                                 json={"model": self.model, "prompt": text, "add_special_tokens": False})
        except httpread.ReadFailed as exc:
            raise Failed(self._redact(str(exc))) from None
        if r.status != 200:
            return None
        tokens = _json_or_empty(r).get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            return None
        return tokens

    async def metrics(self) -> Snapshot | None:
        """One ``/metrics`` scrape, or ``None`` when the server does not export usable metrics
        (absent, not HTTP 200, not Prometheus text, too large, or a series the bench reads is
        NaN/Inf: each but the first named once in ``warnings``). Raises ``Failed`` when the
        server does not answer within the deadline or the connection breaks."""
        import time as _time

        t0 = _time.monotonic()
        try:
            r = await self._get("/metrics")
        except (httpread.TooLarge, httpread.BadAnswer) as exc:
            self._warn(f"/metrics not used: {self._redact(exc.reason)}")
            return None
        except httpread.ReadFailed as exc:
            raise Failed(f"/metrics: {self._redact(str(exc))}") from None
        if r is None or r.status != 200:
            return None
        try:
            snap = Snapshot.parse(r.text(), r.url, self.small, started=t0)
        except httpread.ReadFailed as exc:
            self._warn(f"/metrics not used: {self._redact(exc.reason)}")
            return None
        bad = snap.nonfinite_read(READ_SERIES)
        if bad:
            self._warn(f"/metrics not used: {httpread.unusable_text(snap.nonfinite, bad)}")
            return None
        return snap

    async def complete(
        self,
        prompt: str | list[int],
        max_tokens: int,
        *,
        temperature: float = 0.0,
        ignore_eos: bool = True,
        seed: int | None = None,
    ) -> Completion:
        """One streamed ``/v1/completions`` request; see the module docstring for the shape.

        Raises ``Failed`` on an HTTP error status, a timeout, or an error chunk.
        """
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "ignore_eos": ignore_eos,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_cached_tokens_details": True,
            "return_token_ids": True,
        }
        if seed is not None:
            body["seed"] = seed
        self._count()
        out = Completion(t_start=time.perf_counter())
        acc = _Acc()
        where = f"{self.url}/v1/completions"
        policy = httpread.Policy(deadline_s=self.policy.deadline_s,
                                 max_body_bytes=max(httpread.MAX_BODY_BYTES, STREAM_BYTES_PER_TOKEN * max_tokens))
        budget = httpread.Budget(where, policy.max_body_bytes)
        sent = [False]
        try:
            async with httpread.guard(where, policy, sent=sent, redact=self._redact):
                async with self._http.stream("POST", "/v1/completions", json=body) as r:
                    sent[0] = True
                    if r.status_code == 401:
                        raise self._refused_key("/v1/completions", Failed)
                    if r.status_code != 200:
                        text = await _head(r, 4096)
                        raise Failed(f"{where} answered {r.status_code}: {shown(self._redact(text), 300)}")
                    budget.check_length(r.headers)
                    buf = bytearray()
                    done = False
                    # decoded under the cap, one content coding at most (httpread.body_chunks)
                    async with contextlib.aclosing(httpread.body_chunks(r, where, budget)) as pieces:
                        async for piece in pieces:
                            buf += piece
                            while not done and (i := buf.find(b"\n")) >= 0:
                                line = bytes(buf[:i])
                                del buf[:i + 1]
                                done = self._line(line, out, acc, where)
                            if done:
                                break
                            if len(buf) > MAX_SSE_LINE_BYTES:
                                raise Failed(f"{where}: a stream line longer than {MAX_SSE_LINE_BYTES:,} bytes")
                    if not done and buf:
                        self._line(bytes(buf), out, acc, where)
        except httpread.DeadlinePassed:
            raise Failed(
                f"{where}: no whole answer within {self.request_timeout_s:g} s",
                hint="raise --request-timeout, or lower --prefix-tokens / --prefixes",
            ) from None
        except httpread.ConnectionLost as exc:
            raise Failed(f"{where}: {self._redact(exc.reason)}",
                         hint="the server closed the connection mid-request (did it crash? `escha-deploy logs`)") from None
        except httpread.ReadFailed as exc:
            raise Failed(f"{where}: {self._redact(exc.reason)}") from None
        out.t_end = time.perf_counter()
        out.token_ids = acc.ids if acc.saw_ids else None
        if out.completion_tokens == 0 and acc.saw_ids:
            out.completion_tokens = len(acc.ids)
        return out

    def _line(self, raw: bytes, out: Completion, acc: "_Acc", where: str) -> bool:
        """Take one SSE line into ``out``; True at ``data: [DONE]``. Raises ``Failed`` for an
        error chunk or a chunk that is not SGLang's shape."""
        line = raw.decode("utf-8", errors="replace").rstrip("\r")
        if not line.startswith("data:"):
            return False
        data = line[5:].strip()
        if data == "[DONE]":
            return True
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError):
            raise Failed(f"{where}: a stream chunk is not JSON: {shown(self._redact(data), 120)}") from None
        if not isinstance(chunk, dict):
            raise Failed(f"{where}: a stream chunk is not a JSON object: {shown(self._redact(data), 120)}")
        if "error" in chunk or chunk.get("object") == "error":
            err = chunk.get("error", chunk)
            raise Failed(f"{where} stream error: {shown(self._redact(str(err)), 300)}")
        try:
            _take(chunk, out, acc, time.perf_counter())
        except (TypeError, ValueError) as exc:
            raise Failed(f"{where}: a stream chunk is not in SGLang's shape ({shown(str(exc), 120)})") from None
        return False


@dataclass
class _Acc:
    """Token ids of one completion as they stream in."""

    ids: list[int] = field(default_factory=list)
    saw_ids: bool = False


def _count_of(v: Any, what: str) -> int:
    """A token count or id from an answer: a JSON integer, 0 to 2**53 (JSON's exact integers,
    RFC 8259 section 6). Raises ``ValueError`` naming ``what``."""
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 2**53:
        return v
    raise ValueError(f"{what} is not a count: {shown(repr(v), 40)}")


def _take(chunk: dict[str, Any], out: Completion, acc: _Acc, now: float) -> None:
    """One completion chunk (SGLang 0.5.19 ``CompletionStreamResponse``: ``choices[].text``,
    ``token_ids``, ``finish_reason``; ``usage``; ``sglext.cached_tokens_details``) into ``out``.
    Raises ``ValueError``/``TypeError`` for a field of another type."""
    choices = chunk.get("choices") or []
    if not isinstance(choices, list):
        raise TypeError("choices is not a list")
    for choice in choices:
        if not isinstance(choice, dict):
            raise TypeError("a choice is not an object")
        piece = choice.get("text") or ""
        if not isinstance(piece, str):
            raise TypeError("choices[].text is not text")
        tids = choice.get("token_ids")
        if tids:
            if not isinstance(tids, list):
                raise TypeError("choices[].token_ids is not a list")
            acc.saw_ids = True
            acc.ids.extend(_count_of(t, "a token id") for t in tids)
        if piece or tids:
            if out.t_first is None:
                out.t_first = now
                out.first_chunk_tokens = len(tids) if tids else 1
            out.t_last = now
            out.chunks.append(now)
        out.text += piece
        reason = choice.get("finish_reason")
        if reason:
            out.finish_reason = shown(str(reason), 40)
    ext = chunk.get("sglext") or {}
    details = ext.get("cached_tokens_details") if isinstance(ext, dict) else None
    if details is not None:
        if not isinstance(details, dict):
            raise TypeError("sglext.cached_tokens_details is not an object")
        out.details = {str(k): _count_of(v, f"cached_tokens_details.{shown(str(k), 20)}")
                       for k, v in details.items() if v is not None}
    usage = chunk.get("usage")
    if usage:
        if not isinstance(usage, dict):
            raise TypeError("usage is not an object")
        out.prompt_tokens = _count_of(usage.get("prompt_tokens") or 0, "usage.prompt_tokens")
        out.completion_tokens = _count_of(usage.get("completion_tokens") or 0, "usage.completion_tokens")
        ptd = usage.get("prompt_tokens_details")
        if isinstance(ptd, dict) and ptd.get("cached_tokens") is not None:
            out.usage_cached = _count_of(ptd["cached_tokens"], "usage.prompt_tokens_details.cached_tokens")


async def _head(r, limit: int) -> str:
    """At most ``limit`` bytes of an answer's body, as text (an error page's start), decoded as
    ``httpread.body_chunks`` decodes (one coding, bounded); a body that cannot be decoded is
    shown as its reason."""
    got = b""
    budget = httpread.Budget(str(r.url), max(limit, 1 << 20))  # one network read fits: its start is kept
    try:
        async with contextlib.aclosing(httpread.body_chunks(r, str(r.url), budget)) as pieces:
            async for piece in pieces:
                got += piece
                if len(got) >= limit:
                    break
    except httpread.TooLarge:
        pass  # a decoded chunk past 1 MiB: what came before it is shown
    except httpread.BadAnswer as exc:
        return f"({exc.reason})"
    return got[:limit].decode("utf-8", errors="replace")


def _json_or_empty(r: httpread.Answer) -> dict[str, Any]:
    try:
        data = r.json()
    except httpread.BadAnswer:
        return {}
    return data if isinstance(data, dict) else {}


def _opt_bool(d: dict[str, Any], key: str) -> bool | None:
    v = d.get(key)
    return bool(v) if isinstance(v, bool) else None


def _opt_int(d: dict[str, Any], key: str) -> int | None:
    """A whole number the server reported (``None`` when absent or of another type; the JSON
    reader has already refused NaN and infinities)."""
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or abs(v) > 2**53:
        return None
    return int(v)


def _opt_float(d: dict[str, Any], key: str) -> float | None:
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= 1e300 else None


def _opt_str(d: dict[str, Any], key: str) -> str | None:
    """A name the server reported, printable and at most 200 characters; ``None`` when absent
    or not text."""
    v = d.get(key)
    return shown(v) if isinstance(v, str) and v else None


def _opt_strs(d: dict[str, Any], key: str) -> list[str] | None:
    v = d.get(key)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        return None
    return [shown(x) for x in v[:16]]
