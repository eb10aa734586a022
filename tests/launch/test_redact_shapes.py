"""Redaction by a token's shape as well as by its name: cloud keys, database passwords, JWTs,
PEM private keys, webhook paths, credentials in a schemeless address. Every secret below is
fake, made for this test (``FAKE``/``ESCHA`` in it, or a run of repeated characters)."""

import json

import pytest

from escha_deploy.utils.redact import Redactor

AWS_ID = "AKIAESCHAFAKE0000001"  # AWS's documented shape: AKIA/ASIA + 16 capitals and digits
AWS_TMP_ID = "ASIAESCHAFAKE0000002"
AWS_SECRET = "escha/FAKE/secret/0123456789abcdefABCDEFg"  # 40 characters, as AWS's are
SESSION = "FwoGZXIvYXdzEFAKEsessionESCHA0123456789/abc+def=="
PASSWORD = "fake-pw-escha-0042"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJlc2NoYS1mYWtlIn0."
       "ZmFrZS1zaWduYXR1cmUtZXNjaGEtMDAwMQ")
GCP = "AIza" + "FakeEschaKey0123456789abcdefghijklmn"[:35]
PEM_BODY = "MIIEvFAKEESCHAkeybodyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
SLACK = "T00FAKE00/B00FAKE00/escHaFakeWebhookSecret00"
AZURE = "ZmFrZS1lc2NoYS1henVyZS1hY2NvdW50LWtleQ=="

#: (line, the secret it holds)
SHAPES = [
    (f"boto: using key {AWS_ID} for s3", AWS_ID),
    (f"creds={AWS_TMP_ID}", AWS_TMP_ID),
    (f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET),
    (f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}", AWS_SECRET),
    (f'{{"SecretAccessKey": "{AWS_SECRET}", "SessionToken": "{SESSION}"}}', AWS_SECRET),
    (f'{{"SecretAccessKey": "x", "SessionToken": "{SESSION}"}}', SESSION),
    (f"export AWS_SESSION_TOKEN={SESSION}", SESSION),
    (f"X-Amz-Security-Token: {SESSION}", SESSION),
    (f"PGPASSWORD={PASSWORD} psql -h db", PASSWORD),
    (f"MYSQL_PWD={PASSWORD} mysql -u root", PASSWORD),
    (f"DB_PASSWORD='{PASSWORD}'", PASSWORD),
    (f"+ mysql -u root -p{PASSWORD} -h 10.0.0.5 app", PASSWORD),
    (f'{{"user": "app", "password": "{PASSWORD}"}}', PASSWORD),
    (f'{{"password" : "two words {PASSWORD}"}}', PASSWORD),
    (f"machine db.example.com login app password {PASSWORD}", PASSWORD),
    (f"Authorization header was {JWT}", JWT),
    (f"id_token {JWT} expired", JWT),
    (f"maps key {GCP}", GCP),
    ('{"private_key": "-----BEGIN PRIVATE KEY-----\\n' + PEM_BODY + '\\n-----END PRIVATE KEY-----\\n"}', PEM_BODY),
    ("-----BEGIN RSA PRIVATE KEY----- " + PEM_BODY + " -----END RSA PRIVATE KEY-----", PEM_BODY),
    (f"POST https://hooks.slack.com/services/{SLACK} failed", SLACK),
    (f"DefaultEndpointsProtocol=https;AccountName=escha;AccountKey={AZURE};EndpointSuffix=core.windows.net", AZURE),
    (f"connecting to admin:{PASSWORD}@db.internal:5432", PASSWORD),
    (f"API_KEY\uff1a{PASSWORD}", PASSWORD),
    (f"password\uff1a {PASSWORD}", PASSWORD),
]


@pytest.mark.parametrize("line, secret", SHAPES, ids=[f"shape{i}" for i in range(len(SHAPES))])
def test_each_shape_masked(line, secret):
    out = Redactor()(line)
    assert secret not in out and "***" in out, out
    # and no piece of it long enough to use
    for piece in secret.replace("/", " ").replace("+", " ").replace(".", " ").split():
        if len(piece) >= 12:
            assert piece not in out, (piece, out)


def test_a_pem_block_over_many_lines():
    """A key printed as its file is, line by line: the lines between BEGIN and END go too."""
    r = Redactor()
    lines = ["loading key", "-----BEGIN EC PRIVATE KEY-----", PEM_BODY, PEM_BODY[::-1],
             "-----END EC PRIVATE KEY-----", "server up"]
    out = [r(x) for x in lines]
    assert out[0] == "loading key" and out[-1] == "server up"
    assert not any(PEM_BODY in x or PEM_BODY[::-1] in x for x in out)
    assert Redactor()("\n".join(lines)).count(PEM_BODY) == 0
    # a BEGIN line with no body after it hides nothing that follows
    r = Redactor()
    tail = ["-----BEGIN PRIVATE KEY-----", "ValueError: Not enough host memory available.", "server up"]
    assert [r(x) for x in tail][1:] == tail[1:]
    r = Redactor()
    assert [r(x) for x in ["[ts] -----BEGIN PRIVATE KEY-----", f"[ts] {PEM_BODY}", "[ts] AbC=", "[ts] ok."]] == [
        "[ts] -----BEGIN PRIVATE KEY-----***", "***", "***", "[ts] ok."]


ORDINARY = [
    "lmsysorg/sglang:v0.5.19@sha256:" + "0123456789abcdef" * 4,
    "image=lmsysorg/sglang:v0.5.19-cu129@sha256:" + "fedcba9876543210" * 4,
    "sha256:" + "a1b2c3d4" * 8 + "  model-00001-of-00004.safetensors",
    "git rev 5afdb13c0f0e2d4b9b8e1d6f1a2c3b4d5e6f7a8b",
    "/root/.cache/huggingface/hub/models--Qwen--Qwen3-8B/snapshots/0123abcd/config.json",
    "PWD=/work/main OLDPWD=/tmp HOME=/root",
    "kv pool 12,345,678 tokens, 2.58 GB; max_total_tokens=131072 page_size=64 tp=2",
    "git@github.com:sgl-project/sglang.git",
    "user alice logged in at 10:00:00 from 127.0.0.1:8000",
    "the password is checked by the proxy; key cache 1.2 GB",
    "Prefill batch. #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: 0.00",
    "session=None token=null password: None",
    "ASIAN market AKIA1234",
]


@pytest.mark.parametrize("line", ORDINARY, ids=[f"ordinary{i}" for i in range(len(ORDINARY))])
def test_ordinary_text_left_alone(line):
    assert Redactor()(line) == line


def test_diagnose_json_is_redacted(tmp_path, cli):
    """``diagnose --format json`` prints its evidence lines through the same redaction."""
    log = tmp_path / "server.log"
    cause = ("ValueError: Not enough host memory available. Requesting 2.58 GB but only have 1.12 GB free. "
             "Please reduce the size of the hierarchical cache.")
    log.write_text("\n".join(f"{line} {cause}" for line, _ in SHAPES) + "\n")
    for fmt in ("json", "table"):
        res = cli("diagnose", str(log), "--format", fmt)
        assert res.code == 0, res.err
        if fmt == "json":
            assert json.loads(res.out)["matches"]
        for _, secret in SHAPES:
            assert secret not in res.out + res.err, (fmt, secret)


def test_a_name_inside_a_path_or_before_a_structure_is_not_a_secret_name():
    """A file named passwd or api_key is a path (its error is kept whole), and a secret-named
    key whose value is an object or a list (a compose file's ``secrets:``) names no value."""
    r = Redactor()
    for line in ("open /etc/passwd: permission denied",
                 "/run/secrets/escha_api_key: no such file or directory",
                 '{"escha_api_key": {"file": "./router.key"}}', "db_password: [a, b]"):
        assert r(line) == line
    assert r("DB_PASSWORD: fake-pw-escha-0043") == "DB_PASSWORD: ***"
