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

Errors: cannot connect, or not ready, at ``probe`` -> ``Refused`` (exit 3); an HTTP error,
a timeout or a stream error during the run -> ``Failed`` (exit 4). The API key, if any, goes
in the ``Authorization`` header and is never printed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from escha_deploy.errors import BadInput, EschaError, Failed, Refused

from .metrics import HOST_TOTAL_TOKENS, MAMBA_USAGE, Snapshot
from .models import ServerFacts

#: Default read timeout per request, seconds: an 18K-token cold prefill at the seed's
#: 1,010 tok/s takes 18 s, and 8 of them queued behind each other about 150 s.
DEFAULT_REQUEST_TIMEOUT_S = 600.0
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
        from escha_deploy.launch.redact import Redactor

        self._redact = Redactor([api_key] if api_key else [])
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(request_timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=64),
        )
        self.model = "default"
        self.tokenizer = False

    def _masked(self, exc: BaseException) -> str:
        """An exception's text with the key masked (h11's LocalProtocolError quotes the whole
        header value, ``Bearer KEY``)."""
        return self._redact(str(exc))

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

    async def _get(self, path: str) -> httpx.Response | None:
        """GET ``path``; ``None`` on 404/405 (endpoint absent). Connection errors propagate.
        Raises ``Refused`` on 401: the server has an API key and refused ours (``_refused_key``)."""
        self._count()
        r = await self._http.get(path)
        if r.status_code == 401:
            raise self._refused_key(path, Refused)
        if r.status_code in (404, 405):
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
            health = await self._get("/health")
        except httpx.TransportError as exc:
            raise Refused(
                f"{self.url}: cannot connect ({type(exc).__name__}: {self._masked(exc)})",
                hint="start the server (`escha-deploy up`) or check --endpoint",
            ) from None
        if health is not None and health.status_code != 200:
            raise Refused(f"{self.url}/health answered {health.status_code}: server not ready")
        info: dict[str, Any] = {}
        r = await self._get("/server_info")
        if r is not None and r.status_code == 200:
            info = _json_or_empty(r)
        minfo: dict[str, Any] = {}
        r = await self._get("/model_info")
        if r is not None and r.status_code == 200:
            minfo = _json_or_empty(r)
        model = minfo.get("served_model_name")
        if not model:
            r = await self._get("/v1/models")
            data = _json_or_empty(r) if r is not None and r.status_code == 200 else {}
            cards = data.get("data") or []
            model = cards[0].get("id") if cards else None
        self.model = model or "default"
        self.tokenizer = True
        self.tokenizer = (await self.tokenize("ping")) is not None
        snap = await self.metrics()
        model_type = minfo.get("model_type")
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
            version=info.get("version"),
            model=self.model,
            model_type=model_type,
            architectures=minfo.get("architectures"),
            hybrid=hybrid,
            hicache=_opt_bool(info, "enable_hierarchical_cache"),
            cache_report=_opt_bool(info, "enable_cache_report"),
            deterministic=_opt_bool(info, "enable_deterministic_inference"),
            metrics=snap is not None,
            tokenizer=self.tokenizer,
            max_total_num_tokens=_opt_int(info, "max_total_num_tokens"),
            max_req_input_len=_opt_int(info, "max_req_input_len"),
            host_pool_tokens=host_tokens,
            hicache_ratio=info.get("hicache_ratio"),
            hicache_write_policy=info.get("hicache_write_policy"),
            max_mamba_cache_size=_opt_int(info, "max_mamba_cache_size"),
        )

    async def tokenize(self, text: str) -> list[int] | None:
        """Token ids of ``text`` from ``POST /v1/tokenize`` (no special tokens), or ``None``
        when the server has no tokenizer endpoint (or it fails)."""
        if not self.tokenizer:
            return None
        self._count()
        try:
            r = await self._http.post(
                "/v1/tokenize",
                json={"model": self.model, "prompt": text, "add_special_tokens": False},
            )
        except httpx.TimeoutException as exc:
            raise Failed(f"{self.url}/v1/tokenize: no answer ({self._masked(exc)})") from None
        if r.status_code != 200:
            return None
        tokens = _json_or_empty(r).get("tokens")
        if not isinstance(tokens, list) or (tokens and not isinstance(tokens[0], int)):
            return None
        return tokens

    async def metrics(self) -> Snapshot | None:
        """One ``/metrics`` scrape, or ``None`` when the server does not export metrics."""
        r = await self._get("/metrics")
        if r is None or r.status_code != 200:
            return None
        try:
            return Snapshot.parse(r.text)
        except ValueError:
            return None

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
        ids: list[int] = []
        saw_ids = False
        try:
            async with self._http.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code == 401:
                    raise self._refused_key("/v1/completions", Failed)
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")[:300]
                    raise Failed(f"{self.url}/v1/completions answered {r.status_code}: {text}")
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk or chunk.get("object") == "error":
                        err = chunk.get("error", chunk)
                        raise Failed(f"{self.url}/v1/completions stream error: {err}")
                    now = time.perf_counter()
                    for choice in chunk.get("choices") or []:
                        piece = choice.get("text") or ""
                        tids = choice.get("token_ids")
                        if tids:
                            saw_ids = True
                            ids.extend(tids)
                        if piece or tids:
                            if out.t_first is None:
                                out.t_first = now
                                out.first_chunk_tokens = len(tids) if tids else 1
                            out.t_last = now
                            out.chunks.append(now)
                        out.text += piece
                        if choice.get("finish_reason"):
                            out.finish_reason = choice["finish_reason"]
                    ext = chunk.get("sglext") or {}
                    if ext.get("cached_tokens_details") is not None:
                        out.details = ext["cached_tokens_details"]
                    usage = chunk.get("usage")
                    if usage:
                        out.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                        out.completion_tokens = int(usage.get("completion_tokens") or 0)
                        ptd = usage.get("prompt_tokens_details")
                        if ptd is not None and ptd.get("cached_tokens") is not None:
                            out.usage_cached = int(ptd["cached_tokens"])
        except httpx.TimeoutException:
            raise Failed(
                f"{self.url}/v1/completions: no answer within {self.request_timeout_s:g} s",
                hint="raise --request-timeout, or lower --prefix-tokens / --prefixes",
            ) from None
        except httpx.TransportError as exc:
            raise Failed(f"{self.url}/v1/completions: connection lost ({self._masked(exc)})") from None
        out.t_end = time.perf_counter()
        out.token_ids = ids if saw_ids else None
        if out.completion_tokens == 0 and saw_ids:
            out.completion_tokens = len(ids)
        return out


def _json_or_empty(r: httpx.Response) -> dict[str, Any]:
    try:
        data = r.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _opt_bool(d: dict[str, Any], key: str) -> bool | None:
    v = d.get(key)
    return bool(v) if isinstance(v, bool) else None


def _opt_int(d: dict[str, Any], key: str) -> int | None:
    v = d.get(key)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
