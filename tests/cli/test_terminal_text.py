"""Terminal controls from a file, a server or a log never reach the terminal: each printer the
text passes through drops C0/C1 controls, ESC sequences and the Unicode bidi controls
(``termtext.printable``; Unicode Standard Annex #9 for the bidi set, CVE-2021-42574 for why)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from escha_deploy.utils.termtext import printable

#: An OSC title change, a CSI colour, a C1 CSI, and the bidi controls (override, isolate, marks)
HOSTILE = "\x1b]0;PWNED\x07\x1b[31m\x9b2J\u202e\u2066\u200f\u061c"
BAD = ("\x1b", "\x9b", "\x07", "\u202e", "\u2066", "\u200f", "\u061c")


def clean(text: str) -> bool:
    return not any(c in text for c in BAD)


def test_printable_drops_bidi_controls_keeps_tab_and_newline_when_asked():
    assert printable("a\u202ab\u202ec\u2066d\u2069e\u200ef\u200fg\u061ch") == "abcdefgh"
    assert printable(f"x{HOSTILE}y\tz") == "xy\tz"
    assert printable("one\ntwo\r", newlines=True) == "one\ntwo" and printable("one\ntwo") == "onetwo"
    assert printable("Qwen/Qwen3-8B@0123abcd — ünïcode 日本") == "Qwen/Qwen3-8B@0123abcd — ünïcode 日本"


def test_an_error_quoting_a_profile_key(cli, tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text('extends: rtx5060ti-tp2-fp8\n"hicache\\e]0;PWNED\\a\\e[31m\\u202e": 1\n')
    r = cli("plan", "-p", str(p))
    assert r.code == 2 and "unknown key" in r.err and clean(r.err + r.out), r.err


def _lock(folder: Path, repo: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    import hashlib

    (folder / "escha-model.lock.json").write_text(json.dumps({
        "schema_version": 1, "repo": repo, "revision": "main", "commit": "0123456789abcdef" * 2 + "01234567",
        "endpoint": "http://127.0.0.1:9", "pulled_at": "2026-12-07T00:00:00Z",
        "files": [{"name": "config.json", "size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()}]}))


def test_model_verify_prints_the_pin_without_controls(cli, tmp_path):
    folder = tmp_path / "m"
    _lock(folder, f"escha-test/tiny{HOSTILE}")
    r = cli("model", "verify", str(folder))
    assert r.code == 0 and "escha-test/tiny@0123456789ab" in r.out and clean(r.out + r.err), repr(r.out)


def test_plans_model_folder_line_without_controls(cli, tmp_path):
    """A model folder's name (a profile's ``model.host_dir``) quoted by plan's refusal."""
    folder = tmp_path / f"m{HOSTILE}x"
    _lock(folder, "escha-test/tiny")
    p = tmp_path / "p.yaml"
    p.write_text("extends: rtx5060ti-tp2-fp8\nmodel:\n  host_dir: " + json.dumps(str(folder)) + "\n")
    r = cli("plan", "-p", str(p))
    assert r.code == 2 and f"{tmp_path}/mx has no weights" in r.err and clean(r.out + r.err), repr(r.err)


@pytest.mark.parametrize("rank", [f"0{HOSTILE}"])
def test_status_rank_header_without_controls(rank):
    """A rank label is a dict key of the row: the filter reaches keys as well as values."""
    from escha_deploy.cli.status import _printable

    row = {"server": {"ranks": {rank: {"x": f"v{HOSTILE}"}}}}
    out = _printable(row)
    (key, val), = out["server"]["ranks"].items()
    assert key == "0" and val == {"x": "v"}
