"""A native `serve` killed with SIGKILL, before and after its server is ready, and two `serve`
at once: afterwards no process of the server and no secrets file is left (listed by the test).

The child is a STAND-IN for `python -m sglang.launch_server` (SGLang cannot start here: no
torch, no GPU): it reads its ``--config`` file as SGLang's ConfigArgumentMerger does, then
spawns two grandchildren as SGLang's scheduler processes are spawned, one of them ignoring
SIGTERM (a scheduler stuck in a CUDA call), and sets no parent-death signal itself, so only
`serve`'s own care can end them. With ``STANDIN_STUBBORN=1`` the server itself ignores SIGTERM
and a third grandchild, also ignoring it, leaves the process group with ``setsid``. It logs SGLang's ready line once ``STANDIN_READY_AFTER``
seconds have passed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .conftest import STANDIN_PROFILE

KEY = "sk-escha-fault-0123456789"

STANDIN = textwrap.dedent('''\
    #!/usr/bin/env python3
    # STAND-IN for `python -m sglang.launch_server` (see the test module's docstring).
    import os, subprocess, sys, time, yaml
    argv = sys.argv[1:]
    cfg = argv[argv.index("--config") + 1]
    yaml.safe_load(open(cfg))  # what SGLang does first, while parsing its arguments
    print("config-file=" + cfg, flush=True)
    # the modes as this process found them: `serve` unlinks the file once the server is ready,
    # which can be before the test reads the line above on a loaded machine
    print("config-modes=%o,%o" % (os.stat(cfg).st_mode & 0o777, os.stat(os.path.dirname(cfg)).st_mode & 0o777),
          flush=True)
    kids = [subprocess.Popen([sys.executable, "-c", code, "scheduler-standin", MARK]) for code in (
        "import time; time.sleep(3600)",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)")]
    if os.environ.get("STANDIN_STUBBORN") == "1":  # ignores SIGTERM; one grandchild left the group
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        kids.append(subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal("
                                      "signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)", "setsid-standin", MARK],
                                     start_new_session=True))
    print("grandchildren=" + ",".join(str(k.pid) for k in kids), flush=True)
    time.sleep(float(os.environ.get("STANDIN_READY_AFTER", "0")))
    print("[2026-11-30 10:00:00] The server is fired up and ready to roll!", flush=True)
    while True:
        time.sleep(0.1)
''')


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The stand-in script and key file, and a runtime folder of this test's own: the port
    locks and the secrets directories of `serve` go to ``$XDG_RUNTIME_DIR`` (on tmpfs, as
    there), so another run's `serve` on this host, which sweeps dead serves' secrets under its
    own runtime folder, never sees this test's."""
    import shutil
    import tempfile

    run_dir = Path(tempfile.mkdtemp(prefix="escha-test-run-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    run_dir.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run_dir))
    yield from _standin(tmp_path)
    shutil.rmtree(run_dir, ignore_errors=True)


def _standin(tmp_path):
    p = tmp_path / "standin_sglang.py"
    p.write_text(STANDIN.replace("MARK]", f"{str(tmp_path)!r}]"))
    p.chmod(0o755)
    key = tmp_path / "api_key"
    key.write_text(KEY + "\n")
    yield p, key


def free_port() -> int:
    """A port nothing listens on now (bound by the kernel's choice, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(cond, timeout: float = 10.0, step: float = 0.05) -> bool:
    """Wait for ``cond()`` to hold (a condition, not a sleep); its last value."""
    deadline = time.monotonic() + timeout
    while not (ok := cond()) and time.monotonic() < deadline:
        time.sleep(step)
    return bool(ok)


def ours(marker: str) -> list[str]:
    """Live processes whose command line names ``marker`` (this test's tmp dir): the stand-in
    server and its grandchildren (`serve` itself, whose arguments name it too, aside)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z" and "escha_deploy.cli.main" not in cmd:
            out.append(f"{pid}: {cmd.strip()[:400]}")
    return out


def secret_dirs(pid: int) -> list[Path]:
    """Secrets directories a `serve` with this pid made (native: on tmpfs)."""
    from escha_deploy.launch.native import SECRET_DIR_PREFIX, tmpfs_root

    root = tmpfs_root()
    return sorted(root.glob(f"{SECRET_DIR_PREFIX}{pid}-*")) if root else []


def start_serve(standin, port: int | None = None, ready_after: float = 0, stubborn: bool = False) -> subprocess.Popen:
    """A native `serve` of the stand-in on ``port`` (default: a free one); ``.port`` is it."""
    script, key = standin
    port = port or free_port()
    env = dict(os.environ, ESCHA_SGLANG_PYTHON=str(script), ESCHA_SKIP_GPU_PREFLIGHT="1",
               STANDIN_READY_AFTER=str(ready_after), STANDIN_STUBBORN="1" if stubborn else "0")
    env.pop("ESCHA_SERVE_MODE", None)
    cmd = [sys.executable, "-m", "escha_deploy.cli.main", "serve", "--profile", str(STANDIN_PROFILE),
           "--set", "runtime.needs=[]", "--set", "hicache.enabled=false", "--set", f"container.port={port}",
           "--set", f"container.api_key_file={key}", "--set", "container.stop_timeout_s=2"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    p.port = port
    return p


def read_until(p: subprocess.Popen, prefix: str, timeout: float = 60) -> str:
    deadline = time.time() + timeout
    assert p.stdout is not None
    for line in p.stdout:
        if prefix in line:
            return line.strip()
        assert time.time() < deadline, f"no {prefix!r} line"
    raise AssertionError(f"serve ended before {prefix!r}")


def gone_within(marker: str, seconds: float) -> list[str]:
    deadline = time.time() + seconds
    while (left := ours(marker)) and time.time() < deadline:
        time.sleep(0.2)
    return left


def test_sigkill_after_ready_leaves_no_process_and_no_secrets_file(standin, tmp_path):
    p = start_serve(standin)
    try:
        cfg = Path(read_until(p, "config-file=").split("=", 1)[1])
        assert read_until(p, "config-modes=").split("=", 1)[1].strip() == "600,700"
        read_until(p, "ready to roll")
        deadline = time.time() + 5
        while cfg.exists() and time.time() < deadline:
            time.sleep(0.05)
        assert not cfg.exists()  # read at startup; unlinked once the server is ready
        # the stand-in server and its two grandchildren, once both have started
        assert until(lambda: len(ours(str(tmp_path))) == 3), ours(str(tmp_path))
        p.kill()  # SIGKILL: no handler of `serve` runs
        p.wait()
        left = gone_within(str(tmp_path), 2 + 10)  # the stop timeout, then SIGKILL
        assert left == [], left
        assert secret_dirs(p.pid) == []
    finally:
        p.kill()
        for ln in ours(str(tmp_path)):
            os.kill(int(ln.split(":")[0]), signal.SIGKILL)


def test_sigkill_before_ready_leaves_no_process_and_its_secrets_go(standin, tmp_path):
    from escha_deploy.launch.native import tmpfs_root

    p = start_serve(standin, ready_after=60)
    try:
        cfg = Path(read_until(p, "config-file=").split("=", 1)[1])
        assert cfg.parent.parent == tmpfs_root()  # tmpfs: never on a disk
        assert cfg.stat().st_mode & 0o777 == 0o600
        read_until(p, "grandchildren=")
        p.kill()
        p.wait()
        left = gone_within(str(tmp_path), 2 + 10)
        assert left == [], left
        deadline = time.time() + 5
        while secret_dirs(p.pid) and time.time() < deadline:
            time.sleep(0.05)
        assert secret_dirs(p.pid) == []  # the watchdog removed it
    finally:
        p.kill()
        for ln in ours(str(tmp_path)):
            os.kill(int(ln.split(":")[0]), signal.SIGKILL)


def test_next_serve_removes_what_a_killed_serve_and_watchdog_left(standin, tmp_path):
    """Both `serve` and its watchdog killed at once (SIGKILL to both) before ready: the secrets
    file stays (0600, tmpfs) until the next `serve` on this host starts, which removes it."""
    p = start_serve(standin, ready_after=60)
    try:
        cfg = Path(read_until(p, "config-file=").split("=", 1)[1])
        read_until(p, "grandchildren=")
        dogs = [ln for ln in ours("watchdog.py") if f" {cfg.parent}" in ln]
        assert len(dogs) == 1, ours("watchdog.py")
        os.kill(int(dogs[0].split(":")[0]), signal.SIGKILL)
        p.kill()
        p.wait()
        time.sleep(0.5)
        assert cfg.exists() and cfg.stat().st_mode & 0o777 == 0o600
        # this double fault orphans the grandchildren (nothing of ours is left to end them)
        for ln in ours(str(tmp_path)):
            os.kill(int(ln.split(":")[0]), signal.SIGKILL)
        q = start_serve(standin)
        try:
            read_until(q, "ready to roll")
            assert not cfg.parent.exists()
        finally:
            q.send_signal(signal.SIGTERM)
            q.wait(timeout=30)
        assert gone_within(str(tmp_path), 2 + 10) == []
        assert secret_dirs(q.pid) == []
    finally:
        p.kill()
        for ln in ours(str(tmp_path)):
            os.kill(int(ln.split(":")[0]), signal.SIGKILL)


def test_second_serve_on_the_same_port_is_refused(standin, tmp_path):
    p = start_serve(standin)
    try:
        read_until(p, "ready to roll")
        q = start_serve(standin, port=p.port)
        out = q.communicate(timeout=60)[0]
        assert q.returncode == 3, out
        assert f"another `serve` (pid {p.pid}) is running the server on port {p.port}" in out
        assert until(lambda: len(ours(str(tmp_path))) == 3), ours(str(tmp_path))  # the first server untouched
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        assert gone_within(str(tmp_path), 2 + 10) == []
        # the lock went with it: a new `serve` on that port starts
        r = start_serve(standin, port=p.port)
        read_until(r, "ready to roll")
        r.send_signal(signal.SIGTERM)
        r.wait(timeout=30)
    finally:
        p.kill()
        for ln in ours(str(tmp_path)):
            os.kill(int(ln.split(":")[0]), signal.SIGKILL)


def test_server_killed_by_a_signal_is_named(standin, tmp_path):
    p = start_serve(standin)
    try:
        read_until(p, "ready to roll")
        server = [ln for ln in ours(str(tmp_path)) if "standin_sglang.py" in ln]
        os.kill(int(server[0].split(":")[0]), signal.SIGKILL)  # as the OOM killer would
        out = p.communicate(timeout=60)[0]
        assert p.returncode == 4, out
        assert "serve: SGLang was killed by signal 9 (SIGKILL); exiting 4" in out
        assert gone_within(str(tmp_path), 2 + 10) == []  # its grandchildren ended too
    finally:
        p.kill()
        for ln in ours(str(tmp_path)):
            os.kill(int(ln.split(":")[0]), signal.SIGKILL)


def sessions(lines: list[str]) -> set[int]:
    return {os.getsid(int(ln.split(":")[0])) for ln in lines}


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_stubborn_server_and_a_setsid_grandchild_leave_nothing(standin, tmp_path, how):
    """The server ignores SIGTERM, and one grandchild (ignoring it too) left the process group
    with setsid: a forwarded SIGTERM or SIGINT escalates to SIGKILL after the stop timeout
    (2 s here), and SIGKILL of `serve` leaves the whole tree to the watchdog (a subreaper)."""
    p = start_serve(standin, stubborn=True)
    try:
        read_until(p, "ready to roll")
        assert until(lambda: len(ours(str(tmp_path))) == 4), ours(str(tmp_path))
        before = ours(str(tmp_path))
        assert len(before) == 4 and len(sessions(before)) == 2, before  # one left the session
        if how == "SIGKILL":
            p.kill()
            p.wait()
            out = ""
        else:
            p.send_signal(getattr(signal, how))
            out = p.communicate(timeout=30)[0]
            assert p.returncode == 128 + 9, out  # the server's own end: SIGKILL
            assert "serve: SGLang did not exit within 2 s of " + how in out, out
        left = gone_within(str(tmp_path), 2 + 10)
        assert left == [], left
        assert secret_dirs(p.pid) == []
    finally:
        p.kill()
        for ln in ours(str(tmp_path)):
            os.kill(int(ln.split(":")[0]), signal.SIGKILL)


def test_second_signal_escalates_at_once(standin, tmp_path):
    p = start_serve(standin, stubborn=True)
    try:
        read_until(p, "ready to roll")
        p.send_signal(signal.SIGINT)
        read_until(p, "SIGINT forwarded to SGLang")
        p.send_signal(signal.SIGINT)
        out = p.communicate(timeout=30)[0]
        assert p.returncode == 128 + 9, out
        assert "serve: SIGINT again: SIGKILL to all of SGLang's processes" in out
        assert "did not exit within" not in out  # not the stop timeout's escalation
        assert gone_within(str(tmp_path), 2 + 10) == []
    finally:
        p.kill()
        for ln in ours(str(tmp_path)):
            os.kill(int(ln.split(":")[0]), signal.SIGKILL)


def test_sigkill_of_the_watchdog_leaves_no_process(standin, tmp_path):
    """The watchdog killed (SIGKILL) while `serve` runs a stubborn server (it ignores SIGTERM)
    whose grandchild left its session with setsid: `serve` is a subreaper too, so the tree
    comes to it; it ends all of it (SIGTERM, the 2 s stop timeout, SIGKILL) and exits 4."""
    p = start_serve(standin, stubborn=True)
    try:
        read_until(p, "ready to roll")
        assert until(lambda: len(ours(str(tmp_path))) == 4), ours(str(tmp_path))
        dogs = [ln for ln in ours("watchdog.py") if f"escha-serve-{p.pid}-" in ln]
        assert len(dogs) == 1, ours("watchdog.py")
        t0 = time.monotonic()
        os.kill(int(dogs[0].split(":")[0]), signal.SIGKILL)
        out = p.communicate(timeout=30)[0]
        took = time.monotonic() - t0
        assert p.returncode == 4, out
        assert "watchdog ended before the server did" in out
        assert took < 2 + 2, took  # the stop timeout this test set (2 s), plus 2 s
        left = gone_within(str(tmp_path), 2)  # serve ended it all before it exited
        assert left == [], left
    finally:
        p.kill()
        for ln in ours(str(tmp_path)):
            os.kill(int(ln.split(":")[0]), signal.SIGKILL)
