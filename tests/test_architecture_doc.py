"""docs/ARCHITECTURE.md has a table row for every module under escha_deploy/ (a new module
without one fails here), and names no module that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "escha_deploy"
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()


def _rows() -> set[str]:
    """The first cell of every table row, as written (`launch/up.py`)."""
    return {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", DOC, flags=re.M)}


def test_every_module_has_a_row():
    rows = _rows()
    missing = []
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG).as_posix()
        if f.name == "__init__.py" and f.parent != PKG:
            # a package: its row is `pkg/` (top level) or any row of its modules
            if f"{f.parent.relative_to(PKG).as_posix()}/" in rows or rel in rows:
                continue
            if any(r.startswith(f.parent.relative_to(PKG).as_posix() + "/") for r in rows):
                continue
            missing.append(rel)
        elif f.name != "__init__.py" and rel not in rows:
            missing.append(rel)
    assert missing == [], f"docs/ARCHITECTURE.md has no row for {missing}"


def test_every_row_names_a_module_that_exists():
    gone = [r for r in _rows() if r.endswith((".py", "/")) and not (PKG / r).exists()]
    assert gone == [], gone
