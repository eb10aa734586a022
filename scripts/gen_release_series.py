#!/usr/bin/env python3
"""Write our patch series rebased onto each SGLang release that has a ``rebase.yaml``.

What it writes: ``runtime_patches/<release>/`` (``series``, the patches, ``base/<wheel
tag>.json``, ``deltas.json``) for each release folder of ``escha_deploy/catalog/releases/``
holding a ``rebase.yaml``, by ``escha-deploy runtime rebase --onto <release>`` on that release's
wheel (``sglang-<release>-cp311-*.whl`` in ``.cache/wheels``, or ``--wheels DIR``). Each hunk of
our series (``runtime_patches/*.patch``, made for the release ``index.yaml`` names as
``series_made_for``) is carried over, found where it moved, or taken from ``rebase.yaml``;
each rebased patch records the outcome and the reason per hunk. Review the diff.

Usage::

    python scripts/gen_release_series.py            # rewrite every rebased series
    python scripts/gen_release_series.py --check    # exit 1 naming each stale file

Exit codes: 0 written or up to date; 1 stale; 2 bad usage or a wheel missing.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RELEASES = REPO / "escha_deploy" / "catalog" / "releases"
SERIES = REPO / "runtime_patches"


def rebased() -> list[str]:
    """The releases with a ``rebase.yaml``, sorted."""
    return sorted(p.parent.name for p in RELEASES.glob("*/rebase.yaml"))


def wheel_for(release: str, wheels: Path) -> Path | None:
    found = sorted(wheels.glob(f"sglang-{release}-cp311-*.whl"))
    return found[0] if found else None


def write(release: str, wheel: Path, out: Path) -> int:
    """``runtime rebase --onto`` into ``out``; its exit code."""
    import contextlib
    import io

    from escha_deploy.cli.main import main as cli

    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the per-hunk table: in the patches
            cli(["runtime", "rebase", "--onto", release, "--wheel", str(wheel), "--output", str(out)])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def stale_files(fresh: Path, committed: Path) -> list[str]:
    """Files that differ between the two folders (both ways, ``base/`` included)."""
    names = {p.relative_to(fresh).as_posix() for p in fresh.rglob("*") if p.is_file()}
    names |= {p.relative_to(committed).as_posix() for p in committed.rglob("*") if p.is_file()}
    return sorted(n for n in names if not ((fresh / n).is_file() and (committed / n).is_file()
                                           and filecmp.cmp(fresh / n, committed / n, shallow=False)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare, write nothing")
    ap.add_argument("--wheels", type=Path, default=REPO / ".cache" / "wheels")
    args = ap.parse_args(argv)
    stale: list[str] = []
    for release in rebased():
        wheel = wheel_for(release, args.wheels)
        if wheel is None:
            print(f"error: no sglang-{release}-cp311-*.whl in {args.wheels}", file=sys.stderr)
            return 2
        if not args.check:
            rc = write(release, wheel, SERIES / release)
            if rc:
                return rc
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / release
            rc = write(release, wheel, out)
            if rc:
                return rc
            stale += [f"runtime_patches/{release}/{n}" for n in stale_files(out, SERIES / release)]
    if stale:
        print(f"stale: {', '.join(stale)}: run scripts/gen_release_series.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
