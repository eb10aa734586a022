"""Code, tests and docs cite public sources (an SGLang file, sglang#NNNN) or say the fact,
never documents outside the repository (the design notes, research notes or seed reports)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# written in pieces so this file does not match itself
OUTSIDE = re.compile("DESIGN" + r"\.md|" + "research" + r"/[a-z0-9-]+\.md|" + "shared" + "/seeds")


def test_nothing_cites_a_document_outside_the_repository():
    hits = []
    for top in ("escha_deploy", "tests", "docs"):
        for p in (ROOT / top).rglob("*"):
            if p.is_file() and p.suffix in {".py", ".md", ".yaml", ".yml", ".json", ".sh", ".txt", ".toml"}:
                for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                    if OUTSIDE.search(line):
                        hits.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert hits == []
