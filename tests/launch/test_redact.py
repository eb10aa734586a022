"""Secret redaction, including SGLang 0.5.19's startup line that carries the API key
(sglang/srt/entrypoints/engine.py: logger.info(f"server_args={server_args.resolved_dict()}"))."""

from escha_deploy.launch.redact import Redactor

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
