"""`bench` against a server whose API key refuses ours: one line naming the refused key, exit 3.

The decision comes from SGLang 0.5.19's own ``decide_request_auth`` (sglang/srt/utils/auth.py,
loaded from the pinned wheel: the module imports no torch and no FastAPI) behind a small
stdlib HTTP server, a STAND-IN for FastAPI, which is not installed here. SGLang exempts /health
and /metrics from the key, so such a server looks ready and still refuses every request.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytestmark = pytest.mark.wheel
WHEEL = os.environ.get("ESCHA_SGLANG_WHEEL", "")
SERVER_KEY = "sk-the-servers-key-0123456789"


@pytest.fixture
def keyed_server(tmp_path):
    if not WHEEL or not os.path.isfile(WHEEL):
        pytest.skip("ESCHA_SGLANG_WHEEL not set")
    src = tmp_path / "sglang_auth.py"
    with zipfile.ZipFile(WHEEL) as z:
        src.write_bytes(z.read("sglang/srt/utils/auth.py"))
    spec = importlib.util.spec_from_file_location("sglang_auth", src)
    auth = importlib.util.module_from_spec(spec)
    sys.modules["sglang_auth"] = auth  # dataclasses resolves the module by name
    spec.loader.exec_module(auth)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _answer(self):
            d = auth.decide_request_auth(method=self.command, path=self.path,
                                         authorization_header=self.headers.get("Authorization"),
                                         api_key=SERVER_KEY, admin_api_key=None,
                                         auth_level=auth.AuthLevel.NORMAL)
            code, body = (200, {}) if d.allowed else (d.error_status_code, {"error": "Unauthorized"})
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    sys.modules.pop("sglang_auth", None)


def bench(*args, env=None):
    return subprocess.run([sys.executable, "-m", "escha_deploy.cli.main", "bench", *args], capture_output=True,
                          text=True, env=env or dict(os.environ), timeout=60)


def test_no_key_is_named_as_refused(keyed_server):
    env = dict(os.environ)
    env.pop("ESCHA_API_KEY", None)
    r = bench("-e", keyed_server, env=env)
    assert r.returncode == 3, r.stderr
    assert "the server refused the API key (HTTP 401; no key was sent)" in r.stderr
    assert "Traceback" not in r.stderr


def test_wrong_key_is_named_as_refused_and_not_printed(keyed_server, tmp_path):
    key = tmp_path / "key"
    key.write_text("sk-not-the-servers-key-987654\n")
    r = bench("-e", keyed_server, "--api-key-file", str(key))
    assert r.returncode == 3, r.stderr
    assert "the server refused the API key (HTTP 401; the key sent)" in r.stderr
    assert "sk-not-the-servers-key" not in r.stdout + r.stderr
