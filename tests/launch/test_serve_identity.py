"""A native ``serve``'s state file names its process by pid AND start time: `down` never signals
a pid that Linux gave out again, `status` shows such a file as stale, and a file of the older
format (no start time) is not signalled on its word.

The "stranger" is a real process (``sleep``) whose pid the state file names; the state files
are written as raw JSON, in the shapes the previous and the current version write."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from inproc import run_main

from escha_deploy.launch.serve_state import ServeState, find_states, write_state

NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


@pytest.fixture
def run(tmp_path, monkeypatch):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(d))
    return d


@pytest.fixture
def stranger():
    """A process that is not a ``serve``: what a freed pid may belong to later."""
    p = subprocess.Popen(["sleep", "30"])
    yield p
    p.kill()
    p.wait()


def _state_file(run, pid: int, port: int, profile: str, **extra) -> os.PathLike:
    """A state file folder ``run`` holds for ``port`` (the keys ``serve`` writes, raw)."""
    base = run / f"escha-deploy-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    path = base / f"serve-{port}.json"
    path.write_text(json.dumps({"schema_version": 1, "pid": pid, "host": "127.0.0.1", "port": port,
                                "profile": profile, "plan_digest": "", "api_key_file": None,
                                "started_at": time.time(), **extra}))
    path.chmod(0o600)
    return path


def _alive(p: subprocess.Popen) -> bool:
    return p.poll() is None


def process_start(pid: int) -> int | None:
    """The start time of ``pid``, clock ticks after boot (proc(5) /proc/PID/stat field 22), read
    here on its own so that the tests below run against a version that lacks it."""
    try:
        return int(open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def test_process_start_reads_field_22_and_write_state_records_it(run):
    from escha_deploy.launch.serve_state import SAME, identity, process_start
    mine = process_start(os.getpid())
    assert isinstance(mine, int) and mine > 0
    assert process_start(2**22 + 12345) is None
    st = ServeState(pid=os.getpid(), port=7, profile="ident-own", started_at=time.time())
    path = write_state(st)
    assert json.loads(path.read_text())["pid_start"] == mine
    (found,), _ = find_states("ident-own")
    assert identity(found) == SAME


def test_down_never_signals_a_reused_pid(run, stranger):
    start = process_start(stranger.pid)
    assert start is not None
    path = _state_file(run, stranger.pid, 41001, "ident-reused", pid_start=start + 1, schema_version=2)
    r = run_main("down", "--profile", "ident-reused", "--timeout", "1", env=NO_DOCKER)
    time.sleep(0.2)
    assert _alive(stranger), "down signalled a process that is not the serve that wrote the state file"
    # nothing of the profile runs: 0, or 3 for the Docker daemon this test has none of
    assert r.code in (0, 3) and "stopped" not in r.err and "Traceback" not in r.err, r.err
    assert not path.exists()  # stale: removed


def test_status_shows_a_reused_pid_as_stale(run, stranger):
    start = process_start(stranger.pid)
    path = _state_file(run, stranger.pid, 41002, "ident-stale", pid_start=start + 7, schema_version=2)
    r = run_main("status", "--profile", "ident-stale", env=NO_DOCKER)
    assert r.code == 3, r.out + r.err  # nothing running: the file was a stranger's pid
    assert "stale" in r.err and str(stranger.pid) in r.err
    assert not path.exists()
    from escha_deploy.launch.serve_state import OTHER, identity

    assert identity(ServeState(pid=stranger.pid, pid_start=start + 7, port=1, profile="x", started_at=0)) == OTHER


def test_down_does_not_signal_a_state_file_without_start_time(run, stranger):
    path = _state_file(run, stranger.pid, 41003, "ident-old")  # the previous version's file: no pid_start
    r = run_main("down", "--profile", "ident-old", "--timeout", "1", env=NO_DOCKER)
    time.sleep(0.2)
    assert _alive(stranger), "down signalled a pid it could not verify"
    assert r.code == 3, r.out + r.err
    lines = [ln for ln in r.err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "cannot verify" in lines[0] and f"kill -TERM {stranger.pid}" in lines[0]
    assert str(path) in lines[0]
    assert "Traceback" not in r.err
    assert path.exists()  # kept: the user decides


def test_status_lists_an_unverified_file_with_a_note(run, stranger):
    _state_file(run, stranger.pid, 41004, "ident-old-status")
    states, notes = find_states("ident-old-status")
    assert [s.pid for s in states] == [stranger.pid]
    assert any("cannot verify" in n for n in notes)
