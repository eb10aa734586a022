"""Every import of escha_deploy inside the package resolves, the lazy ones too (an import inside a
function runs only when that function does, so a moved module or name would fail there, late,
on a user's machine): each ``import escha_deploy.X`` and ``from ... import NAME`` found by walking
every module's syntax tree, at any depth, is imported here and each name looked up. A module or
name that moved fails loudly, naming the file and line that still uses it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "escha_deploy"
ROOT = PKG.parent

def _module_of(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def imports() -> list[tuple[str, int, str, str | None]]:
    """``(file:line, module, name or None)`` of every import of escha_deploy in the package."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        module, is_pkg = _module_of(path)
        where = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), where)):
            if isinstance(node, ast.Import):
                found += [(where, node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "escha_deploy"]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".") if is_pkg else module.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] == "escha_deploy":
                    found += [(where, node.lineno, target, a.name) for a in node.names]
    return found


def test_the_walk_finds_the_lazy_imports():
    """The walk reaches imports inside functions, not just the module's top."""
    found = {(where, module, name) for where, _, module, name in imports()}
    assert ("escha_deploy/pipeline/gathering.py", "escha_deploy.facts.machine", "read_model_folder") in found
    assert len(found) > 500


def test_every_import_in_the_package_resolves():
    bad = []
    for where, line, module, name in imports():
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            bad.append(f"{where}:{line}: import {module}: {exc}")
            continue
        if name is None or name == "*" or hasattr(mod, name):
            continue
        try:  # "from package import submodule"
            importlib.import_module(f"{module}.{name}")
        except ImportError:
            bad.append(f"{where}:{line}: from {module} import {name}: {module} has no {name!r}")
    assert bad == []


@pytest.mark.parametrize("name", importlib.import_module("escha_deploy.pipeline").__all__)
def test_each_name_the_pipeline_re_exports_is_its_stages(name):
    """``escha_deploy.pipeline`` re-exports its stages' public names; none is shadowed by a stage
    module of the same name (a submodule, once imported, is an attribute of its package)."""
    import types

    import escha_deploy.pipeline as pipeline

    value = getattr(pipeline, name)
    assert not isinstance(value, types.ModuleType), f"escha_deploy.pipeline.{name} is a module"
    stage = importlib.import_module(f"escha_deploy.pipeline.{pipeline._STAGES[name]}")
    assert getattr(stage, name) is value
