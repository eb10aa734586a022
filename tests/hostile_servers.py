"""HOSTILE HTTP servers: test fixtures that answer the way a broken or malicious server does,
to prove that every client of a server escha-deploy does not control (``status``, ``bench``,
``canary``, ``fleet status``; ``escha_deploy/utils/httpread.py``) ends within its deadline with one
named error. They are not SGLang: each speaks just enough HTTP/1.1 over a raw socket to be
wrong in one way.

Each binds 127.0.0.1 on a port the OS picks, serves every connection in a daemon thread, and
stops by itself after ``lifetime_s`` (default 60 s) even if the test never stops it; ``stop()``
ends it at once. Use as a context manager::

    with HostileServer("slow-body") as srv:
        ...  # srv.url is http://127.0.0.1:PORT

Kinds (``KINDS``):

- ``slow-body``: ``/metrics`` headers at once (chunked), then the body one byte a second;
- ``slow-headers``: the status line and headers one byte a second;
- ``huge``: a valid 50 MB ``/metrics`` (about 1.9 million series) with its ``Content-Length``;
- ``huge-chunked``: the same body chunked, no length announced;
- ``endless``: a chunked ``/metrics`` body at full speed that never ends;
- ``nan``: valid SGLang-named series whose values are ``NaN``, ``+Inf`` and ``-Inf``;
- ``overflow``: finite values whose sum is not (two ``cached_tokens_total`` series of 1e308);
- ``tiny-seconds``: usable numbers whose quotient is not: 9e15 bytes loaded back in 1e-320 s
  (a subnormal duration), so the load-back rate is inf;
- ``redirect``: ``302 Found`` to another path on the same server, for every request;
- ``reset-mid-request``: ``/health`` 200, ``/server_info``, ``/model_info`` JSON, 404 for the
  rest and for ``POST /v1/tokenize``, and a ``POST /v1/completions`` whose socket is closed
  (reset) before its body is read (a server that crashes mid-request);
- ``escapes``: the same endpoints, whose strings (version, model name, a completion's error
  page) carry terminal escapes (``ESCAPES``: an OSC title, a CSI colour, a C1 CSI) and rich
  markup; ``POST /v1/completions`` answers 500 with them.
- ``gzip-twice``: a small ``/metrics`` sent with ``Content-Encoding: gzip, gzip`` (each layer
  undone in turn: 64 MiB of text from about 300 KB on the wire), whatever was asked for;
- ``gzip-bomb``: ``Content-Encoding: gzip``, 256 MiB of text from about 1.2 MB on the wire;
- ``gzip-broken``: ``Content-Encoding: gzip``, a valid ``/metrics`` whose gzip stream is cut off;
- ``many-labels``: one sample with 300,000 labels (3.5 MB, under the size cap);
- ``wide-labels``: one sample with 1,000 labels on a line under the line cap.

``headers`` holds each request's headers (lower-case names), in order.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

KINDS = ("slow-body", "slow-headers", "huge", "huge-chunked", "endless", "nan", "overflow", "tiny-seconds",
         "redirect", "reset-mid-request", "escapes", "gzip-twice", "gzip-bomb", "gzip-broken", "many-labels",
         "wide-labels")

#: About 26 bytes a line, so 50 MB is about 1.9 million series.
_HUGE_BYTES = 50 * 10**6


def _gzip(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data, compresslevel=1, mtime=0)


def _zeros_gzip(n: int) -> bytes:
    """``n`` bytes of metric-text filler, gzipped, built a MiB at a time (never all in memory)."""
    import zlib

    z = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"#" * (1 << 20)
    return b"".join(z.compress(block) for _ in range(n >> 20)) + z.flush()


def _labels_body(n: int) -> bytes:
    head = b"# TYPE sglang:token_usage gauge\n"
    return head + b"sglang:token_usage{" + b",".join(b'l%d="v"' % i for i in range(n)) + b"} 0.5\n"


def _encoded_body(kind: str) -> bytes:
    if kind == "gzip-twice":
        return _gzip(_zeros_gzip(64 << 20))
    if kind == "gzip-bomb":
        return _zeros_gzip(256 << 20)
    if kind == "gzip-broken":
        whole = _gzip(NAN_BODY.replace(b"NaN", b"1").replace(b"+Inf", b"2").replace(b"-Inf", b"3"))
        return whole[: len(whole) - 12]
    return b""


def _huge_body() -> bytes:
    head = b"# TYPE sglang:token_usage gauge\n"
    line = b'sglang:token_usage{tp_rank="%07d"} 0.5\n'
    n = (_HUGE_BYTES - len(head)) // len(line % 0)
    return head + b"".join(line % i for i in range(n))


#: Valid SGLang 0.5.19 series names (watch/names.py) with values that are not numbers.
NAN_BODY = (
    "# TYPE sglang:cached_tokens_total counter\n"
    'sglang:cached_tokens_total{cache_source="device"} NaN\n'
    'sglang:cached_tokens_total{cache_source="host"} +Inf\n'
    "# TYPE sglang:prompt_tokens_total counter\n"
    "sglang:prompt_tokens_total NaN\n"
    "# TYPE sglang:num_requests_total counter\n"
    "sglang:num_requests_total -Inf\n"
    "# TYPE sglang:token_usage gauge\n"
    'sglang:token_usage{tp_rank="0"} NaN\n'
    "# TYPE sglang:hicache_host_total_tokens gauge\n"
    'sglang:hicache_host_total_tokens{tp_rank="0"} +Inf\n'
    "# TYPE sglang:hicache_host_used_tokens gauge\n"
    'sglang:hicache_host_used_tokens{tp_rank="0"} NaN\n'
).encode()


#: Finite values that overflow a float when ``status`` adds them up (cached tokens by tier).
OVERFLOW_BODY = (
    "# TYPE sglang:cached_tokens_total counter\n"
    'sglang:cached_tokens_total{cache_source="device"} 1e308\n'
    'sglang:cached_tokens_total{cache_source="host"} 1e308\n'
    "# TYPE sglang:prompt_tokens_total counter\n"
    "sglang:prompt_tokens_total 1e308\n"
).encode()


#: What a terminal would act on: an OSC window title (ended by BEL), a CSI colour, a C1 CSI
#: clearing the screen, and rich markup that would print as a hyperlink.
ESCAPES = "\x1b]0;PWNED\x07\x1b[31mred\u009b2J[link=http://127.0.0.1/x]ok[/link]"


#: Usable numbers whose quotient overflows: load-back bytes over a subnormal duration.
TINY_SECONDS_BODY = (
    "# TYPE sglang:load_back_bytes_total counter\n"
    'sglang:load_back_bytes_total{tp_rank="0"} 9e15\n'
    "# TYPE sglang:load_back_duration_seconds histogram\n"
    'sglang:load_back_duration_seconds_sum{tp_rank="0"} 1e-320\n'
    'sglang:load_back_duration_seconds_count{tp_rank="0"} 1\n'
    'sglang:load_back_duration_seconds_bucket{tp_rank="0",le="+Inf"} 1\n'
    "# TYPE sglang:cached_tokens_total counter\n"
    'sglang:cached_tokens_total{cache_source="host"} 5\n'
).encode()


class HostileServer:
    """One hostile server of ``kind`` (``KINDS``) on 127.0.0.1; ``url``; stops after
    ``lifetime_s`` seconds or at ``stop()``."""

    def __init__(self, kind: str, *, lifetime_s: float = 60.0) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
        self.kind = kind
        self.lifetime_s = lifetime_s
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[str] = []  # "METHOD PATH" of each request read
        self.headers: list[dict[str, str]] = []
        self._body = (_huge_body() if kind in ("huge", "huge-chunked") else _encoded_body(kind)
                      if kind.startswith("gzip-") else _labels_body(300_000 if kind == "many-labels" else 1000)
                      if kind.endswith("-labels") else b"")
        self._thread = threading.Thread(target=self._serve, name=f"hostile-{kind}", daemon=True)
        self._t_end = time.monotonic() + lifetime_s

    def start(self) -> "HostileServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def __enter__(self) -> "HostileServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def _over(self) -> bool:
        return self._stop.is_set() or time.monotonic() > self._t_end

    def _serve(self) -> None:
        while not self._over:
            try:
                conn, _ = self._sock.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    # ---- one connection ------------------------------------------------------------------------

    def _read_head(self, conn: socket.socket) -> tuple[str, str, dict[str, str], bytes] | None:
        conn.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data and len(data) < 65536:
            chunk = conn.recv(4096)
            if not chunk:
                return None
            data += chunk
        raw_head, _, rest = data.partition(b"\r\n\r\n")
        head = raw_head.decode("latin-1").split("\r\n")
        method, path = (head[0].split(" ") + ["", ""])[:2]
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in head[1:])}
        self.requests.append(f"{method} {path}")
        self.headers.append(headers)
        return method, path, headers, rest

    def _trickle(self, conn: socket.socket, data: bytes) -> None:
        for i in range(len(data)):
            if self._over:
                return
            conn.sendall(data[i:i + 1])
            self._stop.wait(1.0)

    def _handle(self, conn: socket.socket) -> None:
        try:
            got = self._read_head(conn)
            if got is None:
                return
            method, path, headers, rest = got
            if method == "POST" and self.kind != "reset-mid-request":  # read it: closing sends no reset
                want = int(headers.get("content-length") or 0) - len(rest)
                while want > 0 and (chunk := conn.recv(min(want, 65536))):
                    want -= len(chunk)
            elif path == "/v1/tokenize":  # read its small body, so that closing sends no reset
                want = int(headers.get("content-length") or 0) - len(rest)
                while want > 0 and (chunk := conn.recv(min(want, 65536))):
                    want -= len(chunk)
            getattr(self, "_" + self.kind.replace("-", "_"))(conn, method, path)
        except OSError:
            pass  # the client gave up: that is the point
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _slow_body(self, conn, method, path) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
        while not self._over:
            conn.sendall(b"1\r\n#\r\n")
            self._stop.wait(1.0)

    def _slow_headers(self, conn, method, path) -> None:
        self._trickle(conn, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Slow: " + b"a" * 4096 + b"\r\n\r\n")

    def _huge(self, conn, method, path) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(self._body))
        view = memoryview(self._body)
        for i in range(0, len(view), 1 << 20):
            if self._over:
                return
            conn.sendall(view[i:i + (1 << 20)])

    def _huge_chunked(self, conn, method, path) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
        view = memoryview(self._body)
        for i in range(0, len(view), 1 << 16):
            if self._over:
                return
            part = bytes(view[i:i + (1 << 16)])
            conn.sendall(b"%x\r\n" % len(part) + part + b"\r\n")
        conn.sendall(b"0\r\n\r\n")

    def _endless(self, conn, method, path) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
        line = b'sglang:token_usage{tp_rank="0"} 0.5\n' * 1800
        chunk = b"%x\r\n" % len(line) + line + b"\r\n"
        while not self._over:
            conn.sendall(chunk)

    def _nan(self, conn, method, path, body: bytes = NAN_BODY) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n" % len(body) + body)

    def _overflow(self, conn, method, path) -> None:
        self._nan(conn, method, path, OVERFLOW_BODY)

    def _tiny_seconds(self, conn, method, path) -> None:
        self._nan(conn, method, path, TINY_SECONDS_BODY)

    def _redirect(self, conn, method, path) -> None:
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: %s/elsewhere\r\nContent-Length: 0\r\n"
                     b"Connection: close\r\n\r\n" % self.url.encode())

    def _escapes(self, conn, method, path) -> None:
        import json

        answers = {"/health": "", "/server_info": json.dumps({"version": ESCAPES, "hicache_write_policy": ESCAPES}),
                   "/model_info": json.dumps({"served_model_name": ESCAPES, "model_type": ESCAPES,
                                              "architectures": [ESCAPES]})}
        status, body = ("200 OK", answers[path]) if method == "GET" and path in answers else (
            ("500 Internal Server Error", ESCAPES) if path == "/v1/completions" else ("404 Not Found", ""))
        data = body.encode()
        conn.sendall(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n" % (status.encode(), len(data)) + data)

    def _encoded(self, conn, coding: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Encoding: %s\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (coding, len(self._body)) + self._body)

    def _gzip_twice(self, conn, method, path) -> None:
        self._encoded(conn, b"gzip, gzip")

    def _gzip_bomb(self, conn, method, path) -> None:
        self._encoded(conn, b"gzip")

    def _gzip_broken(self, conn, method, path) -> None:
        self._encoded(conn, b"gzip")

    def _many_labels(self, conn, method, path) -> None:
        self._nan(conn, method, path, self._body)

    def _wide_labels(self, conn, method, path) -> None:
        self._nan(conn, method, path, self._body)

    def _reset_mid_request(self, conn, method, path) -> None:
        answers = {"/health": b"", "/server_info": b'{"version": "0.5.19"}',
                   "/model_info": b'{"served_model_name": "hostile", "model_type": "llama"}'}
        if method == "GET" and path in answers:
            body = answers[path]
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n" % len(body) + body)
            return
        if method == "GET" or path == "/v1/tokenize":  # no tokenizer endpoint: bench sizes by estimate
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        # a POST: close at once, its body unread; SO_LINGER 0 sends a reset, as a crashed process's
        # socket does when data it never read is pending
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
