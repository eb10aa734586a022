"""A fork's commits on SGLang v0.5.19, imported as they are: ``git format-patch`` files.

A fork is a branch of the SGLang repository (github.com/sgl-project/sglang) on the ``v0.5.19``
tag; ``git format-patch v0.5.19..BRANCH -o DIR`` writes one mail per commit. This module reads
such a directory and turns it into patches the strict applier (``series.py``) applies together
with our series, in one order, to clean copies of the installed package:

- **Headers** come from Python's ``email`` package (``policy.default``): ``Subject`` (RFC 2047
  encoded words and folded lines decoded; a leading ``[PATCH n/m]`` removed), ``From`` and
  ``Date``; the commit hash from the mbox ``From <hash> ...`` line git writes first.
- **Diffs** are read from the mail's bytes as they are (format-patch writes 8bit bodies), file
  block by file block (``diff --git a/P b/P``). ``python/sglang/P`` maps to ``sglang/P`` of the
  installed package. Refused, naming the commit: anything under ``sgl-kernel/`` or
  ``python/pyproject.toml`` (a rebuilt kernel wheel or new dependencies, which an image build
  with no network cannot make), and for the package's files renames, copies, mode changes (and
  new files that are executable or symbolic links) and binary diffs. Files elsewhere
  (``tools/``, ``test/``, ``docs/``) are listed and left out, whatever their change: they are
  not part of the installed package.
- **The declaration** (``escha-fork.yaml`` beside the patches) says which capabilities each
  commit provides (never guessed from the diff), which fork commits to drop, and for every
  file that one of our patches and a fork commit both touch, a decision: ``ours-first``,
  ``fork-first``, ``drop-ours`` or ``drop-fork``. Without one the import is refused naming
  both patches and the file, even when both would apply: two host-reserve mechanisms in one
  runtime are worse than a conflict.

The result is an ordered patch list (series patches and fork commits interleaved as decided),
so inventory, apply and verify treat a fork's files exactly like our series' files.
"""

from __future__ import annotations

import email
import email.policy
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from escha_deploy.utils.errors import BadInput, Refused
from escha_deploy.utils.relpaths import confine, decode_path, unquote_c
from escha_deploy.runtime.series import FilePatch, Patch, once, parse_diff

#: The declaration file, next to the patches.
DECLARATION = "escha-fork.yaml"
#: Where the sglang package lives in SGLang's git repository.
REPO_ROOT = "python/sglang"
DECISIONS = ("ours-first", "fork-first", "drop-ours", "drop-fork")
_FROM_LINE = re.compile(rb"^From ([0-9a-f]{40}) ")
_SUBJECT_PREFIX = re.compile(r"^\s*\[PATCH[^\]]*\]\s*")
_HASH = re.compile(r"^[0-9a-f]{7,40}$")
#: git's extended header lines (git-diff(1), "generating patch text with -p").
_EXTENDED = ("old mode", "new mode", "deleted file mode", "new file mode", "copy from", "copy to",
             "rename from", "rename to", "similarity index", "dissimilarity index")
#: A path whose change needs more than the Python package: why each is refused.
_NEEDS_REBUILD = (
    ("sgl-kernel/", "sgl-kernel/ is compiled into the sgl-kernel wheel; rebuild and pin that "
                    "wheel in the base image instead"),
    ("python/pyproject.toml", "python/pyproject.toml changes SGLang's dependencies, which an "
                              "offline image build cannot install"),
)


@dataclass(frozen=True)
class Commit:
    """One ``git format-patch`` mail: ``file`` (its name in the directory), the 40-hex
    ``commit``, the decoded ``subject``, ``author`` (``Name <mail>``), ``date`` (ISO 8601 with
    the author's UTC offset), the sha256 of the file's bytes, the kept change (``files`` relative to the sglang
    package) and the repository paths ``left_out`` (outside ``python/sglang/``)."""

    file: str
    commit: str
    subject: str
    author: str
    date: str
    sha256: str
    files: tuple[FilePatch, ...]
    left_out: tuple[str, ...]

    @property
    def short(self) -> str:
        return self.commit[:12]

    def label(self) -> str:
        """``<hash12> (<subject>)``: how messages name the commit."""
        return f"commit {self.short} ({self.subject})"

    def patch(self, capabilities: tuple[str, ...]) -> Patch:
        """The applier's view of this commit, with the capabilities declared for it."""
        header = {"Subject": self.subject, "From": self.author, "Date": self.date,
                  "Commit": self.commit}
        if self.left_out:
            header["Left-Out"] = ", ".join(self.left_out)
        return Patch(self.file, "fork", self.sha256, capabilities, header, self.files)


def _diff_path(line: bytes, where: str) -> tuple[str, str]:
    """``(a-path, b-path)`` of a ``diff --git a/X b/Y`` line, relative to the repository.

    Git C-quotes a name with unusual bytes (``quote.c: quote_c_style``), each side on its own;
    a quoted side is read back (``relpaths.unquote_c``) before it is checked, so ``\\056\\056``
    is the ``..`` it spells. Raises ``BadInput`` (``where``: the patch file and line) for a
    broken quote, a side without its ``a/`` / ``b/`` prefix, a path that is not UTF-8, or a
    path that would leave the repository (absolute, ``..``, ``//``, NUL: ``relpaths.confine``).
    """
    rest = line[len(b"diff --git "):].rstrip(b"\r\n")
    if rest.startswith(b'"'):
        a, tail = unquote_c(rest, where)
        if not tail.startswith(b" "):
            raise BadInput(f"{where}: expected ' b/PATH' after the quoted a/ path")
        tail = tail[1:]
        if tail.startswith(b'"'):
            b, after = unquote_c(tail, where)
            if after:
                raise BadInput(f"{where}: text after the quoted b/ path")
        else:
            b = tail
    elif rest.endswith(b'"') and b' "b/' in rest:
        a, _, quoted = rest.partition(b' "b/')
        b, after = unquote_c(b'"b/' + quoted, where)
        if after:
            raise BadInput(f"{where}: text after the quoted b/ path")
    else:
        # unquoted: "a/P b/P" for everything but renames and copies (refused by their own lines)
        n = (len(rest) - 5) // 2
        if rest[2:2 + n] == rest[5 + n:] and rest[2 + n:5 + n] == b" b/":
            a, b = rest[:2 + n], rest[3 + n:]
        else:
            a, _, b = rest.partition(b" b/")
            b = b"b/" + b if _ else b
    if not a.startswith(b"a/") or not b.startswith(b"b/"):
        raise BadInput(f"{where}: expected 'diff --git a/PATH b/PATH'")
    return tuple(confine(decode_path(p[2:], where), where, "the repository")  # type: ignore[return-value]
                 for p in (a, b))


#: Largest format-patch file read (64 MiB): SGLang's largest upstream commits are a few MB.
MAX_PATCH_BYTES = 64 * 2**20


def read_commit(path: Path) -> tuple[Commit | None, list[str]]:
    """Read one ``git format-patch`` file. Returns ``(commit, problems)``: ``problems`` are
    refusal lines naming the commit and file (a rename, a binary diff, ``sgl-kernel/``, ...);
    ``commit`` is ``None`` when the file is not a format-patch mail at all (then ``problems``
    says why). Raises ``BadInput`` (``file:line``) for a malformed diff, and for a file that is
    not a regular one (a FIFO in the folder would block forever) or is over 64 MiB
    (``jsonio.read_regular``)."""
    from escha_deploy.utils.jsonio import read_regular

    data = read_regular(path, "the patch", max_bytes=MAX_PATCH_BYTES)
    name = path.name
    lines = data.splitlines(keepends=True)
    m = _FROM_LINE.match(lines[0]) if lines else None
    if m is None:
        return None, [f"{name}:1: not a `git format-patch` file (no 'From <commit hash> ...' "
                      "first line)"]
    second = next((i for i in range(1, len(lines)) if _FROM_LINE.match(lines[i])), None)
    if second is not None:  # git am (git mailsplit) would make two commits of it
        raise BadInput(f"{name}:{second + 1}: a second mail ('From <commit hash>' line) in one file; "
                       "export one commit per file, as `git format-patch` does")
    msg = email.message_from_bytes(data, policy=email.policy.default)
    if msg.is_multipart():
        return None, [f"{name}: a multipart mail (format-patch --attach); export without "
                      "--attach/--inline"]
    cte = str(msg.get("Content-Transfer-Encoding", "8bit")).strip().lower()
    if cte not in ("7bit", "8bit"):
        return None, [f"{name}: Content-Transfer-Encoding {cte}; export with git format-patch's "
                      "default 8bit bodies"]
    subject = _SUBJECT_PREFIX.sub("", str(msg.get("Subject", ""))).strip()
    date = msg.get("Date")
    when = getattr(date, "datetime", None)  # ISO 8601 with the author's offset, as git wrote it
    commit = Commit(name, m.group(1).decode(), subject, str(msg.get("From", "")).strip(),
                    when.isoformat() if when is not None else str(date or "").strip(),
                    hashlib.sha256(data).hexdigest(), (), ())
    who = f"{name}: {commit.label()}"

    # the body starts after the first empty line; file blocks start at "diff --git"
    body = next((i + 1 for i, ln in enumerate(lines) if ln in (b"\n", b"\r\n")), len(lines))
    starts = [i for i in range(body, len(lines)) if lines[i].startswith(b"diff --git ")]
    masked = [b"\n"] * len(lines)  # what parse_diff reads: the kept blocks, at their own lines
    problems: list[str] = []
    left_out: list[str] = []
    empty_files: list[FilePatch] = []
    root = REPO_ROOT + "/"
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        a_path, b_path = _diff_path(lines[start], f"{name}:{start + 1}")
        ext: dict[str, str] = {}
        binary = False
        has_text = False
        for j in range(start + 1, end):
            ln = lines[j].rstrip(b"\r\n").decode("utf-8", "replace")
            if ln.startswith("--- ") or ln.startswith("@@"):
                has_text = True
                break
            if ln.startswith("GIT binary patch") or (ln.startswith("Binary files ")
                                                     and ln.endswith(" differ")):
                binary = True
                break
            for key in _EXTENDED:
                if ln.startswith(key + " "):
                    ext[key] = ln[len(key) + 1:]
                    break
        shown = b_path if b_path else a_path
        where = f"{who}: {shown} (line {start + 1})"
        paths = {a_path, b_path, ext.get("rename from"), ext.get("rename to"),
                 ext.get("copy from"), ext.get("copy to")} - {None, ""}
        rebuild = next((why for p, why in _NEEDS_REBUILD for q in sorted(paths)
                        if q == p or (p.endswith("/") and q.startswith(p))), None)
        if rebuild is not None:
            problems.append(f"{where}: {rebuild}")
            continue
        if not any(q.startswith(root) for q in paths):
            left_out.append(shown)  # not part of the installed package: whatever the change
            continue
        if "rename from" in ext or "copy from" in ext:
            kind = "renames" if "rename from" in ext else "copies"
            src = ext.get("rename from") or ext.get("copy from")
            dst = ext.get("rename to") or ext.get("copy to")
            problems.append(f"{who}: {kind} {src} to {dst} (line {start + 1}); the applier takes "
                            "text diffs only: export with `git format-patch --no-renames`")
            continue
        if "old mode" in ext or "new mode" in ext:
            problems.append(f"{where}: changes the file mode {ext.get('old mode')} -> "
                            f"{ext.get('new mode')}; an image build cannot carry mode changes")
            continue
        if ext.get("new file mode", "100644") != "100644":
            problems.append(f"{where}: adds a file of mode {ext['new file mode']} (executable "
                            "or symbolic link); only plain files (100644) can be imported")
            continue
        if binary:
            problems.append(f"{where}: a binary diff; only text diffs can be imported")
            continue
        if has_text:
            masked[start:end] = lines[start:end]
        elif "new file mode" in ext:  # git writes no hunk for an empty new file
            empty_files.append(FilePatch(None, shown[len(root):], (), start + 1))
        elif "deleted file mode" in ext:
            empty_files.append(FilePatch(shown[len(root):], None, (), start + 1))
    if not starts:
        problems.append(f"{who}: no 'diff --git' blocks (an empty commit?)")
    if problems:
        return commit, problems
    files = parse_diff(masked, name, REPO_ROOT) + empty_files
    once(files, name, REPO_ROOT)
    return Commit(commit.file, commit.commit, commit.subject, commit.author, commit.date,
                  commit.sha256, tuple(files), tuple(left_out)), []


@dataclass
class Declaration:
    """``escha-fork.yaml``: ``commits`` maps a commit (hash or unique prefix, 7+ hex) to the
    capabilities it provides; ``drop`` lists fork commits left out; ``overlaps`` holds one
    decision per (our patch, fork commit) pair that touch a common file."""

    commits: dict[str, list[str]] = field(default_factory=dict)
    drop: list[str] = field(default_factory=list)
    overlaps: list[dict] = field(default_factory=list)
    #: The SGLang release the fork branch is on (``git format-patch vX.Y.Z..BRANCH``); None when
    #: not declared: the release our series is made for (``fork_release``).
    release: str | None = None
    #: The commit-built base the commits are made against (docs/runtime.md, "A commit-built
    #: base"): ``("commit", HEX)`` or ``("inventory", SHA256)`` (its lock's or base inventory's
    #: digest); None when the branch is on a release tag.
    parent: tuple[str, str] | None = None
    positions: dict = field(default_factory=dict)
    file: str = DECLARATION

    def where(self, *key) -> str:
        """``escha-fork.yaml:LINE: a.b`` for a key path."""
        from escha_deploy.utils.yamlpos import position_of

        f, line = position_of(self.positions, tuple(key)) or (self.file, 1)
        return f"{f}:{line}: {'.'.join(str(k) for k in key)}"


def read_declaration(path: Path) -> Declaration:
    """Parse ``escha-fork.yaml``; an absent file declares nothing. Raises ``BadInput`` naming
    ``file:line`` for a malformed one."""
    from escha_deploy.utils.jsonio import read_regular
    from escha_deploy.utils.yamlpos import MAX_FILE_BYTES, parse_yaml_text

    raw = read_regular(path, "the fork declaration", max_bytes=MAX_FILE_BYTES, missing_ok=True)
    if raw is None:
        return Declaration(file=str(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start}") from None
    _, pos = parse_yaml_text(text, str(path))  # syntax errors with file:line, and positions
    import yaml

    # every scalar as written (BaseLoader): YAML would read an all-digit hash as a number
    data = yaml.load(text, Loader=yaml.BaseLoader)
    decl = Declaration(positions=pos, file=str(path))
    data = data or {}
    problems = []
    if not isinstance(data, dict):
        raise BadInput(f"{path}:1: expected a mapping with release, commits, drop, overlaps")
    for key in data:
        if key not in ("release", "parent", "commits", "drop", "overlaps"):
            problems.append(f"{decl.where(key)}: unknown key (expected release, parent, commits, drop, overlaps)")
    if "parent" in data:
        par = data["parent"]
        named = [k for k in ("commit", "inventory") if isinstance(par, dict) and k in par]
        if not isinstance(par, dict) or not named or set(par) - {"commit", "inventory"}:
            problems.append(f"{decl.where('parent')}: expected {{commit: HEX}} or {{inventory: SHA256}}, the "
                            "SGLang tree built from a commit that the branch is on")
        elif len(named) > 1 or "release" in data:
            both = " and ".join([*(f"parent.{k}" for k in named), *(["release"] if "release" in data else [])])
            problems.append(f"{decl.where('parent')}: the parent is named two ways ({both}); name it one way: "
                            "parent.commit (the commit it is built from) or parent.inventory (its lock's digest)")
        elif named == ["commit"] and not (isinstance(par["commit"], str) and _HASH.match(par["commit"].lower())):
            problems.append(f"{decl.where('parent', 'commit')}: expected a commit hash, 7 to 40 hex digits")
        elif named == ["inventory"] and not (isinstance(par["inventory"], str)
                                             and re.fullmatch(r"[0-9a-f]{64}", par["inventory"])):
            problems.append(f"{decl.where('parent', 'inventory')}: expected the lock's digest, 64 hex digits "
                            "(`escha-deploy runtime lock` prints it)")
        else:
            decl.parent = (named[0], par[named[0]].lower())
    if "release" in data:
        rel = data["release"]
        if not (isinstance(rel, str) and re.fullmatch(r"\d+\.\d+\.\d+", rel)):
            problems.append(f"{decl.where('release')}: expected the SGLang release the fork branch is "
                            f"on, X.Y.Z (the tag of `git format-patch vX.Y.Z..BRANCH`), got {rel!r}")
        else:
            decl.release = rel
    commits = data.get("commits") or {}  # BaseLoader: an empty value is ""
    if not isinstance(commits, dict):
        problems.append(f"{decl.where('commits')}: expected a mapping of commit hash to a "
                        "list of capabilities")
        commits = {}
    for k, v in commits.items():
        caps = ([v] if v else []) if isinstance(v, str) else v
        if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
            problems.append(f"{decl.where('commits', k)}: expected a list of capability names")
            continue
        decl.commits[str(k)] = caps
    drop = data.get("drop") or []
    if not isinstance(drop, list):
        problems.append(f"{decl.where('drop')}: expected a list of commit hashes")
        drop = []
    decl.drop = [str(d) for d in drop]
    overlaps = data.get("overlaps") or []
    if not isinstance(overlaps, list):
        problems.append(f"{decl.where('overlaps')}: expected a list of "
                        "{ours: PATCH, fork: COMMIT, decision: ...}")
        overlaps = []
    for n, o in enumerate(overlaps):
        if not isinstance(o, dict) or set(o) != {"ours", "fork", "decision"}:
            problems.append(f"{decl.where('overlaps', n)}: expected exactly the keys ours, fork, "
                            "decision")
            continue
        if o["decision"] not in DECISIONS:
            problems.append(f"{decl.where('overlaps', n, 'decision')}: {o['decision']!r} is not "
                            f"one of {', '.join(DECISIONS)}")
            continue
        decl.overlaps.append({k: str(v) for k, v in o.items()} | {"index": n})
    if problems:
        raise BadInput(*problems)
    return decl


@dataclass
class ForkImport:
    """A fork directory resolved against our series: ``commits`` in the directory's order,
    ``order`` the patches to apply (series and fork interleaved), ``dropped`` one line per
    patch or commit left out and why."""

    directory: Path
    commits: list[Commit]
    order: list[Patch]
    dropped: list[str]
    capabilities: dict[str, tuple[str, ...]]


def fork_release(directory: Path) -> tuple[str, bool]:
    """``(release, declared)``: the SGLang release a fork directory's commits are made for, from
    its ``escha-fork.yaml`` ``release:``; when not declared, the release our series is made for
    (``releases.series_release``: forks were exported against it before the key existed) and
    ``declared`` False. Raises ``BadInput`` for a malformed declaration."""
    decl = read_declaration(Path(directory) / DECLARATION)
    if decl.release is not None:
        return decl.release, True
    from escha_deploy.sglang.releases import series_release

    return series_release(), False


def check_fork_release(directory: Path, runtime_release: str | None) -> None:
    """Refuse (``Refused``, exit 3, one line naming both releases) fork commits made for another
    SGLang release than ``runtime_release`` (the installed or targeted one; its ``X.Y.Z``
    prefix counts, so ``0.5.19.post1`` is 0.5.19). ``None`` (release unknown) checks nothing.
    A commit made against another tag changes lines that release does not have, or worse,
    applies and changes what that release changed since (``runtime rebase --check`` says which)."""
    if not runtime_release:
        return
    m = re.match(r"\d+\.\d+\.\d+", runtime_release)
    if m is None:
        return
    made_for, declared = fork_release(directory)
    if made_for == m.group(0):
        return
    how = "declared as release" if declared else "no release: declared, so the one our series is made for"
    raise Refused(
        f"{Path(directory) / DECLARATION}: the fork's commits are made for SGLang {made_for} ({how}); "
        f"this runtime is SGLang {m.group(0)}",
        hint=f"rebase the fork branch onto v{m.group(0)}, export it with `git format-patch "
        f"v{m.group(0)}..BRANCH`, set `release: {m.group(0)}` in {DECLARATION} (`escha-deploy runtime "
        f"rebase --check {m.group(0)} --fork-dir DIR` shows which commits need it)")


def fork_parent(directory: Path) -> tuple[str, str] | None:
    """The parent a fork directory's ``escha-fork.yaml`` names (``Declaration.parent``), or None."""
    return read_declaration(Path(directory) / DECLARATION).parent


def check_fork_base(directory: Path, version: str | None, base_digest: str | None, where: str) -> None:
    """Refuse (exit 3, one line) fork commits whose declared base is not this one: a ``parent:``
    (``Declaration.parent``) that is not the tree at ``where`` (SGLang ``version``, the commit its
    version names; ``base_digest``: the inventory digest of its unpatched files, its lock's), else
    ``check_fork_release``'s release check."""
    parent = fork_parent(directory)
    if parent is None:
        check_fork_release(directory, version)
        return
    decl = Path(directory) / DECLARATION
    kind, value = parent
    if kind == "commit":
        from escha_deploy.sglang.releases import built_commit

        have = built_commit(version) if version else None
        if have and (have.startswith(value) or value.startswith(have)):
            return
        this = f"built from commit {have}" if have else "no commit named in its version"
    else:
        if base_digest == value:
            return
        this = f"base inventory digest {base_digest}"
    raise Refused(f"{decl}: the fork's commits are made against the parent {kind} {value}; {where} is SGLang "
                  f"{version} ({this})",
                  hint="apply them to the tree they were made on, or export them again from this base "
                  "(`git format-patch BASE..BRANCH`) and name it in parent:")


def fork_patch_files(directory: Path) -> list[Path]:
    """The ``*.patch`` files of a fork directory, by name (format-patch numbers them)."""
    return sorted(Path(directory).glob("*.patch"))


def _resolve(decl: Declaration, key: str, commits: list[Commit], where: str) -> Commit | str:
    """The commit ``key`` names (full hash or unique prefix), else an error line."""
    k = key.strip().lower()
    if not _HASH.match(k):
        return f"{where}: {key!r} is not a commit hash (7 to 40 hex digits)"
    found = [c for c in commits if c.commit.startswith(k)]
    if len(found) == 1:
        return found[0]
    if not found:
        return (f"{where}: no commit {key} among the {len(commits)} patches of this directory "
                "(a declaration may name only commits that are imported)")
    return f"{where}: {key} is ambiguous ({', '.join(c.short for c in found)})"


def load_fork(directory: Path, series: list[Patch]) -> ForkImport:
    """Read a fork directory (``*.patch`` + ``escha-fork.yaml``) and order it with ``series``.

    Raises ``Refused`` (exit 3) naming each commit that cannot be imported and each file both
    one of our patches and a fork commit touch without a decision; ``BadInput`` (exit 2) for a
    malformed declaration: a capability not in ``escha_deploy.sglang.capabilities``, one of our
    series' capabilities declared for a fork commit, a commit not in the directory.
    """
    from escha_deploy.sglang.capabilities import fork_capability_problem
    from escha_deploy.sglang.releases import series_release

    directory = Path(directory)
    files = fork_patch_files(directory)
    if not files:
        raise BadInput(f"{directory}: no *.patch files (make them with "
                       f"`git format-patch v{series_release()}..BRANCH -o DIR`)")
    commits: list[Commit] = []
    problems: list[str] = []
    for f in files:
        c, probs = read_commit(f)
        problems += probs
        if c is not None:
            commits.append(c)
    if problems:
        raise Refused(*problems, hint="fix these commits on the fork branch (or leave them out "
                      "of the range) and export again; docs/runtime.md, 'Bring your fork'")
    seen: dict[str, str] = {}
    for c in commits:
        if c.commit in seen:
            problems.append(f"{c.file}: {c.label()} is also {seen[c.commit]}")
        seen[c.commit] = c.file
    series_names = {p.name for p in series}
    for c in commits:
        if c.file in series_names:
            problems.append(f"{c.file}: has the name of a patch of our series; rename the file")
    if problems:
        raise BadInput(*problems)

    decl = read_declaration(directory / DECLARATION)
    caps: dict[str, tuple[str, ...]] = {c.file: () for c in commits}
    for key, names in decl.commits.items():
        c = _resolve(decl, key, commits, decl.where("commits", key))
        if isinstance(c, str):
            problems.append(c)
            continue
        bad = [(n, fork_capability_problem(n)) for n in names]
        problems += [f"{decl.where('commits', key)}: {why}" for _, why in bad if why]
        caps[c.file] = tuple(n for n, why in bad if why is None)
    dropped_fork: dict[str, str] = {}
    for n, key in enumerate(decl.drop):
        c = _resolve(decl, key, commits, decl.where("drop", n))
        if isinstance(c, str):
            problems.append(c)
        else:
            dropped_fork[c.file] = "listed under drop"
    by_name = {p.name: p for p in series}
    decisions: dict[tuple[str, str], str] = {}
    dropped_ours: dict[str, str] = {}
    for o in decl.overlaps:
        n = o["index"]
        if o["ours"] not in by_name:
            problems.append(f"{decl.where('overlaps', n, 'ours')}: {o['ours']!r} is not a patch of "
                            f"our series ({', '.join(by_name)})")
            continue
        c = _resolve(decl, o["fork"], commits, decl.where("overlaps", n, "fork"))
        if isinstance(c, str):
            problems.append(c)
            continue
        decisions[(o["ours"], c.file)] = o["decision"]
        if o["decision"] == "drop-ours":
            dropped_ours[o["ours"]] = f"drop-ours against {c.label()}"
        elif o["decision"] == "drop-fork":
            dropped_fork[c.file] = f"drop-fork against {o['ours']}"
    if problems:
        raise BadInput(*problems)

    ours = [p for p in series if p.name not in dropped_ours]
    fork = [c for c in commits if c.file not in dropped_fork]
    for p in series:
        for c in commits:
            shared = sorted(set(p.touched) & {f.path for f in c.files})
            d = decisions.get((p.name, c.file))
            if shared and d is None and p in ours and c in fork:
                problems += [f"{p.name} (our series) and {c.file}, {c.label()}, both change "
                             f"sglang/{s}: declare ours-first, fork-first, drop-ours or drop-fork "
                             f"for this pair under overlaps in {DECLARATION}" for s in shared]
            elif not shared and d is not None:
                problems.append(f"{DECLARATION}: overlaps: {p.name} and {c.label()} share no "
                                f"file; remove that decision (use drop: to leave a commit out)")
    if problems:
        raise Refused(*problems, hint="two mechanisms for one file are worse than a conflict: "
                      "choose one (docs/runtime.md, 'Bring your fork')")

    # one order: our patches as early as possible, each after the fork commits it must follow
    order: list[Patch] = []
    oi, fi = 0, 0
    while oi < len(ours) or fi < len(fork):
        if oi < len(ours):
            p = ours[oi]
            waits = [c for c in fork[fi:] if decisions.get((p.name, c.file)) == "fork-first"]
            if not waits:
                order.append(p)
                oi += 1
                continue
        c = fork[fi]
        blocked = [q for q in ours[oi:] if decisions.get((q.name, c.file)) == "ours-first"]
        if oi < len(ours) and blocked:
            raise Refused(f"{DECLARATION}: overlaps: no order satisfies both {ours[oi].name} "
                          f"fork-first and {blocked[0].name} ours-first against {c.label()} "
                          "(fork commits keep their own order)")
        order.append(c.patch(caps[c.file]))
        fi += 1
    dropped = ([f"{n} (our series): {why}" for n, why in dropped_ours.items()]
               + [f"{c.file}, {c.label()}: {dropped_fork[c.file]}" for c in commits
                  if c.file in dropped_fork])
    return ForkImport(directory, commits, order, dropped, caps)

