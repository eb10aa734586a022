"""``canary`` with its default options as the first requests on a fresh real server (marked ``gpu``).

The server is the GPU rig's: native ``escha-deploy serve --profile tests/gpu_rig/h200-tiny.yaml``
(SGLang 0.5.19 from the serving closure, a tiny random-weight hybrid Qwen3.5 model: 2,048 device
tokens, 16 mamba slots, host pool at ratio 2, page 1, ``write_through``), started for this module
as tests/runtime/test_real_server_gpu.py starts its own (tests/gpu_rig/realserver.py), so nothing has been asked of
it before the canary. The canary sizes its prefix and its fill from ``/server_info`` and
``/metrics`` and must reach the host tier on the first try: PASS, with the host hit shown by the
response (``cached_tokens_details.host``) or the metrics.

Run on the GPU machine after ``scripts/gpu-run.sh`` has installed the closure (it sets
``ESCHA_RUNTIME_DESCRIPTION``), e.g. ``python3 -m pytest -m gpu -q tests/bench/test_canary_gpu.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.gpu_rig import realserver as rs

pytestmark = pytest.mark.gpu

PROFILE = rs.RIG / "h200-tiny.yaml"
READY_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A fresh rig server for this module (as tests/runtime/test_real_server_gpu.py starts one)."""
    rs.closure_description()
    rs.make_model(PROFILE, "tiny")
    log = rs.logs_dir(tmp_path_factory) / ("serve-tiny-%s.log" % __name__.rsplit(".", 1)[-1])
    port = rs.free_port()
    srv = rs.start(rs.serve_cmd(PROFILE, port), log, port)
    try:
        rs.wait_ready(srv, READY_TIMEOUT_S)
        yield srv
    finally:
        rs.kill_all(srv)


def test_default_canary_passes_first_on_a_fresh_server(server):
    r = subprocess.run([sys.executable, "-m", "escha_deploy", "canary", "-e", server.base, "--format", "json"],
                       capture_output=True, text=True, cwd=rs.REPO, timeout=480)
    assert r.stdout.strip(), r.stderr[-4000:]
    result = json.loads(r.stdout)
    rs.report("canary/first_run", {k: result[k] for k in ("verdict", "reason", "evidence", "fill_requests",
                                                        "fill_tokens")})
    assert r.returncode == 0 and result["verdict"] == "pass", (result["reason"], result["evidence"])
    host = result["answers"][2]
    assert (host["host_tokens"] or 0) > 0 or (host["host_metric_tokens"] or 0) > 0, host
    assert result["answers"][0]["text"] == host["text"]
