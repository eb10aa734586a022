"""After `up` is ready it prints the first request to send; the printed curl, run as printed by
a shell, gets HTTP 200 from the STAND-IN server image (tests/launch/standin/: no GPU here) on the
real Docker daemon, with the key read from its file and never printed."""

from __future__ import annotations

import json
import subprocess

import pytest

from .conftest import STANDIN_PROFILE, run_cli

pytestmark = pytest.mark.docker
P = str(STANDIN_PROFILE)
KEY = "sk-standin-first-request-4b1d"


def test_printed_curl_run_as_printed_gets_200(docker_client, standin_image, tmp_path, no_leaks):
    image = standin_image("escha-standin:serverkey", mode="server_key", server_key=KEY)
    key = tmp_path / "api key"  # a space: the printed command must quote the path
    key.write_text(KEY + "\n")
    r = run_cli("up", "--profile", P, "--set", f"container.image={image}", "--set",
                f"container.api_key_file={key}", "--detach", "--timeout", "90")
    try:
        assert r.returncode == 0, r.stderr
        assert KEY not in r.stderr and KEY not in r.stdout  # the key stays in its file
        lines = r.stderr.splitlines()
        curl = lines[lines.index("first request (curl):") + 1].strip()
        assert curl.startswith("curl ") and "/v1/chat/completions" in curl and "$(cat " in curl
        assert "from openai import OpenAI" in r.stderr and "read().strip()" in r.stderr
        run = subprocess.run(["bash", "-c", curl + " -o /dev/stderr -w '%{http_code}'"], capture_output=True,
                             text=True, timeout=30)
        assert run.stdout == "200", (run.stdout, run.stderr)
        # and exactly as printed (--fail-with-body: a status >= 400 exits 22)
        exact = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=30)
        assert exact.returncode == 0, exact.stderr
        answer = json.loads(exact.stdout)
        from escha_deploy.profile import load_profile

        m = load_profile(P).model
        assert answer["object"] == "chat.completion" and answer["model"] == (m.served_model_name or m.path)
        ask = run_cli("ask", "-p", P, "--set", f"container.api_key_file={key}", "Say hello")
        assert ask.returncode == 0, ask.stderr
        assert ask.stdout.strip() == "stand-in: hello" and "cached tokens:" in ask.stderr
    finally:
        run_cli("down", "--profile", P)


def test_ask_with_no_container_of_the_profile_says_so_as_ask(docker_client, tmp_path):
    """With the daemon answering and no container of the profile, `ask` says "ask: nothing
    running ..." with its own hint, not `status`'s words (it found no server the way `status`
    does, so `status:` in front confused a first user)."""
    name = f"ask-none-{tmp_path.name}"
    r = run_cli("ask", "--profile", P, "--set", f"name={name}", "hello")
    assert r.returncode == 3, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: ask: nothing running for profile {name}"], r.stderr
    assert "hint: start it with `escha-deploy up`, or name the server with --endpoint" in r.stderr
