"""Launch code reports through a ``Report`` callback: no module under escha_deploy/launch
imports the CLI (its output module or anything else of it)."""

from __future__ import annotations

import ast
from pathlib import Path

import escha_deploy.launch as launch_pkg

LAUNCH = Path(launch_pkg.__file__).parent


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # relative: resolve against escha_deploy.launch
                base = ["escha_deploy", "launch"][: 3 - node.level] if node.level <= 2 else []
                mod = ".".join([*base, mod]) if mod else ".".join(base)
            out.append(mod)
        elif isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
    return out


def test_no_launch_module_imports_the_cli():
    offenders = {p.name: m for p in sorted(LAUNCH.glob("*.py")) for m in _imports(p)
                 if m == "escha_deploy.cli" or m.startswith("escha_deploy.cli.")}
    assert not offenders, offenders


def test_the_check_sees_an_import_of_the_cli(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from escha_deploy.cli.output import info\n    from ..cli import output\n")
    assert _imports(bad) == ["escha_deploy.cli.output", "escha_deploy.cli"]

