"""Faults around `up` on the real Docker daemon with the STAND-IN server image and profile
(tests/launch/standin/): a signal while `up` waits, two `up` at once, `down` during `up`, the
server killed by a signal, the daemon's socket going away, the API key refused.

Each test lists what is left afterwards (``leftovers``: running containers and live CLI
processes of ours) and asserts it is empty, and that the L3 directory's files are untouched
(same names, sizes, modification times and SHA-256). The L3 tier is SGLang's real file backend
(``hicache.l3: {kind: file, ...}``, ``--hicache-storage-backend file``), so the directory is
mounted into the container (checked) and the fault could reach it.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .conftest import STANDIN_PROFILE, run_cli, STANDIN_CONTAINER, STANDIN_LABEL, STANDIN_NAME

pytestmark = pytest.mark.docker
P = str(STANDIN_PROFILE)
NAME = STANDIN_CONTAINER
LABEL = STANDIN_LABEL


def start_up(image: str, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """`escha-deploy up` in a fresh process, as a user starts it (we signal it)."""
    cmd = [sys.executable, "-m", "escha_deploy.cli.main", "up", "--profile", P, "--set",
           f"container.image={image}", *extra]
    return subprocess.Popen(cmd, env=dict(env or os.environ, ESCHA_TEST_CLAMP_MEMLOCK="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_container(client, status: str = "running", timeout: float = 60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True)
        if found and found[0].status == status:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no {status} container for the stand-in profile within {timeout} s")


def leftovers(client, procs=()) -> list[str]:
    """What a fault left running: containers of the stand-in profile that run, and our CLI
    processes still alive. Empty when clean."""
    out = [f"container {c.name} ({c.status})" for c in client.containers.list(filters={"label": LABEL}, ignore_removed=True)]
    out += [f"process {p.pid} ({' '.join(p.args[2:5])})" for p in procs if p.poll() is None]
    return out


def l3_dir(tmp_path: Path) -> Path:
    d = tmp_path / "l3"
    (d / "pages").mkdir(parents=True)
    (d / "pages" / "page-000.bin").write_bytes(os.urandom(4096))
    (d / "index.json").write_text('{"pages": 1}')
    return d


def l3_sets(d: Path) -> tuple[str, str]:
    """The file L3 backend on ``d``: `up` checks the folder, mounts it and passes SGLang
    ``--hicache-storage-backend file`` with the folder as its storage directory."""
    return ("--set", f"hicache.l3={{kind: file, dir: {d}, max_size: 1GB}}")


def assert_l3_mounted(container, d: Path) -> None:
    """The container sees the L3 folder (a read-write bind mount of ``d``) and the server is
    told to use it: the launch spec it runs (mounted at /etc/escha/launch-spec.json) passes
    SGLang the file backend, and the folder as the container sees it in
    SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR (read by sglang/srt/mem_cache/hicache_storage.py:375)."""
    import json

    container.reload()
    mounts = {m["Source"]: m for m in container.attrs["Mounts"]}
    assert str(d) in mounts and mounts[str(d)]["RW"], container.attrs["Mounts"]
    spec = next(m["Source"] for m in container.attrs["Mounts"] if m["Destination"] == "/etc/escha/launch-spec.json")
    launch = json.loads(Path(spec).read_text())
    argv = launch["argv"]
    assert argv[argv.index("--hicache-storage-backend") + 1] == "file", argv
    assert launch["env"]["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] == mounts[str(d)]["Destination"], launch["env"]


def l3_state(d: Path) -> dict[str, tuple]:
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns,
                                    hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(d.rglob("*")) if p.is_file()}


def cleanup(client) -> None:
    assert run_cli("down", "--profile", P).returncode == 0
    assert not client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True)


@pytest.mark.parametrize("sig,code,mode", [(signal.SIGINT, 130, "follow"), (signal.SIGTERM, 143, "detach")])
def test_signal_while_waiting_stops_and_keeps_the_container(docker_client, standin_image, tmp_path, no_leaks,
                                                            sig, code, mode):
    image = standin_image("escha-standin:slow60", startup_s=60)
    l3 = l3_dir(tmp_path)
    before = l3_state(l3)
    proc = start_up(image, *l3_sets(l3), *(["--detach"] if mode == "detach" else []))
    try:
        c = wait_container(docker_client)
        assert_l3_mounted(c, l3)
        # in the ready wait, once the server has logged (a loaded machine can take seconds to
        # start its Python): what `logs` must show afterwards is there before the signal
        deadline = time.time() + 60
        while b"Load weight begin" not in c.logs() and time.time() < deadline:
            time.sleep(0.2)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == code, err
        assert "Traceback" not in err
        assert f"interrupted by {sig.name} while waiting for ready" in err
        assert "is stopped (not running) and kept for its log" in err
        assert leftovers(docker_client, [proc]) == []
        kept = docker_client.containers.get(NAME)
        assert kept.status == "exited"  # kept for `logs`, as the crash path keeps it
        assert "Load weight begin" in run_cli("logs", "--profile", P).stdout
    finally:
        proc.kill()
        cleanup(docker_client)
    assert l3_state(l3) == before


def test_two_up_at_once_one_starts_one_refuses(docker_client, standin_image, tmp_path, no_leaks):
    image = standin_image("escha-standin:slow", startup_s=4)
    l3 = l3_dir(tmp_path)
    before = l3_state(l3)
    extra = (*l3_sets(l3), "--detach")
    procs = [start_up(image, *extra), start_up(image, *extra)]
    try:
        results = [(p.wait(timeout=90), p.communicate()[1]) for p in procs]
        codes = sorted(r[0] for r in results)
        assert codes == [0, 3], results
        loser = next(err for rc, err in results if rc == 3)
        assert "another `up` is starting" in loser or "another `up` (pid" in loser, loser
        assert all("Traceback" not in err for _, err in results)
        running = docker_client.containers.list(filters={"label": LABEL}, ignore_removed=True)
        assert len(running) == 1 and running[0].attrs["HostConfig"]["RestartPolicy"]["Name"] == "on-failure"
        assert_l3_mounted(running[0], l3)
        assert [x for x in leftovers(docker_client, procs) if x.startswith("process")] == []
    finally:
        for p in procs:
            p.kill()
        cleanup(docker_client)
    assert leftovers(docker_client, procs) == []
    assert l3_state(l3) == before


def test_second_up_while_first_waits_names_it_and_leaves_it_alone(docker_client, standin_image, no_leaks):
    # 20 s to ready: the second `up` (plan, checks, the lock) must run while the first still
    # waits, also on a loaded machine (with 4 s the first was ready and the second found it running)
    image = standin_image("escha-standin:slow20", startup_s=20)
    first = start_up(image, "--detach")
    try:
        c = wait_container(docker_client)
        second = run_cli("up", "--profile", P, "--set", f"container.image={image}", "--detach")
        assert second.returncode == 3, second.stderr
        assert f"another `up` (pid {first.pid}) is starting profile {STANDIN_NAME}" in second.stderr
        _, err = first.communicate(timeout=120)
        assert first.returncode == 0, err
        assert docker_client.containers.get(NAME).id == c.id  # not replaced as stale
    finally:
        first.kill()
        cleanup(docker_client)


def test_down_during_up_wins(docker_client, standin_image, tmp_path, no_leaks):
    image = standin_image("escha-standin:slow60", startup_s=60)
    l3 = l3_dir(tmp_path)
    before = l3_state(l3)
    proc = start_up(image, *l3_sets(l3), "--detach")
    try:
        assert_l3_mounted(wait_container(docker_client), l3)
        time.sleep(0.5)
        d = run_cli("down", "--profile", P)
        assert d.returncode == 0, d.stderr
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 4, err
        assert "Traceback" not in err and "NotFound" not in err
        assert "`escha-deploy down` wins over `up`" in err or "`down` wins over `up`" in err, err
        assert leftovers(docker_client, [proc]) == []
        assert not docker_client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True)
    finally:
        proc.kill()
        cleanup(docker_client)
    assert l3_state(l3) == before


def test_server_killed_by_signal_is_named(docker_client, standin_image, no_leaks):
    image = standin_image("escha-standin:slow60", startup_s=60)
    proc = start_up(image, "--detach")
    try:
        c = wait_container(docker_client)
        time.sleep(0.5)
        # from inside, as the kernel's OOM killer would: no `docker kill`, no event of Docker's
        c.exec_run(["python3", "-c", "import os;[os.kill(int(p),9) for p in os.listdir('/proc') if p.isdigit()"
                    " and b'server.py' in open(f'/proc/{p}/cmdline','rb').read()]"])
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 4, err
        assert "killed by signal 9 (SIGKILL)" in err and "exit status 137" in err, err
        assert "exited with code 137" not in err.split("error:")[-1]
        assert leftovers(docker_client, [proc]) == []
    finally:
        proc.kill()
        cleanup(docker_client)


class SocketProxy:
    """STAND-IN for the Docker daemon's socket going away: forwards a unix socket to the real
    daemon's until ``close()``, which drops every connection and removes the socket file (what
    a client sees when dockerd stops; the shared test daemon itself must keep running)."""

    def __init__(self, path: Path, target: str = "/var/run/docker.sock") -> None:
        self.path, self.target = path, target
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(str(path))
        self.srv.listen(64)
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                a, _ = self.srv.accept()
            except OSError:
                return
            b = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            b.connect(self.target)
            self.conns += [a, b]
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self._pipe, args=(x, y), daemon=True).start()

    @staticmethod
    def _pipe(x: socket.socket, y: socket.socket) -> None:
        try:
            while data := x.recv(65536):
                y.sendall(data)
        except OSError:
            pass
        finally:
            for s in (x, y):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.srv.close()
        self.path.unlink(missing_ok=True)
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass


def test_daemon_gone_during_wait_is_not_an_exit_code(docker_client, standin_image, tmp_path, no_leaks):
    if not Path("/var/run/docker.sock").exists():
        pytest.skip("the test daemon is not on /var/run/docker.sock")
    image = standin_image("escha-standin:slow60", startup_s=60)
    proxy = SocketProxy(tmp_path / "docker.sock")
    # --timeout 6: the reconnect window ends with the ready wait (else guard.RECONNECT_S, 30 s)
    proc = start_up(image, "--detach", "--timeout", "6",
                    env=dict(os.environ, DOCKER_HOST=f"unix://{tmp_path / 'docker.sock'}"))
    try:
        wait_container(docker_client)
        time.sleep(0.5)
        proxy.close()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 4, err
        assert "Traceback" not in err
        assert "up: the Docker daemon stopped answering" in err, err
        assert "the Docker daemon went away while `up` waited and did not answer again" in err, err
        assert "exited with code 0" not in err and "exited" not in err.split("error:")[-1]
    finally:
        proc.kill()
        proxy.close()
        cleanup(docker_client)  # the daemon is back for us: nothing of this `up` stays running


def test_daemon_back_after_2_s_during_wait_is_reconnected(docker_client, standin_image, tmp_path, no_leaks):
    """The daemon's socket drops for 2 s during the ready wait and comes back (a new proxy on
    the same path): `up` asks again, follows the log again, and is ready (exit 0, restart policy switched)."""
    if not Path("/var/run/docker.sock").exists():
        pytest.skip("the test daemon is not on /var/run/docker.sock")
    image = standin_image("escha-standin:slow", startup_s=4)
    sock = tmp_path / "docker.sock"
    proxy = SocketProxy(sock)
    proc = start_up(image, "--detach", env=dict(os.environ, DOCKER_HOST=f"unix://{sock}"))
    try:
        wait_container(docker_client)
        time.sleep(0.5)
        proxy.close()
        time.sleep(2)
        proxy = SocketProxy(sock)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "up: the Docker daemon stopped answering" in err and "up: the Docker daemon answers again" in err
        assert "up: ready in" in err and "Traceback" not in err
        c = docker_client.containers.get(NAME)
        assert c.status == "running" and c.attrs["HostConfig"]["RestartPolicy"]["Name"] == "on-failure"
    finally:
        proc.kill()
        proxy.close()
        cleanup(docker_client)


def test_refused_api_key_says_so_without_waiting_for_the_timeout(docker_client, standin_image, tmp_path,
                                                                 no_leaks):
    image = standin_image("escha-standin:serverkey", mode="server_key", server_key="sk-the-servers-own-key")
    key = tmp_path / "key"
    key.write_text("sk-another-key-0123456789\n")
    t0 = time.monotonic()
    r = run_cli("up", "--profile", P, "--set", f"container.image={image}", "--set",
                f"container.api_key_file={key}", "--detach", "--timeout", "60")
    try:
        assert r.returncode == 4, r.stderr
        assert "refused the API key (HTTP 401 on /generate)" in r.stderr
        assert time.monotonic() - t0 < 30  # a 401 is final: no wait for the ready timeout
        assert "sk-another-key" not in r.stderr
        assert leftovers(docker_client) == []
    finally:
        cleanup(docker_client)


def test_sigterm_while_following_the_log_stops_and_removes(docker_client, standin_image, tmp_path, no_leaks):
    image = standin_image("escha-standin:ok")
    l3 = l3_dir(tmp_path)
    before = l3_state(l3)
    proc = start_up(image, *l3_sets(l3))  # no --detach: follows the log
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "up: ready in" in line:
                break
        assert_l3_mounted(docker_client.containers.get(NAME), l3)
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert f"up: {NAME} stopped and removed" in err
        assert leftovers(docker_client, [proc]) == []
        assert not docker_client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True)
    finally:
        proc.kill()
        cleanup(docker_client)
    assert l3_state(l3) == before
