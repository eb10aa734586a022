"""``httpread.request`` called from code that runs on an event loop (bench's load loop starts its
servers through ``up``, whose ready wait reads through httpread): it answers as from plain code,
on a thread of its own, instead of "Cannot run the event loop while another loop is running".
The server is a real one on 127.0.0.1 (http.server in a thread)."""

from __future__ import annotations

import asyncio
import http.server
import threading

from escha_deploy.utils import httpread


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_read_from_inside_a_running_loop_answers():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/health"
    try:
        plain = httpread.get(url)

        async def inside() -> httpread.Answer:
            return httpread.get(url)  # synchronous code on the running loop, as bench's launcher is

        nested = asyncio.run(inside())
    finally:
        srv.shutdown()
        srv.server_close()
    assert plain.status == nested.status == 200
    assert nested.body == plain.body == b'{"ok": true}'
