"""Fixtures for the runtime tests: the real sglang 0.5.19 wheel, unpacked like pip does.

The wheel is found at ``$ESCHA_SGLANG_WHEEL``, else ``.cache/wheels/`` in the repo (where .ci/test
downloads it with ``pip download --no-deps sglang==0.5.19``), else ``/tmp/wheels``. Tests that
need it are marked ``wheel`` and skip when it is absent (CI always has it).

The wheel is unpacked once per session (the pristine tree, 4,374 files, 85 MB). A test's own
tree (``site``) is made of hard links to it: ``runtime apply`` replaces the files it patches by
rename (``patching._write_by_rename``), so the pristine inode is never written. A test that
changes a file itself goes through ``rewrite()``, which unlinks first. After every test that
used a tree, the pristine tree's sha256 inventory is checked against the one taken at unpacking,
so a test that writes through a link fails instead of spoiling the tests after it. Tests that
only read an applied tree share one (``applied_shared``), itself checked the same way.

The check after each test compares every file's inode, size and mtime (``stat_inventory``,
tens of milliseconds) with those taken at unpacking: a write through a hard link changes the
shared inode's mtime, a file replaced by rename its inode, and a file removed or added the
set of names. The sha256 inventory (``inv.scan``, about 0.2 s quiet and over 0.5 s with the
suite running) is compared once more at the session's end.
"""

from __future__ import annotations

import os
import re
import shutil
import zipfile
from pathlib import Path

import pytest

from escha_deploy.runtime import inventory as inv

REPO = Path(__file__).resolve().parents[2]
CP311 = "sglang-0.5.19-cp311-cp311-manylinux_2_34_x86_64.whl"


def _any_python(p: Path) -> bool:
    """An sglang 0.5.19 manylinux_2_34 wheel for any CPython (the series' bases: cp311, cp312)."""
    return re.fullmatch(r"sglang-0\.5\.19-cp3\d+-cp3\d+-manylinux_2_34_x86_64\.whl", p.name) is not None


def find_wheel(name: str = CP311) -> Path | None:
    """``$ESCHA_SGLANG_WHEEL`` (any Python's 0.5.19 wheel, e.g. a GPU machine's cp312), else
    ``name`` in ``.cache/wheels`` or ``/tmp/wheels``. The serving closure's trimmed tree is not
    read here: the patched-import test in test_series.py imports SGLang without the stand-ins
    ``gpu_host_pools.py`` installs, and on a machine without flashinfer it stops there."""
    env = os.environ.get("ESCHA_SGLANG_WHEEL")
    if env and Path(env).is_file() and (Path(env).name == name or _any_python(Path(env))):
        return Path(env)
    candidates = [REPO / ".cache" / "wheels" / name, Path("/tmp/wheels") / name]
    return next((p for p in candidates if p.is_file() and p.name == name), None)


def link_tree(src: Path, dst: Path) -> Path:
    """``dst``: the folders of ``src`` made anew, every file a hard link to ``src``'s."""
    shutil.copytree(src, dst, copy_function=os.link)
    return dst


def rewrite(path: Path, data: bytes | str) -> None:
    """Give ``path`` new contents without writing through a hard link: unlink, then write."""
    path.unlink(missing_ok=True)
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)


def stat_inventory(root: Path) -> dict[str, tuple[int, int, int]]:
    """``{relative path: (inode, size, mtime in ns)}`` of every file under ``root``, no
    ``__pycache__`` (as ``inv.scan``), links not followed."""
    out: dict[str, tuple[int, int, int]] = {}
    cut = len(str(root)) + 1
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            out[full[cut:]] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def stat_drift(now: dict, before: dict) -> list[str]:
    """What differs between two ``stat_inventory`` results, one line per kind (empty: none)."""
    changed = sorted(k for k in now.keys() & before.keys() if now[k] != before[k])
    out = [f"{what}: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}" for what, names in
           (("changed", changed), ("missing", sorted(before.keys() - now.keys())),
            ("new", sorted(now.keys() - before.keys()))) if names]
    return out


class Pristine:
    """The unpacked wheel with its sha256 inventory and its stat inventory, both taken right
    after unpacking."""

    def __init__(self, root: Path):
        self.root = root
        self.inventory = inv.scan(root)
        self.stats = stat_inventory(root)

    def check(self, what: str) -> None:
        drift = stat_drift(stat_inventory(self.root), self.stats)
        assert not drift, f"{what} wrote through a hard link into the pristine tree: {drift}"

    def check_contents(self, what: str) -> None:
        drift = inv.compare(inv.scan(self.root), self.inventory)
        assert drift.ok, f"{what} wrote through a hard link into the pristine tree: {drift.lines()}"


@pytest.fixture(scope="session")
def sglang_wheel() -> Path:
    w = find_wheel()
    if w is None:
        pytest.skip(f"the real {CP311} is not here (.ci/test downloads it)")
    return w


@pytest.fixture(scope="session")
def _pristine(sglang_wheel, tmp_path_factory) -> Pristine:
    site = tmp_path_factory.mktemp("pristine-site")
    with zipfile.ZipFile(sglang_wheel) as z:
        z.extractall(site)
    pristine = Pristine(site)
    yield pristine
    pristine.check_contents("a test of this session")


@pytest.fixture
def site(_pristine, tmp_path, request) -> Path:
    """A test's own tree of the unpacked wheel (``sglang/`` + its dist-info), as ``pip install
    --no-deps --no-compile`` leaves site-packages; hard links to the pristine tree (see the
    module docstring), which is checked unchanged after the test."""
    dst = link_tree(_pristine.root, tmp_path / "site-packages")
    yield dst
    _pristine.check(request.node.nodeid)


@pytest.fixture(scope="session")
def _applied_shared(_pristine, tmp_path_factory):
    """One tree with the series applied, for tests that only read it: ``(package dir, state
    dir, inventory of the applied tree)``."""
    from escha_deploy.cli.main import main

    root = tmp_path_factory.mktemp("applied-shared")
    site = link_tree(_pristine.root, root / "site-packages")
    state = root / "state"
    try:  # the real command, as the tests' own `applied` fixture runs it
        main(["runtime", "apply", "--sglang-dir", str(site / "sglang"), "--state-dir", str(state)])
    except SystemExit as exc:
        assert not exc.code, f"runtime apply exited {exc.code}"
    _pristine.check("runtime apply")
    before = inv.scan(root)
    yield site / "sglang", state, stat_inventory(root)
    drift = inv.compare(inv.scan(root), before)
    assert drift.ok, f"a test of this session changed the shared applied tree: {drift.lines()}"


@pytest.fixture
def applied_shared(_applied_shared, _pristine, request):
    """``(package dir, state dir)`` of the shared applied tree. Read only: after the test the
    whole tree (package, dist-info and state) must hash as before, and the pristine one too."""
    pkg, state, before = _applied_shared
    yield pkg, state
    drift = stat_drift(stat_inventory(pkg.parent.parent), before)
    assert not drift, f"{request.node.nodeid} changed the shared applied tree: {drift}"
    _pristine.check(request.node.nodeid)
