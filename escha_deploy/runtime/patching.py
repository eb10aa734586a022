"""Apply the series (+ overlays) to an installed sglang, and verify it file by file.

Two-phase inventory: (a) the base, every file of the unpatched package; (b) the
deltas, the files the series changes or adds with their expected hashes. The deltas are always
computed by applying the patches to a clean copy of the base's files, never read back from the
tree being verified:

- at ``apply``, the clean copy is the tree itself before anything is written (it was first
  checked against the committed base inventory, or recorded when there is none);
- at ``verify``, it is the pristine copies ``apply`` saved under ``<state>/base-files`` (each
  checked against the base inventory's sha256 before use), or the wheel given with
  ``--base-wheel``.

The state directory (default ``/etc/escha``, beside ``runtime.json``) holds ``runtime.json``,
``base-inventory.json`` (only for a base with no committed inventory), ``base-files/``,
``overlays/`` (a copy of the applied overlays) and ``fork/`` (a copy of the imported fork
commits and their declaration, ``runtime import``).
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from escha_deploy.utils.errors import BadInput, Refused
from escha_deploy.runtime import inventory as inv
from escha_deploy.runtime.series import PACKAGE as PACKAGE_NAME
from escha_deploy.runtime.series import Patch, apply_series, capabilities_of, read_series

if TYPE_CHECKING:
    # imported where a description is built: the models import pydantic, which `verify` skips
    from escha_deploy.runtime.description import BuiltBase, RuntimeDescription, SeriesEntry

def series_dir(release: str | None = None) -> Path:
    """The series folder for SGLang ``release``: ``runtime_patches/`` (shipped in the wheel as
    ``escha_deploy/_data/runtime_patches``) for the release our series is made for
    (``releases.series_release``) and for ``None``; ``runtime_patches/<release>/`` for a release
    ``runtime rebase --onto`` wrote a series for. Raises ``Refused`` naming both releases when
    ``release`` has no series."""
    from escha_deploy.utils.paths import runtime_patches_dir

    root = runtime_patches_dir()
    if release is None:
        return root
    rebased = root / release
    if (rebased / "series").is_file():
        return rebased
    from escha_deploy.sglang.releases import series_release  # pydantic: not on `verify`'s path

    if release == series_release():
        return root
    raise Refused(
        f"no patch series for SGLang {release}: ours is made for {series_release()}"
        + (f" and rebased onto {', '.join(rebased_releases())}" if rebased_releases() else ""),
        hint=f"`escha-deploy runtime rebase --onto {release}` writes one (docs/runtime.md, "
        "\"Upgrading SGLang\")")


def rebased_releases() -> list[str]:
    """The releases with a series of their own under ``runtime_patches/<release>/``, sorted."""
    from escha_deploy.utils.paths import runtime_patches_dir

    root = runtime_patches_dir()
    return sorted(p.name for p in root.iterdir() if (p / "series").is_file())


def series_release_of(version: str | None) -> str | None:
    """The release whose series an install of sglang ``version`` gets: ``version`` when
    ``runtime_patches/<version>/`` holds a series, else ``None`` (the series our patches are
    made for, as before any rebase: its base inventory then tells a stock wheel of another
    release by its drift). An SGLang built from a commit (``0.5.23.post1.dev4+g...``) gets the
    series of its release prefix (``releases.nearest_release``'s rule)."""
    if version and version not in rebased_releases():
        import re

        m = re.match(r"v?(\d+\.\d+\.\d+)\.post\d+", version)
        version = m.group(1) if m else version
    return version if version and version in rebased_releases() else None


def _built_version(version: str | None) -> bool:
    """True for a PEP 440 version with more than ``X.Y.Z`` (``releases.is_built_version``; here
    without importing pydantic, which ``verify`` skips)."""
    import re

    return bool(version) and re.fullmatch(r"v?\d+\.\d+\.\d+", version or "") is None


def built_of(located: inv.Located) -> str | None:
    """The nearest release (``releases.nearest_release``) when the installed sglang's version is
    more than ``X.Y.Z`` (built from a commit; text that is no PEP 440 version is refused there),
    else None. Raises one line (exit 2 or 3)
    naming the package when that release cannot be told."""
    from escha_deploy.sglang.releases import nearest_release

    if not _built_version(located.version):  # a release (supported or not: its wheel's inventory tells)
        return None
    assert located.version is not None
    return nearest_release(located.version, f"{located.package_dir}")


def committed_base_path(tag: str | None, release: str | None = None) -> Path | None:
    """``base/<tag>.json`` of ``release``'s series folder (``series_dir``) when committed for
    this wheel tag, else ``None`` (also when the release has no series)."""
    if not tag:
        return None
    try:
        folder = series_dir(release)
    except Refused:
        return None
    p = folder / "base" / f"{tag}.json"
    return p if p.is_file() else None


def committed_inventories(release: str) -> list[Path]:
    """Every inventory committed for ``release``'s wheels (``base/*.json`` of its series folder,
    ``series_dir``); ``[]`` when the release has no series."""
    try:
        folder = series_dir(release)
    except Refused:
        return []
    return sorted((folder / "base").glob("*.json"))


def has_fork(fork_dir: Path | None) -> bool:
    """True when ``fork_dir`` holds imported ``*.patch`` files."""
    return fork_dir is not None and Path(fork_dir).is_dir() and any(Path(fork_dir).glob("*.patch"))


def fork_with_series(fork_dir: Path, release: str | None = None):
    """Our series for ``release`` (``series_dir``) and the fork commits of ``fork_dir``,
    resolved into one order (``fork.load_fork``)."""
    from escha_deploy.runtime.fork import load_fork as _load

    return _load(Path(fork_dir), read_series(series_dir(release), "series"))


def load_patches(overlay_dir: Path | None, fork_dir: Path | None = None,
                 release: str | None = None) -> list[Patch]:
    """Our series for ``release`` (``series_dir``; ``None``: the release it is made for),
    interleaved with the fork commits of ``fork_dir`` as its declaration orders them when
    there are any, then the overlays of ``overlay_dir`` (if given and present)."""
    if has_fork(fork_dir):
        patches = fork_with_series(fork_dir, release).order
    else:
        patches = read_series(series_dir(release), "series")
    if overlay_dir is not None and Path(overlay_dir).is_dir():
        patches += read_series(Path(overlay_dir), "overlay")
    names = [p.name for p in patches]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise BadInput(*[f"{overlay_dir}: overlay {n} has the name of a series patch" for n in dupes])
    return patches


def compute_deltas(patches: list[Patch], read_base) -> tuple[dict[str, inv.Entry | None],
                                                             dict[str, bytes | None]]:
    """``(deltas, contents)``: per touched path, ``(size, sha256)`` or ``None`` (deleted), and
    the patched bytes. ``read_base(rel)`` returns a clean base file's bytes or ``None``."""
    try:
        contents = apply_series(patches, read_base)
    except Refused as exc:
        if not any(p.source == "fork" for p in patches):
            raise
        from escha_deploy.sglang.releases import series_release

        fork_only = [p for p in patches if p.source == "fork"]
        try:  # the fork's commits alone, in their order, on this base: do they apply at all?
            apply_series(fork_only, read_base)
        except Refused:
            raise Refused(*exc.problems, hint=(
                "the fork's commits do not apply to this base even without our patches: they were made against "
                "another base than the one escha-fork.yaml names (release:, or parent: for an SGLang built from a "
                "commit); export them from that base (`git format-patch BASE..BRANCH`), or name the base they "
                "were made on (docs/runtime.md, 'Bring your fork')")) from None
        raise Refused(*exc.problems, hint=(
            f"a fork commit was made against stock {series_release()} and our patches too: where both change "
            "the same lines only one order (fork-first, ours-first) or a drop applies; set it "
            "under overlaps in escha-fork.yaml (docs/runtime.md, 'Bring your fork')")) from None
    deltas = {rel: (None if b is None else (len(b), inv.sha256_bytes(b)))
              for rel, b in contents.items()}
    return deltas, contents


def expected_inventory(base: dict[str, inv.Entry], deltas: dict[str, inv.Entry | None]
                       ) -> dict[str, inv.Entry]:
    """Base plus deltas: the inventory a correctly patched tree has."""
    out = dict(base)
    for rel, entry in deltas.items():
        if entry is None:
            out.pop(rel, None)
        else:
            out[rel] = entry
    return out


def base_id(located: inv.Located, base_ref: str | None) -> str:
    """``wheel:<tag>`` for a wheel install, else ``image:<ref>`` (``--base-ref``), else
    ``dir:<package dir>``."""
    if located.wheel_tag and not located.is_editable:
        return f"wheel:{located.wheel_tag}"
    if base_ref:
        return f"image:{base_ref}"
    return f"dir:{located.package_dir}"


def series_entry(p: Patch) -> SeriesEntry:
    """The description's record of one applied patch (a fork commit's provenance included)."""
    from escha_deploy.runtime.description import SeriesEntry

    h = p.header
    extra = {}
    if p.source == "fork":
        extra = {"commit": h.get("Commit"), "subject": h.get("Subject"), "author": h.get("From"),
                 "date": h.get("Date"),
                 "left_out": [x for x in h.get("Left-Out", "").split(", ") if x]}
    return SeriesEntry(name=p.name, source=p.source, sha256=p.sha256,
                       capabilities=list(p.capabilities), **extra)


def fork_label(patches: list[Patch]) -> str:
    """The ``io.escha.runtime.fork`` label: JSON list of ``{commit, subject, author, date}`` of
    the fork commits among ``patches``, in order (``""`` when none). Non-ASCII is kept.
    (Here, beside ``series_entry``, not in ``fork``: ``fork`` imports nothing of ``patching``.)"""
    from escha_deploy.runtime.description import fork_label_of

    return fork_label_of([series_entry(p) for p in patches])


@dataclass
class ApplyResult:
    description: RuntimeDescription
    deltas: dict[str, inv.Entry | None]
    base_files: int


def _remove_stale_pyc(package_dir: Path, rel: str) -> None:
    src = package_dir / rel
    cache = src.parent / "__pycache__"
    if src.suffix == ".py" and cache.is_dir():
        for pyc in cache.glob(f"{src.stem}.*.pyc"):
            pyc.unlink()


def _write_by_rename(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` through a temporary file in the same folder, then
    ``os.replace`` it over ``target`` (an atomic rename on POSIX).

    A reader (a server importing the package) never sees a half-written module, and a file
    that is hard-linked elsewhere keeps its old bytes there. The mode is the old file's, or
    0o666 less the umask for a new file (what ``Path.write_bytes`` would give).
    """
    from escha_deploy.utils.paths import replace_file

    replace_file(target, data)


def check_targets(pkg: Path, patches: list[Patch], paths) -> None:
    """Refuse, before anything is written, a target of ``paths`` (relative to the package
    folder ``pkg``) that is not a confined relative path (``relpaths.confine``: the parser
    already refuses those, this is the applier's own guard) or whose resolved location leaves
    ``pkg`` (a symbolic link inside the tree pointing out of it). Raises ``BadInput`` naming the
    patch file and the ``+++`` line that writes the path, one line per target."""
    from escha_deploy.utils.relpaths import confine

    where = {}
    for p in patches:
        for fp in p.files:
            for rel in (fp.old, fp.new):
                if rel is not None:
                    where.setdefault(rel, f"{p.name}:{fp.line}" if fp.line else p.name)
    root = Path(pkg).resolve()
    problems = []
    for rel in sorted(paths):
        at = where.get(rel, "the series")
        try:
            confine(rel, at, f"{PACKAGE_NAME}/")
        except BadInput as exc:
            problems.append(exc.message)
            continue
        target = (root / rel).resolve()
        if not target.is_relative_to(root):
            problems.append(f"{at}: {PACKAGE_NAME}/{rel} resolves to {target}, outside {root}")
    if problems:
        raise BadInput(*problems, hint="nothing was written; a patch may change only files of "
                       "the sglang package")


def _check_expected(value: str | None, actual: list[str], what: str) -> list[str]:
    if not value:  # not given (a plain `docker build` passes an empty build argument)
        return []
    want = [x for x in value.split(",") if x]
    if want != actual:
        return [f"build argument {what}={','.join(want)!r} but the series gives {','.join(actual)!r}"]
    return []


def apply(
    located: inv.Located,
    state_dir: Path,
    overlay_dir: Path | None = None,
    base_ref: str | None = None,
    expect_capabilities: str | None = None,
    expect_series: str | None = None,
    escha_version: str | None = None,
    fork_dir: Path | None = None,
    base_lock: Path | None = None,
) -> ApplyResult:
    """Patch the installed sglang in place, then verify it; write the state and description.

    Raises ``Refused`` when the base drifts from its committed inventory (paths named), a hunk
    does not apply (patch, file and hunk named; nothing is written then), the build arguments
    disagree with the series, or the result fails verification. ``BadInput`` for a malformed
    patch or overlay.
    """
    pkg = located.package_dir
    nearest = built_of(located)  # before anything is read or written: a version no rule places
    lock = None
    if base_lock is not None:
        from escha_deploy.runtime.lock import read_lock

        lock = read_lock(base_lock)
    base = inv.scan(pkg)
    if lock is not None:  # the pinned tree, file by file, before anything is written
        lock.check_tree(base, located.version, str(pkg))
    release = series_release_of(located.version)
    # a commit-built tree is not the stock wheel its tag names: never checked against its inventory
    committed = None if nearest else committed_base_path(located.wheel_tag, release)
    if committed is not None:
        _, committed_files = inv.read_inventory(committed)
        drift = inv.compare(base, committed_files)
        if not drift.ok:
            raise Refused(
                *[f"base drift against {committed.name}: {line}" for line in drift.lines()],
                hint="the installed sglang is not the stock wheel (already patched? then run "
                "`escha-deploy runtime verify`)",
            )
    base_digest = inv.digest(base)
    if lock is not None:
        print(f"base: {pkg} matches {lock.path} ({len(base)} files, digest {base_digest[:12]})", file=sys.stderr)
    elif nearest is not None:
        from escha_deploy.runtime.lock import DEFAULT_LOCK

        print(f"SGLang {located.version} is built from a commit and no lock file pins it: its inventory is "
              f"recorded as found; pin it beforehand with `escha-deploy runtime lock --sglang-dir {pkg} --output "
              f"{DEFAULT_LOCK}`", file=sys.stderr)
    if committed is None and lock is None:
        print(f"no committed base inventory for {base_id(located, base_ref)}: recorded the one "
              f"found, digest {base_digest}", file=sys.stderr)

    if has_fork(fork_dir):
        from escha_deploy.runtime.fork import check_fork_base

        check_fork_base(Path(fork_dir), located.version, base_digest, str(pkg))  # type: ignore[arg-type]
    fork = fork_with_series(fork_dir, release) if has_fork(fork_dir) else None
    patches = load_patches(overlay_dir, fork_dir, release)
    names = [p.name for p in patches]
    caps = capabilities_of(patches)
    problems = (_check_expected(expect_capabilities, caps, "capabilities")
                + _check_expected(expect_series, names, "series"))
    if problems:
        raise Refused(*problems)

    def read_base(rel: str) -> bytes | None:
        return (pkg / rel).read_bytes() if rel in base else None

    deltas, contents = compute_deltas(patches, read_base)  # raises before anything is written
    check_targets(pkg, patches, contents)  # every target inside the tree, before the first write

    state_dir = Path(state_dir)
    saved = state_dir / "base-files"
    if saved.exists():
        shutil.rmtree(saved)
    for rel in contents:
        if rel in base:
            dst = saved / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(pkg / rel, dst)
    recorded = state_dir / "base-inventory.json"
    if committed is None:  # a committed base is read from runtime_patches/base at verify time
        inv.write_inventory(recorded, base_id(located, base_ref), located.version, base)
    else:
        recorded.unlink(missing_ok=True)
    ov_copy = state_dir / "overlays"
    if ov_copy.exists():
        shutil.rmtree(ov_copy)
    if overlay_dir is not None and Path(overlay_dir).is_dir() and any(
            p.source == "overlay" for p in patches):
        shutil.copytree(overlay_dir, ov_copy)
    fork_copy = state_dir / "fork"
    if fork_copy.exists():
        shutil.rmtree(fork_copy)
    if fork is not None:
        shutil.copytree(fork_dir, fork_copy)

    for rel, data in contents.items():
        target = pkg / rel
        _remove_stale_pyc(pkg, rel)
        if data is None:
            target.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            _write_by_rename(target, data)

    expected = expected_inventory(base, deltas)
    drift = inv.compare(inv.scan(pkg), expected)
    if not drift.ok:
        raise Refused(*drift.lines())
    from escha_deploy.runtime.description import RuntimeDescription

    desc = RuntimeDescription(
        built=built_base(located, nearest, base, lock),
        sglang_version=located.version,
        base=base_id(located, base_ref),
        base_inventory_digest=base_digest,
        base_inventory_committed=committed is not None,
        python=located.python,
        sglang_dir=str(pkg),
        series=[series_entry(p) for p in patches],
        dropped=fork.dropped if fork is not None else [],
        capabilities=caps,
        inventory_digest=inv.digest(expected),
        escha_version=escha_version,
    )
    return ApplyResult(desc, deltas, len(base))


def built_base(located: inv.Located, nearest: str | None, base: dict[str, inv.Entry], lock) -> BuiltBase | None:
    """The description's record of a commit-built base (``built_of``: ``nearest`` its nearest
    release, None for a release), with what differs from that release (``lock.nearest_findings``)."""
    if nearest is None or located.version is None:
        return None
    from escha_deploy.runtime.description import BuiltBase
    from escha_deploy.runtime.lock import nearest_findings
    from escha_deploy.sglang.releases import built_commit

    found = nearest_findings(base, nearest, committed_inventories(nearest), lock.parser if lock is not None else None)
    return BuiltBase(version=located.version, commit=(lock.commit if lock is not None else None)
                     or built_commit(located.version), nearest_release=nearest,
                     lock_digest=lock.digest if lock is not None else None,
                     lock_file=lock.path.name if lock is not None else None,
                     differs=found.differs, differs_count=found.differs_count, unchecked=found.unchecked,
                     parser_differs=found.parser, parser_read=lock is not None and lock.parser is not None)


@dataclass
class VerifyResult:
    drift: inv.Drift
    files: int
    expected_digest: str
    base: str
    deltas: dict[str, inv.Entry | None]


def recorded_series(path: Path) -> list[tuple[str, str]] | None:
    """``[(patch file name, sha256 hex)]`` from the ``series`` of the ``runtime.json`` that
    ``runtime apply`` wrote (``RuntimeDescription.series``); ``None`` when ``path`` does not exist.

    Reads only the two fields ``verify`` compares, with ``json`` rather than the
    ``RuntimeDescription`` model: building that model imports pydantic's model machinery, about
    0.1 s of a 0.3 s ``verify`` on a 2-core machine (docs/performance.md). Raises ``BadInput``
    naming the file (and the entry) when the file is not JSON or an entry lacks a string name or
    sha256.
    """
    from escha_deploy.utils.jsonio import loads_json, read_regular

    path = Path(path)
    raw = read_regular(path, "the runtime description", missing_ok=True)
    if raw is None:
        return None
    doc = loads_json(raw, path, "the runtime description")
    series = doc.get("series", []) if isinstance(doc, dict) else None
    if not isinstance(series, list):
        raise BadInput(f"{path}: not a runtime description (series: expected a list)")
    out = []
    for i, entry in enumerate(series):
        name = entry.get("name") if isinstance(entry, dict) else None
        sha = entry.get("sha256") if isinstance(entry, dict) else None
        if not (isinstance(name, str) and isinstance(sha, str)):
            raise BadInput(f"{path}: not a runtime description "
                           f"(series.{i}: expected an object with string name and sha256)")
        out.append((name, sha))
    return out


def verify(
    located: inv.Located,
    state_dir: Path,
    recorded: list[tuple[str, str]] | None = None,
    overlay_dir: Path | None = None,
    base_wheel: Path | None = None,
    fork_dir: Path | None = None,
    base_lock: Path | None = None,
) -> VerifyResult:
    """Compare the installed tree with base + deltas. Returns the drift (empty when equal).

    Base inventory: the committed one for the installed wheel tag, else
    ``<state>/base-inventory.json``. Clean base files: ``base_wheel`` when given, else
    ``<state>/base-files``. Overlays: ``overlay_dir``, else ``<state>/overlays``; fork commits:
    ``fork_dir``, else ``<state>/fork``. ``recorded``: the series ``runtime apply`` recorded
    (``recorded_series``); when given, the patches found now must equal it. Raises
    ``Refused`` when no base inventory or clean copy is available, a clean copy does not match
    the base inventory, or the patches differ from those the description records.
    """
    state_dir = Path(state_dir)
    committed = None if _built_version(located.version) else committed_base_path(
        located.wheel_tag, series_release_of(located.version))
    if base_lock is not None:  # the pinned base: the one recorded at apply must be it
        from escha_deploy.runtime.lock import read_lock

        lock = read_lock(base_lock)
        applied_base = state_dir / "base-inventory.json"
        if applied_base.is_file():
            drift = inv.compare(inv.read_inventory(applied_base)[1], lock.files)
            if not drift.ok:
                raise Refused(*[f"{lock.path}: the base applied was not this lock's: {line}" for line in drift.lines()],
                              hint="apply again on the pinned tree (`escha-deploy runtime apply --base-lock FILE`)")
        header, base = {"base": f"lock:{lock.path.name}"}, lock.files
    elif committed is not None:
        header, base = inv.read_inventory(committed)
    elif (state_dir / "base-inventory.json").is_file():
        header, base = inv.read_inventory(state_dir / "base-inventory.json")
    else:
        raise Refused(
            f"no base inventory: none committed for {located.wheel_tag or located.package_dir} "
            f"and no {state_dir / 'base-inventory.json'}",
            hint="run `escha-deploy runtime apply` first (it records the base)",
        )
    if overlay_dir is None and (state_dir / "overlays").is_dir():
        overlay_dir = state_dir / "overlays"
    if fork_dir is None and (state_dir / "fork").is_dir():
        fork_dir = state_dir / "fork"
    if has_fork(fork_dir):
        from escha_deploy.runtime.fork import check_fork_base

        check_fork_base(Path(fork_dir), located.version, inv.digest(base),  # type: ignore[arg-type]
                        str(located.package_dir))
    patches = load_patches(overlay_dir, fork_dir, series_release_of(located.version))
    if recorded is not None:
        now = [(p.name, p.sha256) for p in patches]
        if recorded != now:
            raise Refused(
                f"the patches differ from those applied: recorded "
                f"{', '.join(n for n, _ in recorded) or 'none'}; now "
                f"{', '.join(n for n, _ in now)} (or their bytes changed)",
            )

    if base_wheel is not None:
        def read_base(rel: str) -> bytes | None:
            return inv.read_wheel_file(base_wheel, rel)
    else:
        saved = state_dir / "base-files"

        def read_base(rel: str) -> bytes | None:
            if rel not in base:
                return None
            p = saved / rel
            if not p.is_file():
                raise Refused(f"no clean copy of sglang/{rel} under {saved}",
                              hint="pass --base-wheel with the stock wheel")
            data = p.read_bytes()
            if (len(data), inv.sha256_bytes(data)) != base[rel]:
                raise Refused(f"{p}: clean copy does not match the base inventory")
            return data

    deltas, _ = compute_deltas(patches, read_base)
    expected = expected_inventory(base, deltas)
    actual = inv.scan(located.package_dir)
    return VerifyResult(inv.compare(actual, expected), len(actual), inv.digest(expected),
                        str(header.get("base")), deltas)
