"""Native ``serve`` refuses a held HTTP port before it starts SGLang (exit 3), naming the port
and the process listening on it. The port is held by a real listening socket of this test
process; the child SGLang is the STAND-IN of test_native.py (SGLang cannot start here), and
the assertion that matters is that it never ran. The address checked is the launch spec's
(``container.port``), never read back out of the server's argv."""

from __future__ import annotations

import os
import socket

import psutil
import pytest

from escha_deploy.utils.errors import Refused
from escha_deploy.launch.preflight import port_free
from escha_deploy.pipeline.spec import launch_digest, spec_json

from .conftest import STANDIN_PROFILE, run_cli
from .test_native import fake_sglang, secret_files, serve_args, serve_env  # noqa: F401 (fixtures)

def me() -> str:
    """This process as the port check names it, read when asked: pytest-xdist renames its workers
    (setproctitle), so a name read at import can be stale by the time a test runs."""
    return f"process {os.getpid()} ({psutil.Process().name()})"


@pytest.fixture
def held_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_held_port_is_refused_naming_port_and_owner(held_port):
    with pytest.raises(Refused) as e:
        port_free("127.0.0.1", held_port)
    (msg,) = e.value.args
    assert msg.startswith(f"container.port: port {held_port} on 127.0.0.1 is already in use by {me()}")
    assert "Address already in use" in msg


def test_held_on_loopback_is_also_taken_for_0_0_0_0(held_port):
    with pytest.raises(Refused):
        port_free("0.0.0.0", held_port)


def test_free_port_passes(held_port):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert port_free("127.0.0.1", free) is None


def test_serve_does_not_start_the_child_on_a_held_port(fake_sglang, secret_files, held_port):  # noqa: F811
    r = run_cli(*serve_args(*secret_files), "--set", f"container.port={held_port}",
                env=serve_env(fake_sglang, STANDIN_MODE="serve"))
    assert r.returncode == 3, r.stdout + r.stderr
    assert "argv=" not in r.stdout + r.stderr  # the stand-in SGLang never ran
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"port {held_port} on 127.0.0.1 is already in use by {me()}" in errors[0]
    assert "Traceback" not in r.stderr


def test_extra_args_port_is_refused_as_the_plan_decides_not_checked(fake_sglang, secret_files, held_port):  # noqa: F811
    # --port belongs to container.port: the profile refuses it in extra_args (exit 2) before any
    # port is looked at, so the held port in extra_args is never what serve checks or binds
    r = run_cli(*serve_args(*secret_files), "--set", f"runtime.extra_args=['--port={held_port}']",
                env=serve_env(fake_sglang, STANDIN_MODE="serve"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "argv=" not in r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "runtime.extra_args" in errors[0] and "container.port" in errors[0], errors
    assert "already in use" not in r.stderr


def test_serve_spec_checks_the_specs_port_not_its_argv(fake_sglang, secret_files, held_port, tmp_path):  # noqa: F811
    # a native spec whose container.port is held and whose argv names another (free) port: the
    # check reads the port the spec decided; a reader of the argv would pass and start the child
    from escha_deploy.pipeline import LaunchOptions, Options, ProfileTarget, ThisHost, plan_request
    from escha_deploy.profile import load_profile

    key, hf = secret_files
    profile = load_profile(str(STANDIN_PROFILE), ["runtime.needs=[]", "hicache.enabled=false",
                                                  f"container.api_key_file={key}", f"container.hf_token_file={hf}",
                                                  f"container.port={held_port}"])
    launch = plan_request(profile, ThisHost(server_here=False), ProfileTarget(),
                          Options(launch=LaunchOptions(native=True))).launch
    assert launch is not None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    argv = list(launch.argv)
    assert argv[argv.index("--port") + 1] == str(held_port)  # rendered from container.port
    argv[argv.index("--port") + 1] = str(free)
    spec = launch.model_copy(update={"argv": argv, "plan_digest": launch_digest(launch.profile_data, launch.facts,
                                                                                argv, launch.env, launch.preflight)})
    path = tmp_path / "launch-spec.json"
    path.write_text(spec_json(spec))
    r = run_cli("serve", "--spec", str(path), env=serve_env(fake_sglang, STANDIN_MODE="serve"))
    assert r.returncode == 3, r.stdout + r.stderr
    assert "argv=" not in r.stdout + r.stderr
    assert f"port {held_port} on 127.0.0.1 is already in use" in r.stderr
