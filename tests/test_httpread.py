"""The HTTP reading policy (escha_deploy/utils/httpread.py) against the HOSTILE servers of
tests/hostile_servers.py (real sockets on 127.0.0.1, not SGLang): every request ends within
its deadline (plus the client's own set-up) with the error class that names what went wrong,
and Prometheus text is read under the series cap with NaN/Inf kept out."""

from __future__ import annotations

import time

import pytest

from escha_deploy.utils import httpread
from escha_deploy.bench.metrics import Snapshot
from hostile_servers import NAN_BODY, HostileServer

DEADLINE = httpread.Policy(deadline_s=1.5)


def timed_get(url: str, policy: httpread.Policy = DEADLINE):
    t0 = time.monotonic()
    try:
        answer = httpread.get(url, policy=policy)
        return answer, time.monotonic() - t0
    except httpread.ReadFailed as exc:
        return exc, time.monotonic() - t0


@pytest.mark.parametrize("kind, error, words", [
    # one byte a second: an httpx read timeout restarts with every byte; the deadline does not
    ("slow-body", httpread.DeadlinePassed, "no whole answer within 1.5 s"),
    ("slow-headers", httpread.DeadlinePassed, "no whole answer within 1.5 s"),
    ("huge", httpread.TooLarge, "the answer is 49,999,982 bytes; at most 8,388,608 are read"),
    ("huge-chunked", httpread.TooLarge, "the answer goes past 8,388,608 bytes"),
    ("endless", httpread.TooLarge, "the answer goes past 8,388,608 bytes"),
])
def test_a_hostile_answer_ends_within_the_deadline_with_its_named_error(kind, error, words):
    with HostileServer(kind) as srv:
        got, took = timed_get(srv.url + "/metrics")
    assert isinstance(got, error), got
    assert str(got).startswith(f"{srv.url}/metrics: {words}"), got
    assert took < DEADLINE.deadline_s + 1.0, f"{took:.2f} s"


def test_a_redirect_is_not_followed():
    with HostileServer("redirect") as srv:
        answer = httpread.get(srv.url + "/metrics", policy=DEADLINE)
    assert answer.status == 302 and httpread.status_problem(answer) == "HTTP 302 Found"
    assert srv.requests == ["GET /metrics"]  # /elsewhere never asked


def test_nothing_listening_is_unreachable():
    with HostileServer("redirect") as srv:
        url = srv.url
    got, took = timed_get(url + "/metrics")  # stopped: the port refuses
    assert isinstance(got, httpread.Unreachable) and "cannot connect" in str(got)
    assert took < 1.0


def test_a_connection_reset_after_the_request_is_connection_lost():
    async def post() -> None:
        async with httpread.async_client(DEADLINE) as client:
            await httpread.aread(client, "POST", srv.url + "/v1/completions", policy=DEADLINE,
                                 json={"prompt": "x" * 2_000_000})

    import asyncio

    with HostileServer("reset-mid-request") as srv:
        with pytest.raises(httpread.ReadFailed) as exc:
            asyncio.run(post())
    assert isinstance(exc.value, (httpread.ConnectionLost, httpread.Unreachable)), exc.value
    assert str(exc.value).startswith(f"{srv.url}/v1/completions: ")


def test_nan_and_inf_are_kept_out_of_the_samples_and_named():
    got = httpread.metric_samples(NAN_BODY.decode(), "u")
    assert got.samples == {}
    names = {httpread.series_name(k) for k in got.nonfinite}
    assert 'sglang:cached_tokens_total{cache_source="host"}' in names and "sglang:prompt_tokens_total" in names
    text = httpread.unusable_text(got.nonfinite, sorted(got.nonfinite))
    assert text.startswith("not a usable number (NaN, Inf, or past 2**53): ") and text.endswith(" and 4 more")


def test_a_series_not_read_may_be_nan_and_one_read_may_not():
    """SGLang 0.5.19 exports sglang:fwd_occupancy as NaN before its first forward pass (seen on
    a real server): it is not one status reads, so the scrape stays usable."""
    text = ('sglang:fwd_occupancy{tp_rank="0"} NaN\n'
            'sglang:cached_tokens_total{cache_source="host"} 5\n'
            'sglang:token_usage{tp_rank="0"} 1e300\n')
    snap = Snapshot.parse(text)
    assert snap.samples == {("sglang:cached_tokens_total", (("cache_source", "host"),)): 5.0}
    assert snap.nonfinite_read(["sglang:cached_tokens_total"]) == []
    assert snap.nonfinite_read(["sglang:token_usage", "sglang:cached_tokens_total"]) == [
        ("sglang:token_usage", (("tp_rank", "0"),))]


def test_the_series_cap_stops_the_parse():
    text = "".join(f'sglang:token_usage{{tp_rank="{i}"}} 0.5\n' for i in range(1001))
    with pytest.raises(httpread.TooLarge, match="more than 1,000 series"):
        httpread.metric_samples(text, "u", httpread.Policy(max_series=1000))
    assert len(httpread.metric_samples(text, "u", httpread.Policy(max_series=1001)).samples) == 1001


def test_the_deadline_counts_the_parse():
    text = "".join(f'sglang:token_usage{{tp_rank="{i}"}} 0.5\n' for i in range(2000))
    with pytest.raises(httpread.DeadlinePassed, match="not parsed within 1 s"):
        httpread.metric_samples(text, "u", httpread.Policy(deadline_s=1), started=time.monotonic() - 5)


def test_text_that_is_not_prometheus_is_a_bad_answer():
    with pytest.raises(httpread.BadAnswer, match="not Prometheus text"):
        httpread.metric_samples('sglang:x{a="1" 2\n', "u")


def test_an_error_line_never_carries_control_sequences():
    exc = httpread.BadAnswer("http://127.0.0.1:1/x\x1b[31m", "answered \x1b]0;PWNED\x07red\x9b2J" + "y" * 500)
    assert "\x1b" not in str(exc) and "\x07" not in str(exc) and "\x9b" not in str(exc)
    assert str(exc).startswith("http://127.0.0.1:1/x: answered redyyy") and len(str(exc)) < 340


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_a_deadline_is_a_positive_number_of_seconds(bad):
    with pytest.raises(ValueError, match="deadline_s"):
        httpread.Policy(deadline_s=bad)


class _Interrupt(BaseException):
    """Stands for what a signal handler raises (``launch.guard.Signalled``: a BaseException)."""


def test_an_interrupt_raised_inside_a_task_group_comes_out_as_itself(monkeypatch):
    """httpcore connects through an anyio task group, and anyio wraps what a task raises in a
    BaseExceptionGroup: a SIGTERM whose handler raised there reached `up` as a group (a
    traceback, exit 1, in a CI run) instead of as the signal (exit 143). ``request`` unwraps it."""
    import anyio

    async def interrupted(client, method, url, **_kw):
        async def task():
            raise _Interrupt()

        async with anyio.create_task_group() as tg:
            tg.start_soon(task)
            await anyio.sleep(5)

    monkeypatch.setattr(httpread, "aread", interrupted)
    t0 = time.monotonic()
    with pytest.raises(_Interrupt):
        httpread.request("GET", "http://127.0.0.1:9/health", policy=DEADLINE)
    assert time.monotonic() - t0 < 2


def test_an_ordinary_error_group_is_left_alone(monkeypatch):
    async def failed(client, method, url, **_kw):
        raise ExceptionGroup("two", [ValueError("a"), KeyError("b")])

    monkeypatch.setattr(httpread, "aread", failed)
    with pytest.raises(ExceptionGroup):
        httpread.request("GET", "http://127.0.0.1:9/health", policy=DEADLINE)
