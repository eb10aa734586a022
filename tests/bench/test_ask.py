"""`escha-deploy ask PROMPT` against the bench STAND-IN server (tests/bench/standin_sglang.py:
SGLang 0.5.19's response shapes, no GPU): the answer on stdout, the cached-token sources
(sglext.cached_tokens_details: device, host) on stderr."""

from __future__ import annotations

import json

PROMPT = "Tell me about the tides of the northern sea and the moon that pulls them every day"


def test_ask_prints_the_answer_and_where_the_cached_tokens_came_from(cli, standin):
    srv = standin(device_tokens=20_000, host_tokens=80_000)
    first = cli("ask", "-e", srv.url, PROMPT, "--max-tokens", "8")
    assert first.code == 0, first.err
    assert first.out.strip()  # the stand-in's deterministic words
    assert "cached tokens: none reported" in first.err  # nothing was cached yet
    again = cli("ask", "-e", srv.url, PROMPT, "--max-tokens", "8", "-f", "json")
    assert again.code == 0, again.err
    data = json.loads(again.out)
    assert data["device_tokens"] > 0 and data["host_tokens"] == 0, data  # the prefix, from the device pool
    assert data["cached_tokens"] == data["device_tokens"] and data["prompt_tokens"] > data["cached_tokens"]
    third = cli("ask", "-e", srv.url, PROMPT, "--max-tokens", "8")
    assert f"cached tokens: {data['cached_tokens']} of {data['prompt_tokens']} prompt tokens (device " in third.err


def test_ask_with_nothing_running_exits_3(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    r = cli("ask", "-p", "rtx5060ti-tp2-fp8", "hello")
    assert r.code == 3 and "error: " in r.err, r.err
    closed = cli("ask", "-e", "http://127.0.0.1:9", "hello")
    assert closed.code == 3 and "ask: nothing answers at http://127.0.0.1:9" in closed.err
    assert cli("ask", "-e", "http://127.0.0.1:9", "  ").code == 2


def test_dry_run_prints_the_first_request_with_the_key_file_not_the_key(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    key = tmp_path / "key"
    key.write_text("sk-never-printed-77\n")
    r = cli("up", "--dry-run", "-p", "rtx5060ti-tp2-fp8", "--set", f"container.api_key_file={key}")
    assert "sk-never-printed-77" not in r.out + r.err
    lines = r.out.splitlines()
    curl = lines[lines.index("# once `up` is ready, the first request (curl)") + 1]
    assert curl.startswith("curl -sS --fail-with-body http://127.0.0.1:30000/v1/chat/completions")
    assert f'-H "Authorization: Bearer $(cat {key})"' in curl and '"model":"qwen3.x-27b-int4"' in curl, curl
