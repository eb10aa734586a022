"""A STAND-IN for an SGLang 0.5.19 HTTP server, for tests only, on 127.0.0.1 only.

No real SGLang server can run on the development or CI machines (no GPU),
so the bench client and the canary are tested against this small, named stand-in. It models
the real server's *response shapes*, read from the 0.5.19 wheel (``sglang/srt/...``):

- ``/v1/completions`` (``entrypoints/openai/serving_completions.py``, ``protocol.py``
  ``CompletionResponse``/``CompletionStreamResponse``): ``usage.prompt_tokens_details`` is
  ``{"cached_tokens": N}`` only with ``--enable-cache-report`` and only when N > 0
  (``usage_processor.py`` ``_details_if_cached``), ``null`` otherwise (absent in the streamed
  usage chunk, dumped with ``exclude_none``); ``sglext.cached_tokens_details`` is
  ``{"device": D, "host": H}`` when the request sets ``return_cached_tokens_details`` and
  something was cached (``output_streamer.py`` ``get_cached_tokens_details``), sent in the
  stream as its own chunk with ``choices: []`` before the usage chunk; ``token_ids`` per
  chunk with ``return_token_ids``; ``data: [DONE]`` last.
- ``/v1/chat/completions``, ``/generate`` (``meta_info`` with ``cached_tokens`` always and
  ``cached_tokens_details``), ``/v1/tokenize`` and ``/tokenize``
  (``serving_tokenize.py``: ``{"tokens", "count", "max_model_len"}``), ``/health``,
  ``/server_info``, ``/model_info``, ``/v1/models``, ``/flush_cache`` (clears both tiers).
- ``/health`` answers 503 while the modelled model load lasts (``load_seconds``), as SGLang does
  until its warmup request finished; ``/v1/loads`` (``entrypoints/v1_loads.py``) with the
  ``LoadSnapshot`` core keys and the sections asked for. SMG 1.13 calls, per worker, ``/health``,
  ``/v1/models``, ``/server_info``, ``/model_info`` when it registers it, then ``/v1/loads``,
  ``/loads`` and ``/metrics`` (seen in its log against this stand-in, tests/fleet); ``/loads``
  and ``/version`` are routes of no SGLang 0.5.19 server and answer 404 here too.
- ``/metrics`` (only with ``metrics=True``, like ``--enable-metrics``), written with
  ``prometheus_client`` as SGLang does, names and labels from
  ``observability/metrics_collector.py``: ``sglang:cached_tokens_total{cache_source}``,
  ``sglang:prompt_tokens_total``, ``sglang:load_back_tokens_total{pool}``,
  ``sglang:hicache_backup_tokens_total{pool}``, ``sglang:evicted_tokens_total``,
  ``sglang:hicache_host_total_tokens`` / ``_used_tokens`` (HiCache only), ``sglang:mamba_usage``,
  each family with SGLang's type and label names (``_Metrics`` says which collector labels
  what; tests/watch/test_standin_exposition.py compares them with a real 0.5.19 exposition and
  the TP 2 references built from the wheels). ``tp_size``, ``metrics_all_schedulers`` and
  ``release`` ("0.5.19" or "0.5.23") choose how the ranks appear.

Behaviour is a *model*, not SGLang: a word-level tokenizer (ids from CRC32), a two-tier LRU
prefix cache (device pool, host pool) instead of a radix tree, sleeps for compute time at
configured rates (prefill under one lock, like one GPU), and deterministic output from the
prompt's ids. Switches model known upstream bugs: ``prune_on_evict`` (sglang#33713: a hybrid
model's unified cache drops evicted prefixes instead of keeping them in host memory, so no host
hit ever happens), ``corrupt_host_restore`` (sglang#39830: a host-tier hit gives a different,
fluent answer), ``corrupt_device_hit`` (a device-path bug such as sglang#39342),
``never_load_back`` (the host tier is written and never read: backups and host use rise,
``load_back_tokens_total`` stays 0, as measured on stock 0.5.19 with a hybrid model, sglang#33713),
``drop_without_backup`` (evicted device KV is freed without a host copy and counted in
``hicache_dropped_tokens_total{reason="host_pressure"}``, as ``hiradix_cache.py`` does when a
write-back backup fails).

For ``status`` it also exports, as 0.5.19 names them: ``num_running_reqs``, ``num_queue_reqs``,
``load_back_bytes_total`` and ``load_back_duration_seconds`` (the modelled copy: tokens x
``kv_bytes_per_token`` at ``load_back_tps``), ``hicache_backup_bytes_total`` and
``hicache_dropped_tokens_total{reason,pool}`` (pre-seeded at 0 per pool, as
``unified_radix_cache.py`` does).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_WORD = re.compile(r"\w+|[^\w\s]")
_VOCAB: dict[int, str] = {}
_VOCAB_LOCK = threading.Lock()
_OUT_WORDS = ("the", "code", "is", "entry", "answer", "river", "amber", "42", "17", "and", ",")


def tokenize(text: str) -> list[int]:
    """Word-level stand-in tokenizer: one id per word or punctuation mark, from CRC32."""
    ids = []
    for w in _WORD.findall(text):
        i = zlib.crc32(w.encode()) % 1_000_000 + 1000
        with _VOCAB_LOCK:
            _VOCAB.setdefault(i, w)
        ids.append(i)
    return ids


def detokenize(ids: list[int]) -> str:
    return " ".join(_VOCAB.get(i, f"<{i}>") for i in ids)


@dataclass
class StandinConfig:
    """Switches and rates of the stand-in. Rates are tokens per second."""

    model: str = "standin-hybrid-27b"
    model_type: str = "qwen3_5"
    hicache: bool = True
    cache_report: bool = True
    metrics: bool = True
    deterministic: bool = True
    tokenizer: bool = True
    server_info: bool = True
    ready: bool = True
    device_tokens: int = 100_000
    host_tokens: int = 200_000
    page_size: int = 1
    prefill_tps: float = 200_000.0
    load_back_tps: float = 5_000_000.0
    decode_tps: float = 2_000.0
    stream_interval: int = 1
    max_req_input_len: int = 131_072
    write_policy: str = "write_through"
    hybrid: bool = True
    tp_size: int = 1  # ranks whose radix caches count (summed into one series on 0.5.19)
    metrics_all_schedulers: bool = False  # --enable-metrics-for-all-schedulers: every rank's gauges
    release: str = "0.5.19"  # "0.5.23": radix-cache and scheduler series labelled per rank
    prune_on_evict: bool = False
    corrupt_host_restore: bool = False
    corrupt_device_hit: bool = False
    never_load_back: bool = False
    drop_without_backup: bool = False
    kv_bytes_per_token: int = 4096  # host bytes one KV token costs per rank (the bytes counters)
    cached_details: bool = True  # False: ignore return_cached_tokens_details (older server)
    load_seconds: float = 0.0  # /health answers 503 for this long after start (a model load)


@dataclass
class _Hit:
    device: int = 0
    host: int = 0


@dataclass
class StandinState:
    """The two-tier cache (key: prompt ids) and a log of request paths."""

    device: OrderedDict = field(default_factory=OrderedDict)
    host: OrderedDict = field(default_factory=OrderedDict)
    paths: list[str] = field(default_factory=list)
    in_flight: int = 0
    health_codes: list[int] = field(default_factory=list)
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    gpu: threading.Lock = field(default_factory=threading.Lock)


def _lcp(a: tuple, b: tuple) -> int:
    n = min(len(a), len(b))
    i = 0
    # compare in blocks for speed, then finish one by one
    while i + 256 <= n and a[i:i + 256] == b[i:i + 256]:
        i += 256
    while i < n and a[i] == b[i]:
        i += 1
    return i


class _Metrics:
    """The stand-in's ``/metrics``, labelled as SGLang labels each collector (checked against a
    real 0.5.19 exposition and the CPU-built TP 2 references, tests/watch/test_standin_exposition.py):

    - tokenizer series (``TokenizerMetricsCollector``): ``model_name``, ``engine_type``;
    - scheduler series (``SchedulerMetricsCollector.init_new``): those plus ``tp_rank``,
      ``pp_rank``, ``moe_ep_rank`` (0.5.23: and ``dp_rank``), exported by TP rank 0 only unless
      ``--enable-metrics-for-all-schedulers`` (``metrics_all_schedulers``);
    - radix-cache series (``RadixCacheMetricsCollector``): every rank's cache records them. In
      0.5.19 their only label is ``cache_type`` (``BasePrefixCache.init_metrics_collector``), so
      the multiprocess registry sums the ranks into one series (``radix`` adds ``amount`` once
      per rank); 0.5.23 labels them per rank (``radix_cache_metric_labels``: ``tp_rank``,
      ``pp_rank``, ``dp_rank``).
    """

    def __init__(self, cfg: StandinConfig) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.cfg = cfg
        self.registry = CollectorRegistry()
        later = cfg.release != "0.5.19"
        tok = ["model_name", "engine_type"]
        sched = tok + ["tp_rank", "pp_rank", "moe_ep_rank"] + (["dp_rank"] if later else [])
        radix = ["cache_type"] + (["tp_rank", "pp_rank", "dp_rank"] if later else [])
        r = self.registry
        self.base = {"model_name": cfg.model, "engine_type": "unified"}
        exporting = range(cfg.tp_size) if cfg.metrics_all_schedulers else range(1)
        self.ranks = [dict(self.base, tp_rank=str(t), pp_rank="0", moe_ep_rank="0",
                           **({"dp_rank": "0"} if later else {})) for t in exporting]
        cache_type = ("UnifiedRadixCache" if cfg.hybrid else "HiRadixCache") if cfg.hicache else "RadixCache"
        #: (label set, how many ranks' counts it carries)
        self.radix_series = ([({"cache_type": cache_type, "tp_rank": str(t), "pp_rank": "0", "dp_rank": "0"}, 1)
                              for t in range(cfg.tp_size)] if later
                             else [({"cache_type": cache_type}, cfg.tp_size)])
        self.prompt = Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.",
                              tok + ["is_streaming"], registry=r)
        self.gen = Counter("sglang:generation_tokens_total", "Number of generation tokens.",
                           tok + ["is_streaming"], registry=r)
        self.cached = Counter("sglang:cached_tokens_total",
                              "Number of cached prompt tokens by source (device/host/storage).",
                              tok + ["cache_source"], registry=r)
        self.requests = Counter("sglang:num_requests_total", "Number of requests processed.",
                                tok + ["is_streaming"], registry=r)
        self.evicted = Counter("sglang:evicted_tokens_total", "Device KV token slots freed.",
                               radix, registry=r)
        self.load_back = Counter("sglang:load_back_tokens_total",
                                 "Tokens loaded back from host DRAM (L2) to GPU, by host pool.",
                                 radix + ["pool"], registry=r)
        self.backup = Counter("sglang:hicache_backup_tokens_total",
                              "Tokens backed up from GPU to host DRAM (L2), by host pool.",
                              radix + ["pool"], registry=r)
        self.mamba = Gauge("sglang:mamba_usage", "The token usage for Mamba layers.", sched,
                           registry=r)
        self.token_usage = Gauge("sglang:token_usage", "The token usage.", sched, registry=r)
        self.running = Gauge("sglang:num_running_reqs", "The number of running requests.", sched,
                             registry=r)
        self.queued = Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.",
                            sched, registry=r)
        self.load_back_bytes = Counter("sglang:load_back_bytes_total",
                                       "Bytes loaded back from local host DRAM (L2) to GPU.",
                                       radix, registry=r)
        self.load_back_s = Histogram("sglang:load_back_duration_seconds",
                                     "Time taken to load KV cache from CPU back to GPU in seconds.",
                                     radix, registry=r,
                                     buckets=[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0])
        self.backup_bytes = Counter("sglang:hicache_backup_bytes_total",
                                    "Bytes backed up from GPU to local host DRAM (L2).", radix,
                                    registry=r)
        self.dropped = Counter("sglang:hicache_dropped_tokens_total",
                               "The number of device KV tokens destroyed without a host backup.",
                               radix + ["reason", "pool"], registry=r)
        if cfg.hicache:
            for lab, _ in self.radix_series:
                for pool in (("kv", "mamba") if cfg.hybrid else ("kv",)):
                    self.dropped.labels(**lab, reason="host_pressure", pool=pool).inc(0)
        self.host_total = self.host_used = None
        if cfg.hicache:
            self.host_total = Gauge("sglang:hicache_host_total_tokens",
                                    "Total capacity of the host KV cache in tokens.", sched,
                                    registry=r)
            self.host_used = Gauge("sglang:hicache_host_used_tokens",
                                   "Number of tokens currently used in the host KV cache.",
                                   sched, registry=r)
            for lab in self.ranks:
                self.host_total.labels(**lab).set(cfg.host_tokens)
                self.host_used.labels(**lab).set(0)
        for lab in self.ranks:
            self.mamba.labels(**lab).set(0)
            self.token_usage.labels(**lab).set(0)
            self.running.labels(**lab).set(0)
            self.queued.labels(**lab).set(0)

    def radix(self, counter, amount: float, **extra: str) -> None:
        """Every rank's radix cache counts ``amount`` (its own shard of the same tokens)."""
        if amount > 0:
            for lab, n_ranks in self.radix_series:
                counter.labels(**lab, **extra).inc(amount * n_ranks)

    def radix_observe(self, hist, seconds: float) -> None:
        for lab, n_ranks in self.radix_series:
            for _ in range(n_ranks):
                hist.labels(**lab).observe(seconds)

    def set_all(self, gauge, value: float) -> None:
        for lab in self.ranks:
            gauge.labels(**lab).set(value)

    def text(self) -> bytes:
        """The exposition without prometheus_client's ``*_created`` series: SGLang's multiprocess
        export (``MultiProcessCollector``) has none."""
        from prometheus_client import generate_latest

        out = []
        for line in generate_latest(self.registry).decode().splitlines(keepends=True):
            name = line.split()[2] if line.startswith("#") else line.split("{")[0].split(" ")[0]
            if not name.endswith("_created"):
                out.append(line)
        return "".join(out).encode()


class StandinServer:
    """The stand-in on ``127.0.0.1`` and a free port; ``url`` once started."""

    def __init__(self, cfg: StandinConfig | None = None) -> None:
        self.cfg = cfg or StandinConfig()
        self.state = StandinState()
        self.metrics = _Metrics(self.cfg) if self.cfg.metrics else None
        self._httpd: _Quiet | None = None
        self._thread: threading.Thread | None = None
        self.started_at = time.monotonic()

    @property
    def loading(self) -> bool:
        """True during the modelled model load: SGLang answers /health with 503 until the
        warmup request finished (``entrypoints/http_server.py`` ``health_generate``)."""
        return time.monotonic() - self.started_at < self.cfg.load_seconds

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self, port: int = 0) -> "StandinServer":
        """Listen on 127.0.0.1:``port`` (0: a free one); the load clock starts now."""
        handler = _make_handler(self)
        self.started_at = time.monotonic()
        self._httpd = _Quiet(("127.0.0.1", port), handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def port(self) -> int:
        """The port it listens on (the one the kernel gave for ``start(0)``)."""
        assert self._httpd is not None
        return int(self._httpd.server_address[1])

    def stop(self) -> None:
        """Stop like a server process that exits: stop listening and drop open connections."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd.close_connections()
            self._httpd = None

    def __enter__(self) -> "StandinServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the cache model ---------------------------------------------------------------
    def _used(self, tier: OrderedDict) -> int:
        return sum(len(k) for k in tier)

    def _match(self, ids: tuple) -> _Hit:
        cfg = self.cfg
        cap = len(ids) - 1  # the last prompt token is always computed
        page = max(1, cfg.page_size)
        best_dev = max((_lcp(ids, k) for k in self.state.device), default=0)
        best_dev = min(cap, best_dev) // page * page
        hit = _Hit(device=best_dev)
        if cfg.hicache and not cfg.never_load_back:
            best_host = max((_lcp(ids, k) for k in self.state.host), default=0)
            best_host = min(cap, best_host) // page * page
            hit.host = max(0, best_host - best_dev)
        return hit

    def _host_put(self, key: tuple) -> bool:
        st, cfg = self.state, self.cfg
        for k in [k for k in st.host if _lcp(k, key) * 2 >= len(k)]:
            del st.host[k]
        while st.host and self._used(st.host) + len(key) > cfg.host_tokens:
            victim = next((k for k in st.host if k not in st.device), next(iter(st.host)))
            del st.host[victim]
        if len(key) > cfg.host_tokens:
            return False
        st.host[key] = True
        if self.metrics:
            self.metrics.radix(self.metrics.backup, len(key), pool="kv")
            self.metrics.radix(self.metrics.backup_bytes, len(key) * cfg.kv_bytes_per_token)
            if cfg.hybrid:
                self.metrics.radix(self.metrics.backup, 1, pool="mamba")
        return True

    def _insert(self, key: tuple) -> None:
        st, cfg = self.state, self.cfg
        for k in [k for k in st.device if _lcp(k, key) * 2 >= len(k)]:
            del st.device[k]
        st.device[key] = True
        st.device.move_to_end(key)
        if (cfg.hicache and cfg.write_policy.startswith("write_through") and not cfg.prune_on_evict
                and not cfg.drop_without_backup):
            self._host_put(key)
        while self._used(st.device) > cfg.device_tokens and len(st.device) > 1:
            victim, _ = st.device.popitem(last=False)
            if self.metrics:
                self.metrics.radix(self.metrics.evicted, len(victim))
            if cfg.hicache and cfg.drop_without_backup:
                st.host.pop(victim, None)
                if self.metrics:
                    self.metrics.radix(self.metrics.dropped, len(victim), reason="host_pressure",
                                          pool="kv")
            elif cfg.hicache and cfg.prune_on_evict:
                st.host.pop(victim, None)  # sglang#33713: pruned, not demoted
            elif cfg.hicache and cfg.write_policy == "write_back":
                self._host_put(victim)
        if self.metrics and self.metrics.host_used is not None:
            for lab in self.metrics.ranks:
                self.metrics.host_used.labels(**lab).set(self._used(st.host))

    def serve(self, ids: list[int], max_tokens: int) -> tuple[_Hit, list[int]]:
        """Prefill (with cache), then the output ids. Sleeps for the modelled compute time."""
        cfg = self.cfg
        key = tuple(ids)
        with self.state.lock:
            self.state.in_flight += 1
            self.state.max_in_flight = max(self.state.max_in_flight, self.state.in_flight)
            hit = self._match(key)
            m = self.metrics
            if hit.host and m:
                m.radix(m.load_back, hit.host, pool="kv")
                if cfg.hybrid:
                    m.radix(m.load_back, 1, pool="mamba")
                m.radix(m.load_back_bytes, hit.host * cfg.kv_bytes_per_token)
                m.radix_observe(m.load_back_s, hit.host / cfg.load_back_tps)
            self._insert(key)
            if m:
                m.set_all(m.running, self.state.in_flight)
                m.set_all(m.token_usage, min(1.0, self._used(self.state.device) / cfg.device_tokens))
        uncached = len(ids) - hit.device - hit.host
        with self.state.gpu:
            time.sleep(uncached / cfg.prefill_tps + hit.host / cfg.load_back_tps)
        with self.state.lock:
            self.state.in_flight -= 1
            if self.metrics:
                self.metrics.set_all(self.metrics.running, self.state.in_flight)
        salt = b""
        if cfg.corrupt_host_restore and hit.host > 0:
            salt = b"host-restore-damage"
        if cfg.corrupt_device_hit and hit.device > 0:
            salt = b"device-path-damage"
        rng = random.Random(zlib.crc32(b"".join(i.to_bytes(4, "little") for i in ids) + salt))
        words = [rng.choice(_OUT_WORDS) for _ in range(max_tokens)]
        return hit, tokenize(" ".join(words))[:max_tokens]

    def usage(self, prompt: int, completion: int, hit: _Hit, *, stream: bool) -> dict:
        cached = hit.device + hit.host
        details = {"cached_tokens": cached} if (self.cfg.cache_report and cached > 0) else None
        u = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
             "completion_tokens": completion, "prompt_tokens_details": details,
             "reasoning_tokens": 0}
        if stream:  # final usage chunk is dumped with exclude_none=True
            u = {k: v for k, v in u.items() if v is not None}
        return u

    def observe(self, prompt: int, completion: int, hit: _Hit, stream: bool) -> None:
        m = self.metrics
        if m is None:
            return
        s = {"is_streaming": "true" if stream else "false"}
        m.prompt.labels(**m.base, **s).inc(prompt)
        m.gen.labels(**m.base, **s).inc(completion)
        m.requests.labels(**m.base, **s).inc()
        if hit.device:
            m.cached.labels(**m.base, cache_source="device").inc(hit.device)
        if hit.host:
            m.cached.labels(**m.base, cache_source="host").inc(hit.host)
        if self.cfg.hybrid:
            for lab in m.ranks:
                m.mamba.labels(**lab).set(0.25)


class _Quiet(ThreadingHTTPServer):
    """A client closing a kept-alive connection is normal here; do not print a traceback."""

    daemon_threads = True
    # socketserver's default listen backlog is 5: a 6th simultaneous connect waits for a SYN
    # retry (1 s), which would show up as a slow concurrent pass. uvicorn's default is 2048.
    request_queue_size = 128

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._live: set = set()
        self._live_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._live_lock:
            self._live.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._live_lock:
            self._live.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Close every open connection, as a process that exits does (kept-alive client
        connections would otherwise still be answered by their handler threads)."""
        import socket

        with self._live_lock:
            live = list(self._live)
        for sock in live:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


def _details(hit: _Hit) -> dict | None:
    if hit.device or hit.host:
        return {"device": hit.device, "host": hit.host}
    return None


def _make_handler(srv: StandinServer):
    cfg = srv.cfg

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go in separate writes

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        # ---- helpers -------------------------------------------------------------------
        def _send(self, code: int, body: bytes = b"", ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj: Any) -> None:
            self._send(code, json.dumps(obj).encode())

        def _error(self, code: int, message: str) -> None:
            self._json(code, {"object": "error", "message": message, "type": "BadRequestError",
                              "param": None, "code": code})

        def _sse_start(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

        def _sse(self, payload: str) -> None:
            b = f"data: {payload}\n\n".encode()
            self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
            self.wfile.flush()

        def _sse_end(self) -> None:
            self._sse("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _body(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}")

        # ---- routes --------------------------------------------------------------------
        def do_GET(self) -> None:
            srv.state.paths.append(self.path)
            if self.path in ("/health", "/health_generate"):
                code = 200 if cfg.ready and not srv.loading else 503
                srv.state.health_codes.append(code)
                return self._send(code)
            if self.path.split("?")[0] == "/v1/loads":
                return self._loads()
            if self.path in ("/server_info", "/get_server_info") and cfg.server_info:
                return self._json(200, {
                    "model_path": f"/models/{cfg.model}", "served_model_name": cfg.model,
                    "enable_hierarchical_cache": cfg.hicache,
                    "enable_cache_report": cfg.cache_report,
                    "enable_metrics": cfg.metrics,
                    "enable_deterministic_inference": cfg.deterministic,
                    "hicache_ratio": cfg.host_tokens / cfg.device_tokens if cfg.hicache else 2.0,
                    "hicache_size": 0, "hicache_write_policy": cfg.write_policy,
                    "hicache_mem_layout": "page_first", "page_size": cfg.page_size,
                    "max_mamba_cache_size": None, "stream_interval": cfg.stream_interval,
                    "max_total_num_tokens": cfg.device_tokens,
                    "max_req_input_len": cfg.max_req_input_len,
                    "internal_states": [{}], "version": cfg.release, "tp_size": cfg.tp_size, "kv_events": None,
                })
            if self.path in ("/model_info", "/get_model_info"):
                return self._json(200, {
                    "model_path": f"/models/{cfg.model}", "served_model_name": cfg.model,
                    "tokenizer_path": f"/models/{cfg.model}", "is_generation": True,
                    "preferred_sampling_params": None, "weight_version": "default",
                    "load_format": "auto", "reasoning_parser": None, "tool_call_parser": None,
                    "has_image_understanding": False, "has_audio_understanding": False,
                    "model_type": cfg.model_type, "architectures": ["StandinForCausalLM"],
                })
            if self.path == "/v1/models":
                return self._json(200, {"object": "list", "data": [{
                    "id": cfg.model, "object": "model", "created": int(time.time()),
                    "owned_by": "sglang", "root": cfg.model, "parent": None,
                    "max_model_len": cfg.max_req_input_len}]})
            if self.path.startswith("/metrics") and srv.metrics is not None:
                return self._send(200, srv.metrics.text(), "text/plain; version=0.0.4")
            if self.path == "/flush_cache":
                return self._flush()
            self._json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            srv.state.paths.append(self.path)
            body = self._body()
            if self.path in ("/v1/tokenize", "/tokenize") and cfg.tokenizer:
                prompt = body.get("prompt")
                if isinstance(prompt, list):
                    toks = [tokenize(p) for p in prompt]
                    return self._json(200, {"tokens": toks, "count": [len(t) for t in toks],
                                            "max_model_len": cfg.max_req_input_len})
                toks = tokenize(prompt or "")
                return self._json(200, {"tokens": toks, "count": len(toks),
                                        "max_model_len": cfg.max_req_input_len})
            if self.path == "/v1/completions":
                return self._completions(body)
            if self.path == "/v1/chat/completions":
                return self._chat(body)
            if self.path == "/generate":
                return self._generate(body)
            if self.path == "/flush_cache":
                return self._flush()
            self._json(404, {"detail": "Not Found"})

        def _loads(self) -> None:
            """``/v1/loads`` (``entrypoints/v1_loads.py`` ``get_loads``; SMG 1.13 polls it with
            ``include=core,disagg,queues,memory``): the core keys of one DP rank's
            ``LoadSnapshot`` (``managers/load_snapshot.py``), sections only when asked."""
            from urllib.parse import parse_qs, urlparse

            include = (parse_qs(urlparse(self.path).query).get("include") or [""])[0]
            sections = {x.strip() for x in include.split(",") if x.strip()} or {"all"}
            used = srv._used(srv.state.device)
            load: dict[str, Any] = {
                "timestamp": time.time(), "dp_rank": 0, "num_running_reqs": srv.state.in_flight,
                "num_waiting_reqs": 0, "num_waiting_uncached_tokens": 0, "num_used_tokens": used,
                "num_total_tokens": cfg.device_tokens, "num_active_tokens": 0,
                "max_total_num_tokens": cfg.device_tokens, "max_running_requests": 48,
                "token_usage": used / cfg.device_tokens, "gen_throughput": 0.0, "cache_hit_rate": 0.0,
                "utilization": 0.0, "total_prefill_uncached_tokens": 0, "total_prefill_busy_us": 0,
                "decode_moments": None}
            if sections & {"all", "memory"}:
                load["memory"] = {"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0,
                                  "token_capacity": cfg.device_tokens}
            if sections & {"all", "queues"}:
                load["queues"] = {"waiting": 0, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0}
            self._json(200, {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                             "version": "0.5.19", "accelerator": None, "num_accelerators": cfg.tp_size,
                             "loads": [load]})

        def _flush(self) -> None:
            with srv.state.lock:
                srv.state.device.clear()
                srv.state.host.clear()
            self._send(200, b"Cache flushed.\nPlease check backend logs for more details. ",
                       "text/plain")

        def _prompt_ids(self, prompt: Any) -> list[int] | None:
            if isinstance(prompt, str):
                return tokenize(prompt)
            if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
                return list(prompt)
            return None

        def _run(self, ids: list[int], body: dict) -> tuple[_Hit, list[int], int]:
            max_tokens = int(body.get("max_tokens", 16))
            if len(ids) >= cfg.max_req_input_len:
                raise ValueError(
                    f"The input ({len(ids)} tokens) is longer than the model's context length "
                    f"({cfg.max_req_input_len} tokens).")
            hit, out = srv.serve(ids, max_tokens)
            return hit, out, max_tokens

        def _completions(self, body: dict) -> None:
            ids = self._prompt_ids(body.get("prompt"))
            if ids is None or not ids:
                return self._error(400, "Invalid prompt")
            try:
                hit, out, _ = self._run(ids, body)
            except ValueError as exc:
                return self._error(400, str(exc))
            rid = uuid.uuid4().hex
            created = int(time.time())
            model = body.get("model", cfg.model)
            want_ids = bool(body.get("return_token_ids"))
            details = (_details(hit) if body.get("return_cached_tokens_details")
                       and cfg.cached_details else None)
            stream = bool(body.get("stream"))
            srv.observe(len(ids), len(out), hit, stream)
            if not stream:
                choice = {"index": 0, "text": detokenize(out), "logprobs": None,
                          "finish_reason": "length", "matched_stop": None}
                if want_ids:
                    choice["token_ids"] = out
                resp = {"id": rid, "object": "text_completion", "created": created,
                        "model": model, "choices": [choice],
                        "usage": srv.usage(len(ids), len(out), hit, stream=False),
                        "metadata": {"weight_version": "default"}}
                if details:
                    resp["sglext"] = {"cached_tokens_details": details}
                return self._json(200, resp)
            self._sse_start()
            step = max(1, cfg.stream_interval)
            for i in range(0, len(out), step):
                piece = out[i:i + step]
                time.sleep(len(piece) / cfg.decode_tps)
                last = i + step >= len(out)
                choice = {"index": 0, "text": (" " if i else "") + detokenize(piece),
                          "logprobs": None, "finish_reason": "length" if last else None,
                          "matched_stop": None}
                if want_ids:
                    choice["token_ids"] = piece
                self._sse(json.dumps({"id": rid, "object": "text_completion",
                                      "created": created, "model": model,
                                      "choices": [choice], "usage": None}))
            if details:
                self._sse(json.dumps({"id": rid, "object": "text_completion", "created": created,
                                      "model": model, "choices": [], "usage": None,
                                      "sglext": {"cached_tokens_details": details}}))
            opts = body.get("stream_options") or {}
            if opts.get("include_usage"):
                self._sse(json.dumps({"id": rid, "object": "text_completion",
                                      "created": created, "model": model, "choices": [],
                                      "usage": srv.usage(len(ids), len(out), hit, stream=True)}))
            self._sse_end()

        def _chat(self, body: dict) -> None:
            msgs = body.get("messages") or []
            text = "".join(f"<|{m.get('role')}|>\n{m.get('content')}\n" for m in msgs)
            ids = tokenize(text + "<|assistant|>\n")
            try:
                hit, out, _ = self._run(ids, body)
            except ValueError as exc:
                return self._error(400, str(exc))
            srv.observe(len(ids), len(out), hit, False)
            resp = {"id": uuid.uuid4().hex, "object": "chat.completion",
                    "created": int(time.time()), "model": body.get("model", cfg.model),
                    "choices": [{"index": 0, "message": {"role": "assistant",
                                                         "content": detokenize(out),
                                                         "reasoning_content": None,
                                                         "tool_calls": None},
                                 "logprobs": None, "finish_reason": "length",
                                 "matched_stop": None}],
                    "usage": srv.usage(len(ids), len(out), hit, stream=False),
                    "metadata": {"weight_version": "default"}}
            details = (_details(hit) if body.get("return_cached_tokens_details")
                       and cfg.cached_details else None)
            if details:
                resp["sglext"] = {"cached_tokens_details": details}
            self._json(200, resp)

        def _generate(self, body: dict) -> None:
            ids = body.get("input_ids") or tokenize(body.get("text") or "")
            sp = body.get("sampling_params") or {}
            try:
                hit, out, n = self._run(ids, {"max_tokens": sp.get("max_new_tokens", 128)})
            except ValueError as exc:
                return self._json(400, {"error": {"message": str(exc)}})
            srv.observe(len(ids), len(out), hit, False)
            self._json(200, {
                "text": detokenize(out), "output_ids": out,
                "meta_info": {"id": uuid.uuid4().hex,
                              "finish_reason": {"type": "length", "length": n},
                              "prompt_tokens": len(ids), "weight_version": "default",
                              "num_retractions": 0, "reasoning_tokens": 0,
                              "completion_tokens": len(out),
                              "cached_tokens": hit.device + hit.host,
                              "cached_tokens_details": _details(hit)},
            })

    return Handler


def main(argv: list[str] | None = None) -> None:
    """Run the stand-in as a process (for an image in launch tests): ``--port N`` (0 = free),
    ``--host`` (127.0.0.1 unless an image needs 0.0.0.0 inside its own network namespace),
    ``--config JSON`` (``StandinConfig`` fields), ``--set hicache.enabled=false`` (the override
    ``--hicache-ab`` makes) or ``--spec PATH`` (the launch spec `up` mounts: its
    ``hicache_enabled`` is read); other arguments, such as ``serve --profile NAME``, are ignored.
    Without ``prometheus_client`` installed, ``/metrics`` is off, as on a server without
    ``--enable-metrics``."""
    import argparse
    import importlib.util

    ap = argparse.ArgumentParser(description="STAND-IN SGLang 0.5.19 HTTP server (tests only)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--config", default="{}")
    ap.add_argument("--set", action="append", default=[],
                    help="profile overrides as `escha-deploy serve` gets them; only "
                    "hicache.enabled=true|false (what --hicache-ab changes) and container.port=N are read")
    ap.add_argument("--spec", default=None, help="launch spec JSON; only hicache_enabled is read")
    a, _rest = ap.parse_known_args(argv)  # e.g. `serve --profile NAME` from a container command
    cfg = StandinConfig(**json.loads(a.config))
    if a.spec:
        with open(a.spec) as f:
            cfg.hicache = bool(json.load(f).get("hicache_enabled", True))
    for item in a.set:
        key, _, value = item.partition("=")
        if key == "hicache.enabled":
            cfg.hicache = value.strip().lower() in ("1", "true", "yes", "on")
        if key == "container.port":  # the port `serve --profile` binds (bench's native launcher sets it)
            a.port = int(value)
    if cfg.metrics and importlib.util.find_spec("prometheus_client") is None:
        cfg.metrics = False
        print("stand-in: prometheus_client missing, /metrics off", flush=True)
    srv = StandinServer(cfg)
    srv._httpd = _Quiet((a.host, a.port), _make_handler(srv))
    print(f"stand-in listening on {srv.url}", flush=True)
    srv._httpd.serve_forever()


if __name__ == "__main__":
    main()
