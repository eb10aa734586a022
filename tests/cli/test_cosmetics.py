"""Small wording of the CLI's output: an empty default in JSON is the empty string, and the
default release's source reads without nested parentheses."""

from __future__ import annotations

import json


def test_keys_json_gives_an_empty_default_as_the_empty_string(cli):
    r = cli("profiles", "show", "rtx5060ti-tp2", "--keys", "--format", "json")
    assert r.code == 0, r.err
    row = next(x for x in json.loads(r.out) if x["key"] == "description")
    assert row["default"] == ""  # it was the two characters '""'
    t = cli("profiles", "show", "rtx5060ti-tp2", "--keys")
    line = next(x for x in t.out.splitlines() if x.startswith("description = "))
    assert '(default ""; text)' in line  # the table still shows the empty string


def test_the_default_release_source_has_no_nested_parentheses(cli):
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "64GiB")
    line = next(x for x in r.out.splitlines() if x.startswith("SGLang "))
    assert line == "SGLang 0.5.19 (the default release, escha_deploy/catalog/releases/index.yaml)", line
