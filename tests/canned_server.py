"""A corpus case's ``server`` (and a test's stand-in daemon): an HTTP/1.1 server on 127.0.0.1 (a port the OS picks) that gives
canned answers, so a case can feed a command what a server sends as it feeds it a file.

``answers`` maps a path pattern (``fnmatch``, matched against the path without its query; the
first pattern that matches wins, ``*`` for the rest) to an answer: ``status`` (default 200),
``headers`` (name: value, sent as written), ``body`` (text; ``$repeat(N, TEXT)$`` expands as in
argv), ``encode`` (a list of ``gzip``: applied to the body in order, whatever the request asked
for). ``Content-Length`` is added; the connection is closed after each answer. A path no
pattern matches answers 404. ``requests`` holds ``METHOD PATH`` of each request."""

from __future__ import annotations

import fnmatch
import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


class CannedServer:
    def __init__(self, answers: dict[str, dict], expand: Callable[[str], str] = str) -> None:
        self.answers = [(pattern, self._prepare(a, expand)) for pattern, a in answers.items()]
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet: the test reads requests
                pass

            def _answer(self) -> None:
                server.requests.append(f"{self.command} {self.path}")
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                path = self.path.split("?", 1)[0]
                status, headers, body = next((a for p, a in server.answers if fnmatch.fnmatchcase(path, p)),
                                             (404, {}, b""))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                self.close_connection = True

            do_GET = do_POST = do_DELETE = do_PUT = do_HEAD = _answer

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="corpus-server", daemon=True)

    @staticmethod
    def _prepare(answer: dict, expand: Callable[[str], str]) -> tuple[int, dict[str, str], bytes]:
        body = expand(str(answer.get("body", ""))).encode()
        for coding in answer.get("encode") or ():
            if coding != "gzip":
                raise ValueError(f"encode: {coding!r}; only gzip")
            body = gzip.compress(body, compresslevel=1, mtime=0)
        return int(answer.get("status", 200)), {str(k): str(v) for k, v in (answer.get("headers") or {}).items()}, body

    def __enter__(self) -> "CannedServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
