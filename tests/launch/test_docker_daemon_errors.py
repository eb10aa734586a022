"""A Docker daemon that answers with an error (HTTP 500), or loses a container between the list
and the next call: `status`, `down`, `logs` and `up --dry-run` say so in one line, exit 3,
never docker-py's traceback; the dry run keeps its preview, its daemon checks "not checked" as
for a daemon that does not answer.

The daemon is a stand-in: an HTTP server on 127.0.0.1 (tests/canned_server.py) that answers in
the Docker Engine API's shape (docs.docker.com/reference/api/engine: ``GET /version``,
``/containers/json``, ``/containers/{id}/json``, an error as ``{"message": ...}``), reached by
docker-py through ``DOCKER_HOST=tcp://127.0.0.1:PORT``."""

from __future__ import annotations

import json

import pytest

from canned_server import CannedServer
from inproc import CLEAN_LINE, run_main

API = "/v1.43"
VERSION = {"/version": {"headers": {"Content-Type": "application/json"},
                        "body": json.dumps({"ApiVersion": "1.43", "Version": "24.0.7", "MinAPIVersion": "1.12"})}}
BOOM = {"status": 500, "headers": {"Content-Type": "application/json"},
        "body": json.dumps({"message": "stand-in daemon: \x1b[31mstorage driver failed"})}
CID = "c0ffee" * 10 + "abcd"
LISTED = {"headers": {"Content-Type": "application/json"},
          "body": json.dumps([{"Id": CID, "Names": ["/escha-dk500"], "State": "running",
                               "Labels": {"io.escha.managed-by": "escha-deploy", "io.escha.profile": "dk500"}}])}
INSPECTED = {"headers": {"Content-Type": "application/json"},
             "body": json.dumps({"Id": CID, "Name": "/escha-dk500",
                                 "State": {"Status": "running", "StartedAt": "2026-12-07T20:00:00.000000000Z"},
                                 "Config": {"Image": "escha-sglang:test", "Tty": False,
                                            "Labels": {"io.escha.managed-by": "escha-deploy",
                                                       "io.escha.profile": "dk500"}},
                                 "HostConfig": {"PortBindings": {}}, "Mounts": []})}
GONE = {"status": 404, "headers": {"Content-Type": "application/json"},
        "body": json.dumps({"message": f"No such container: {CID}"})}


def daemon(answers: dict, tmp_path) -> tuple[CannedServer, dict[str, str]]:
    srv = CannedServer({**VERSION, **answers})
    return srv, {"DOCKER_HOST": f"tcp://127.0.0.1:{srv.port}", "XDG_RUNTIME_DIR": str(tmp_path / "run"),
                 "XDG_CACHE_HOME": str(tmp_path / "xdg")}


def one_line(r, code: int = 3) -> str:
    assert "Traceback" not in r.text, r.text
    assert r.code == code, r.text
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert all(CLEAN_LINE.match(ln) for ln in lines), r.err
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1, r.err
    assert "\x1b" not in r.text
    return errors[0]


@pytest.mark.parametrize("argv", [("status",), ("status", "--check"), ("down",), ("logs",),
                                  ("logs", "--profile", "dk500")])
def test_a_500_on_the_container_list_is_one_line_exit_3(tmp_path, argv):
    srv, env = daemon({"*": BOOM}, tmp_path)
    with srv:
        r = run_main(*argv, env=env)
    line = one_line(r)
    assert line.startswith(f"error: {argv[0]}: docker: the daemon answered HTTP 500 Internal Server Error to "
                           f"GET {API}/containers/json (stand-in daemon: storage driver failed)"), line


@pytest.mark.parametrize("argv", [("status",), ("down",), ("logs",)])
def test_a_500_on_inspect_is_one_line_exit_3(tmp_path, argv):
    srv, env = daemon({f"{API}/containers/json": LISTED, "*": BOOM}, tmp_path)
    with srv:
        r = run_main(*argv, env=env)
    assert f"to GET {API}/containers/{CID}/json" in one_line(r)


def test_a_container_removed_between_list_and_inspect_is_gone(tmp_path):
    srv, env = daemon({f"{API}/containers/json": LISTED, f"{API}/containers/{CID}/json": GONE}, tmp_path)
    with srv:
        st = run_main("status", env=env)
        dn = run_main("down", env=env)
    assert "nothing running" in one_line(st)
    assert dn.code == 0 and "down: nothing running" in dn.err, dn.text


def test_logs_of_a_container_removed_after_inspect_is_one_line(tmp_path):
    srv, env = daemon({f"{API}/containers/json": LISTED, f"{API}/containers/{CID}/json": INSPECTED,
                       f"{API}/containers/{CID}/logs": GONE}, tmp_path)
    with srv:
        r = run_main("logs", env=env)
    line = one_line(r)
    assert line.startswith(f"error: logs: docker: the daemon no longer knows GET {API}/containers/{CID}/logs "
                           "(removed meanwhile?)"), line


def test_up_dry_run_keeps_its_preview(tmp_path):
    srv, env = daemon({"*": BOOM}, tmp_path)
    with srv:
        r = run_main("up", "-p", "rtx5060ti-tp2-fp8", "--dry-run", env=env)
    assert "Traceback" not in r.text and r.code == 3, r.text
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error: ")]
    assert any(ln.startswith("error: up --dry-run: docker: the daemon answered HTTP 500 Internal Server Error to "
                             f"GET {API}/info") for ln in errors), r.err
    assert "warning: up --dry-run: not checked: port (the Docker daemon answered with an error)" in r.err
    assert "# container (docker-py containers.create arguments)" in r.out and "verdict ok" in r.out
