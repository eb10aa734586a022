"""Pure parts of `up`'s guard (escha_deploy/launch/guard.py): owner labels and end causes."""

from __future__ import annotations

import subprocess
import sys

from escha_deploy.facts.machine import host_id
from escha_deploy.launch import guard


def test_owner_label_names_this_live_process():
    label = guard.owner_label()
    assert guard.owner_alive(label) is True
    assert guard.owner_pid(label) == str(__import__("os").getpid())


def test_owner_of_a_finished_process_or_a_reused_pid_is_not_alive():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert guard.owner_alive(f"{host_id()}:{p.pid}:1.00") is False
    me = guard.owner_label().rsplit(":", 1)[0]
    assert guard.owner_alive(me + ":12.00") is False  # same pid, another start time: reused


def test_owner_on_another_host_is_unknown_and_a_missing_label_is_stale():
    assert guard.owner_alive("0000000000000000:1:1.00") is None
    assert guard.owner_alive(None) is False and guard.owner_alive("garbage") is False


def test_end_names_signals_oom_down_and_daemon():
    assert guard.signal_of(137) == 9 and guard.signal_of(-15) == 15 and guard.signal_of(1) is None
    assert guard.End(exit_code=137).what() == "was killed by signal 9 (SIGKILL), exit status 137"
    assert "from the kernel's OOM killer" in guard.End(exit_code=137, oom_killed=True).what()
    assert guard.End(exit_code=3).what() == "exited with code 3"
    assert "SIGTERM from `escha-deploy down`" in guard.End(exit_code=0, kill_signal=15).what()
    assert "removed by another command" in guard.End(gone=True).what()
    daemon = guard.End(daemon_gone=True).what()
    assert "Docker daemon went away" in daemon and "exited" not in daemon
    assert guard.signal_name(65) == "signal 65"


def test_interrupted_exits_128_plus_the_signal():
    assert guard.Interrupted(2, "x").exit_code == 130
    assert guard.Interrupted(15, "x").exit_code == 143
