"""One content coding at most, decoded under the cap; Prometheus text held to a line length and
a label count before it is parsed. Real servers on 127.0.0.1 (tests/hostile_servers.py) that
encode what they were not asked to, and a real ``status --check`` against them, under a
wall-clock alarm of its deadline plus 2 s."""

from __future__ import annotations

import os
import time
import tracemalloc
import uuid

import pytest

from escha_deploy.launch.serve_state import ServeState, write_state
from escha_deploy.utils import httpread
from hostile_servers import HostileServer
from inproc import CLEAN_LINE, OverBudget, run_bounded

DEADLINE = httpread.Policy(deadline_s=2.0)
NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def timed_get(url: str):
    t0 = time.monotonic()
    try:
        return httpread.get(url, policy=DEADLINE), time.monotonic() - t0
    except httpread.ReadFailed as exc:
        return exc, time.monotonic() - t0


def test_identity_is_asked_for():
    with HostileServer("redirect") as srv:
        httpread.get(srv.url + "/metrics", policy=DEADLINE)
    assert srv.headers[0].get("accept-encoding") == "identity", srv.headers


def test_two_codings_are_refused_never_decoded():
    with HostileServer("gzip-twice") as srv:
        got, took = timed_get(srv.url + "/metrics")
    assert isinstance(got, httpread.BadAnswer), got
    assert str(got) == (f"{srv.url}/metrics: the answer is encoded 2 times (Content-Encoding: gzip, gzip); "
                        "one coding at most is decoded")
    assert took < DEADLINE.deadline_s + 2


def test_one_gzip_bomb_is_decoded_only_up_to_the_cap():
    with HostileServer("gzip-bomb") as srv:
        tracemalloc.start()
        try:
            got, took = timed_get(srv.url + "/metrics")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert isinstance(got, httpread.TooLarge) and "goes past 8,388,608 bytes" in str(got), got
    # the cap (8 MiB) held, and once more while joined: never a whole network read's expansion
    assert peak < 3 * httpread.MAX_BODY_BYTES, f"{peak / 2**20:.0f} MiB"
    assert took < DEADLINE.deadline_s + 2


def test_a_gzip_stream_cut_off_is_a_bad_answer():
    with HostileServer("gzip-broken") as srv:
        got, _ = timed_get(srv.url + "/metrics")
    assert isinstance(got, httpread.BadAnswer), got
    assert "the body cannot be decoded (gzip: the compressed stream ends early)" in str(got)


def test_a_long_line_and_a_sample_of_many_labels_are_refused_before_the_parser():
    long_line = 'sglang:token_usage{' + ",".join(f'l{i}="v"' for i in range(300_000)) + "} 0.5\n"
    t0 = time.monotonic()
    with pytest.raises(httpread.TooLarge, match=r"line 1 is 3,488,913 characters; at most 65,536 are read"):
        httpread.metric_samples(long_line, "u", started=t0)
    wide = 'sglang:token_usage{' + ",".join(f'l{i}="v"' for i in range(1000)) + "} 0.5\n"
    with pytest.raises(httpread.TooLarge, match="line 1: a sample with 1,000 labels; at most 64 are read"):
        httpread.metric_samples(wide, "u", started=t0)
    assert time.monotonic() - t0 < 1
    ok = 'sglang:token_usage{' + ",".join(f'l{i}="v"' for i in range(64)) + "} 0.5\n"
    assert len(httpread.metric_samples(ok, "u").samples) == 1


@pytest.mark.parametrize("kind, named", [
    ("gzip-twice", "{url}/metrics: the answer is encoded 2 times (Content-Encoding: gzip, gzip)"),
    ("many-labels", "{url}/metrics: line 2 is 3,488,913 characters; at most 65,536 are read"),
    ("wide-labels", "{url}/metrics: line 2: a sample with 1,000 labels; at most 64 are read"),
])
def test_status_check_ends_within_its_deadline(tmp_path, kind, named):
    run = tmp_path / "run"
    (run / f"escha-deploy-{os.getuid()}").mkdir(parents=True, mode=0o700)
    with HostileServer(kind) as srv:
        name = f"codings-{uuid.uuid4().hex[:8]}"
        write_state(ServeState(pid=os.getpid(), port=srv.port, profile=name, started_at=time.time()),
                    run / f"escha-deploy-{os.getuid()}")
        try:
            r, took = run_bounded("status", "--profile", name, "--check", "--http-timeout", "2", "--interval", "0.05",
                                  env={**NO_DOCKER, "XDG_RUNTIME_DIR": str(run)}, time_s=4.0)
        except OverBudget as exc:
            pytest.fail(f"status --check --http-timeout 2 did not end within 4 s: {exc}")
    assert "Traceback" not in r.text
    assert r.code == 5, r.text
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: status --check: {name}: " + named.format(url=srv.url)), r.err
    assert all(CLEAN_LINE.match(ln) for ln in r.err.splitlines() if ln.strip()), r.err
