"""``escha-deploy status`` against STAND-IN servers (tests/bench/standin_sglang.py) on
loopback: the ``--check`` exit codes, the ``--format json`` schema, every server-side alert
raised by the stand-in's modelled behaviour and quiet without it, a bounded load test whose
host-hit share the view must report, ``--record`` read back, ``--watch``."""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest

from escha_deploy.watch.record import read_record
from escha_deploy.launch.serve_state import ServeState, find_states, write_state
from inproc import run_main

#: The keys ``status --format json`` printed before the live view; they stay.
OLD_KEYS = {"profile", "container", "state", "endpoint", "plan_digest", "image", "uptime_s", "restart_policy"}
NEW_KEYS = {"kind", "sampled_at", "plan", "metrics_error", "server", "host", "container_memory", "alerts",
            "not_evaluated"}
#: No Docker daemon: native servers are found without one (its error becomes nothing).
NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def load(url: str, *, docs: int = 6, rounds: int = 5, words: int = 150) -> dict[str, int]:
    """A bounded workload on loopback: ``docs`` long prefixes asked ``rounds`` times each, in
    turn, so the device pool evicts them and the host tier serves them again. Returns the
    cached tokens by tier the server's responses reported (``sglext.cached_tokens_details``)."""
    got = {"device": 0, "host": 0, "requests": 0}
    with httpx.Client(base_url=url, timeout=10, trust_env=False) as c:
        for r in range(rounds):
            for d in range(docs):
                prompt = f"document {d} " + " ".join(f"w{d}x{i}" for i in range(words)) + f" question {r}"
                body = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2,
                                                       "return_cached_tokens_details": True}).json()
                det = (body.get("sglext") or {}).get("cached_tokens_details") or {}
                got["device"] += det.get("device", 0)
                got["host"] += det.get("host", 0)
                got["requests"] += 1
    return got


def status(name: str, *args: str):
    r = run_main("status", "--profile", name, *args, env=NO_DOCKER)
    rows = json.loads(r.out) if "--format" in args and r.out.strip() else None
    return r, rows


CHECK = ("--check", "--interval", "0.05", "--format", "json")


def test_healthy_box_exits_0_and_shows_the_host_share_the_standin_produced(box):
    srv, name = box(device_tokens=500, host_tokens=20_000)
    produced = load(srv.url)
    assert produced["host"] > 0 and produced["requests"] == 30
    r, rows = status(name, *CHECK)
    assert r.code == 0, r.err
    (row,) = rows
    assert OLD_KEYS | NEW_KEYS <= set(row)
    assert row["kind"] == "native" and row["state"] == "running" and row["endpoint"] == srv.url
    w = row["server"]["window"]
    assert w["since_start"] and w["requests"] == 30
    assert w["cached_tokens"]["host"] == produced["host"] and w["cached_tokens"]["device"] == produced["device"]
    assert w["share"]["host"] == pytest.approx(produced["host"] / (produced["host"] + produced["device"]))
    rank, every = row["server"]["ranks"]["0"], row["server"]["ranks"]["all"]  # 0.5.19: radix counters summed
    assert every["load_back_tokens"]["kv"] == produced["host"] and rank["load_back_tokens"] is None
    assert every["load_back_gb_per_s"] == pytest.approx(4096 * 1e9 / 1e9, rel=1e-6)  # bytes/token x tokens/s
    assert rank["host_total_tokens"] == 20_000 and rank["planned_host_tokens"] == 20_000
    assert row["host"]["mem_available_bytes"] > 0 and os.getpid() in row["host"]["server_pids"]
    assert row["alerts"] == [] and "inert_host_tier" not in row["not_evaluated"]


def test_inert_host_tier_raises_its_alert_exit_3(box):
    srv, name = box(device_tokens=500, host_tokens=20_000, never_load_back=True)
    produced = load(srv.url)
    assert produced["host"] == 0
    r, rows = status(name, *CHECK)
    assert r.code == 3, r.err
    assert [a["id"] for a in rows[0]["alerts"]] == ["inert_host_tier"]
    assert "status --check: alert" in r.err and "inert_host_tier" in r.err
    assert rows[0]["server"]["window"]["share"]["host"] == 0.0
    assert rows[0]["server"]["ranks"]["0"]["host_used_tokens"] > 0


def test_device_kv_dropped_raises_its_alert(box):
    srv, name = box(device_tokens=500, host_tokens=20_000, drop_without_backup=True)
    load(srv.url, rounds=1)
    r, rows = status(name, *CHECK)
    assert r.code == 3 and "kv_dropped" in [a["id"] for a in rows[0]["alerts"]]


@pytest.mark.parametrize("prefill_tps,fires", [("1000000000", True), ("10", False)])
def test_load_back_slower_than_recompute(box, prefill_tps, fires):
    srv, name = box(device_tokens=500, host_tokens=20_000, load_back_tps=1e6)  # 1 us per token loaded
    load(srv.url, rounds=2)
    r, rows = status(name, *CHECK, "--prefill-tps", prefill_tps)
    got = [a["id"] for a in rows[0]["alerts"]]
    assert ("load_back_slower_than_recompute" in got) is fires, r.err
    assert r.code == (3 if fires else 0)


def test_page_cache_under_the_plans_floor_on_this_machine(box):
    """This machine's real page cache against a floor it cannot meet, then one it meets."""
    srv, name = box(plan={"page_cache_floor_bytes": 1 << 60})
    r, rows = status(name, *CHECK)
    assert r.code == 3 and [a["id"] for a in rows[0]["alerts"]] == ["page_cache_low"]


def test_metrics_off_is_exit_5(box):
    srv, name = box(metrics=False)
    r, rows = status(name, *CHECK)
    assert r.code == 5, r.err
    assert "HTTP 404" in rows[0]["metrics_error"] and "--enable-metrics" in r.err


def test_server_not_answering_is_exit_5(box):
    srv, name = box()
    srv.stop()
    r, rows = status(name, *CHECK)
    assert r.code == 5 and rows[0]["metrics_error"].startswith("server not answering")


def test_nothing_running_is_exit_3(runtime):
    r = run_main("status", "--profile", "watch-nothing-here", "--check", env=NO_DOCKER)
    assert r.code == 3


def test_a_stale_state_file_is_removed(runtime):
    dead = ServeState(pid=2**22 + 12345, port=1, profile="watch-stale", started_at=time.time())
    path = write_state(dead)
    r = run_main("status", "--profile", "watch-stale", env=NO_DOCKER)
    assert r.code == 3 and not path.exists()
    assert "no longer runs" in r.err
    assert find_states()[0] == []


def test_record_is_read_back_through_the_bounded_reader(box, tmp_path):
    srv, name = box(device_tokens=500, host_tokens=20_000)
    load(srv.url, rounds=1)
    rec = tmp_path / "day2.jsonl"
    r = run_main("status", "--profile", name, "--watch", "--count", "3", "--interval", "0.05",
                 "--format", "json", "--record", str(rec), env=NO_DOCKER)
    assert r.code == 0, r.err
    lines = r.out.splitlines()  # --watch --format json: one line per look
    assert len(lines) == 3 and all(json.loads(ln)[0]["profile"] == name for ln in lines)
    looks = read_record(rec)
    assert len(looks) == 3 and all(lk["targets"][0]["profile"] == name for lk in looks)
    assert looks[-1]["targets"][0]["server"]["window"]["since_start"] is False  # --watch: over the window
    with rec.open("a") as f:
        f.write('{"schema_version": 1, "t": 1, "t": 2}\n')
    from escha_deploy.utils.errors import BadInput

    with pytest.raises(BadInput, match=r"day2.jsonl:4"):
        read_record(rec)


def test_watch_draws_the_live_view(box):
    srv, name = box(device_tokens=500, host_tokens=20_000, tp_size=2, metrics_all_schedulers=True)
    load(srv.url, rounds=2)
    r = run_main("status", "--profile", name, "--watch", "--count", "2", "--interval", "0.05", env=NO_DOCKER)
    assert r.code == 0, r.err
    for text in ("host tier and device pools, per tp_rank", "rank 0", "rank 1", "all ranks", "total 0,1,all",
                 "MemAvailable",
                 "look 2"):
        assert text in r.out, text


def test_watch_and_check_do_not_go_together(runtime):
    assert run_main("status", "--watch", "--check", env=NO_DOCKER).code == 2


def test_the_profiles_watch_thresholds_are_used(box):
    srv, name = box(plan={"thresholds": {"inert_min_requests": 1000}}, device_tokens=500, host_tokens=20_000,
                    never_load_back=True)
    load(srv.url)
    r, rows = status(name, *CHECK)
    assert r.code == 0, r.err
    assert "needs 1000 requests" in rows[0]["not_evaluated"]["inert_host_tier"]


def test_measured_bandwidth_from_doctors_findings_beside_the_achieved(box, tmp_path, monkeypatch):
    """doctor's restore probe (saved findings of this host) is the reference the view shows."""
    from escha_deploy.facts.saved import DoctorFindings, RestoreBandwidth, save_findings
    from escha_deploy.facts.machine import host_id
    from escha_deploy.utils.paths import doctor_findings_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    save_findings(DoctorFindings(created_at="2026-12-01T00:00:00+00:00", host_id=host_id(),
                                 restore_bandwidth=RestoreBandwidth(method="pinned copy_", bytes=1 << 30,
                                                                    load_gbps=24.5, backup_gbps=20.0)),
                  doctor_findings_path())
    srv, name = box(device_tokens=500, host_tokens=20_000)
    load(srv.url, rounds=2)
    r, rows = status(name, *CHECK)
    rank = rows[0]["server"]["ranks"]["all"]
    assert rank["measured_h2d_gb_per_s"] == 24.5 and rank["load_back_gb_per_s"] > 0
    assert rows[0]["plan"]["h2d_bytes_per_s"] == 24.5e9


@pytest.mark.parametrize("host,url", [("127.0.0.1", "http://127.0.0.1:5"), ("0.0.0.0", "http://127.0.0.1:5"),
                                      ("::", "http://[::1]:5"), ("::1", "http://[::1]:5")])
def test_a_native_servers_address_from_its_bind_host(host, url):
    assert ServeState(pid=1, port=5, host=host, profile="p", started_at=0).url == url


def test_a_container_that_is_not_running_is_exit_3(monkeypatch):
    """An exited container of the profile (no endpoint to ask) is named, exit 3, not 5."""
    from escha_deploy.watch import session

    row = {"profile": "watch-exited", "container": "escha-watch-exited", "state": "exited", "endpoint": "-",
           "plan_digest": "", "image": "i", "uptime_s": None, "restart_policy": "on-failure", "kind": "container"}
    monkeypatch.setattr(session, "find_targets",
                        lambda profile, note=None: [session.Target(kind="container", profile="watch-exited",
                                                                   url=None, row=row)])
    r, rows = status("watch-exited", *CHECK)
    assert r.code == 3 and "not running: container escha-watch-exited is exited" in r.err
    assert rows[0]["metrics_error"].endswith("exited, no endpoint")


#: The nested shape of a ``status --format json`` row: scripts read these keys.
SHAPE = {
    "server": {"hicache", "window", "ranks", "total", "unknown_series", "suspect_numbers"},
    "window": {"seconds", "since_start", "requests", "prompt_tokens", "cached_tokens", "share", "spec_accept_length"},
    "share": {"device", "host", "storage"},
    "rank": {"host_used_tokens", "host_total_tokens", "host_fill", "host_mamba_used_states",
             "host_mamba_total_states", "planned_host_mamba_slots", "planned_host_tokens", "planned_host_bytes",
             "load_back_tokens", "load_back_bytes", "load_back_seconds", "load_back_gb_per_s",
             "measured_h2d_gb_per_s", "backup_tokens", "backup_bytes", "dropped_tokens", "evicted_tokens",
             "token_usage", "mamba_usage", "num_running", "num_queued"},
    "total": {"summed_ranks", "host_used_tokens", "host_total_tokens", "load_back_bytes", "load_back_seconds",
              "backup_bytes", "evicted_tokens", "num_running", "num_queued", "load_back_tokens", "backup_tokens",
              "dropped_tokens", "load_back_gb_per_s_slowest_rank"},
    "host": {"mem_total_bytes", "mem_available_bytes", "page_cache_bytes", "page_cache_floor_bytes",
             "swap_total_bytes", "swap_free_bytes", "swap_in_pages_per_s", "swap_out_pages_per_s", "psi",
             "server_pids", "server_rss_bytes", "cgroup", "cgroup_events_in_window"},
    "alert": {"id", "title", "evidence", "fix"},
}


def test_json_shape(box):
    srv, name = box(device_tokens=500, host_tokens=20_000, tp_size=2, metrics_all_schedulers=True, never_load_back=True)
    load(srv.url)
    r, rows = status(name, *CHECK)
    row = rows[0]
    assert set(row) == OLD_KEYS | NEW_KEYS | {"pid"}
    s = row["server"]
    assert set(s) == SHAPE["server"] and set(s["window"]) == SHAPE["window"]
    assert set(s["window"]["share"]) == SHAPE["share"] and set(s["total"]) == SHAPE["total"]
    assert set(s["ranks"]) == {"0", "1", "all"} and all(set(v) == SHAPE["rank"] for v in s["ranks"].values())
    assert s["total"]["summed_ranks"] == [0, 1, "all"]
    assert set(row["host"]) == SHAPE["host"]
    assert row["alerts"] and all(set(a) == SHAPE["alert"] for a in row["alerts"])
    json.dumps(rows, allow_nan=False)  # strict JSON: no NaN or Infinity anywhere


def test_an_unreadable_state_file_is_named_and_skipped(runtime):
    from escha_deploy.launch.native import runtime_dir

    bad = runtime_dir() / "serve-7.json"
    bad.write_text('{"pid": 1, "pid": 2}')
    r = run_main("status", "--profile", "watch-bad", env=NO_DOCKER)
    assert r.code == 3 and f"{bad}: unreadable state file" in r.err and "twice" in r.err


def test_check_of_a_native_server_imports_no_docker_client(box, tmp_path):
    """A native server and no Docker daemon to ask: ``status --check`` neither imports docker-py
    nor connects (a subprocess: this test process has docker-py loaded already)."""
    import subprocess
    import sys

    srv, name = box(device_tokens=500, host_tokens=20_000)
    code = ("import sys\nfrom escha_deploy.cli.main import main\n"
            "try:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\nprint('exit', rc)\n"
            "print('docker loaded:', 'docker' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code, "status", "--profile", name, "--check", "--interval", "0.05"],
                       env={**os.environ, **NO_DOCKER}, capture_output=True, text=True, timeout=120)
    assert p.stdout.splitlines()[-2:] == ["exit 0", "docker loaded: False"], p.stdout + p.stderr
