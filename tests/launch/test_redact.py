"""Secret redaction, including SGLang 0.5.19's startup line that carries the API key
(sglang/srt/entrypoints/engine.py: logger.info(f"server_args={server_args.resolved_dict()}"))."""

from escha_deploy.utils.redact import Redactor

KEY = "sk-escha-test-0123456789"
LINE = ("[2026-11-29 16:20:00] server_args={'model_path': '/models/q', 'host': '0.0.0.0', "
        f"'api_key': '{KEY}', 'admin_api_key': None, 'ssl_keyfile_password': 'pw', 'tp_size': 2}}")


def test_known_value_and_field_masked():
    out = Redactor([KEY])(LINE)
    assert KEY not in out and "'api_key': '***'" in out and "'ssl_keyfile_password': '***'" in out
    assert "'admin_api_key': None" in out and "'tp_size': 2" in out


def test_field_masked_even_when_value_unknown():
    assert KEY not in Redactor()(LINE)
    assert "sk-x" not in Redactor()("ServerArgs(api_key='sk-x', port=1)")


def test_hf_token_and_bearer():
    tok = "hf_" + "a1" * 17
    out = Redactor()(f"token {tok} Authorization: Bearer {KEY}")
    assert tok not in out and KEY not in out


def test_short_values_are_not_replaced_literally():
    assert Redactor(["ab"])("about tab") == "about tab"


#: A generated key with no telling prefix (24 letters and digits, many switches between them)
GEN = "a8F3kQ9zL2mN7pR4tV6wX1yB"


def test_keys_by_their_shape():
    """A key nobody named: an issuer's prefix anywhere (the line that is only the key), the value of
    ``token=`` and other credential pairs, every cookie value, a generated word after a key-like
    name."""
    r = Redactor()
    assert r(KEY) == "***" and r(f"  {KEY}\t") == "  ***\t" and r(f"seen {KEY}, retrying") == "seen ***, retrying"
    assert r(f"GET /v1/models token={KEY}") == "GET /v1/models token=***"
    assert r("token=plainword1") == "token=***" and r("auth_token=x9") == "auth_token=***"
    assert r(f"Cookie: session={KEY}") == "Cookie: session=***"
    assert r(f"cookie: theme=dark; sid={GEN}") == "cookie: theme=***; sid=***"
    assert r(f"Set-Cookie: id={GEN}; Path=/; Max-Age=60; HttpOnly") == "Set-Cookie: id=***; Path=/; Max-Age=60; HttpOnly"
    assert r(f"x-auth-token: {GEN}") == "x-auth-token: ***" and r(f"session_key {GEN}") == "session_key ***"
    assert r(f'{{"password": "{GEN}"}}') == '{"password": "***"}' and r(f"secret={GEN}") == "secret=***"
    assert r("ghp_" + "A1b2" * 9) == "***"


def test_shapes_leave_a_servers_counts_and_names_alone():
    """SGLang's own lines name tokens, keys and sessions without a secret: counts, cache keys,
    model names, flags with ordinary values are kept as they are (the diagnosis reads them)."""
    r = Redactor()
    for line in ("Prefill batch. #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: 0.00, #queue-req: 0",
                 "Decode batch. #running-req: 1, #token: 3352, token usage: 0.01, cuda graph: True",
                 "max_prefill_tokens=16384 num_tokens=8192 eos_token=<|im_end|> pad_token_id=0",
                 "the key cache of layer 3 uses 1.2 GB; session ended", "session=None token=null",
                 "model=Qwen3.5-27B-FP8 arch=Qwen3_5ForCausalLM key=value sk-learn 1.3"):
        assert r(line) == line
