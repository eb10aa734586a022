"""Native ``serve`` refuses a held HTTP port before it starts SGLang (exit 3), naming the port
and the process listening on it. The port is held by a real listening socket of this test
process; the child SGLang is the STAND-IN of test_native.py (SGLang cannot start here), and
the assertion that matters is that it never ran."""

from __future__ import annotations

import os
import socket

import psutil
import pytest

from escha_deploy.errors import Refused
from escha_deploy.launch.preflight import port_free

from .conftest import run_cli
from .test_native import fake_sglang, secret_files, serve_args, serve_env  # noqa: F401 (fixtures)

ME = f"process {os.getpid()} ({psutil.Process().name()})"


@pytest.fixture
def held_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_held_port_is_refused_naming_port_and_owner(held_port):
    with pytest.raises(Refused) as e:
        port_free(["-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", str(held_port)])
    (msg,) = e.value.args
    assert msg.startswith(f"container.port: port {held_port} on 127.0.0.1 is already in use by {ME}")
    assert "Address already in use" in msg


def test_held_on_loopback_is_also_taken_for_0_0_0_0(held_port):
    with pytest.raises(Refused):
        port_free(["--host", "0.0.0.0", f"--port={held_port}"])


def test_free_port_passes(held_port):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert port_free(["--host", "127.0.0.1", "--port", str(free)]) is None


def test_serve_does_not_start_the_child_on_a_held_port(fake_sglang, secret_files, held_port):  # noqa: F811
    r = run_cli(*serve_args(*secret_files), "--set", f"container.port={held_port}",
                env=serve_env(fake_sglang, STANDIN_MODE="serve"))
    assert r.returncode == 3, r.stdout + r.stderr
    assert "argv=" not in r.stdout + r.stderr  # the stand-in SGLang never ran
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"port {held_port} on 127.0.0.1 is already in use by {ME}" in errors[0]
    assert "Traceback" not in r.stderr
