"""compose.yaml: the committed file equals a fresh render of the default profile, Debian's
docker-compose 1.29 accepts it, and it validates against the compose specification's JSON
schema that docker-compose ships (compose/config/compose_spec.json)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from escha_deploy.launch.compose import render_profile

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
DEFAULT_PROFILE = "rtx5060ti-tp2-fp8"
SPEC_SCHEMA = Path("/usr/lib/python3/dist-packages/compose/config/compose_spec.json")


def test_committed_compose_equals_render():
    assert COMPOSE.read_text() == render_profile(DEFAULT_PROFILE), (
        "compose.yaml is stale: escha-deploy compose --profile rtx5060ti-tp2-fp8 -o compose.yaml")


def test_compose_carries_the_launch_settings():
    svc = yaml.safe_load(COMPOSE.read_text())["services"]["sglang"]
    assert svc["ipc"] == "host" and svc["init"] is True
    assert svc["ulimits"] == {"memlock": {"soft": -1, "hard": -1},
                              "stack": {"soft": 67108864, "hard": 67108864}}
    assert svc["ports"] == ["127.0.0.1:30000:30000"]
    assert svc["entrypoint"] == ["escha-deploy", "serve"]
    assert svc["build"]["dockerfile"] == "Dockerfile.hicache"
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2
    assert "/health" in " ".join(svc["healthcheck"]["test"])
    assert svc["restart"] == "no" and "0.0.0.0" in svc["environment"]["NO_PROXY"]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="Debian's docker-compose not installed")
def test_docker_compose_config_accepts_it():
    r = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(not SPEC_SCHEMA.is_file(), reason="no packaged compose specification schema")
def test_compose_spec_schema():
    jsonschema = pytest.importorskip("jsonschema")
    # The packaged schema names draft 7's meta-schema by a URL jsonschema does not know.
    jsonschema.Draft7Validator(json.loads(SPEC_SCHEMA.read_text())).validate(
        yaml.safe_load(COMPOSE.read_text()))


def test_secrets_render_as_compose_secrets_and_expose(tmp_path):
    k = tmp_path / "key"
    k.write_text("sk-escha-test-0123456789\n")
    text = render_profile(DEFAULT_PROFILE, [f"container.api_key_file={k}", "container.expose=true"])
    doc = yaml.safe_load(text)
    assert "sk-escha-test" not in text
    assert doc["secrets"] == {"escha_api_key": {"file": str(k)}}
    assert doc["services"]["sglang"]["ports"] == ["0.0.0.0:30000:30000"]
