"""`up`, `down`, `status`, `logs` on a real Docker daemon with the STAND-IN server image and
the STAND-IN test profile (tests/launch/standin/), which need no GPU."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from .conftest import STANDIN_PROFILE, planned_sizes_for, run_cli, STANDIN_PORT, STANDIN_CONTAINER, STANDIN_LABEL, STANDIN_NAME

pytestmark = pytest.mark.docker
P = str(STANDIN_PROFILE)
PORT = STANDIN_PORT


def up(*extra: str, image: str, timeout: float = 120, env=None):
    return run_cli("up", "--profile", P, "--set", f"container.image={image}", "--detach", *extra,
                   env=env, timeout=timeout)


def down():
    return run_cli("down", "--profile", P)


def port_free(port: int = PORT) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_up_refuses_without_gpu_runtime_and_creates_nothing(docker_client, no_leaks):
    """This machine's Docker has no NVIDIA runtime: a profile that wants GPUs exits 3 at preflight."""
    r = run_cli("up", "--profile", P, "--set", "container.gpus=all", "--detach")
    assert r.returncode == 3, r.stderr
    assert "no NVIDIA GPU runtime" in r.stderr
    assert not docker_client.containers.list(all=True, filters={"label": STANDIN_LABEL})


def test_up_ready_drift_logs_status_restart_down(docker_client, standin_image, tmp_path, no_leaks):
    image = standin_image("escha-standin:ok")
    l3 = tmp_path / "l3"
    l3.mkdir()
    (l3 / "keep.bin").write_bytes(b"x")
    r = up("--set", "hicache.l3.kind=file", "--set", f"hicache.l3.dir={l3}", image=image)
    try:
        assert r.returncode == 0, r.stderr
        assert "drift:" not in r.stderr  # the stand-in logs exactly the planned sizes
        assert "capturing CUDA graphs" in r.stderr  # progress fed by the log phases
        c = docker_client.containers.get(STANDIN_CONTAINER)
        hc = c.attrs["HostConfig"]
        assert hc["RestartPolicy"] == {"Name": "on-failure", "MaximumRetryCount": 3}
        assert hc["IpcMode"] == "host" and hc["Init"] is True
        assert "no-new-privileges" in hc["SecurityOpt"] and hc["CapDrop"] == ["ALL"]
        limits = {u["Name"]: u["Soft"] for u in hc["Ulimits"]}
        assert limits["stack"] == 67108864 and "memlock" in limits  # memlock clamped here (test switch)
        assert hc["PortBindings"][f"{PORT}/tcp"][0]["HostIp"] == "127.0.0.1"
        assert any(m["Source"] == str(l3) for m in c.attrs["Mounts"])
        env = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
        assert "127.0.0.1" in env["NO_PROXY"] and "0.0.0.0" in env["no_proxy"]
        s = run_cli("status", "--profile", P, "--format", "json")
        assert s.returncode == 0, s.stderr
        row = json.loads(s.stdout)[0]
        assert row["state"] == "running" and row["endpoint"] == f"http://127.0.0.1:{PORT}"
        # the live view's container half: Docker's stats, the plan up left beside the spec, and a
        # stand-in without /metrics named as such
        assert row["kind"] == "container" and row["container_memory"]["usage_bytes"] > 0
        assert row["container_memory"]["name"] == STANDIN_CONTAINER and not row["container_memory"]["oom_killed"]
        assert row["plan"]["profile"] == STANDIN_NAME and row["plan"]["host_kv_tokens"] > 0
        assert "HTTP 404" in row["metrics_error"] and row["host"]["server_rss_bytes"] > 0
        lg = run_cli("logs", "--profile", P)
        assert "The server is fired up and ready to roll!" in lg.stdout
        # restart after ready: kill the server inside; on-failure brings it back
        # the killer skips itself (its own command line names server.py too) and says what it killed
        # before it kills: when the server is the container's main process the container stops
        # and Docker kills the exec with it (exit 137), so only what it printed tells
        killed = c.exec_run(["python3", "-c", "import os;k=[p for p in os.listdir('/proc') if p.isdigit()"
                             " and int(p)!=os.getpid() and b'server.py' in open(f'/proc/{p}/cmdline','rb').read()];"
                             "print(k,flush=True);[os.kill(int(p),9) for p in k]"])
        assert killed.exit_code in (0, 137) and killed.output.strip() not in (b"", b"[]"), killed
        deadline = time.time() + 60  # a loaded CI machine: the supervisor's exit, then Docker's restart
        while time.time() < deadline:
            c.reload()
            if c.attrs["RestartCount"] >= 1 and c.status == "running":
                break
            time.sleep(0.2)
        assert c.attrs["RestartCount"] >= 1 and c.status == "running", (
            c.status, c.attrs["RestartCount"], c.attrs["State"], c.logs(tail=30).decode(errors="replace"))
    finally:
        d = down()
    assert d.returncode == 0, d.stderr
    assert port_free()
    assert (l3 / "keep.bin").exists()  # down never deletes the L3 directory
    assert run_cli("status", "--profile", P).returncode == 3
    assert run_cli("logs", "--profile", P).returncode == 3
    assert down().returncode == 0  # nothing running is still success


def test_drift_is_reported(docker_client, standin_image, no_leaks):
    sizes = planned_sizes_for()
    sizes["host_kv_bytes"] = int(sizes["host_kv_bytes"] * 1.05)
    image = standin_image("escha-standin:drift", sizes=sizes)
    r = up(image=image)
    try:
        assert r.returncode == 0, r.stderr
        assert "drift: host KV pool rank 0: planned" in r.stderr and "(+5.0%)" in r.stderr
        assert "drift: host mamba pool" not in r.stderr
    finally:
        assert down().returncode == 0


def test_crash_is_diagnosed_exit_4(docker_client, standin_image, no_leaks):
    image = standin_image("escha-standin:crash", mode="crash")
    r = up(image=image)
    try:
        assert r.returncode == 4, r.stderr
        assert "[host-memory-check]" in r.stderr
        assert "Requesting 2.58 GB" in r.stderr  # the log tail is printed
    finally:
        assert down().returncode == 0


def test_health_without_generate_times_out_exit_4(docker_client, standin_image, no_leaks):
    image = standin_image("escha-standin:nogen", mode="no_generate")
    r = up("--timeout", "3", image=image)
    try:
        assert r.returncode == 4, r.stderr
        assert "[health-without-generate]" in r.stderr
    finally:
        assert down().returncode == 0


def test_up_twice_is_a_noop(docker_client, standin_image, no_leaks):
    image = standin_image("escha-standin:ok")
    try:
        assert up(image=image).returncode == 0
        cid = docker_client.containers.get(STANDIN_CONTAINER).id
        r2 = up(image=image)
        assert r2.returncode == 0 and "already running" in r2.stderr
        assert docker_client.containers.get(STANDIN_CONTAINER).id == cid
    finally:
        assert down().returncode == 0


def test_port_conflict_names_owner_and_creates_nothing(docker_client, standin_image, no_leaks):
    image = standin_image("escha-standin:ok")
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", PORT))
        s.listen()
        r = up(image=image)
    assert r.returncode == 3, r.stderr
    assert f"127.0.0.1:{PORT} is held by process {os.getpid()}" in r.stderr
    assert not docker_client.containers.list(all=True, filters={"label": STANDIN_LABEL})


def test_daemon_down_exits_3(no_leaks):
    env = dict(os.environ, DOCKER_HOST="unix:///nonexistent/docker.sock")
    r = run_cli("up", "--profile", P, "--detach", env=env)
    assert r.returncode == 3 and "daemon not reachable" in r.stderr
    assert run_cli("status", "--profile", P, env=env).returncode == 3


def test_kill_9_during_startup_then_up_replaces_stale(docker_client, standin_image, no_leaks):
    image = standin_image("escha-standin:slow", startup_s=4)
    cmd = [sys.executable, "-m", "escha_deploy.cli.main", "up", "--profile", P, "--set",
           f"container.image={image}", "--detach"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, ESCHA_TEST_CLAMP_MEMLOCK="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        while time.time() < deadline and not docker_client.containers.list(
                filters={"label": STANDIN_LABEL}):
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        stale = docker_client.containers.get(STANDIN_CONTAINER)
        assert stale.attrs["HostConfig"]["RestartPolicy"]["Name"] == "no"  # never confirmed ready
        r = up(image=image)
        assert r.returncode == 0, r.stderr
        assert "replacing stale container" in r.stderr
        assert docker_client.containers.get(STANDIN_CONTAINER).id != stale.id
    finally:
        assert down().returncode == 0
    assert port_free()


def test_secrets_stay_out_of_container_config_labels_and_logs(docker_client, standin_image, tmp_path,
                                                              no_leaks):
    key, hf = "sk-escha-up-0123456789", "hf_" + "Qx7" * 12
    (tmp_path / "k").write_text(key + "\n")
    (tmp_path / "h").write_text(hf + "\n")
    image = standin_image("escha-standin:ok")
    r = up("--set", f"container.api_key_file={tmp_path / 'k'}", "--set",
           f"container.hf_token_file={tmp_path / 'h'}", image=image)
    try:
        assert r.returncode == 0, r.stderr
        c = docker_client.containers.get(STANDIN_CONTAINER)
        shown = str(c.attrs["Config"]) + str(c.attrs["Args"]) + str(c.attrs["HostConfig"])
        assert key not in shown and hf not in shown
        mounts = {m["Destination"]: m for m in c.attrs["Mounts"]}
        assert mounts["/run/secrets/escha_api_key"]["RW"] is False
        logs = run_cli("logs", "--profile", P)
        assert key not in logs.stdout + r.stdout + r.stderr
    finally:
        assert down().returncode == 0
