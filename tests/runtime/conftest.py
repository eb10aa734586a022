"""Fixtures for the runtime tests: the real sglang 0.5.19 wheel, unpacked like pip does.

The wheel is found at ``$ESCHA_SGLANG_WHEEL``, else ``.cache/wheels/`` in the repo (where .ci/test
downloads it with ``pip download --no-deps sglang==0.5.19``), else ``/tmp/wheels``. Tests that
need it are marked ``wheel`` and skip when it is absent (CI always has it).
"""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CP311 = "sglang-0.5.19-cp311-cp311-manylinux_2_34_x86_64.whl"


def find_wheel(name: str = CP311) -> Path | None:
    env = os.environ.get("ESCHA_SGLANG_WHEEL")
    candidates = ([Path(env)] if env else []) + [REPO / ".cache" / "wheels" / name,
                                                 Path("/tmp/wheels") / name]
    return next((p for p in candidates if p.is_file() and p.name == name), None)


@pytest.fixture(scope="session")
def sglang_wheel() -> Path:
    w = find_wheel()
    if w is None:
        pytest.skip(f"the real {CP311} is not here (.ci/test downloads it)")
    return w


@pytest.fixture(scope="session")
def _pristine_site(sglang_wheel, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("pristine-site")
    with zipfile.ZipFile(sglang_wheel) as z:
        z.extractall(site)
    return site


@pytest.fixture
def site(_pristine_site, tmp_path) -> Path:
    """A fresh copy of the unpacked wheel (``sglang/`` + its dist-info), as ``pip install
    --no-deps --no-compile`` leaves site-packages."""
    dst = tmp_path / "site-packages"
    shutil.copytree(_pristine_site, dst)
    return dst
