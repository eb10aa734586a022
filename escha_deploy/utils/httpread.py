"""The one way escha-deploy reads a server it does not control: ``status`` (``/metrics``),
``bench`` and ``canary`` (an SGLang server's API), ``fleet status`` (the router's ``/workers``),
``up``'s ready wait (``/health``, ``/generate``, ``/server_info``: ``launch/ready.py``).

Nothing such a server sends is trusted. The policy (``Policy``), for every request:

- **a total deadline** (``Policy.deadline_s``): connecting, the status line and headers and the
  whole body end within it, or the request ends with ``DeadlinePassed``. httpx's own timeouts
  are per operation (a read timeout restarts with every byte that arrives, httpx docs
  "Timeouts"), so a server sending one byte a second would never time out; here the request
  runs under ``asyncio.timeout``, which cancels it wherever it waits, the header phase
  included. The synchronous entry point (``get``) runs the same coroutine on its own loop.
- **a size cap** on the body (``Policy.max_body_bytes``): a ``Content-Length`` above it is
  refused before the body is read; a body that streams past it (chunked, or a lying length)
  is refused at the chunk that crosses it, so an endless body costs at most the cap in memory.
  The cap counts decoded bytes (after ``Content-Encoding``), so a gzip bomb stops there too.
- **one content coding at most**: every request asks for ``Accept-Encoding: identity`` (RFC 9110
  section 12.5.3), and what a server encodes anyway is decoded here, not by httpx (whose
  decoder undoes every listed coding of a whole network read at once, before any cap is
  counted): one coding (``gzip``, ``x-gzip``, ``deflate``), through ``zlib``'s decompressor
  with ``max_length`` (a read never yields more than the room left under the cap). Two
  codings or more (``Content-Encoding: gzip, gzip``, each layer multiplying the size) or an
  unknown one are refused with one line (``BadAnswer``), never decoded; so is a gzip body that
  breaks off (``ContentDecoder``). The wire bytes count against the cap too.
- **a series cap** on Prometheus text (``metric_samples``: ``MAX_SERIES``), counted while
  parsing, and the deadline checked while parsing: a valid but huge ``/metrics`` ends with
  ``TooLarge``, never a parse of millions of series. Before the parser runs, each line is
  held to ``MAX_LINE_CHARS`` and each sample to ``MAX_LABELS`` labels (``text_bounds``):
  ``prometheus_client``'s parser takes time quadratic in the labels of one sample, and checks
  nothing between two samples, so one sample of 300,000 labels (2.7 MB, under the size cap)
  would hold it for minutes.
- **numbers are finite and exact**: a sample that is ``NaN``, ``+/-Inf`` or beyond
  ``MAX_SAMPLE`` is kept out of the samples and listed by name (``MetricSamples.nonfinite``),
  for the caller to report as "not a number" (two such values would sum to ``inf``).
- **text is printable**: every error line that quotes the server (a reason phrase, an
  exception from the HTTP stack) goes through ``termtext.shown``: no control sequence from the
  server reaches the terminal, and no line is longer than 200 characters.
- no redirect is followed (httpx's default) and no proxy is read from the environment
  (``trust_env=False``): the caller names the server.

Errors (all ``ReadFailed``, whose ``str`` is one printable line naming the URL):
``Unreachable`` (cannot connect: refused, reset before an answer, no route),
``ConnectionLost`` (the connection broke after the request was sent), ``DeadlinePassed``,
``TooLarge``, ``BadAnswer`` (not HTTP, bad encoding, not JSON). Callers map them to their exit
codes (``status --check``: 5 inconclusive; ``bench``: 3 at the probe, 4 during the run).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import ssl

    import httpx

from escha_deploy.utils.termtext import shown

#: ``status``'s and ``fleet status``'s deadline per request, seconds (``status --http-timeout``).
#: A real SGLang 0.5.19 ``/metrics`` of a TP 1 server is 74 KB and answers in milliseconds on
#: loopback; 10 s leaves room for a busy box without letting a stuck one hold a health check.
DEFAULT_DEADLINE_S = 10.0
#: Largest body read, bytes (8 MiB): a real SGLang 0.5.19 ``/metrics`` is 74 KB with 489 series
#: at TP 1 (about 150 bytes a series), so a TP 8 box exporting every rank
#: (``--enable-metrics-for-all-schedulers``) is about 0.6 MB; this is more than ten times that.
MAX_BODY_BYTES = 8 * 2**20
#: Most Prometheus samples read from one answer: about 4,000 on that TP 8 box; more than ten
#: times that. Parsing this many takes about 0.7 s (``prometheus_client`` 0.26, one core).
MAX_SERIES = 50_000
#: Largest sample value taken, in magnitude: 2**53, where a double stops holding every integer
#: (IEEE 754 binary64: a 53-bit significand). No counter SGLang exports (tokens, bytes,
#: seconds, requests) gets there: 2**53 tokens is 9e15.
MAX_SAMPLE = float(2**53)
#: Longest line of Prometheus text read, characters: a real SGLang 0.5.19 line is under 300
#: (a histogram bucket with its five labels); a label value holding a model's path adds a few
#: hundred more. 64 KiB is far past both.
MAX_LINE_CHARS = 64 * 1024
#: Most labels on one sample: SGLang 0.5.19 puts at most six on one (``model_name``,
#: ``engine_type``, ``tp_rank``, ``pp_rank``, ``le``, ``cache_source``); the Prometheus text
#: format sets no limit, so this is ten times that and more.
MAX_LABELS = 64
#: The content codings decoded (RFC 9110 section 8.4.1: ``x-gzip`` is ``gzip``'s alias); one at most.
CODINGS = ("gzip", "x-gzip", "deflate")


class ReadFailed(Exception):
    """A request to a server we do not control did not give a usable answer; ``str`` is one
    printable line naming the URL."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = shown(url, 120)
        self.reason = shown(reason)
        super().__init__(f"{self.url}: {self.reason}")


class Unreachable(ReadFailed):
    """Nothing answers at the address (connection refused or reset, no route, name unknown)."""


class ConnectionLost(ReadFailed):
    """The server took the request and closed the connection before the answer ended."""


class DeadlinePassed(ReadFailed):
    """The whole request (connect, headers, body) did not end within the deadline."""


class TooLarge(ReadFailed):
    """The body is larger than the size cap, or the text holds more series than the series cap."""


class BadAnswer(ReadFailed):
    """The server answered with something that is not HTTP, not decodable, or not JSON."""


@dataclass(frozen=True)
class Policy:
    """How one request is read: ``deadline_s`` seconds in all (connect to last byte), at most
    ``max_body_bytes`` bytes of body (decoded), at most ``max_series`` Prometheus samples."""

    deadline_s: float = DEFAULT_DEADLINE_S
    max_body_bytes: int = MAX_BODY_BYTES
    max_series: int = MAX_SERIES

    def __post_init__(self) -> None:
        if not (math.isfinite(self.deadline_s) and self.deadline_s > 0):
            raise ValueError(f"deadline_s must be a positive number of seconds, not {self.deadline_s!r}")


@dataclass(frozen=True)
class Answer:
    """A whole answer: ``status`` (HTTP status code), ``body`` (decoded bytes, within the cap),
    ``content_type`` (the header's value, lower case, or ""), ``seconds`` (wall time taken)."""

    url: str
    status: int
    body: bytes
    content_type: str = ""
    seconds: float = 0.0

    def text(self) -> str:
        """The body as text (UTF-8; a byte that is not UTF-8 becomes U+FFFD)."""
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON through the bounded reader (``jsonio.loads_json``: depth, duplicate
        keys, NaN refused). Raises ``BadAnswer``."""
        from escha_deploy.utils.errors import BadInput
        from escha_deploy.utils.jsonio import loads_json

        try:
            return loads_json(self.body, self.url, "an answer")
        except BadInput as exc:
            raise BadAnswer(self.url, f"not JSON ({exc.problems[0].split(': ', 1)[-1]})") from None


@functools.lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    """One TLS context for every client (building one loads the CA bundle: about 80 ms)."""
    import httpx

    return httpx.create_ssl_context()


def async_client(policy: Policy = Policy(), *, connect_s: float | None = None, **kw: Any) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for servers we do not control: no proxy from the environment,
    no redirect followed, httpx's per-operation timeouts at the deadline (a backstop: the
    deadline itself is ``guard``'s), connecting within ``connect_s`` when given. ``kw`` goes to
    httpx (``base_url``, ``headers``, ``limits``)."""
    import httpx

    timeout = httpx.Timeout(policy.deadline_s, connect=min(connect_s or policy.deadline_s, policy.deadline_s))
    kw["headers"] = {"Accept-Encoding": "identity", **dict(kw.get("headers") or {})}
    return httpx.AsyncClient(timeout=timeout, trust_env=False,
                             follow_redirects=False, verify=_ssl_context(), **kw)


def _exc_text(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextlib.asynccontextmanager
async def guard(url: str, policy: Policy, *, sent: list[bool] | None = None,
                redact: Callable[[str], str] = str) -> AsyncIterator[None]:
    """Run the block under ``policy``'s deadline and turn what httpx raises into one
    ``ReadFailed``. ``sent``: a one-item list the block sets to ``[True]`` once the server has
    taken the request (then a broken connection is ``ConnectionLost``, not ``Unreachable``).
    ``redact`` masks secrets in an exception's text (h11 quotes a refused header whole)."""
    import asyncio

    import httpx

    try:
        async with asyncio.timeout(policy.deadline_s):
            yield
    except TimeoutError:
        raise DeadlinePassed(url, f"no whole answer within {policy.deadline_s:g} s") from None
    except httpx.TimeoutException:
        raise DeadlinePassed(url, f"no whole answer within {policy.deadline_s:g} s") from None
    except httpx.ConnectError as exc:
        raise Unreachable(url, f"cannot connect ({redact(_exc_text(exc))})") from None
    except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.CloseError) as exc:
        kind = ConnectionLost if (sent and sent[0]) or isinstance(exc, httpx.ReadError) else Unreachable
        what = "connection lost" if kind is ConnectionLost else "no answer"
        raise kind(url, f"{what} ({redact(_exc_text(exc))})") from None
    except httpx.DecodingError as exc:
        raise BadAnswer(url, f"the body cannot be decoded ({redact(_exc_text(exc))})") from None
    except httpx.HTTPError as exc:  # the rest of httpx's family: protocol, proxy, unsupported
        raise BadAnswer(url, redact(_exc_text(exc))) from None


class Budget:
    """The size cap of one body, counted chunk by chunk (``take``); ``TooLarge`` past it."""

    def __init__(self, url: str, max_bytes: int) -> None:
        self.url, self.max_bytes, self.n = url, max_bytes, 0

    def check_length(self, headers: Mapping[str, str]) -> None:
        """Refuse a declared ``Content-Length`` above the cap before reading the body."""
        raw = headers.get("content-length")
        if raw is not None and raw.strip().isdigit() and len(raw.strip()) < 20 and int(raw) > self.max_bytes:
            raise TooLarge(self.url, f"the answer is {int(raw):,} bytes; at most {self.max_bytes:,} are read")

    def take(self, chunk: bytes | str) -> None:
        self.n += len(chunk)
        if self.n > self.max_bytes:
            raise TooLarge(self.url, f"the answer goes past {self.max_bytes:,} bytes; at most that many are read")


def content_coding(headers: Mapping[str, str] | httpx.Headers, url: str) -> str | None:
    """The one content coding of an answer (``CODINGS``), None for none (or ``identity``).
    Raises ``BadAnswer`` for two codings or more (each is undone in turn, so each multiplies
    the decoded size: RFC 9110 section 8.4) or one not in ``CODINGS``."""
    values = headers.get_list("content-encoding") if hasattr(headers, "get_list") else (
        [headers["content-encoding"]] if "content-encoding" in headers else [])
    codings = [c.strip().lower() for v in values for c in v.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if len(codings) > 1:
        raise BadAnswer(url, f"the answer is encoded {len(codings)} times (Content-Encoding: "
                             f"{shown(', '.join(codings), 60)}); one coding at most is decoded")
    if codings and codings[0] not in CODINGS:
        raise BadAnswer(url, f"the answer's Content-Encoding {shown(codings[0], 40)} is not one of "
                             f"{', '.join(CODINGS)} (identity was asked for)")
    return codings[0] if codings else None


class ContentDecoder:
    """One content coding undone with a bound: ``feed(data, room)`` returns at most ``room + 1``
    decoded bytes (``zlib``'s ``max_length``), so a caller that refuses past ``room`` never holds
    more than that; ``end(room)`` the rest, and ``BadAnswer`` when the stream broke off or is
    not of its coding. ``deflate`` is read as zlib data, else as raw deflate (what some servers
    send: httpx does the same)."""

    def __init__(self, coding: str, url: str) -> None:
        import zlib

        self.coding, self.url = coding, url
        self._raw_tried = coding != "deflate"
        self._z = zlib.decompressobj(16 + zlib.MAX_WBITS if coding in ("gzip", "x-gzip") else zlib.MAX_WBITS)
        self._fed = False

    def _bad(self, why: str) -> BadAnswer:
        return BadAnswer(self.url, f"the body cannot be decoded ({self.coding}: {shown(why, 80)})")

    def feed(self, data: bytes, room: int) -> bytes:
        import zlib

        if self._z.eof:  # bytes after the end of the stream: not of this coding's one stream
            if data.strip(b"\0"):
                raise self._bad("data after the end of the compressed stream")
            return b""
        try:
            out = self._z.decompress(data, max(room, 0) + 1)
        except zlib.error as exc:
            if self._raw_tried or self._fed:
                raise self._bad(str(exc)) from None
            self._raw_tried = True
            self._z = zlib.decompressobj(-zlib.MAX_WBITS)
            return self.feed(data, room)
        self._fed = True
        return out

    def end(self, room: int) -> bytes:
        import zlib

        if not self._fed:
            return b""
        try:
            out = self._z.flush(max(room, 0) + 1)
        except zlib.error as exc:
            raise self._bad(str(exc)) from None
        if not self._z.eof and len(out) <= room:
            raise self._bad("the compressed stream ends early")
        return out


async def body_chunks(r: httpx.Response, url: str, budget: Budget) -> AsyncGenerator[bytes, None]:
    """The decoded body of ``r`` (opened with ``stream``), chunk by chunk, under ``budget``: the
    raw bytes off the wire (``Response.aiter_raw``: not decoded by httpx) are counted, then at
    most one content coding is undone (``content_coding``, ``ContentDecoder``) within the room
    left; ``TooLarge`` past the cap, ``BadAnswer`` for codings refused. Close it
    (``contextlib.aclosing``) when stopping early."""
    coding = content_coding(r.headers, url)
    dec = ContentDecoder(coding, url) if coding else None
    wire = Budget(url, budget.max_bytes)
    async with contextlib.aclosing(cast("AsyncGenerator[bytes, None]", r.aiter_raw())) as chunks:
        async for chunk in chunks:
            wire.take(chunk)
            out = chunk if dec is None else dec.feed(chunk, budget.max_bytes - budget.n)
            budget.take(out)
            if out:
                yield out
    if dec is not None:
        out = dec.end(budget.max_bytes - budget.n)
        budget.take(out)
        if out:
            yield out


async def aread(client: httpx.AsyncClient, method: str, url: str, *, policy: Policy = Policy(),
                redact: Callable[[str], str] = str,
                **kw: Any) -> Answer:
    """One request through ``client`` (``async_client``), its whole body read under ``policy``.
    ``url`` may be relative to the client's ``base_url``; ``kw`` goes to ``client.stream``
    (``json``, ``headers``). Raises ``ReadFailed``."""
    shown_url = str(client.base_url).rstrip("/") + url if url.startswith("/") else url
    t0 = time.monotonic()
    budget = Budget(shown_url, policy.max_body_bytes)
    sent = [False]
    async with guard(shown_url, policy, sent=sent, redact=redact):
        async with client.stream(method, url, **kw) as r:
            sent[0] = True
            budget.check_length(r.headers)
            parts = []
            # an async generator, closed at a refusal too
            async with contextlib.aclosing(body_chunks(r, shown_url, budget)) as chunks:
                async for chunk in chunks:
                    parts.append(chunk)
            return Answer(url=shown_url, status=r.status_code, body=b"".join(parts),
                          content_type=r.headers.get("content-type", "").lower(),
                          seconds=time.monotonic() - t0)
    raise AssertionError("unreachable")  # pragma: no cover - guard re-raises or the block returns


def get(url: str, *, policy: Policy = Policy(), headers: dict[str, str] | None = None) -> Answer:
    """``GET url`` for synchronous callers (``status``, ``fleet status``): ``request``."""
    return request("GET", url, policy=policy, headers=headers)


def request(method: str, url: str, *, policy: Policy = Policy(), headers: dict[str, str] | None = None,
            content: bytes | None = None) -> Answer:
    """One request for synchronous callers (``status``, ``fleet status``, ``up``'s ready wait:
    ``launch/ready.py``): ``aread`` on an event loop of its own, with a client made for the
    call, so the whole answer comes within ``policy.deadline_s`` seconds or not at all.
    ``content``: the request body (bytes), sent as is. Raises ``ReadFailed``."""

    async def one() -> Answer:
        async with async_client(policy) as client:
            return await aread(client, method, url, policy=policy, headers=headers or {}, content=content)

    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _on_a_loop_of_its_own(one)
    # called from code running on an event loop (bench's load loop starts servers through `up`,
    # whose ready wait reads here): a second loop cannot run in this thread, so on a thread of its own
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="httpread") as pool:
        return pool.submit(_on_a_loop_of_its_own, one).result()


def _interrupt_in(group: BaseExceptionGroup) -> BaseException | None:
    """The first exception in ``group`` (nested groups searched) that is a ``BaseException`` but
    no ``Exception``: ``KeyboardInterrupt``, ``SystemExit``, a signal handler's own; else None."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found = _interrupt_in(exc)
            if found is not None:
                return found
        elif not isinstance(exc, Exception):
            return exc
    return None


def _on_a_loop_of_its_own(one: Callable[[], Coroutine[Any, Any, Answer]]) -> Answer:
    """``one()`` run to its end on a new event loop in this thread, closed after it."""
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(one())
    except BaseExceptionGroup as group:
        # an interrupt raised while a task group ran (a signal handler's exception, `up`'s
        # guard.Signalled, raised inside anyio's connect task: httpcore connects through a task
        # group, and anyio wraps what its tasks raise) comes out as itself, so the caller's
        # `except` for it sees it; a CI run's SIGTERM during `up`'s ready wait printed the group
        # as a traceback and exited 1 instead of 143
        interrupt = _interrupt_in(group)
        if interrupt is None:
            raise
        raise interrupt from None
    finally:
        try:  # as asyncio.run ends: cancel what is left (Ctrl-C mid-read), close the generators
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            # close() does not wait for the resolver's worker thread (asyncio.run would): a
            # name lookup that hangs must not outlive the deadline in this call
            loop.close()


def header_safe(value: str) -> bool:
    """Whether ``value`` can go in an HTTP header as httpx sends it: printable ASCII (RFC 9110
    section 5.5 allows Latin-1 but no line break; httpx encodes header values as ASCII and
    raises ``UnicodeEncodeError`` otherwise, httpx/_models.py ``_normalize_header_value``)."""
    return value.isascii() and value.isprintable()


def status_problem(answer: Answer) -> str | None:
    """Why a non-200 answer is one, in words (``HTTP 503 Service Unavailable``), else None."""
    if answer.status == 200:
        return None
    from http import HTTPStatus

    try:
        phrase = HTTPStatus(answer.status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP {answer.status}{' ' + phrase if phrase else ''}"


# ---- Prometheus text ---------------------------------------------------------------------------

SampleKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class MetricSamples:
    """Prometheus text parsed under the policy: ``samples`` maps (sample name, sorted labels)
    to a finite value; ``nonfinite`` holds the keys whose value was NaN, +/-Inf or beyond
    ``MAX_SAMPLE``, with it."""

    samples: dict[SampleKey, float] = field(default_factory=dict)
    nonfinite: dict[SampleKey, float] = field(default_factory=dict)
    #: keys given more than once (the last value is kept), in the order first repeated
    duplicates: list[SampleKey] = field(default_factory=list)
    #: samples after a ``# EOF`` line (OpenMetrics 1.0, "Overall structure": the exposition
    #: MUST end with it); they are read, and named as suspect
    after_eof: int = 0


def series_name(key: SampleKey) -> str:
    """``name{label="value",...}`` for messages (printable, at most 120 characters)."""
    name, labels = key
    inner = ",".join(f'{k}="{v}"' for k, v in labels)
    return shown(f"{name}{{{inner}}}" if labels else name, 120)


def unusable_text(nonfinite: dict[SampleKey, float], keys: list[SampleKey], shown_at_most: int = 3) -> str:
    """The words for series whose values are not usable numbers (``MetricSamples.nonfinite``):
    ``not a usable number (NaN, Inf, or past 2**53): NAME{...} = nan, ... and N more``."""
    more = f" and {len(keys) - shown_at_most} more" if len(keys) > shown_at_most else ""
    return ("not a usable number (NaN, Inf, or past 2**53): "
            + ", ".join(f"{series_name(k)} = {nonfinite[k]:g}" for k in keys[:shown_at_most]) + more)


def metric_samples(text: str, url: str, policy: Policy = Policy(), *, started: float | None = None) -> MetricSamples:
    """Parse Prometheus text exposition (``prometheus_client.parser``, the library SGLang
    writes it with) under ``policy``: at most ``max_series`` samples, and (``started``, a
    ``time.monotonic()`` value) within the deadline counted from then. Raises ``TooLarge``,
    ``DeadlinePassed``, or ``BadAnswer`` for text that is not Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    text_bounds(text, url)
    t_end = None if started is None else started + policy.deadline_s
    out: dict[SampleKey, float] = {}
    bad: dict[SampleKey, float] = {}
    dups: dict[SampleKey, None] = {}
    n = 0
    eof = text.find("\n# EOF")
    eof_at = -1 if eof < 0 and not text.startswith("# EOF") else max(eof, 0)
    after_eof = 0
    if eof_at >= 0:
        rest = text[eof_at:].lstrip("\n").split("\n", 1)
        after_eof = sum(1 for ln in (rest[1] if len(rest) > 1 else "").split("\n")
                        if ln.strip() and not ln.startswith("#"))
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                n += 1
                if n > policy.max_series:
                    raise TooLarge(url, f"more than {policy.max_series:,} series; at most that many are read")
                if t_end is not None and n % 1000 == 0 and time.monotonic() > t_end:
                    raise DeadlinePassed(url, f"the answer was not parsed within {policy.deadline_s:g} s")
                key = (s.name, tuple(sorted(s.labels.items())))
                if key in out or key in bad:
                    dups[key] = None
                v = float(s.value)
                if math.isfinite(v) and abs(v) <= MAX_SAMPLE:
                    out[key] = v
                    bad.pop(key, None)
                else:
                    bad[key] = v
                    out.pop(key, None)
    except ReadFailed:
        raise
    except (ValueError, TypeError, IndexError, KeyError) as exc:  # the parser's ways of refusing text
        raise BadAnswer(url, f"not Prometheus text ({_exc_text(exc)})") from None
    return MetricSamples(out, bad, list(dups), after_eof)


def text_bounds(text: str, url: str) -> None:
    """Refuse Prometheus text with a line past ``MAX_LINE_CHARS`` or a sample with more than
    ``MAX_LABELS`` labels (``TooLarge``), before a parser spends time on either. Labels are
    counted as ``="`` pairs of the line (one per label; a label value holding ``="`` counts
    more, never fewer). Linear in the text."""
    import re

    pair = re.compile(r'=\s*"')
    for i, line in enumerate(text.split("\n"), 1):
        if len(line) > MAX_LINE_CHARS:
            raise TooLarge(url, f"line {i} is {len(line):,} characters; at most {MAX_LINE_CHARS:,} are read")
        if "{" in line and not line.startswith("#"):
            n = len(pair.findall(line))
            if n > MAX_LABELS:
                raise TooLarge(url, f"line {i}: a sample with {n:,} labels; at most {MAX_LABELS} are read")
