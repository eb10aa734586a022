"""``image_preflight.run_once`` when the Docker daemon does not answer in time: docker-py's
transport raises ``requests``' ``ReadTimeout`` (not a ``DockerException``), and `up --dry-run`
ended in a traceback on a loaded daemon (its 3-s probe client). Now it is the check's "no answer"
reason. The daemon is a STAND-IN here (a client whose calls raise what docker-py raises): a real
daemon cannot be made to time out on cue; the real daemon's path is tests/launch/test_up_sglang_preflight.py."""

from __future__ import annotations

import pytest
from requests.exceptions import ConnectionError as RequestsConnectionError
from requests.exceptions import ReadTimeout

from escha_deploy.launch.image_preflight import NOT_CREATED, NOT_RUN, run_once


class _Containers:
    def __init__(self, create_raises=None, container=None):
        self.create_raises, self.container = create_raises, container

    def create(self, **kwargs):
        if self.create_raises:
            raise self.create_raises
        return self.container


class _Container:
    def __init__(self, wait_raises):
        self.wait_raises, self.removed = wait_raises, False

    def start(self):
        pass

    def wait(self, timeout):
        raise self.wait_raises

    def remove(self, force):
        raise ReadTimeout("read timed out (remove)")  # the daemon still does not answer


class _Client:
    def __init__(self, containers):
        self.containers = containers


ARGS = {"image": "escha-test:none", "command": ["true"], "environment": {}, "labels": {}, "mounts": [],
        "device_requests": []}


@pytest.mark.parametrize("exc", [ReadTimeout("UnixHTTPConnectionPool: Read timed out. (read timeout=3)"),
                                 RequestsConnectionError("connection aborted")])
def test_a_daemon_that_does_not_answer_the_create_is_a_reason_not_a_traceback(exc):
    out = run_once(_Client(_Containers(create_raises=exc)), ARGS, 5)
    assert isinstance(out, str) and out.startswith(f"{NOT_CREATED}: ") and str(exc) in out


def test_a_daemon_that_stops_answering_after_the_create_is_a_reason_and_the_remove_is_tried():
    c = _Container(wait_raises=ReadTimeout("read timed out (wait)"))
    out = run_once(_Client(_Containers(container=c)), ARGS, 5)
    assert out == f"{NOT_RUN}: read timed out (wait)"
