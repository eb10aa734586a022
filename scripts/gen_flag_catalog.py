#!/usr/bin/env python3
"""Regenerate an SGLang release's flag catalog from its real server argument parser.

What it writes: ``escha_deploy/catalog/releases/VERSION/flags.json`` for the sglang installed
beside it (VERSION is that wheel's version; its folder must exist: ``releases/README.md``), one
record per argparse
action that ``sglang.srt.server_args.ServerArgs.add_cli_args`` adds to a fresh
``argparse.ArgumentParser`` (504 actions for 0.5.19, ``-h/--help`` included): option strings,
dest, action class (``_StoreAction``, ``_StoreTrueAction``, ...), default, and where they say
something: type name (``str``, ``int``, ``float`` or ``module.function`` such as
``json.loads``), nargs, choices, const, ``required``, and for sglang's deprecated actions
``deprecated``, ``new_flag`` and ``removed`` (the parser error of a flag that now only fails).
A missing key means null (or false). ``escha_deploy.sglang.flagcheck`` checks rendered argv against it; ``.ci/check-flag-catalog.sh``
rebuilds it from a freshly downloaded wheel and fails on any difference.

How: run with the Python of a throwaway virtual environment that holds the real sglang
wheel (installed ``--no-deps``) plus what its import chain needs (``--print-requirements
--release VERSION`` prints the release's ``parser-requirements.txt``, with torch pinned to the
CPU build ``torch==2.13.0``). Only the standard
library and sglang are imported here; escha_deploy is not.

Why importing the real parser and not reading the source (AST): the issue allows both. The
source route would have to re-implement ``arg_groups/arg_utils.py:add_cli_args_from_dataclass``
(``Annotated``/``Literal``/``Optional``/``List`` unwrapping, aliases, ``cli_name``, dest
anchoring, ``required`` when no default) and evaluate the four hand-registered flags whose
choices are computed at call time (``--sampling-backend`` from a set plus an environment
switch, ``--reasoning-parser`` from ``ReasoningParser.DetectorMap``, ``--tool-call-parser``
from ``FunctionCallParser.ToolCallParserEnum``, ``--kv-canary-real-data`` from an enum), the
deprecated aliases with custom action classes, and constants imported from other modules.
Every one of those is a place where a re-implementation can silently drift from what
``prepare_server_args`` really accepts; calling ``add_cli_args`` gives the parser itself, so
the catalog is correct by construction and a future change in the derivation code is caught
by the CI diff instead of hidden by it. The cost is the import chain (torch, triton,
transformers, ... ; about 2.5 GB installed, mostly read from this machine's disk), measured
in docs/flag-catalog.md.

Stand-ins used only to reach the parser: ``torchvision`` and ``torchvision.io``.
``sglang/srt/utils/common.py`` imports ``torchvision.io.decode_jpeg`` at module top; the only
torchvision that pip resolves for torch 2.13.0 is a CUDA build that fails to import against the
CPU torch (``operator torchvision::nms does not exist``). When no torchvision is installed,
this script puts two empty modules with real ``ModuleSpec``s in ``sys.modules`` (transformers
calls ``importlib.util.find_spec("torchvision")``, which raises on a ``None`` spec). No
argparse action refers to torchvision, and nothing in ``add_cli_args`` calls into it.
Triton is the real package (xgrammar requires it anyway).

Hygiene: every ``SGLANG_*`` variable is removed from the environment before the import, so
an operator's shell cannot change a choice list (``SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE`` adds
``token_oracle`` to ``--sampling-backend``); ``SGLANG_CACHE_DIR`` and ``HOME`` point into a
temporary directory because ``sglang/__init__.py`` derives cache paths from them. SGLang
plugins (``sglang.srt.plugins.load_plugins``) are not loaded: the catalog is the stock parser.

Usage::

    python3 scripts/gen_flag_catalog.py --print-requirements --release 0.5.19 > req.txt
    VENV/bin/python scripts/gen_flag_catalog.py                 # rewrite the committed file
    VENV/bin/python scripts/gen_flag_catalog.py --out x.json    # write elsewhere
    VENV/bin/python scripts/gen_flag_catalog.py --check         # exit 1 and print a diff if stale

Exit codes: 0 written or identical; 1 ``--check`` found a difference; 2 bad usage, or the
installed sglang is not ``--release`` or has no release folder.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

CATALOG_SCHEMA = 1
REPO_ROOT = Path(__file__).resolve().parent.parent
RELEASES = REPO_ROOT / "escha_deploy" / "catalog" / "releases"


def release_folder(version: str) -> Path:
    """``escha_deploy/catalog/releases/VERSION``; ``SystemExit(2)`` when it does not exist (the
    release is not supported: its folder with ``facts.yaml`` comes first)."""
    folder = RELEASES / version
    if not (folder / "facts.yaml").is_file():
        print(f"error: sglang {version} has no release folder ({folder}/facts.yaml); "
              "see escha_deploy/catalog/releases/README.md", file=sys.stderr)
        raise SystemExit(2)
    return folder


def requirements(version: str) -> list[str]:
    """The release's ``parser-requirements.txt``: pinned requirements, comments dropped."""
    text = (release_folder(version) / "parser-requirements.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _install_torchvision_stand_in() -> bool:
    """Put empty ``torchvision``/``torchvision.io`` modules in ``sys.modules`` if none is installed.

    A stand-in used only to reach the parser (see the module docstring). Returns whether the
    stand-in was installed.
    """
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        return False
    tv = types.ModuleType("torchvision")
    tv.__spec__ = importlib.machinery.ModuleSpec("torchvision", None, is_package=True)
    tv.__path__ = []  # type: ignore[attr-defined]
    tv.__version__ = "0.0.0+escha-stand-in"  # type: ignore[attr-defined]
    io = types.ModuleType("torchvision.io")
    io.__spec__ = importlib.machinery.ModuleSpec("torchvision.io", None)

    def decode_jpeg(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("torchvision stand-in: only the argument parser may be used")

    io.decode_jpeg = decode_jpeg  # type: ignore[attr-defined]
    tv.io = io  # type: ignore[attr-defined]
    sys.modules["torchvision"] = tv
    sys.modules["torchvision.io"] = io
    return True


def _clean_environment(tmp: str) -> None:
    for key in [k for k in os.environ if k.startswith("SGLANG_")]:
        del os.environ[key]
    os.environ["SGLANG_CACHE_DIR"] = os.path.join(tmp, "sglang-cache")
    os.environ["HOME"] = tmp
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def _json_value(value: Any) -> Any:
    """A JSON-safe, deterministic rendering of a default, const or choice.

    JSON scalars, lists and dicts pass through (sets become sorted lists); ``argparse.SUPPRESS``
    stays the string ``==SUPPRESS==``; anything else becomes ``{"repr": repr(value)}``.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_json_value(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _json_value(v) for k, v in value.items()}
    return {"repr": repr(value)}


def _type_name(func: Any) -> str | None:
    """``str``/``int``/``float`` for builtins, else ``module.qualname`` (``json.loads``)."""
    if func is None:
        return None
    if func in (str, int, float):
        return func.__name__
    module = getattr(func, "__module__", None) or "?"
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    return f"{module}.{name}"


def _action_record(action: argparse.Action) -> dict[str, Any]:
    cls = type(action)
    record: dict[str, Any] = {
        "flags": list(action.option_strings),
        "dest": action.dest,
        "action": cls.__name__,
        "default": _json_value(action.default),
    }
    # Compact: a key is written only when it says something (absent = null / false).
    optional = {
        "type": _type_name(action.type),
        "nargs": action.nargs,
        "choices": None if action.choices is None else _json_value(action.choices),
        "const": _json_value(action.const),
    }
    record.update({k: v for k, v in optional.items() if v is not None})
    if action.required:
        record["required"] = True
    if cls.__module__.endswith("argparse_actions") and cls.__name__.startswith("Deprecated"):
        record["deprecated"] = True
        new_flag = getattr(action, "new_flag", None)
        if new_flag:
            record["new_flag"] = new_flag
        error = getattr(action, "error_message", None)
        if error:
            record["removed"] = " ".join(str(error).split())
    return record


def installed_release(expected: str | None = None, need_folder: bool = True) -> str:
    """The installed sglang's version; ``SystemExit(2)`` when it is not ``expected`` (if given)
    or, with ``need_folder``, has no release folder (an SGLang built from a commit has none: its
    catalog goes to ``--out``, ``escha-deploy runtime lock``)."""
    import importlib.metadata

    installed = importlib.metadata.version("sglang")
    if expected and installed != expected:
        print(f"error: installed sglang is {installed}, expected {expected}", file=sys.stderr)
        raise SystemExit(2)
    if need_folder:
        release_folder(installed)
    return installed


def build_catalog(expected: str | None = None, need_folder: bool = True) -> tuple[dict[str, Any], dict[str, float | bool]]:
    """Import the real parser and describe it.

    Returns ``(catalog, stats)``: the catalog mapping (schema, runtime, version, parser source,
    actions in registration order) and timings in seconds (``import_s``, ``build_s``) plus
    whether the torchvision stand-in was used. Raises ``SystemExit(2)`` when the installed
    sglang is not ``expected`` or has no release folder.
    """
    installed = installed_release(expected, need_folder)
    stand_in = _install_torchvision_stand_in()
    t0 = time.perf_counter()
    from sglang.srt.server_args import ServerArgs  # the real parser's only entry point

    t1 = time.perf_counter()
    parser = argparse.ArgumentParser(prog="sglang serve")  # as prepare_server_args builds it
    ServerArgs.add_cli_args(parser)
    t2 = time.perf_counter()
    positional = [a.dest for a in parser._actions if not a.option_strings]
    groups = [
        [a.option_strings[0] for a in g._group_actions] for g in parser._mutually_exclusive_groups
    ]
    catalog = {
        "schema": CATALOG_SCHEMA,
        "runtime": "sglang",
        "version": installed,
        "source": "sglang.srt.server_args.ServerArgs.add_cli_args(argparse.ArgumentParser())",
        "generator": "scripts/gen_flag_catalog.py",
        "allow_abbrev": parser.allow_abbrev,
        "positional": positional,
        "mutually_exclusive": groups,
        "actions": [_action_record(a) for a in parser._actions],
    }
    stats = {"import_s": round(t1 - t0, 3), "build_s": round(t2 - t1, 4), "torchvision_stand_in": stand_in}
    return catalog, stats


class _ParseError(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    """The server parser, raising instead of exiting, so many argv can be tried in one process."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ParseError(message)

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        raise _ParseError(message or f"exit {status}")


def parse_with_real_parser(argvs: list[list[str]]) -> list[dict[str, Any]]:
    """Run each bare flag list through the real ``ServerArgs.add_cli_args`` parser.

    Returns one ``{"ok": bool, "error": str | None, "dests": {dest: value}}`` per argv
    (``dests`` only the values given on the command line, JSON-safe). Used by
    ``tests/test_flag_catalog.py`` to compare ``escha_deploy.sglang.flagcheck`` with the parser.
    """
    import contextlib
    import io as _io
    import logging

    build_catalog()  # same checks and stand-in as generation
    from sglang.srt.server_args import ServerArgs

    parser = _RaisingParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    defaults = vars(parser.parse_args(["--model-path", "x"]))
    logging.disable(logging.CRITICAL)  # deprecated flags log a warning each
    out = []
    for argv in argvs:
        try:
            with contextlib.redirect_stderr(_io.StringIO()), contextlib.redirect_stdout(_io.StringIO()):
                ns = vars(parser.parse_args(argv))
        except _ParseError as e:
            out.append({"ok": False, "error": str(e), "dests": {}})
            continue
        given = {k: _json_value(v) for k, v in ns.items() if k not in defaults or defaults[k] != v}
        out.append({"ok": True, "error": None, "dests": given})
    return out


def render(catalog: dict[str, Any]) -> str:
    """Serialize a catalog: header keys first, then one action per line (small, diffable)."""
    head = {k: v for k, v in catalog.items() if k != "actions"}
    lines = ["{"]
    for key, value in head.items():
        lines.append(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)},")
    lines.append('  "actions": [')
    rows = [
        "    " + json.dumps(a, ensure_ascii=False, separators=(", ", ": "))
        for a in catalog["actions"]
    ]
    lines.append(",\n".join(rows))
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", metavar="VERSION",
                    help="the sglang release expected installed (required with --print-requirements)")
    ap.add_argument("--out", type=Path, help="where to write (default: the release folder's flags.json)")
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing; exit 1 on a difference")
    ap.add_argument("--print-requirements", action="store_true", help="print the venv's requirements and exit")
    ap.add_argument("--parse-json", type=Path, metavar="FILE",
                    help="parse each argv of a JSON list of lists with the real parser; print JSON results")
    args = ap.parse_args(argv)
    if args.print_requirements:
        if not args.release:
            ap.error("--print-requirements needs --release VERSION")
        print("\n".join(requirements(args.release)))
        return 0
    if args.parse_json is not None:
        argvs = json.loads(args.parse_json.read_text(encoding="utf-8"))
        with tempfile.TemporaryDirectory(prefix="escha-flagcat-") as tmp:
            _clean_environment(tmp)
            print(json.dumps(parse_with_real_parser(argvs)))
        return 0
    with tempfile.TemporaryDirectory(prefix="escha-flagcat-") as tmp:
        _clean_environment(tmp)
        catalog, stats = build_catalog(args.release, need_folder=args.out is None)
    if args.out is None:
        args.out = release_folder(catalog["version"]) / "flags.json"
    text = render(catalog)
    print(
        f"sglang {catalog['version']}: {len(catalog['actions'])} actions; import {stats['import_s']} s,"
        f" add_cli_args {stats['build_s']} s; torchvision stand-in: {stats['torchvision_stand_in']}",
        file=sys.stderr,
    )
    if args.check:
        old = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if old == text:
            print(f"{args.out}: up to date", file=sys.stderr)
            return 0
        diff = difflib.unified_diff(
            old.splitlines(keepends=True), text.splitlines(keepends=True),
            fromfile=f"{args.out} (committed)", tofile="regenerated from the real parser",
        )
        sys.stdout.writelines(diff)
        print(f"error: {args.out} differs from the real parser; rerun scripts/gen_flag_catalog.py", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
