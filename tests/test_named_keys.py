"""Every profile key the tool or its docs tell a user to set is one that ``--set`` accepts.

A key named in an alert's text (escha_deploy/watch/alerts.py), in a plan of a shipped profile
(its JSON and its table: reasons, warnings, hints) or in a table of the docs is resolved
against the committed profile schema (escha_deploy/catalog/profile.schema.json, generated
from the ``Profile`` model), so advice naming a key that does not exist (``hicache.ratio``
for ``hicache.hicache_ratio``) fails here.
"""

from __future__ import annotations

import ast
import json
import re
from functools import cache
from pathlib import Path

import pytest

from escha_deploy.profile.loading import list_profiles
from escha_deploy.profile.models import FLAT_L3_KEYS
from escha_deploy.utils.paths import catalog_dir
from tests.inproc import run_main

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("hardware", "model", "runtime", "hicache", "safety", "watch", "container")
#: A dotted key that starts with a profile section, not inside a longer dotted name
#: (``io.escha.runtime.x``), a path (``mem_cache/x``) or a word (``sglang_model.x``).
KEY = re.compile(r"(?<![\w./-])(?:%s)(?:\.[a-z0-9_]+)+" % "|".join(SECTIONS))
#: File names that look like keys: ``model.safetensors``, ``model.safetensors.index.json``.
FILE_SUFFIX = re.compile(r"\.(safetensors|json|ya?ml|py|md|txt|bin|png)$|\.safetensors\.")
#: Names in a docs table that are not profile keys and say so where they stand: a field of the
#: plan's JSON (docs/planner.md's "plan JSON" column) or of the launch spec (docs/ARCHITECTURE.md).
NOT_PROFILE_KEYS = {"hicache.host_reserve_bytes": "plan JSON", "container.port_host_ip": "launch spec"}


@cache
def _schema() -> dict:
    return json.loads((catalog_dir() / "profile.schema.json").read_text())


def _branches(node: dict) -> list[dict]:
    """``node`` with every ``$ref``, ``anyOf`` and ``oneOf`` followed, as plain objects."""
    if "$ref" in node:
        return _branches(_schema()["$defs"][node["$ref"].rsplit("/", 1)[1]])
    out = [node] if "properties" in node or "additionalProperties" in node else []
    for key in ("anyOf", "oneOf"):
        for sub in node.get(key, ()):
            out += _branches(sub)
    return out


def resolves(key: str) -> bool:
    """Whether the dotted ``key`` names a field of the profile schema (through any branch of a
    union, such as the L3 kinds, and into free-form mappings)."""
    head, _, flat = key.partition(".")
    if head == "hicache" and flat in FLAT_L3_KEYS:  # read into hicache.l3 (profile/models.py)
        return True
    nodes = [_schema()]
    for part in key.split("."):
        nxt: list[dict] = []
        for node in nodes:
            for branch in _branches(node):
                if part in branch.get("properties", {}):
                    nxt.append(branch["properties"][part])
                elif isinstance(branch.get("additionalProperties"), dict):
                    nxt.append(branch["additionalProperties"])
        if not nxt:
            return False
        nodes = nxt
    return True


def keys_in(text: str) -> set[str]:
    return {k.rstrip(".") for k in KEY.findall(text) if not FILE_SUFFIX.search(k)}


def _strings(tree: ast.AST) -> str:
    return "\n".join(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def _doc_table_rows() -> str:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return "\n".join(line for f in docs for line in f.read_text().splitlines() if line.lstrip().startswith("|"))


def _bad(text: str) -> list[str]:
    return sorted(k for k in keys_in(text) if not resolves(k))


def test_the_resolver_tells_real_keys_from_wrong_ones():
    assert resolves("hicache.hicache_ratio") and resolves("hicache.hicache_write_policy")
    assert resolves("hicache.l3.dir") and resolves("safety.page_cache_floor")
    assert not resolves("hicache.ratio") and not resolves("hicache.write_policy")
    assert _bad("lower hicache.ratio, or `hicache.l3.nope`") == ["hicache.l3.nope", "hicache.ratio"]
    assert keys_in("model.safetensors.index.json, io.escha.runtime.capabilities, x/hicache.py") == set()


def test_every_key_an_alert_names_exists():
    source = (ROOT / "escha_deploy" / "watch" / "alerts.py").read_text()
    text = _strings(ast.parse(source))
    assert keys_in(text), "the alerts name no keys: the scan is broken"
    assert _bad(text) == []


def test_every_key_a_docs_table_names_exists():
    text = _doc_table_rows()
    assert "hicache.hicache_ratio" in keys_in(text)
    assert _bad(text) == sorted(NOT_PROFILE_KEYS)


@pytest.mark.parametrize("profile", list_profiles())
def test_every_key_a_shipped_profiles_plan_names_exists(profile):
    texts = []
    for platform in ("--wsl2", "--linux"):
        for fmt in ("json", "table"):
            r = run_main("plan", "-p", profile, "--host-ram", "16GiB", platform, "-f", fmt)
            assert r.code in (0, 3), r.err
            texts.append(r.out + r.err)
    assert keys_in("\n".join(texts)), "the plan names no keys: the scan is broken"
    assert _bad("\n".join(texts)) == []
