"""Move escha_deploy's loose top-level modules into packages, from one mapping table (``MOVES``):
each module is moved with ``git mv``, and every reference to it is rewritten: imports
(module-level and inside functions, relative ones kept relative where their file stayed), dotted
names in strings (``mock.patch("escha_deploy.host...")``, ``python -m escha_deploy.releases``),
and file paths (``escha_deploy/host.py``) in the code, tests, scripts, docs, CI and
configuration (pyproject.toml, .importlinter).

Run from the repository root, on a clean tree: ``python scripts/house_moves.py``. A branch opened
before the move rebases by running it on its own commits (it rewrites only what still names an
old module; a second run changes nothing; it never rewrites itself). ``--check``: exit 1,
naming each place, when a moved module is still named anywhere.

``pipeline.py`` became the package ``escha_deploy.pipeline`` (its name kept), and was then split
by hand, in the same commit, into one module per stage (``sources``, ``gathering``, ``runtime``,
``decision``, ``rendering``, ``request``); the package re-exports every public name it had, so an
import ``from escha_deploy.pipeline import NAME`` needs no rewrite. Its private helpers moved
with their stage (``_check_extra_args`` to ``decision``, ``_fmt_bytes`` to ``gathering``).
A relative import stays relative where its file did not move; in a moved file it is made
absolute. A module named alone in prose (``host.py``) is rewritten in docs/ and README.md only.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = "escha_deploy"

#: old module (under escha_deploy) -> new module. Packages created here get an __init__.py.
MOVES: dict[str, str] = {
    # what the box is, and the readers that fill it
    "host": "facts.machine",
    "nvml": "facts.nvml",
    "gpu_facts": "facts.gpu_rules",
    "folders": "facts.folders",
    "findings": "facts.saved",
    "factsfile": "facts.factsfile",
    "restore_bandwidth": "facts.restore_bandwidth",
    # SGLang as data
    "releases": "sglang.releases",
    "flagcheck": "sglang.flagcheck",
    "capabilities": "sglang.capabilities",
    "arch": "sglang.arch",
    # the planning pipeline (escha_deploy.pipeline keeps its name: pipeline.py becomes the package)
    "flags": "pipeline.argv",
    "launch_spec": "pipeline.spec",
    "release_compare": "pipeline.compare",
    "plan_chart": "pipeline.chart",
    # the profile
    "profile_keys": "profile.keys",
    # plumbing that knows no domain
    "errors": "utils.errors",
    "units": "utils.units",
    "jsonio": "utils.jsonio",
    "yamlpos": "utils.yamlpos",
    "paths": "utils.paths",
    "relpaths": "utils.relpaths",
    "httpread": "utils.httpread",
    "netaddr": "utils.netaddr",
    "termtext": "utils.termtext",
    "redact": "utils.redact",
    "secretargs": "utils.secretargs",
}

#: modules whose file moves but whose dotted name stays (a module becomes its package)
FILE_MOVES = {"pipeline.py": "pipeline/__init__.py"}

#: new packages' docstrings (written once, when the package is made)
PACKAGE_DOCS = {
    "sglang": '"""SGLang as data: its releases (facts, flag catalogs, late checks), the flag check of an argv,\n'
              'the capabilities our patch series adds, and model architectures as SGLang types them. Reads\n'
              'nothing of the machine (.importlinter)."""\n',
    "utils": '"""Plumbing that knows no domain: errors, units, bounded JSON and YAML with positions, paths,\n'
             'the HTTP reader, addresses, terminal text, redaction and secret flags. Imports no other package\n'
             'of escha_deploy (.importlinter)."""\n',
}

#: a path computed from a moved module's own file, fixed for its new depth
FILE_FIXES = {
    "utils/paths.py": [("PACKAGE_DIR = Path(__file__).resolve().parent\n",
                        "PACKAGE_DIR = Path(__file__).resolve().parent.parent\n")],
}

#: text files whose references are rewritten (besides the Python files under these folders)
TEXT_GLOBS = ["escha_deploy/**/*", "tests/**/*", "scripts/**/*", "docs/**/*", "benchmarks/**/*", ".ci/*",
              "README.md", "pyproject.toml", ".importlinter", "Dockerfile.hicache", "compose.yaml", "docker/**/*"]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".sh", ".txt", ".cfg", ".ini", ".json", ""}
SKIP_PARTS = {"__pycache__", ".git", ".venv", ".cache", "golden"}


def _full(old: str) -> str:
    return f"{PKG}.{old}"


FULL = {_full(o): _full(n) for o, n in MOVES.items()}


def new_module(name: str) -> str:
    """``name`` (a dotted module, or a name inside one) after the move: the longest moved prefix
    replaced."""
    for old, new in FULL.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return name


def _module_of(path: Path) -> tuple[str, bool]:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts = parts[:-1]
    return ".".join(parts), is_pkg


def _absolute(node: ast.ImportFrom, module: str, is_pkg: bool) -> str:
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def rewrite_imports(text: str, module: str, is_pkg: bool, moved_file: bool) -> str:
    """Every import of a moved module in ``text`` (the source of ``module``), at any depth,
    rewritten to its new name; relative imports made absolute where their target moved or
    (``moved_file``) where the file itself moved, since the dots count from its old place."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = []
            changed = False
            for a in node.names:
                n = new_module(a.name)
                changed |= n != a.name
                names.append(n + (f" as {a.asname}" if a.asname else ""))
            if changed:
                edits.append((node.lineno, node.col_offset, node.end_lineno or node.lineno,
                              node.end_col_offset or 0, "import " + ", ".join(names)))
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node, module, is_pkg) if node.level else (node.module or "")
            if not target.startswith(PKG):
                continue
            # "from escha_deploy import host, __version__": each name that is a moved module goes
            # to its new package, with its old name kept as the local name
            groups: dict[str, list[str]] = {}
            for a in node.names:
                full = f"{target}.{a.name}"
                if full in FULL:
                    parent, _, leaf = FULL[full].rpartition(".")
                    local = a.asname or a.name
                    groups.setdefault(parent, []).append(leaf if local == leaf else f"{leaf} as {local}")
                else:
                    groups.setdefault(new_module(target), []).append(
                        a.name + (f" as {a.asname}" if a.asname else ""))
            unchanged = list(groups) == [target] and groups[target] == [
                a.name + (f" as {a.asname}" if a.asname else "") for a in node.names]
            if unchanged and not (node.level and moved_file):
                continue
            seg = ast.get_source_segment(text, node) or ""
            indent = " " * node.col_offset
            # a relative import stays relative, counted from the same place, unless its file moved
            dots = "." * node.level
            base = _absolute(ast.ImportFrom(module=None, names=[], level=node.level), module, is_pkg)
            stmts = []
            same_names = [a.name + (f" as {a.asname}" if a.asname else "") for a in node.names]
            for i, (mod, names) in enumerate(groups.items()):
                body = ", ".join(names)
                if node.level and not moved_file and (mod == base or mod.startswith(base + ".")):
                    mod = dots + mod[len(base) + 1:]
                if len(groups) == 1 and names == same_names:
                    # the names stay: only the module changes, the rest (layout, comments) is kept
                    stmts.append(re.sub(r"^from\s+[.\w]+\s+import", lambda _: f"from {mod} import", seg))
                    continue
                line = f"from {mod} import {body}"
                if len(indent) + len(line) > 120 or ("\n" in seg and len(groups) == 1):
                    line = f"from {mod} import (\n" + "".join(f"{indent}    {n},\n" for n in names) + f"{indent})"
                comments = re.findall(r"#.*$", seg, re.M) if i == 0 else []
                if comments:
                    first, nl, rest = line.partition("\n")
                    line = first + "  " + "  ".join(comments) + nl + rest
                stmts.append(line if i == 0 else indent + line)
            edits.append((node.lineno, node.col_offset, node.end_lineno or node.lineno, node.end_col_offset or 0,
                          "\n".join(stmts)))
    if not edits:
        return text
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln))
    out = text
    for lineno, col, end_lineno, end_col, new in sorted(edits, reverse=True):
        a = offsets[lineno - 1] + len(lines[lineno - 1].encode()[:col].decode(errors="ignore"))
        b = offsets[end_lineno - 1] + len(lines[end_lineno - 1].encode()[:end_col].decode(errors="ignore"))
        out = out[:a] + new + out[b:]
    return out


_NAMES = "|".join(sorted((re.escape(o) for o in MOVES), key=len, reverse=True))
_DOTTED = re.compile(rf"\b{PKG}\.({_NAMES})\b(?![\w-])")
_PATH = re.compile(rf"\b{PKG}/({_NAMES})\.py\b")


#: a module's file named alone (`host.py`) in prose: docs/ and README.md
_BARE = re.compile(rf"(?<=[`( ])({_NAMES})\.py\b")


def rewrite_bare(text: str) -> str:
    """``host.py`` named alone in a document (after a backtick, a parenthesis or a space) ->
    ``facts/machine.py``; ``pipeline.py`` -> ``pipeline/``."""
    text = re.sub(r"(?<=[`( ])pipeline\.py\b", "pipeline/", text)
    return _BARE.sub(lambda m: MOVES[m.group(1)].replace(".", "/") + ".py", text)


def rewrite_text(text: str) -> str:
    """Dotted names (``escha_deploy.host``) and file paths (``escha_deploy/host.py``) of moved
    modules, anywhere in a text file."""
    text = _PATH.sub(lambda m: f"{PKG}/{MOVES[m.group(1)].replace('.', '/')}.py", text)
    text = text.replace(f"{PKG}/pipeline.py", f"{PKG}/pipeline/")
    return _DOTTED.sub(lambda m: f"{PKG}.{MOVES[m.group(1)]}", text)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def _text_files() -> list[Path]:
    tracked = set(_git("ls-files").splitlines())
    out = []
    for rel in sorted(tracked):
        p = ROOT / rel
        if SKIP_PARTS & set(Path(rel).parts) or not p.is_file() or p.suffix not in TEXT_SUFFIXES:
            continue
        if rel.endswith(".patch") or "/runtime/hooks/" in rel:  # copied into SGLang: never named escha's modules
            continue
        if p.resolve() == Path(__file__).resolve():  # this table and its examples name the old modules
            continue
        out.append(p)
    return out


def move_files() -> dict[Path, tuple[str, bool]]:
    """``git mv`` each module that is still at its old place; the new packages' __init__.py.
    Returns each moved file's new path with its old module name (and whether it was a
    package's __init__), from which its relative imports count."""
    moved: dict[Path, tuple[str, bool]] = {}
    base = ROOT / PKG
    for old, new in MOVES.items():
        src = base / f"{old}.py"
        dst = base / (new.replace(".", "/") + ".py")
        if not src.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        init = dst.parent / "__init__.py"
        if not init.exists() and dst.parent.name != "pipeline":
            init.write_text(PACKAGE_DOCS.get(dst.parent.name, ""))
            _git("add", str(init.relative_to(ROOT)))
        if dst.parent.name == "pipeline" and (base / "pipeline.py").exists():
            _git("mv", f"{PKG}/pipeline.py", f"{PKG}/pipeline/__init__.py")
            moved[(base / "pipeline/__init__.py").resolve()] = (f"{PKG}.pipeline", False)
        _git("mv", str(src.relative_to(ROOT)), str(dst.relative_to(ROOT)))
        moved[dst.resolve()] = (_full(old), False)
    for old, new in FILE_MOVES.items():
        if (base / old).exists():
            (base / new).parent.mkdir(parents=True, exist_ok=True)
            _git("mv", f"{PKG}/{old}", f"{PKG}/{new}")
            moved[(base / new).resolve()] = (f"{PKG}.{old[:-3]}", False)
    for rel, fixes in FILE_FIXES.items():
        p = base / rel
        s = p.read_text()
        for a, b in fixes:
            s = s.replace(a, b)
        p.write_text(s)
    return moved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when an old name is left")
    args = ap.parse_args()
    if args.check:
        left = [f"{p.relative_to(ROOT)}:{i}: {ln.strip()}" for p in _text_files()
                for i, ln in enumerate(p.read_text(errors="replace").splitlines(), 1)
                if _DOTTED.search(ln) or _PATH.search(ln)]
        left += [f"{PKG}/{o}.py: not moved" for o in MOVES if (ROOT / PKG / f"{o}.py").exists()]
        print("\n".join(left) or "every module is at its new place")
        return 1 if left else 0
    moved = move_files()
    for p in _text_files():
        text = p.read_text()
        new = text
        if p.suffix == ".py":
            module, is_pkg = moved.get(p.resolve()) or _module_of(p)
            try:
                new = rewrite_imports(new, module, is_pkg, p.resolve() in moved)
            except SyntaxError:
                pass  # a fixture that is not Python: its text alone
        new = rewrite_text(new)
        rel = p.relative_to(ROOT).as_posix()
        if p.suffix == ".md" and (rel.startswith("docs/") or rel == "README.md"):
            new = rewrite_bare(new)
        if new != text:
            p.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
