"""``status --endpoint URL``: a server escha-deploy did not start (no state file, no container),
read from its ``/metrics`` and ``/server_info`` on loopback (the STAND-IN, tests/bench/
standin_sglang.py; a canned server for a planted series): the same view and alerts, the plan's
figures from ``--profile`` or omitted and said so, the key as ``bench`` takes it."""

from __future__ import annotations

import json

from canned_server import CannedServer
from inproc import run_main
from watch.test_status import CHECK, NO_DOCKER, load

from bench.standin_sglang import StandinConfig, StandinServer
from watch.conftest import FAST


def _standin(**kw) -> StandinServer:
    return StandinServer(StandinConfig(**{**FAST, "device_tokens": 500, "host_tokens": 20_000, **kw})).start()


def test_an_endpoint_not_started_here_raises_its_alert_and_omits_the_plan(runtime):
    srv = _standin(drop_without_backup=True)
    url = srv.url
    try:
        load(url, rounds=1)
        r = run_main("status", "--endpoint", url, *CHECK, env=NO_DOCKER)
    finally:
        srv.stop()
    assert r.code == 3, r.err
    (row,) = json.loads(r.out)
    assert row["kind"] == "endpoint" and row["endpoint"] == url and row["plan"] is None
    assert [a["id"] for a in row["alerts"]] == ["kv_dropped"]
    assert f"status --check: alert {url}: kv_dropped: " in r.err
    assert row["server_info"]["max_total_num_tokens"] == 500 and row["server_info"]["version"]
    assert row["server"]["ranks"]["0"]["planned_host_tokens"] is None  # no plan: no planned figure
    assert any(n.startswith("no --profile: the plan-relative figures") for n in row["notes"])
    assert row["host"]["mem_total_bytes"] > 0  # loopback: the server's host is this one


def test_with_a_profile_the_plans_figures_stand_beside_it(runtime):
    srv = _standin()
    try:
        r = run_main("status", "--endpoint", srv.url, "--profile", "rtx5060ti-tp2-fp8", *CHECK, env=NO_DOCKER)
        text = run_main("status", "-e", srv.url, "-p", "rtx5060ti-tp2-fp8", env=NO_DOCKER)
    finally:
        srv.stop()
    assert r.code == 0, r.err
    (row,) = json.loads(r.out)
    assert row["profile"] == "rtx5060ti-tp2-fp8" and row["plan"]["hicache_enabled"] and row["notes"] == []
    assert row["server"]["ranks"]["0"]["planned_host_tokens"] == row["plan"]["host_kv_tokens"] > 0
    assert len(row["plan_digest"]) == 12
    assert "server_info: version" in text.out and "no alerts" in text.out


#: A /metrics body with one series planted: SGLang 0.5.19's host-tier drop counter (the name
#: ``status`` reads, watch/names.py), and the gauges a server always exports.
PLANTED = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{tp_rank="0"} 0
# TYPE sglang:token_usage gauge
sglang:token_usage{tp_rank="0"} %s
"""


def test_a_planted_series_that_is_not_a_number_is_inconclusive_exit_5(runtime):
    srv = CannedServer({"/metrics": {"body": PLANTED % "NaN",
                                     "headers": {"Content-Type": "text/plain; version=0.0.4"}},
                        "/server_info": {"body": json.dumps({"version": "x", "tp_size": 1})}})
    with srv:
        r = run_main("status", "--endpoint", srv.url, "--check", "--interval", "0.05", env=NO_DOCKER)
    assert r.code == 5, r.err
    assert "sglang:token_usage" in r.err and srv.url in r.err
    assert any(req.startswith("GET /server_info") for req in srv.requests)


def test_bad_endpoint_and_key_input_is_one_line_exit_2(runtime, tmp_path):
    r = run_main("status", "--endpoint", "localhost:30000", env=NO_DOCKER)
    assert r.code == 2 and r.err.splitlines()[0] == "error: --endpoint: expected http://HOST:PORT, got 'localhost:30000'"
    r = run_main("status", "--api-key", "sekrit", "--endpoint", "http://127.0.0.1:9", env=NO_DOCKER)
    assert r.code == 2 and "sekrit" not in r.text
    key = tmp_path / "key"
    key.write_text("k\n")
    r = run_main("status", "--api-key-file", str(key), env=NO_DOCKER)
    assert r.code == 2 and "--api-key-file goes with --endpoint" in r.err
