"""The import contract (.importlinter) holds, and the check fails when a module imports up the
layers: the real import-linter over this checkout, then over a copy with one planted import."""

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


def test_an_import_up_the_layers_breaks_it(tmp_path):
    shutil.copytree(ROOT / "escha_deploy", tmp_path / "escha_deploy",
                    ignore=shutil.ignore_patterns("__pycache__", "catalog"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    models = tmp_path / "escha_deploy" / "profile" / "models.py"
    models.write_text(models.read_text() + "\n\ndef _planted():\n    from ..cli import main  # noqa: F401\n")
    r = _lint(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "escha_deploy.profile.models -> escha_deploy.cli" in r.stdout
