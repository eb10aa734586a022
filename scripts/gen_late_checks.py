#!/usr/bin/env python3
"""Catalog the late refusals of an SGLang release: every ``assert`` and ``raise`` in its startup
modules, with file, function and condition, classified by a committed annotations file
(``escha_deploy/catalog/releases/VERSION/late-checks.yaml``), into the table
``releases/VERSION/late-checks.md``; VERSION is the wheel's (``--release`` checks it).

A late refusal is one SGLang makes after argument parsing: while it builds the scheduler, the
model runner, the memory pools (device and host), the HiCache controller and its storage
backends, or the speculative workers, often after minutes of weight loading. The scan reads
the wheel's source with ``ast`` (nothing is imported or installed), so a new SGLang version
shows up as a diff of the generated table.

Scope (paths inside the wheel): ``sglang/srt/managers/scheduler*.py``,
``sglang/srt/managers/cache_controller.py``, ``sglang/srt/model_executor/model_runner.py``,
``sglang/srt/model_executor/model_runner_components/**``, ``sglang/srt/mem_cache/**`` (pools,
radix caches, HiCache host pools and the storage backends under ``mem_cache/storage/``) and
``sglang/srt/speculative/**``.

Per check: ``file`` (relative to ``sglang/``), ``function`` (``Class.method``, or
``<module>``), ``condition``: for ``assert`` its test; for ``raise`` the enclosing ``if``
tests from outermost to innermost (``not (...)`` in an ``else``), ``except T`` inside a
handler, ``always`` when nothing guards it. The key ``file:function:condition`` (``#2``, ... for
repeats in one function) is what the annotations file is keyed by; line numbers are shown but
are not part of the key.

Classification (the release's ``late-checks.yaml``): each key maps to one of

- ``mirrored``: a ``plan`` rule refuses it first (exit 3, field named); ``test`` names the test;
- ``degraded``: SGLang only degrades (logs, falls back); ``warning`` names the plan's warning;
- ``not_reachable``: no profile can reach it; ``why`` says why;
- ``open``: a profile can reach it and no rule mirrors it yet; ``why`` says what it needs.

A release being added may say ``review: incomplete`` in its annotations file: its rows without
an annotation are then ``unreviewed`` in the table (counted, not errors) until someone classifies
them; annotations carry over between releases by key (``--carry-from VERSION`` writes the
previous release's annotations whose rows still exist).

Rows whose condition reads no configuration are marked ``no configuration input`` by this
rule, without an annotation: the condition names no server argument (a ``dest`` of the
release's committed flag catalog, ``flags.json``), no model-config or runtime-context accessor (``server_args``,
``model_config``, ``hf_config``, ``get_schedule()``, ... see ``CONFIG_NAMES``) and no
environment switch (``envs.``). Such a check guards an internal invariant (a tensor shape, a
state transition) that a configuration cannot choose. Every other row must be annotated; the
script exits 1 naming each row without one (and each annotation whose row is gone).

Usage::

    python scripts/gen_late_checks.py [--wheel WHEEL]          # rewrite the release's late-checks.md
    python scripts/gen_late_checks.py --check                   # exit 1 on a stale table
    python scripts/gen_late_checks.py --stub-missing            # print YAML stubs for new rows

Exit codes: 0 written or up to date; 1 stale table or rows without annotation; 2 bad usage.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import sys
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
RELEASES = REPO / "escha_deploy" / "catalog" / "releases"

SCOPE = (
    "sglang/srt/managers/scheduler*.py",
    "sglang/srt/managers/cache_controller.py",
    "sglang/srt/model_executor/model_runner.py",
    "sglang/srt/model_executor/model_runner_components/*",
    "sglang/srt/mem_cache/*",
    "sglang/srt/speculative/*",
)

#: Names that make a condition read configuration, besides the server arguments' dests.
CONFIG_NAMES = frozenset({
    "server_args", "args", "model_config", "hf_config", "hf_text_config", "config", "mambaish_config",
    "hybrid_gdn_config", "get_schedule", "get_memory", "get_exec", "get_parallel", "get_spec", "get_disagg",
    "get_model", "get_hicache", "get_mm", "get_lora", "get_context", "get_platform", "envs", "spec_algorithm",
    "layout", "mem_layout", "io_backend", "storage_backend", "host_to_device_ratio", "host_size",
})

CLASSES = ("mirrored", "degraded", "not_reachable", "open")


@dataclass(frozen=True)
class Check:
    file: str
    function: str
    condition: str
    kind: str  # assert | raise
    line: int
    message: str
    reads_config: bool
    key: str = ""


def wheel_release(wheel: Path) -> str:
    """The release of an sglang wheel, from its file name (``sglang-X.Y.Z-...whl``, PEP 427)."""
    return wheel.name.split("-")[1]


def _dests(release: str) -> frozenset[str]:
    data = json.loads((RELEASES / release / "flags.json").read_text(encoding="utf-8"))
    return frozenset(a["dest"] for a in data["actions"] if a["dest"] != "help")


def _names(node: ast.AST) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def _message(node: ast.AST | None) -> str:
    """The first string constant of an assert message or raised exception, for the table."""
    if node is None:
        return ""
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.strip():
            return " ".join(n.value.split())[:120]
    return ""


class _Scanner(ast.NodeVisitor):
    def __init__(self, file: str, config_names: frozenset[str]) -> None:
        self.file = file
        self.config_names = config_names
        self.scope: list[str] = []
        self.guards: list[tuple[str, ast.AST]] = []
        self.found: list[Check] = []

    def _func(self) -> str:
        return ".".join(self.scope) or "<module>"

    def visit_ClassDef(self, node):  # noqa: N802
        self.scope.append(node.name)
        saved, self.guards = self.guards, []
        self.generic_visit(node)
        self.guards = saved
        self.scope.pop()

    def visit_FunctionDef(self, node):  # noqa: N802
        self.scope.append(node.name)
        saved, self.guards = self.guards, []
        for stmt in node.body:
            self.visit(stmt)
        self.guards = saved
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node):  # noqa: N802
        test = ast.unparse(node.test)
        self.guards.append((test, node.test))
        for stmt in node.body:
            self.visit(stmt)
        self.guards.pop()
        if node.orelse:
            self.guards.append((f"not ({test})", node.test))
            for stmt in node.orelse:
                self.visit(stmt)
            self.guards.pop()

    def visit_ExceptHandler(self, node):  # noqa: N802
        name = ast.unparse(node.type) if node.type is not None else "BaseException"
        self.guards.append((f"except {name}", ast.Constant(None)))
        for stmt in node.body:
            self.visit(stmt)
        self.guards.pop()

    def _add(self, kind: str, condition: str, cond_nodes: list[ast.AST], line: int, message: str) -> None:
        names: set[str] = set()
        for n in cond_nodes:
            names |= _names(n)
        condition = " ".join(condition.split())
        self.found.append(Check(self.file, self._func(), condition, kind, line, message,
                                bool(names & self.config_names)))

    def visit_Assert(self, node):  # noqa: N802
        cond = ast.unparse(node.test)
        nodes = [node.test] + [g for _, g in self.guards]
        if self.guards:
            cond = " and ".join([t for t, _ in self.guards] + [cond])
        self._add("assert", cond, nodes, node.lineno, _message(node.msg))

    def visit_Raise(self, node):  # noqa: N802
        if node.exc is None:  # a bare re-raise refuses nothing new
            return
        cond = " and ".join(t for t, _ in self.guards) or "always"
        self._add("raise", cond, [g for _, g in self.guards], node.lineno, _message(node.exc))


def scan(wheel: Path) -> list[Check]:
    """Every assert and raise in the scope of ``wheel``, keys made unique, in file order."""
    config_names = CONFIG_NAMES | _dests(wheel_release(wheel))
    checks: list[Check] = []
    with zipfile.ZipFile(wheel) as zf:
        for name in sorted(zf.namelist()):
            if not name.endswith(".py") or not any(fnmatch.fnmatch(name, p) for p in SCOPE):
                continue
            rel = name.removeprefix("sglang/")
            scanner = _Scanner(rel, config_names)
            scanner.visit(ast.parse(zf.read(name).decode("utf-8"), filename=name))
            checks += scanner.found
    seen: Counter[str] = Counter()
    out = []
    for c in checks:
        base = f"{c.file}:{c.function}:{c.condition}"
        seen[base] += 1
        key = base if seen[base] == 1 else f"{base} #{seen[base]}"
        out.append(Check(**{**c.__dict__, "key": key}))
    return out


def load_annotations(path: Path) -> dict[str, dict]:
    data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else None
    return dict((data or {}).get("checks") or {})


def review_incomplete(path: Path) -> bool:
    """Whether the annotations file says its review is not done (``review: incomplete``): its
    configuration-reading rows without an annotation are then ``unreviewed`` (shown, counted,
    printed) instead of errors. A release being added starts so; every other check stays."""
    data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else None
    return (data or {}).get("review") == "incomplete"


def _class(c: Check, notes: dict[str, dict]) -> str:
    note = notes.get(c.key)
    if note:
        return note.get("class", "no configuration input")
    return "unreviewed" if c.reads_config else "no configuration input"


def problems(checks: list[Check], notes: dict[str, dict], incomplete: bool = False) -> list[str]:
    """Rows that read configuration without an annotation (unless ``incomplete``), bad
    annotations, stale ones."""
    out = []
    keys = {c.key for c in checks}
    for c in checks:
        if c.reads_config and c.key not in notes and not incomplete:
            out.append(f"{c.file}:{c.line}: no annotation for {c.key!r}")
    for key, note in notes.items():
        if key not in keys:
            out.append(f"annotation for a check that is gone: {key!r}")
            continue
        cls = (note or {}).get("class")
        if cls not in CLASSES:
            out.append(f"{key!r}: class must be one of {', '.join(CLASSES)} (got {cls!r})")
        elif cls == "mirrored" and not note.get("test"):
            out.append(f"{key!r}: a mirrored check names its test")
        elif cls == "degraded" and not note.get("warning"):
            out.append(f"{key!r}: a degraded check names the warning")
        elif cls in ("not_reachable", "open") and not note.get("why"):
            out.append(f"{key!r}: a {cls} check says why")
        elif cls == "mirrored" and not _test_exists(note["test"]):
            out.append(f"{key!r}: its test {note['test']} does not exist")
    return out


def _test_exists(node_id: str) -> bool:
    """``tests/x.py::test_name`` names a file of this repository defining that test function."""
    path, _, name = node_id.partition("::")
    f = REPO / path
    return f.is_file() and f"def {name}(" in f.read_text(encoding="utf-8")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(checks: list[Check], notes: dict[str, dict], wheel_name: str, release: str) -> str:
    counts: Counter[str] = Counter(_class(c, notes) for c in checks)
    shown = (*CLASSES, *(("unreviewed",) if counts["unreviewed"] else ()), "no configuration input")
    lines = [
        f"# SGLang {release}'s late refusals",
        "",
        "Generated by `scripts/gen_late_checks.py` from the wheel "
        f"`{wheel_name}` (do not edit; the classifications live in `late-checks.yaml` beside this file).",
        "Every `assert` and `raise` of the startup modules (scheduler, model runner, `mem_cache/**` with",
        "the HiCache host pools and storage backends, the cache controller, `speculative/**`), with the",
        "condition that guards it. A row is `mirrored` (a `plan` rule refuses it first, exit 3, with the",
        "rule's test), `degraded` (SGLang only degrades; the plan's warning), `not_reachable` (no profile",
        "reaches it; why), `open` (a profile reaches it and no rule mirrors it yet: left, with what it",
        "needs), or `no configuration input` (its condition reads no server argument, model",
        "config or environment switch: an internal invariant; the rule is in the script's docstring).",
        "",
        f"{len(checks)} checks: " + ", ".join(f"{counts[k]} {k}" for k in shown) + ".",
        *(["", f"The review of this release is not done: {counts['unreviewed']} rows read configuration "
               "and have no annotation yet (`unreviewed`)."] if counts["unreviewed"] else []),
        "",
    ]
    by_file: dict[str, list[Check]] = {}
    for c in checks:
        by_file.setdefault(c.file, []).append(c)
    for file, rows in by_file.items():
        lines += [f"## `{file}`", "", "| line | function | condition | class | note |", "|---|---|---|---|---|"]
        for c in rows:
            note = notes.get(c.key) or {}
            cls = _class(c, notes)
            detail = note.get("test") or note.get("warning") or note.get("why") or ""
            if c.message:
                detail = (detail + " " if detail else "") + f"(\"{c.message}\")"
            lines.append(f"| {c.line} | `{_cell(c.function)}` | `{_cell(c.condition[:200])}` | {cls} | {_cell(detail)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, default=os.environ.get("ESCHA_SGLANG_WHEEL"),
                    help="the sglang wheel (default: $ESCHA_SGLANG_WHEEL)")
    ap.add_argument("--release", metavar="VERSION", help="the release the wheel must be (default: the wheel's)")
    ap.add_argument("--annotations", type=Path, help="default: the release folder's late-checks.yaml")
    ap.add_argument("--out", type=Path, help="default: the release folder's late-checks.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if the table or annotations are stale")
    ap.add_argument("--stub-missing", action="store_true", help="print YAML stubs for rows without annotation")
    ap.add_argument("--carry-from", metavar="VERSION",
                    help="write --annotations from VERSION's, keeping the rows that still exist, "
                         "with review: incomplete; then render")
    args = ap.parse_args(argv)
    if not args.wheel or not Path(args.wheel).is_file():
        print("error: --wheel: no sglang wheel (set ESCHA_SGLANG_WHEEL)", file=sys.stderr)
        return 2
    release = wheel_release(Path(args.wheel))
    if args.release and args.release != release:
        print(f"error: --wheel: {Path(args.wheel).name} is sglang {release}, not {args.release}", file=sys.stderr)
        return 2
    folder = RELEASES / release
    if not (folder / "facts.yaml").is_file():
        print(f"error: --wheel: sglang {release} has no release folder ({folder}/facts.yaml)", file=sys.stderr)
        return 2
    args.annotations = args.annotations or folder / "late-checks.yaml"
    args.out = args.out or folder / "late-checks.md"
    checks = scan(Path(args.wheel))
    notes = load_annotations(args.annotations)
    if args.carry_from:
        old = load_annotations(RELEASES / args.carry_from / "late-checks.yaml")
        keys = {c.key for c in checks}
        kept = {k: v for k, v in old.items() if k in keys}
        header = (f"# Classifications of SGLang {release}'s late refusals (scripts/gen_late_checks.py; the generated\n"
                  "# table is late-checks.md beside this file). Keyed by file:function:condition.\n"
                  f"# Carried over by key from {args.carry_from}'s late-checks.yaml ({len(kept)} of {len(old)} rows still\n"
                  "# exist; `--carry-from` wrote them). review: incomplete -- rows without an entry are shown\n"
                  "# as unreviewed until classified (the classes are in the script's docstring).\n")
        body = yaml.safe_dump({"review": "incomplete", "checks": kept}, width=10_000, sort_keys=False)
        args.annotations.write_text(header + body, encoding="utf-8")
        print(f"late checks: carried {len(kept)} of {len(old)} annotations from {args.carry_from}", file=sys.stderr)
        notes = load_annotations(args.annotations)
    if args.stub_missing:
        for c in checks:
            if c.reads_config and c.key not in notes:
                print(yaml.safe_dump({c.key: {"class": "not_reachable", "why": "TODO"}}, width=10_000, sort_keys=False), end="")
        return 0
    errs = problems(checks, notes, review_incomplete(args.annotations))
    text = render(checks, notes, Path(args.wheel).name, release)
    counts = Counter(_class(c, notes) for c in checks)
    print(f"late checks: sglang {release}: {len(checks)} found; " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), file=sys.stderr)
    for e in errs:
        print(f"error: {e}", file=sys.stderr)
    if args.check:
        old = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if old != text:
            print(f"error: {args.out} is stale; rerun scripts/gen_late_checks.py", file=sys.stderr)
            return 1
        return 1 if errs else 0
    args.out.write_text(text, encoding="utf-8")
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
