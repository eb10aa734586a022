"""The import contract (.importlinter) holds, and the check fails when a module imports up the
layers, when two modules import each other, when a fact reader imports the request, and when a
module is outside the contract: the real import-linter over this checkout, then over copies with
one planted fault each."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")
pytestmark = pytest.mark.skipif(not LINT.is_file(), reason="import-linter is in the test extra")


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the copy's package, not the installed one
    return subprocess.run([str(LINT), str(root / ".importlinter")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_checkout_keeps_the_contract():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "escha_deploy", tmp_path / "escha_deploy",
                    ignore=shutil.ignore_patterns("__pycache__", "catalog"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path / "escha_deploy"


def _plant(module: Path, code: str) -> None:
    module.write_text(module.read_text() + f"\n\ndef _planted():\n    {code}  # noqa: F401\n")


def test_an_import_up_the_layers_breaks_it(tmp_path):
    pkg = _copy(tmp_path)
    _plant(pkg / "profile" / "models.py", "from ..cli import main")
    r = _lint(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "escha_deploy.profile.models -> escha_deploy.cli" in r.stdout


def test_a_module_outside_the_contract_breaks_it(tmp_path):
    """A new module directly under escha_deploy/ that .importlinter does not name is refused
    (the layers contract is exhaustive), even when it imports nothing."""
    pkg = _copy(tmp_path)
    (pkg / "planted_room.py").write_text('"""A module no layer names."""\n')
    r = _lint(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "escha_deploy.planted_room" in r.stdout and "not listed as layers" in r.stdout


def test_every_folder_of_python_files_is_a_package():
    """A folder of modules without __init__.py is a namespace package, which import-linter does
    not see: its modules would be outside the contract unnoticed."""
    loose = sorted(str(d.relative_to(ROOT)) for d in (ROOT / "escha_deploy").rglob("*")
                   if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
                   and not (d / "__init__.py").is_file())
    assert loose == []


def test_a_cycle_inside_a_package_breaks_it(tmp_path):
    """Two modules of one package importing each other (here runtime/fork.py back to
    runtime/patching.py, which imports fork) break the no-cycles contract."""
    pkg = _copy(tmp_path)
    _plant(pkg / "runtime" / "fork.py", "from escha_deploy.runtime import patching")
    r = _lint(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "No cycles are allowed in escha_deploy.runtime" in r.stdout


def test_a_fact_reader_importing_the_request_breaks_it(tmp_path):
    pkg = _copy(tmp_path)
    _plant(pkg / "host.py", "from escha_deploy import pipeline")
    r = _lint(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the fact readers never import the request or the commands BROKEN" in r.stdout

