"""SIGINT and SIGTERM aimed at the moment `up` (follow mode, no --detach) reports ready, on the
real Docker daemon with the STAND-IN server image (tests/launch/standin/, ready at once).

`up` prints ``up: ready in`` and only then starts following the log; a signal in between used
to find the default action (SIGTERM: `up` killed; SIGINT: exit 130, nothing said) and leave
the container running with restart policy on-failure. Each try here reads `up`'s stderr, sends
the signal when that line appears plus 0-200 ms (spread evenly over the tries), and lists the
profile's running containers afterwards: there must be none, in every try.

``ESCHA_TEST_SIGNAL_TRIES`` sets the tries per signal (default 20); the loop's time is printed.
Each run uses its own profile name, image tag and port (the daemon is shared).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from .conftest import STANDIN_PROFILE

pytestmark = pytest.mark.docker
TRIES = int(os.environ.get("ESCHA_TEST_SIGNAL_TRIES", "20"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_try(image: str, name: str, port: int, sig: signal.Signals, delay_s: float) -> tuple[int | None, str]:
    """One `up` in follow mode, signalled ``delay_s`` after it printed ``up: ready in``: its exit
    code (None when it never printed the line) and its whole stderr."""
    cmd = [sys.executable, "-m", "escha_deploy.cli.main", "up", "--profile", str(STANDIN_PROFILE),
           "--set", f"name={name}", "--set", f"container.port={port}", "--set", f"container.image={image}"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, ESCHA_TEST_CLAMP_MEMLOCK="1"), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if "up: ready in" in line:
                time.sleep(delay_s)
                proc.send_signal(sig)
                break
        else:
            proc.wait(timeout=180)  # a loaded machine (the suite's workers beside another copy)
            return None, "".join(seen)
        _, rest = proc.communicate(timeout=180)
        return proc.returncode, "".join(seen) + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def image_and_port(standin_image) -> tuple[str, int]:
    """One stand-in image (its port baked in) for both signals' tries: the tries of one signal
    end with nothing of theirs running, so the next signal's may take the port."""
    port = free_port()
    return standin_image(f"escha-standin:sig-{os.getpid()}-{port}", port=port), port


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_at_ready_in_follow_mode_leaves_nothing_running(docker_client, image_and_port, sig):
    # no `no_leaks`: over a minute, it would count (and remove) other suites' containers on the
    # shared daemon; this test removes and checks its own profile's containers by label
    image, port = image_and_port
    name = f"sig-{os.getpid()}-{sig.name.lower()}"
    label = f"io.escha.profile={name}"
    failures = []
    unready = 0  # tries whose `up` never reported ready (no signal sent): repeated, at most TRIES
    t0 = time.monotonic()
    try:
        i = 0
        while i < TRIES:
            delay = 0.2 * i / max(TRIES - 1, 1)
            code, err = one_try(image, name, port, sig, delay)
            running = [c.name for c in docker_client.containers.list(filters={"label": label}, ignore_removed=True)]
            if code is None and running == [] and unready < TRIES:
                unready += 1
                continue
            if not (code == 0 and running == [] and "Traceback" not in err
                    and f"up: escha-{name} stopped and removed" in err):
                failures.append(f"try {i} ({delay * 1000:.0f} ms after ready): exit {code}, running {running}, "
                                f"stderr tail: {err[-600:]!r}")
                for c in docker_client.containers.list(all=True, filters={"label": label}, ignore_removed=True):
                    c.remove(force=True)  # the next try starts clean
            i += 1
    finally:
        elapsed = time.monotonic() - t0
        print(f"\n{sig.name}: {TRIES} tries in {elapsed:.1f} s ({elapsed / max(TRIES, 1):.2f} s per try); "
              f"{TRIES - len(failures)} of {TRIES} left nothing running; {unready} repeated (not ready)")
        for c in docker_client.containers.list(all=True, filters={"label": label}, ignore_removed=True):
            c.remove(force=True)
    assert failures == [], "\n".join(failures)
