"""Where escha-deploy finds its data and keeps its state.

Data (profiles, runtime patches, the flag catalog) ships inside the wheel under
``escha_deploy/_data`` (pyproject ``force-include``); in a source checkout it is read from the
repository's top-level folders. State (doctor findings) lives under the user cache directory
(XDG: ``$XDG_CACHE_HOME/escha-deploy``, default ``~/.cache/escha-deploy``).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The environment variable naming a facts file (``factsfile``); compose sets it to the file's
#: path inside the container. Here rather than in ``factsfile`` so reading it builds no model.
FACTS_ENV = "ESCHA_FACTS"

PACKAGE_DIR = Path(__file__).resolve().parent
_REPO_ROOT = PACKAGE_DIR.parent


def _data_dir(name: str) -> Path:
    shipped = PACKAGE_DIR / "_data" / name
    if shipped.is_dir():
        return shipped
    return _REPO_ROOT / name


def profiles_dir() -> Path:
    """Folder of the shipped profiles (``profiles/*.yaml``)."""
    return _data_dir("profiles")


def runtime_patches_dir() -> Path:
    """Folder of the patch series (``runtime_patches/``)."""
    return _data_dir("runtime_patches")


def catalog_dir() -> Path:
    """Folder of generated catalogs (SGLang flag catalog), inside the package."""
    return PACKAGE_DIR / "catalog"


def cache_dir() -> Path:
    """User cache directory for escha-deploy state (XDG)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "escha-deploy"


def doctor_findings_path() -> Path:
    """``escha-deploy/doctor.json`` under the user cache directory."""
    return cache_dir() / "doctor.json"


def read_json(path: str | Path, what: str, hint: str | None = None) -> object:
    """The JSON value in the file a user named (a facts file, a launch spec, a box's saved
    doctor report). Raises ``BadInput`` (exit 2) with one line naming the file and ``what`` it
    should be when it cannot be read or is not JSON; ``hint`` says how to make a good one."""
    import json

    from .errors import BadInput

    p = Path(path)
    try:
        return json.loads(p.read_text())
    except OSError as exc:
        raise BadInput(f"{p}: cannot read {what}: {exc.strerror or exc}", hint=hint) from None
    except ValueError as exc:
        raise BadInput(f"{p}: {what} is not JSON ({exc})", hint=hint) from None
