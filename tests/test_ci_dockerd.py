""".ci/dockerd.sh with two runs side by side: the daemon is stopped only by the last run that
uses it, never while another run is registered, and a run that died is not counted. The docker
CLI is a STAND-IN (a script on PATH that answers `docker version`), the "daemon" a sleeping
process whose pid is in the script's pid file, and the state folder the test's own: nothing
touches this machine's Docker daemon."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "dockerd.sh"


def _run(tmp: Path, mode: str, caller: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}", "ESCHA_DOCKERD_STATE": str(tmp / "state"),
           "ESCHA_DOCKERD_CALLER": str(caller)}
    return subprocess.run(["bash", str(SCRIPT), mode], capture_output=True, text=True, env=env, timeout=60)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_daemon_stops_only_when_no_other_run_uses_it(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "state").mkdir()
    fake = tmp_path / "bin" / "docker"
    fake.write_text("#!/bin/sh\nexit 0\n")  # STAND-IN docker CLI: the daemon answers
    fake.chmod(0o755)
    daemon = subprocess.Popen(["sleep", "300"])
    import threading

    threading.Thread(target=daemon.wait, daemon=True).start()  # reap it at once, as init would
    run_a, run_b, dead = (subprocess.Popen(["sleep", "300"]) for _ in range(3))
    try:
        (tmp_path / "state" / "escha-dockerd.pid").write_text(f"{daemon.pid}\n")  # "started by this script"
        for run in (run_a, run_b, dead):
            assert _run(tmp_path, "start", run.pid).returncode == 0
        dead.kill()
        dead.wait()
        r = _run(tmp_path, "stop", run_a.pid)
        assert r.returncode == 0 and "still used by run(s)" in r.stderr and str(run_b.pid) in r.stderr
        assert str(dead.pid) not in r.stderr  # a run that died does not hold the daemon
        assert daemon.returncode is None  # run B still uses it
        assert _run(tmp_path, "stop", run_b.pid).returncode == 0
        deadline = time.monotonic() + 30
        while daemon.returncode is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert daemon.returncode is not None  # the last run stopped it
        assert not (tmp_path / "state" / "escha-dockerd.pid").exists()
    finally:
        for p in (daemon, run_a, run_b):
            p.kill()
            p.wait()


def test_a_daemon_this_script_did_not_start_is_never_stopped(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "state").mkdir()
    fake = tmp_path / "bin" / "docker"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    run = subprocess.Popen(["sleep", "300"])
    try:
        assert _run(tmp_path, "start", run.pid).returncode == 0
        assert _run(tmp_path, "stop", run.pid).returncode == 0
        assert not (tmp_path / "state" / "escha-dockerd.pid").exists()
    finally:
        run.kill()
        run.wait()


def test_the_daemon_it_starts_does_not_hold_the_lock(tmp_path):
    """The daemon inherited the script's lock descriptor: every later call (the tests' fixture,
    another run) then waited in flock forever. The STAND-IN dockerd here is a script that marks
    itself up and sleeps; the STAND-IN docker CLI answers once the mark exists."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "state").mkdir()
    mark = tmp_path / "up"
    (tmp_path / "bin" / "docker").write_text(f"#!/bin/sh\n[ -e {mark} ]\n")
    (tmp_path / "bin" / "dockerd").write_text(f"#!/bin/sh\ntouch {mark}\nexec sleep 300\n")
    for f in ("docker", "dockerd"):
        (tmp_path / "bin" / f).chmod(0o755)
    run_a, run_b = (subprocess.Popen(["sleep", "300"]) for _ in range(2))
    pid = None
    try:
        assert _run(tmp_path, "start", run_a.pid).returncode == 0
        pid = int((tmp_path / "state" / "escha-dockerd.pid").read_text())
        fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        assert not [f for f in fds if f.endswith("escha-dockerd.lock")], fds
        assert _run(tmp_path, "start", run_b.pid).returncode == 0  # does not wait for the daemon
    finally:
        if pid:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        for p in (run_a, run_b):
            p.kill()
            p.wait()
