"""``status``'s container half against the real Docker daemon: a small container of our own
(per-run name, the local base image, ``sleep``), its memory from the stats API and its events,
each read once across two looks."""

from __future__ import annotations

import contextlib
import os
import time
import uuid

import pytest

from escha_deploy.watch.collect import container_events, container_reading, read_host

pytestmark = pytest.mark.docker

IMAGE = os.environ.get("ESCHA_TEST_BASE_IMAGE", "escha-sglang-base:ci")


@contextlib.contextmanager
def ours():
    """A shared development daemon: another run's leak check (tests/launch ``no_leaks``) may
    remove a container that appeared during its test; that is no finding about ``status``."""
    from docker.errors import NotFound

    try:
        yield
    except NotFound:
        pytest.skip("the container was removed from outside this test")


@pytest.fixture
def sleeper():
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.images.get(IMAGE)
    except Exception as exc:  # noqa: BLE001 - any reason the daemon or image is not here
        pytest.skip(f"no Docker daemon or no {IMAGE}: {exc}")
    c = client.containers.run(IMAGE, ["60"], entrypoint="sleep", detach=True, remove=True,
                              name=f"escha-watch-test-{uuid.uuid4().hex[:8]}", labels={"io.escha.test": "watch"})
    yield client, c
    try:
        c.remove(force=True)
    except docker.errors.NotFound:
        pass  # removed when it died (remove=True)


def test_stats_and_events_of_a_container(sleeper):
    with ours():
        _stats_and_events(*sleeper)


def _stats_and_events(client, c):
    t0 = time.time() - 60
    first = time.time()
    r = container_reading(c, container_events(client, c.id, t0, first))
    for _ in range(25):  # a container just started may have no memory figures in its first stats
        if r.usage_bytes is not None:
            break
        time.sleep(0.2)
        r = container_reading(c, r.events)
    assert r.name == c.name and r.usage_bytes > 0 and r.limit_bytes > 0 and not r.oom_killed
    assert r.events[:2] == ["create", "start"]
    c.kill()  # SIGKILL (PID 1 ignores the rest): a kill and a die event
    later: list[str] = []
    deadline = time.time() + 10
    while time.time() < deadline and "die" not in later:
        time.sleep(0.2)
        now = time.time()
        later += container_events(client, c.id, first, now)
        first = now  # the next look reads after this one
    assert "kill" in later and "die" in later and "create" not in later  # each event read once


def test_host_reading_of_a_containers_process(sleeper):
    _, c = sleeper
    with ours():
        c.reload()
    h = read_host([c.attrs["State"]["Pid"]], cgroup=False)
    assert h.server_pids == [c.attrs["State"]["Pid"]] and h.server_rss_bytes > 0
