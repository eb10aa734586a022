"""The killed-process rows on the real dockerd: a container that allocates past its
``--memory 256m`` limit is killed by the kernel's OOM killer (Docker's ``State.OOMKilled``,
set from the container cgroup's ``memory.events`` ``oom_kill`` count), one killed with
``docker kill`` (SIGKILL, count unchanged), one stopped (SIGTERM). Each container's own log and
state go through ``manage.diagnose_container``, the code behind ``logs --diagnose``."""

from __future__ import annotations

import time

import pytest

from escha_deploy.launch.manage import diagnose_container

pytestmark = pytest.mark.docker

PRINT_THEN = (
    "import sys, time\n"
    "print('[2026-11-30 09:00:00] The server is fired up and ready to roll!', flush=True)\n"
    "print('[2026-11-30 09:00:01 TP0] Prefill batch, #new-seq: 1, #new-token: 8192', flush=True)\n"
)
ALLOCATE = PRINT_THEN + (
    "chunks = []\n"
    "while True:\n"
    "    b = bytearray(32 * 2**20)\n"
    "    b[::4096] = b'x' * len(b[::4096])  # touch every page so it is charged to the cgroup\n"
    "    chunks.append(b)\n"
)
SLEEP = PRINT_THEN + "time.sleep(120)\n"


def _run(client, image, name, code, **kw):
    try:
        client.containers.get(name).remove(force=True)
    except Exception:
        pass
    return client.containers.run(image, ["python3", "-c", code], name=name, detach=True,
                                 labels={"io.escha.test": "diagnose"}, **kw)


def _wait_exit(c, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        c.reload()
        if c.status in ("exited", "dead"):
            return c.attrs["State"]
        time.sleep(0.3)
    raise AssertionError(f"{c.name} did not exit within {timeout} s")


def _wait_log(c, text, timeout=30):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if text in c.logs().decode():
            return
        time.sleep(0.2)
    raise AssertionError(f"{c.name} never printed {text!r}")


def test_b40_oom_killer_in_a_256m_container(docker_client, base_image, no_leaks):
    c = _run(docker_client, base_image, "escha-test-diag-oom", ALLOCATE, mem_limit="256m", memswap_limit="256m")
    try:
        st = _wait_exit(c)
        assert (st["ExitCode"], st["OOMKilled"]) == (137, True)
        d = diagnose_container(None, container=c)
        assert [m.id for m in d.matches] == ["oom-killer"] and d.conclusive
        text = "\n".join(d.lines())
        assert "OOM killer" in text and "signal 9" in text and "oom_kill count rose" in text
        assert "Prefill batch" in text  # the log itself is part of the diagnosis
    finally:
        c.remove(force=True)


def test_docker_kill_is_sigkill_but_not_proven_oom(docker_client, base_image, no_leaks):
    c = _run(docker_client, base_image, "escha-test-diag-kill", SLEEP)
    try:
        _wait_log(c, "Prefill batch")
        c.kill(signal="SIGKILL")
        st = _wait_exit(c)
        assert (st["ExitCode"], st["OOMKilled"]) == (137, False)
        d = diagnose_container(None, container=c)
        assert [m.id for m in d.matches] == ["killed-sigkill"] and not d.conclusive
        assert "out of memory likely but unproven" in d.matches[0].explanation
    finally:
        c.remove(force=True)


def test_container_stopped_by_sigterm(docker_client, base_image, no_leaks):
    c = _run(docker_client, base_image, "escha-test-diag-term", SLEEP, init=True)  # PID 1 ignores SIGTERM
    try:
        _wait_log(c, "Prefill batch")
        c.kill(signal="SIGTERM")
        st = _wait_exit(c)
        assert st["ExitCode"] == 143
        d = diagnose_container(None, container=c)
        assert [m.id for m in d.matches] == ["killed-by-signal"] and d.conclusive
    finally:
        c.remove(force=True)
