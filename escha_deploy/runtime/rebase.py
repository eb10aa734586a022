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

import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from escha_deploy.errors import BadInput
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
