"""``runtime rebase --check VERSION``: which of our patches (and a fork's commits) apply to
another SGLang release's wheel, which fail (file and hunk), which that release already has.

Read-only: the wheel is read as a zip (``sglang/...`` members), nothing is installed or
imported. Each chain is checked in its order on the wheel's files: our series (each patch on
the files as the patches before it that apply left them), and a fork's ``git format-patch``
commits (their own chain: a fork is a branch on the release tag, not on our series). Hunks
match as ``runtime apply`` matches them (``series.py``: byte for byte, at the recorded line or
an offset, as ``git apply`` does), so a patch this check passes is one ``runtime apply``
applies. A patch is ``already`` in the release when it does not apply and its reverse does
(every hunk's new lines are there).
"""

from __future__ import annotations

import dataclasses
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from escha_deploy.utils.errors import BadInput
from escha_deploy.runtime.series import PACKAGE, FilePatch, Hunk, Patch, _find

Status = Literal["applies", "fails", "already"]


@dataclass(frozen=True)
class HunkFailure:
    """One hunk that does not apply: ``file`` relative to the sglang package, ``hunk`` its
    1-based number in that file's diff (0: the file itself is missing, or exists for a create)."""

    file: str
    hunk: int
    header: str
    why: str

    def line(self) -> str:
        where = f"hunk #{self.hunk} {self.header}" if self.hunk else "the file"
        return f"{PACKAGE}/{self.file}: {where}: {self.why}"


@dataclass(frozen=True)
class Verdict:
    """One patch or commit against the release: ``status`` and, when it fails, each hunk."""

    name: str
    source: str  # series | fork
    label: str
    status: Status
    failures: tuple[HunkFailure, ...] = ()
    files: tuple[str, ...] = ()


@dataclass
class RebaseCheck:
    release: str
    wheel: str
    verdicts: list[Verdict] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # fork files that are not checkable commits

    @property
    def ok(self) -> bool:
        return not self.unreadable and all(v.status == "applies" for v in self.verdicts)


def _try(fp: FilePatch, content: bytes | None) -> tuple[bytes | None, list[HunkFailure]]:
    """Apply every hunk of ``fp`` that matches (a failing hunk is reported and skipped)."""
    if fp.old is None and content is not None:
        return content, [HunkFailure(fp.path, 0, "", "creates a file that the release already has")]
    if fp.old is not None and content is None:
        return None, [HunkFailure(fp.path, 0, "", "the release has no such file")]
    lines = (content or b"").splitlines(keepends=True)
    offset, failures = 0, []
    for k, h in enumerate(fp.hunks, 1):
        start = h.old_start - 1 if h.old else h.old_start
        pos = _find(lines, h.old, start + offset)
        if pos is None:
            failures.append(HunkFailure(fp.path, k, h.header, "its context is not in the release's file"))
            continue
        lines[pos:pos + len(h.old)] = list(h.new)
        offset = pos - start + len(h.new) - len(h.old)
    if fp.new is None:
        return None, failures
    return b"".join(lines), failures


def _reverse(fp: FilePatch) -> FilePatch:
    return FilePatch(old=fp.new, new=fp.old,
                     hunks=tuple(Hunk(h.header, h.old_start, h.new, h.old) for h in fp.hunks))


def check_chain(patches: list[Patch], read: Callable[[str], bytes | None], label: Callable[[Patch], str]) -> list[Verdict]:
    """Each patch of the chain against ``read`` (the release's files), in order."""
    state: dict[str, bytes | None] = {}

    def current(path: str | None) -> bytes | None:
        if path is None:
            return None
        if path not in state:
            state[path] = read(path)
        return state[path]

    out = []
    for p in patches:
        results, failures = {}, []
        for fp in p.files:
            new, bad = _try(fp, current(fp.old if fp.old else fp.new))
            results[fp.path] = new
            failures += bad
        files = tuple(fp.path for fp in p.files)
        if not failures:
            state.update(results)
            out.append(Verdict(p.name, p.source, label(p), "applies", files=files))
            continue
        already = all(not _try(_reverse(fp), current(fp.path))[1] for fp in p.files)
        out.append(Verdict(p.name, p.source, label(p), "already" if already else "fails",
                           () if already else tuple(failures), files))
    return out


def wheel_reader(wheel: Path) -> Callable[[str], bytes | None]:
    """``read(path)``: the bytes of ``sglang/<path>`` in the wheel, or None when absent."""
    zf = zipfile.ZipFile(wheel)
    names = set(zf.namelist())

    def read(path: str) -> bytes | None:
        member = f"{PACKAGE}/{path}"
        return zf.read(member) if member in names else None

    return read


def find_wheel(version: str, wheel: Path | None) -> Path:
    """The wheel to check: ``wheel`` (``--wheel``), else ``sglang-VERSION-*.whl`` in the current
    folder or ``.cache/wheels``. ``BadInput`` when none is found or the file is another release."""
    if wheel is None:
        found = sorted(Path.cwd().glob(f"sglang-{version}-*.whl")) + sorted(
            (Path.cwd() / ".cache" / "wheels").glob(f"sglang-{version}-*.whl"))
        if not found:
            raise BadInput(f"--wheel: no sglang-{version}-*.whl here or in .cache/wheels",
                           hint=f"download it: pip download --no-deps sglang=={version}")
        wheel = found[0]
    if not wheel.is_file():
        raise BadInput(f"--wheel: {wheel}: no such file")
    parts = wheel.name.split("-")
    if len(parts) < 3 or parts[0] != PACKAGE or not wheel.name.endswith(".whl"):
        raise BadInput(f"--wheel: {wheel}: not an sglang wheel (sglang-X.Y.Z-....whl)")
    if parts[1] != version:
        raise BadInput(f"--wheel: {wheel.name} is sglang {parts[1]}, not {version}")
    try:
        zipfile.ZipFile(wheel).close()
    except zipfile.BadZipFile:
        raise BadInput(f"--wheel: {wheel}: not a zip file") from None
    return wheel


def rebase_check(version: str, wheel: Path | None, series: list[Patch], fork_dir: Path | None) -> RebaseCheck:
    """Check ``series`` and the commits in ``fork_dir`` (``git format-patch`` files) against
    the release's wheel (``find_wheel``)."""
    from escha_deploy.runtime.fork import fork_patch_files, read_commit

    path = find_wheel(version, wheel)
    read = wheel_reader(path)
    result = RebaseCheck(release=version, wheel=str(path))
    result.verdicts += check_chain(series, read, lambda p: p.name)
    if fork_dir is not None:
        if not Path(fork_dir).is_dir():
            raise BadInput(f"--fork-dir: {fork_dir}: not a folder")
        commits = []
        for f in fork_patch_files(fork_dir):
            commit, problems = read_commit(f)
            if commit is None or problems:
                result.unreadable += problems or [f"{f.name}: not a commit"]
                if commit is None:
                    continue
            commits.append(commit)
        if not commits and not result.unreadable:
            raise BadInput(f"--fork-dir: {fork_dir}: no *.patch files (`git format-patch vX.Y.Z..BRANCH -o DIR`)")
        labels = {c.file: c.label() for c in commits}
        result.verdicts += check_chain([c.patch(()) for c in commits], read, lambda p: labels[p.name])
    return result


# --- runtime rebase --onto VERSION: a series for another release, re-derived hunk by hunk -----

#: The per-release file that says, for each hunk of our series that cannot be carried over as
#: it is, what the target release needs instead (``catalog/releases/<release>/rebase.yaml``).
RESOLUTIONS = "rebase.yaml"

Outcome = Literal["applies", "moved", "already", "ported", "dropped"]


@dataclass(frozen=True)
class Resolution:
    """One hunk's hand-made answer for the target release: ``drop`` it (the release already
    does what it did, or needs nothing there), or make its ``edits``: each replaces text that
    is exactly once in the release's file (as the hunks before left it) with new text. ``why`` is the reason, written into the rebased patch."""

    patch: str
    file: str
    hunk: int
    why: str
    drop: bool = False
    edits: tuple[tuple[str, str], ...] = ()  # (replace, with): text of the release, exact
    where: str = ""  # rebase.yaml:entry, for errors


@dataclass(frozen=True)
class HunkOutcome:
    """What became of one hunk of the source series on the target release, and why."""

    file: str
    hunk: int
    header: str
    outcome: Outcome
    why: str

    def line(self) -> str:
        return f"{PACKAGE}/{self.file} hunk #{self.hunk} {self.header}: {self.outcome}: {self.why}"


@dataclass
class RebasedPatch:
    name: str
    source_sha256: str
    text: bytes
    outcomes: list[HunkOutcome]


@dataclass
class RebasedSeries:
    release: str
    source_release: str
    wheel: str
    patches: list[RebasedPatch]


def load_resolutions(path: Path) -> list[Resolution]:
    """The entries of a ``rebase.yaml`` (a missing file: none). Each entry: ``patch``, ``file``
    (relative to the sglang package), ``hunk`` (1-based, as ``runtime rebase --check`` numbers
    them), ``why``, and either ``drop: true`` or ``edits`` (a list of ``replace`` + ``with``
    texts; ``replace`` exact and once in the file). Raises
    ``BadInput`` naming the file and the entry for anything else."""
    import yaml

    if not path.is_file():
        return []
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: not YAML: {str(exc).splitlines()[0]}") from None
    entries = doc.get("hunks") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise BadInput(f"{path}: expected a mapping with a list 'hunks'")
    out, problems = [], []
    keys = {"patch", "file", "hunk", "why", "drop", "edits"}
    for i, e in enumerate(entries):
        where = f"{path}: hunks[{i}]"
        if not isinstance(e, dict):
            problems.append(f"{where}: expected a mapping")
            continue
        extra = sorted(set(e) - keys)
        if extra:
            problems.append(f"{where}: unknown keys {', '.join(map(str, extra))}")
        bad = [k for k in ("patch", "file", "why") if not isinstance(e.get(k), str) or not e.get(k)]
        if bad or not isinstance(e.get("hunk"), int) or isinstance(e.get("hunk"), bool) or e["hunk"] < 1:
            problems.append(f"{where}: needs patch, file, why (text) and hunk (a number >= 1)")
            continue
        drop = e.get("drop", False) is True
        edits = e.get("edits")
        good = isinstance(edits, list) and bool(edits) and all(
            isinstance(x, dict) and set(x) == {"replace", "with"} and isinstance(x["replace"], str)
            and x["replace"] and isinstance(x["with"], str) for x in edits)
        if drop == good or (edits is not None and not good):
            problems.append(f"{where}: give either 'drop: true' or 'edits' (a list of "
                            "'replace' + 'with' texts, 'replace' not empty)")
            continue
        out.append(Resolution(e["patch"], e["file"], e["hunk"], " ".join(e["why"].split()), drop,
                              tuple((x["replace"], x["with"]) for x in edits or ()), where))
    if problems:
        raise BadInput(*problems)
    return out


def _context_edges(h: Hunk) -> tuple[int, int]:
    """How many lines a hunk's old and new sides share at their start and at their end."""
    lead = 0
    while lead < min(len(h.old), len(h.new)) and h.old[lead] == h.new[lead]:
        lead += 1
    trail = 0
    while (trail < min(len(h.old), len(h.new)) - lead
           and h.old[len(h.old) - 1 - trail] == h.new[len(h.new) - 1 - trail]):
        trail += 1
    return lead, trail


def _trims(lead: int, trail: int) -> list[tuple[int, int]]:
    """``(before, after)`` context lines to keep, most context first, never the full context
    (it failed) and never none (a change with no context has no place)."""
    out = [(b, a) for b in range(lead + 1) for a in range(trail + 1)
           if 0 < b + a and (b, a) != (lead, trail)]
    return sorted(out, key=lambda t: (-(t[0] + t[1]), -min(t)))


def _unique(lines: list[bytes], block: tuple[bytes, ...]) -> int | None:
    """The one position where ``block`` (non-empty) matches ``lines``; None for none or several."""
    n = len(block)
    hits = [i for i in range(len(lines) - n + 1) if tuple(lines[i:i + n]) == block]
    return hits[0] if len(hits) == 1 else None


def _rebase_file(patch: str, fp: FilePatch, content: bytes | None,
                 resolutions: dict[int, Resolution]) -> tuple[bytes | None, list[HunkOutcome]]:
    """The release's file with each hunk of ``fp`` re-derived on it, and each hunk's outcome."""
    if fp.old is None:
        new = b"".join(fp.hunks[0].new) if fp.hunks else b""
        if content == new:
            return new, [HunkOutcome(fp.path, 1, fp.hunks[0].header, "already",
                                     "the release has this file, byte for byte")]
        if content is not None:
            raise BadInput(f"{patch}: {PACKAGE}/{fp.path}: creates a file the release already has")
        return new, [HunkOutcome(fp.path, 1, fp.hunks[0].header, "applies", "a new file, absent from the release")]
    if content is None:
        raise BadInput(f"{patch}: {PACKAGE}/{fp.path}: the release has no such file "
                       f"(write where it moved in {RESOLUTIONS})")
    lines = content.splitlines(keepends=True)
    outcomes = []
    offset = 0
    for k, h in enumerate(fp.hunks, 1):
        o = HunkOutcome(fp.path, k, h.header, "applies", "")
        res = resolutions.get(k)
        if res is not None and res.drop:
            outcomes.append(dataclasses.replace(o, outcome="dropped", why=res.why))
            continue
        if res is not None:
            for n, (replace, with_) in enumerate(res.edits):
                old = tuple(replace.encode().splitlines(keepends=True))
                pos = _unique(lines, old)
                if pos is None:
                    raise BadInput(f"{res.where}.edits[{n}]: its 'replace' text is not exactly "
                                   f"once in the release's {PACKAGE}/{fp.path}")
                lines[pos:pos + len(old)] = with_.encode().splitlines(keepends=True)
            outcomes.append(dataclasses.replace(o, outcome="ported", why=res.why))
            continue
        start = h.old_start - 1 if h.old else h.old_start
        pos = _find(lines, h.old, start + offset)
        if pos is not None:
            lines[pos:pos + len(h.old)] = list(h.new)
            moved = pos - start
            offset = moved + len(h.new) - len(h.old)
            outcomes.append(dataclasses.replace(o, why=f"its context is in the release's file at "
                                                f"line {pos + 1}" + (f" ({moved:+d} lines)" if moved else "")))
            continue
        if h.new and _find(lines, h.new, start + offset) is not None:
            outcomes.append(dataclasses.replace(
                o, outcome="already", why="the release's file already has its new lines"))
            continue
        lead, trail = _context_edges(h)
        found = None
        for before, after in _trims(lead, trail):  # the full context failed: trim it
            old = h.old[lead - before:len(h.old) - trail + after]
            pos = _unique(lines, old)
            if pos is not None:
                found = (pos, old, h.new[lead - before:len(h.new) - trail + after], before, after)
                break
        if found is not None:
            pos, old, new, before, after = found
            lines[pos:pos + len(old)] = list(new)
            outcomes.append(dataclasses.replace(
                o, outcome="moved", why=f"the release changed the lines around it; its change with "
                f"{before} line(s) of its context before and {after} after is once in the file, "
                f"at line {pos + 1}"))
        else:
            raise BadInput(f"{patch}: {PACKAGE}/{fp.path}: hunk #{k} {h.header}: neither it nor its "
                           f"change alone is in the release's file; say what the release needs "
                           f"in {RESOLUTIONS} (patch, file, hunk {k}: drop, or replace + with)")
    return b"".join(lines), outcomes


def _diff(rel: str, before: bytes | None, after: bytes) -> bytes:
    """A unified diff (3 lines of context, ``a/sglang/...``/``b/sglang/...``) of one file."""
    import difflib

    a = (before or b"").splitlines(keepends=True)
    b = after.splitlines(keepends=True)
    if (a and not a[-1].endswith(b"\n")) or (b and not b[-1].endswith(b"\n")):
        raise BadInput(f"{PACKAGE}/{rel}: no newline at the end of the file; the rebase writes "
                       "only files that end with one")
    old_name = b"/dev/null" if before is None else f"a/{PACKAGE}/{rel}".encode()
    out = difflib.diff_bytes(difflib.unified_diff, a, b, old_name, f"b/{PACKAGE}/{rel}".encode(),
                             b"", b"", n=3)
    return b"".join(line if line.endswith(b"\n") else line + b"\n" for line in out)


def rebase_onto(version: str, wheel: Path | None, series: list[Patch], source_release: str,
                resolutions: list[Resolution]) -> RebasedSeries:
    """Our ``series`` (made for ``source_release``) re-derived on SGLang ``version``'s wheel.

    Each hunk, in order, on the release's file as the hunks before it left it: a
    ``resolutions`` entry for it wins (``dropped`` or ``ported`` with its reason); else it
    ``applies`` (its context at the recorded line or an offset), is ``already`` there (its new
    lines are), or ``moved`` (its context changed around it: the change with 1 to
    ``context - 1`` lines either side is found exactly once). Anything else raises
    ``BadInput`` naming the hunk, and so does a resolution that names no hunk of the series or
    whose text is not in the release. Each rebased patch is the diff of the release's files
    before and after it, with the source patch's header and one ``Rebase-Hunk:`` line per
    hunk. The result is checked: applying the rebased patches with ``runtime apply``'s applier
    gives the same files. Pure apart from reading the wheel.
    """
    path = find_wheel(version, wheel)
    read = wheel_reader(path)
    by_hunk: dict[tuple[str, str, int], Resolution] = {}
    for r in resolutions:
        by_hunk[(r.patch, r.file, r.hunk)] = r
    known = {(p.name, fp.path, k) for p in series for fp in p.files for k in range(1, len(fp.hunks) + 1)}
    stray = [f"{r.where}: {r.patch} {r.file} hunk {r.hunk} is not a hunk of the series"
             for r in resolutions if (r.patch, r.file, r.hunk) not in known]
    if stray:
        raise BadInput(*stray)
    state: dict[str, bytes | None] = {}

    def current(rel: str) -> bytes | None:
        if rel not in state:
            state[rel] = read(rel)
        return state[rel]

    out = []
    for p in series:
        outcomes: list[HunkOutcome] = []
        body = b""
        for fp in p.files:
            before = current(fp.path)
            after, o = _rebase_file(p.name, fp, before, {k: r for (n, f, k), r in by_hunk.items()
                                                         if n == p.name and f == fp.path})
            outcomes += o
            if after is None:
                raise BadInput(f"{p.name}: {PACKAGE}/{fp.path}: the rebase does not delete files")
            if after != before:
                body += _diff(fp.path, before, after)
            state[fp.path] = after
        header = _rebased_header(p, source_release, version, outcomes)
        # a patch whose every change the release has is left out of the series (text empty)
        out.append(RebasedPatch(p.name, p.sha256, header + body if body else b"", outcomes))
    from escha_deploy.runtime.series import apply_series, parse_patch

    again = apply_series([parse_patch(r.text, r.name) for r in out if r.text], read)
    wrong = sorted(k for k, v in again.items() if v != state.get(k))
    if wrong:  # the diffs written must rebuild what the rebase made, or nothing is written
        raise BadInput(*[f"rebased series: {PACKAGE}/{k} does not apply back to what the rebase made"
                         for k in wrong])
    return RebasedSeries(version, source_release, str(path), out)


def _rebased_header(p: Patch, source_release: str, version: str, outcomes: list[HunkOutcome]) -> bytes:
    """The source patch's header lines (up to its first ``--- ``), then the rebase record."""
    lines = []
    for raw in p.header_text.splitlines():
        lines.append(raw)
    while lines and not lines[-1].strip():
        lines.pop()
    lines += ["", f"Rebased: from {p.name} for SGLang {source_release} (sha256 {p.sha256}) onto "
              f"SGLang {version} by `escha-deploy runtime rebase --onto {version}`; per hunk:"]
    lines += [f"Rebase-Hunk: {o.line()}" for o in outcomes]
    return ("\n".join(lines) + "\n\n").encode()


def write_rebased(result: RebasedSeries, out: Path) -> list[Path]:
    """Write a rebased series into the folder ``out`` (made when missing; its parent must
    exist): the ``series`` file, each patch, ``base/<wheel tag>.json`` (the inventory of the
    release's wheel: ``runtime apply`` checks an install against it) and ``deltas.json`` (the
    files the series changes or adds, with ``[size, sha256]`` after patching, computed by
    applying the written patches to the wheel). Patches of an earlier run that the series no
    longer names are removed. Returns the files written."""
    from escha_deploy.utils.paths import output_folder, write_output
    from escha_deploy.runtime import inventory as inv
    from escha_deploy.runtime.series import read_series

    wheel = Path(result.wheel)
    output_folder(out, "--output")
    for old in out.glob("*.patch"):
        if old.name not in {p.name for p in result.patches if p.text}:
            old.unlink()
    written = []
    series = (f"# The escha-deploy patch series rebased onto sglang {result.release} from the one "
              f"for {result.source_release} (runtime rebase --onto {result.release}), applied in "
              "this order (runtime apply).\n"
              + "".join(f"{p.name}\n" if p.text else f"# {p.name}: left out, sglang "
                        f"{result.release} has every change it made\n" for p in result.patches))
    write_output(out / "series", series, "--output")
    written.append(out / "series")
    for p in result.patches:
        if not p.text:
            continue
        write_output(out / p.name, p.text, "--output")
        written.append(out / p.name)
    tag, files = inv.scan_wheel(wheel)
    output_folder(out / "base", "--output")
    text, _ = inv.inventory_text(f"wheel:{tag}", inv.wheel_version(wheel), files)
    write_output(out / "base" / f"{tag}.json", text, "--output")
    written.append(out / "base" / f"{tag}.json")
    from escha_deploy.runtime.patching import compute_deltas

    deltas, _ = compute_deltas(read_series(out), lambda rel: inv.read_wheel_file(wheel, rel))
    doc = {"schema_version": 1,
           "comment": f"Files the series changes or adds, relative to the sglang package, with "
                      f"[size, sha256] after patching the sglang {result.release} {tag} wheel. "
                      f"Written by `escha-deploy runtime rebase --onto {result.release}` "
                      "(scripts/gen_release_series.py); tests/runtime/test_rebase_onto.py checks it.",
           "bases": [f"wheel:{tag}"],
           "deltas": {k: list(v) if v else None for k, v in sorted(deltas.items())}}
    import json

    write_output(out / "deltas.json", json.dumps(doc, indent=1) + "\n", "--output")
    written.append(out / "deltas.json")
    return written
