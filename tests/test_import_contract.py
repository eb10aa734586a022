"""The import contract (.importlinter) holds, and the check fails when a module imports up the
layers, when two modules import each other, when a module is outside the contract, and when one
of its three rules is broken (the box depends on what is wanted, SGLang data reads the box, utils
import another package): the real import-linter over this checkout, then over copies with one
planted fault each."""

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


def test_the_contract_is_a_short_list_of_package_layers():
    """At most 12 layers, each a package (or ``__main__``), and only ``__init__.py`` and
    ``__main__.py`` are modules at the top of the package."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".importlinter")
    layers = [ln.strip() for ln in cfg["importlinter:contract:layers"]["layers"].splitlines() if ln.strip()]
    assert len(layers) <= 12, layers
    pkg = ROOT / "escha_deploy"
    assert sorted(p.name for p in pkg.glob("*.py")) == ["__init__.py", "__main__.py"]
    for layer in layers:
        for name in layer.split("|"):
            name = name.strip()
            assert name == "__main__" or (pkg / name / "__init__.py").is_file(), name


def _broken(tmp_path: Path, module: str, code: str, contract: str) -> None:
    pkg = _copy(tmp_path)
    _plant(pkg.joinpath(*module.split("/")), code)
    r = _lint(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{contract} BROKEN" in r.stdout, r.stdout


def test_the_box_depending_on_what_is_wanted_breaks_it(tmp_path):
    """Rule 1: facts/ (the models and their readers) never imports the request or the commands."""
    _broken(tmp_path, "facts/machine.py", "from escha_deploy import pipeline",
            "what the box is never depends on what is wanted")


def test_sglang_data_reading_the_box_breaks_it(tmp_path):
    """Rule 2: sglang/ never imports facts/."""
    _broken(tmp_path, "sglang/releases.py", "from escha_deploy.facts import machine",
            "SGLang data never reads the box")


def test_utils_importing_another_package_breaks_it(tmp_path):
    """Rule 3: utils/ imports no other package of escha_deploy (here the profile, which lies
    above it, so the layers break too)."""
    _broken(tmp_path, "utils/paths.py", "from escha_deploy.profile import models",
            "utils import no other package of escha_deploy")
