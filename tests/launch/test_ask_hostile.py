"""`ask` reads a server it does not control through the one HTTP reading policy
(escha_deploy/utils/httpread.py): answers of the wrong JSON shape, JSON nested 100,000 deep, an
endless body, a gzip stream cut off, a body or status line trickled a byte a second, error
pages carrying escape sequences or the key wrapped across a line break. Each is one line
(exit 4, or 3 when nothing answers), ends within ``--timeout`` + 2 s, and prints nothing a
terminal acts on. The servers are real, on 127.0.0.1 (tests/hostile_servers.py,
tests/canned_server.py)."""

from __future__ import annotations

import json

import pytest

from canned_server import CannedServer
from hostile_servers import HostileServer
from inproc import CLEAN_LINE, OverBudget, run_bounded

TIMEOUT_S = 2.0
MODELS = {"headers": {"Content-Type": "application/json"}, "body": json.dumps({"data": [{"id": "m1"}]})}


def ask(url: str, *extra: str, time_s: float = TIMEOUT_S + 2):
    try:
        r, took = run_bounded("ask", "-e", url, "--timeout", str(TIMEOUT_S), *extra, "hello", time_s=time_s,
                              env={"NO_COLOR": "1"})
    except OverBudget as exc:
        pytest.fail(f"ask --timeout {TIMEOUT_S:g} did not end within {time_s:g} s: {exc}")
    assert "Traceback" not in r.text, r.text
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert all(CLEAN_LINE.match(ln) for ln in lines), r.err
    assert not any(c in r.text for c in "\x1b\x07\x9b"), repr(r.text)
    return r, [ln for ln in lines if ln.startswith("error: ")]


@pytest.mark.parametrize("kind, words", [
    ("slow-body", "/v1/models: no whole answer within 2 s"),
    ("slow-headers", "/v1/models: no whole answer within 2 s"),
    ("endless", "/v1/models: the answer goes past 8,388,608 bytes"),
    ("gzip-broken", "/v1/models: the body cannot be decoded (gzip: the compressed stream ends early)"),
    ("gzip-twice", "/v1/models: the answer is encoded 2 times"),
])
def test_a_hostile_answer_is_one_line_within_the_timeout(kind, words):
    with HostileServer(kind) as srv:
        r, errors = ask(srv.url)
    assert r.code == 4, r.text
    assert len(errors) == 1 and errors[0].startswith(f"error: ask: {srv.url}{words}"), r.err


@pytest.mark.parametrize("models, words", [
    ("[]", "/v1/models names no model (HTTP 200)"),
    ('{"data": {"id": "m1"}}', "/v1/models names no model (HTTP 200)"),
    ('{"data": [7, "x", null]}', "/v1/models names no model (HTTP 200)"),
    ("[" * 100_000 + "]" * 100_000, "/v1/models: not JSON (an answer is nested deeper than 64 levels)"),
])
def test_json_of_the_wrong_shape_or_depth_is_one_line(models, words):
    with CannedServer({"/v1/models": {"headers": {"Content-Type": "application/json"}, "body": models}}) as srv:
        r, errors = ask(srv.url)
    assert r.code == 4, r.text
    assert len(errors) == 1 and errors[0].startswith(f"error: ask: {srv.url}{words}"), r.err


def test_a_chat_answer_of_the_wrong_shape_reads_as_absent_fields():
    answer = {"choices": [{"message": ["not", "an", "object"]}], "usage": 5, "sglext": "x"}
    with CannedServer({"/v1/models": MODELS, "/v1/chat/completions": {"body": json.dumps(answer)}}) as srv:
        r, errors = ask(srv.url)
    assert r.code == 0 and not errors, r.text
    assert "cached tokens: none reported" in r.err


def test_an_error_page_is_printable_and_a_wrapped_key_is_not_shown(tmp_path):
    key = tmp_path / "key"
    key.write_text("sk-wrapped-secret-0123456789\n")
    page = "denied for sk-wrapped-secret-\n0123456789 \x1b]0;PWNED\x07\x1b[31mred"
    with CannedServer({"/v1/models": MODELS, "/v1/chat/completions": {"status": 403, "body": page}}) as srv:
        r, errors = ask(srv.url, "--api-key-file", str(key))
    assert r.code == 4, r.text
    assert len(errors) == 1 and errors[0] == (f"error: ask: {srv.url}/v1/chat/completions answered HTTP 403: "
                                              "(not shown: it quotes the API key across a line break)"), r.err
    assert "sk-wrapped" not in r.text and "0123456789" not in r.text
    plain = "boom \x1b]0;PWNED\x07\x1b[31mred\x9b2J"
    with CannedServer({"/v1/models": MODELS, "/v1/chat/completions": {"status": 500, "body": plain}}) as srv:
        r, errors = ask(srv.url)
    # 0x9B is the one-byte CSI (ECMA-48, 5.4): "2J" is its parameter and final byte, dropped with it
    assert errors == [f"error: ask: {srv.url}/v1/chat/completions answered HTTP 500: boom red"], r.err


def test_the_answer_text_reaches_the_terminal_without_escapes():
    answer = {"choices": [{"message": {"content": "\x1b]0;PWNED\x07hello\n\x1b[2Jworld"}}]}
    with CannedServer({"/v1/models": MODELS, "/v1/chat/completions": {"body": json.dumps(answer)}}) as srv:
        r, errors = ask(srv.url)
    assert r.code == 0 and not errors, r.text
    assert r.out.splitlines() == ["hello", "world"], repr(r.out)
