"""The patch series and user overlays: read headers, apply unified diffs strictly.

A series directory holds a ``series`` file (patch names in order; ``#`` comments and blank lines
ignored) and the ``NNNN-*.patch`` files it names. When an overlay directory has no ``series``
file, its ``*.patch`` files apply in name order. Each patch starts with a header of
``Key: value`` lines before its first ``--- `` line; ``Capabilities:`` (comma separated, may be
empty) is required and every name must be one of ``escha_deploy.sglang.capabilities.CAPABILITIES``.

Paths in a patch are ``a/sglang/...`` / ``b/sglang/...`` (``-p1`` from site-packages); inside
escha-deploy a file is named by its path relative to the ``sglang`` package directory.

The applier is our own, on purpose: hunks must match their context byte for byte (no fuzz,
no whitespace leniency), at the recorded line or, as ``git apply`` allows, at an offset when
an earlier overlay moved the lines. The libraries tried (whatthepatch 1.0.7) misparsed a
two-file diff with a ``/dev/null`` side, and GNU patch is not in the base images. Any reject
raises ``Refused`` naming the patch, the file and the hunk.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from escha_deploy.utils.errors import BadInput, Refused
from escha_deploy.utils.relpaths import confine, decode_path, unquote_c

_HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
PACKAGE = "sglang"


@dataclass(frozen=True)
class Hunk:
    header: str
    old_start: int
    old: tuple[bytes, ...]
    new: tuple[bytes, ...]


@dataclass(frozen=True)
class FilePatch:
    """One file's change: ``path`` relative to the sglang package; ``None`` sides for create
    (``old is None``) or delete (``new is None``)."""

    old: str | None
    new: str | None
    hunks: tuple[Hunk, ...]
    #: The ``+++`` line (1-based) in its patch file; 0 when none (an empty new file's block).
    line: int = field(default=0, compare=False)

    @property
    def path(self) -> str:
        return self.new if self.new is not None else self.old  # type: ignore[return-value]


@dataclass(frozen=True)
class Patch:
    """A patch file: its name, source (``series`` or ``overlay``), bytes' sha256, header and
    file changes."""

    name: str
    source: str
    sha256: str
    capabilities: tuple[str, ...]
    header: dict[str, str]
    files: tuple[FilePatch, ...] = field(default=())
    #: The text before the first ``--- `` line (the header and its prose), as written.
    header_text: str = field(default="", compare=False)

    @property
    def touched(self) -> list[str]:
        return [f.path for f in self.files]


def _strip_path(raw: bytes, where: str, root: str = PACKAGE) -> str | None:
    """The path of a ``--- ``/``+++ `` line's rest (``raw``), relative to ``root``: ``None``
    for ``/dev/null``. Git C-quotes a path with unusual bytes (``"b/python/sglang/\\303.py"``);
    the quoted form is read back first. Raises ``BadInput`` (``where``) for a path that is not
    UTF-8, a broken quote, a path outside ``a/<root>/`` / ``b/<root>/``, or one that would
    leave ``root`` (``relpaths.confine``)."""
    raw = raw.rstrip(b"\r\n")
    if raw.startswith(b'"'):
        raw, _ = unquote_c(raw, where)
    else:
        raw = raw.split(b"\t")[0]  # git appends a tab (and a date) to a name with a space
    text = decode_path(raw, where)
    if text == "/dev/null":
        return None
    parts = text.split("/", 1)
    if len(parts) != 2 or not parts[1].startswith(root + "/"):
        raise BadInput(f"{where}: path {text!r} is not a/{root}/... or b/{root}/...")
    return confine(parts[1][len(root) + 1:], where, root)


#: Longest line number or count read from a hunk header: 9 digits (a billion lines, beyond any
#: source file), so a header of thousands of digits is refused before ``int`` reads it.
_MAX_DIGITS = 9


def parse_diff(lines: list[bytes], name: str, root: str = PACKAGE) -> list[FilePatch]:
    """The file changes of a unified diff given as lines (with their line ends). Lines outside
    a ``--- ``/``+++ `` pair and its hunks are skipped, so ``name:line`` in errors is the line in
    ``lines``. Paths must be ``a/<root>/...`` and ``b/<root>/...`` and are returned relative to
    ``root`` (the sglang package: ``sglang`` for our series, ``python/sglang`` in SGLang's git
    repository). Raises ``BadInput`` for a malformed diff."""
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith(b"--- "):
            if files and line.startswith(b"@@ -"):  # git apply: "patch fragment without header"
                raise BadInput(f"{name}:{i + 1}: a hunk with no file header before it (git apply "
                               "refuses it: patch fragment without header)")
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith(b"+++ "):
            raise BadInput(f"{name}:{i + 2}: expected a '+++ ' line after '--- '")
        start = i
        old = _strip_path(line[4:], f"{name}:{i + 1}", root)
        new = _strip_path(lines[i + 1][4:], f"{name}:{i + 2}", root)
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith(b"@@"):
            m = _HUNK_RE.match(lines[i])
            if not m:
                raise BadInput(f"{name}:{i + 1}: malformed hunk header")
            if any(len(g) > _MAX_DIGITS for g in m.groups() if g is not None):
                raise BadInput(f"{name}:{i + 1}: hunk header has a number over {_MAX_DIGITS} "
                               "digits")
            hdr = lines[i].decode("utf-8", "replace").rstrip("\r\n")
            old_n = int(m.group(2)) if m.group(2) is not None else 1
            new_n = int(m.group(4)) if m.group(4) is not None else 1
            old_l: list[bytes] = []
            new_l: list[bytes] = []
            i += 1
            last = None
            while i < len(lines) and (len(old_l) < old_n or len(new_l) < new_n
                                      or lines[i].startswith(b"\\")):
                ln = lines[i]
                tag, body = ln[:1], ln[1:]
                if tag == b"\\":  # "\ No newline at end of file": previous line has none
                    for target in last or ():
                        target[-1] = target[-1].rstrip(b"\n").rstrip(b"\r")
                elif tag == b" " or ln in (b"\n", b"\r\n"):
                    body = body if tag == b" " else ln
                    old_l.append(body)
                    new_l.append(body)
                    last = (old_l, new_l)
                elif tag == b"-":
                    old_l.append(body)
                    last = (old_l,)
                elif tag == b"+":
                    new_l.append(body)
                    last = (new_l,)
                else:
                    raise BadInput(f"{name}:{i + 1}: unexpected line in hunk {hdr!r}")
                i += 1
            if len(old_l) != old_n or len(new_l) != new_n:
                raise BadInput(f"{name}:{i}: hunk {hdr!r} is shorter than its header says")
            if i < len(lines) and _hunk_line(lines[i]):
                raise BadInput(f"{name}:{i + 1}: hunk {hdr!r} has more lines than its header says "
                               f"(-{old_n} +{new_n}); git apply would drop or refuse them")
            hunks.append(Hunk(hdr, int(m.group(1)), tuple(old_l), tuple(new_l)))
        if not hunks:
            raise BadInput(f"{name}:{i}: file {new or old} has no hunks")
        files.append(FilePatch(old, new, tuple(hunks), start + 2))
    once(files, name, root)
    return files


def _hunk_line(ln: bytes) -> bool:
    """A line that can only be part of a hunk's body: ``+``, ``-`` or `` `` first, but not the
    next file's ``--- `` line nor format-patch's signature separator (``-- ``)."""
    if ln[:1] == b"+" or ln[:1] == b" ":
        return True
    return ln[:1] == b"-" and not ln.startswith(b"--- ") and ln.rstrip(b"\r\n") != b"-- "


def once(files: list[FilePatch], name: str, root: str = PACKAGE) -> None:
    """Refuse (``BadInput``) a patch that changes one file in two blocks (two new files of one
    name, a file patched twice): ``git diff`` and ``git format-patch`` write one block per file,
    and the second block would be applied to what the first one made, or dropped."""
    seen: dict[str, FilePatch] = {}
    for fp in files:
        for p in {fp.old, fp.new} - {None}:
            first = seen.setdefault(p, fp)  # type: ignore[arg-type]
            if first is not fp:
                at = f"line {first.line}" if first.line else "an earlier block"
                raise BadInput(f"{name}:{fp.line or 1}: {root}/{p} is changed twice in one patch "
                               f"(first at {at}); one block per file, as git writes it")


def parse_patch(data: bytes, name: str, source: str = "series") -> Patch:
    """Parse a patch file's bytes. Raises ``BadInput`` naming ``name:line`` for a malformed
    header or diff."""
    lines = data.splitlines(keepends=True)
    header: dict[str, str] = {}
    i = 0
    while i < len(lines) and not lines[i].startswith(b"--- "):
        m = re.match(rb"^([A-Za-z][A-Za-z-]*):\s*(.*)$", lines[i].rstrip(b"\r\n"))
        if m:
            try:
                value = m.group(2).decode("utf-8").strip()
            except UnicodeDecodeError as exc:
                raise BadInput(f"{name}:{i + 1}: header {m.group(1).decode()!r} is not UTF-8 "
                               f"(byte 0x{m.group(2)[exc.start]:02x})") from None
            header.setdefault(m.group(1).decode(), value)
        i += 1
    files = parse_diff(lines, name)
    if not files:
        raise BadInput(f"{name}: no file changes found (expected '--- a/sglang/...' lines)")
    if "Capabilities" not in header:
        raise BadInput(f"{name}:1: header has no 'Capabilities:' line (write 'Capabilities:' "
                       "with an empty value if the patch provides none)")
    from escha_deploy.sglang.capabilities import CAPABILITIES

    caps = tuple(c.strip() for c in header["Capabilities"].split(",") if c.strip())
    unknown = [c for c in caps if c not in CAPABILITIES]
    if unknown:
        raise BadInput(f"{name}: unknown capabilities {', '.join(unknown)} "
                       f"(known: {', '.join(CAPABILITIES)})")
    header_text = b"".join(lines[:i]).decode("utf-8", "replace")
    return Patch(name, source, hashlib.sha256(data).hexdigest(), caps, header, tuple(files),
                 header_text)


def read_series(directory: Path, source: str = "series") -> list[Patch]:
    """The patches of ``directory`` in order (its ``series`` file, else ``*.patch`` by name).

    Raises ``BadInput`` for a ``series`` line naming a missing file (``series:LINE``).
    """
    directory = Path(directory)
    series_file = directory / "series"
    names: list[tuple[str, str]] = []
    if series_file.is_file():
        from escha_deploy.utils.jsonio import read_regular

        raw_bytes = read_regular(series_file, "the series file", max_bytes=2**20) or b""
        for n, raw in enumerate(raw_bytes.split(b"\n"), 1):
            where = f"{series_file}:{n}"
            entry = decode_path(raw.split(b"#", 1)[0].strip(), where)
            if entry:  # a patch file of this folder: never a path out of it
                names.append((confine(entry, where, str(directory)), where))
    else:
        names = [(p.name, str(p)) for p in sorted(directory.glob("*.patch"))]
    patches = []
    for entry, where in names:
        path = directory / entry
        if not path.is_file():
            raise BadInput(f"{where}: patch {entry!r} not found in {directory}")
        patches.append(parse_patch(path.read_bytes(), entry, source))
    return patches


def _find(lines: list[bytes], old: tuple[bytes, ...], expected: int) -> int | None:
    """Where ``old`` matches ``lines`` exactly: at ``expected`` or the nearest offset."""
    n = len(old)
    if n == 0:
        return min(max(expected, 0), len(lines))
    limit = len(lines) - n
    for delta in range(0, max(expected, limit - expected, 0) + 1):
        for pos in {expected - delta, expected + delta}:
            if 0 <= pos <= limit and tuple(lines[pos:pos + n]) == old:
                return pos
    return None


def apply_file_patch(patch_name: str, fp: FilePatch, content: bytes | None) -> bytes | None:
    """The new bytes of one file (``None`` when deleted). Raises ``Refused`` naming the patch,
    the file and the hunk on any reject."""
    if fp.old is None and content is not None:
        raise Refused(f"{patch_name}: {PACKAGE}/{fp.path}: creates a file that already exists")
    if fp.old is not None and content is None:
        raise Refused(f"{patch_name}: {PACKAGE}/{fp.path}: file to patch does not exist")
    lines = (content or b"").splitlines(keepends=True)
    offset = 0
    for k, h in enumerate(fp.hunks, 1):
        expected = (h.old_start - 1 if h.old else h.old_start) + offset
        pos = _find(lines, h.old, expected)
        if pos is None:
            raise Refused(
                f"{patch_name}: {PACKAGE}/{fp.path}: hunk #{k} {h.header} does not apply "
                "(its context is not in the file)",
                hint="the base differs from the one the series was made for; "
                "`escha-deploy runtime inventory` shows the base",
            )
        lines[pos:pos + len(h.old)] = list(h.new)
        offset = pos - (h.old_start - 1 if h.old else h.old_start) + len(h.new) - len(h.old)
    if fp.new is None:
        if lines:
            raise Refused(f"{patch_name}: {PACKAGE}/{fp.path}: delete left lines behind")
        return None
    return b"".join(lines)


def apply_series(patches: list[Patch], read_base) -> dict[str, bytes | None]:
    """Apply ``patches`` in order to the files ``read_base(path)`` returns (bytes, or ``None``
    when absent). Returns every touched path's final bytes (``None`` = deleted). Pure apart
    from ``read_base``; raises ``Refused`` on the first reject."""
    state: dict[str, bytes | None] = {}
    for p in patches:
        for fp in p.files:
            for path in {fp.old, fp.new} - {None}:
                if path not in state:
                    state[path] = read_base(path)
            result = apply_file_patch(p.name, fp, state[fp.old] if fp.old else state[fp.new])
            if fp.old and fp.old != fp.new:
                state[fp.old] = None
            state[fp.path] = result
    return state


def touched_paths(patches: list[Patch]) -> list[str]:
    """Every path (relative to the sglang package) any patch reads or writes, sorted."""
    return sorted({p for pt in patches for fp in pt.files for p in (fp.old, fp.new) if p})


def capabilities_of(patches: list[Patch]) -> list[str]:
    """The capabilities the patches provide, in registry order, each once; then a fork's own
    (``capabilities.FORK_CAPABILITY``, declared in escha-fork.yaml), in the order declared."""
    from escha_deploy.sglang.capabilities import CAPABILITIES

    have = {c for p in patches for c in p.capabilities}
    own = [c for p in patches for c in p.capabilities if c not in CAPABILITIES]  # a fork's own, namespaced
    return [c for c in CAPABILITIES if c in have] + list(dict.fromkeys(own))
