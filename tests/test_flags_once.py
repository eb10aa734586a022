"""A profile key's SGLang flag (or environment variable) is spelled once in ``escha_deploy/``: in
the key's ``SGLangFlag`` metadata (``profile/models.py``). Every other use looks it up by the key
(``profile.key_flag``, ``profile.key_env``), so renaming a flag is one edit and no renderer,
rule or diagnosis can drift from the key.

A spelling is a string literal in the code that is the name itself or an argv/environment token
``NAME=VALUE``; prose that mentions a flag among other words (messages, docstrings) is not one,
nor a ``description=`` text (the schema's words for the key). ``OTHER_MEANINGS`` lists the files
that spell the same characters for something that is not the key's setting, each with why; an
entry that no longer matches fails too, so the list cannot go stale.
"""

from __future__ import annotations

import ast
import functools
import shutil
from pathlib import Path

from escha_deploy.profile import key_metadata

PACKAGE = Path(__file__).resolve().parents[1] / "escha_deploy"

#: file (under escha_deploy/) -> (why its spellings are not the key's, the names it spells)
OTHER_MEANINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sglang/capabilities.py": (
        "catalog data below the profile layer: the flags the int2-kv and w2-weights overlays add to SGLang's "
        "parser (flagcheck extends the release's catalog with them)",
        ("--kv-cache-dtype", "--kv-cache-quant-group-size", "--quantization")),
    "utils/secretargs.py": (
        "SGLang's table of flags whose value is a secret (checked against the catalog), below the profile layer",
        ("--api-key",)),
    "launch/sglang_preflight.py": (
        "runs as a script in SGLang's interpreter, where escha_deploy may not be importable: the flags SGLang's "
        "sizing and model-runner stages read (STAGE_FLAGS)",
        ("--mem-fraction-static", "--max-total-tokens", "--max-mamba-cache-size", "--max-running-requests",
         "--context-length", "--hicache-size", "--hicache-ratio", "--hicache-mem-layout", "--attention-backend")),
    "cli/plan.py": ("`escha-deploy plan`'s own --hicache-size option", ("--hicache-size",)),
    "cli/bench.py": ("`escha-deploy bench`'s own --api-key option (hidden, refused)", ("--api-key",)),
    "fleet/router.py": ("the router's own --port (sgl-router / SMG), not the server's", ("--port",)),
    "fleet/smg_launch.py": ("the SMG router's own --api-key, which this launcher passes from a key file",
                            ("--api-key",)),
}


def key_of_name() -> dict[str, str]:
    """Each flag and environment variable a profile key declares -> that key."""
    out: dict[str, str] = {}
    for key, meta in key_metadata().items():
        for name in (meta.flag, meta.env):
            if name:
                out.setdefault(name, key)
    return out


@functools.cache
def spellings(root: Path, names: frozenset[str]) -> tuple[list[tuple[str, int, str]], list[tuple[str, int, str]]]:
    """``(declarations, others)`` under ``root``: each ``(path relative to root, line, name)``
    where a string literal is one of ``names`` or ``NAME=VALUE``; declarations are the arguments
    of a ``SGLangFlag(...)`` call, others everything else but ``description=`` texts."""
    decl: list[tuple[str, int, str]] = []
    other: list[tuple[str, int, str]] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        prose: set[int] = set()
        declared: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "description":
                prose |= {id(n) for n in ast.walk(node.value)}
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "SGLangFlag":
                declared |= {id(n) for a in [*node.args, *(k.value for k in node.keywords)] for n in ast.walk(a)}
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in prose:
                continue
            name = node.value.split("=", 1)[0]
            if name in names:
                (decl if id(node) in declared else other).append((rel, node.lineno, name))
    return decl, other


def spelled_twice(root: Path) -> list[str]:
    """One line per spelling of a key's flag or variable outside its declaration and outside
    ``OTHER_MEANINGS``."""
    keys = key_of_name()
    _, other = spellings(root, frozenset(keys))
    return [f"escha_deploy/{rel}:{line}: {name!r} is the setting of the profile key {keys[name]}, declared in its "
            f"SGLangFlag metadata; look it up with key_{'flag' if name.startswith('-') else 'env'}({keys[name]!r})"
            for rel, line, name in other if name not in OTHER_MEANINGS.get(rel, ("", ()))[1]]


def test_each_key_declares_its_flag_once():
    keys = key_of_name()
    decl, _ = spellings(PACKAGE, frozenset(keys))
    where: dict[str, list[str]] = {}
    for rel, line, name in decl:
        where.setdefault(name, []).append(f"{rel}:{line}")
    assert {n: w for n, w in where.items() if len(w) != 1} == {}
    assert set(where) == set(keys)  # every key's setting is declared where the walk found it
    assert all(rel == "profile/models.py" for rel, _, _ in decl)


def test_no_flag_of_a_key_is_spelled_twice():
    assert spelled_twice(PACKAGE) == []


def test_each_other_meaning_still_spells_what_it_names():
    keys = key_of_name()
    _, other = spellings(PACKAGE, frozenset(keys))
    found = {(rel, name) for rel, _, name in other}
    stale = [(rel, name) for rel, (_, names) in OTHER_MEANINGS.items() for name in names if (rel, name) not in found]
    assert stale == []


def test_a_planted_second_spelling_fails(tmp_path):
    """The check on a copy of the package with two planted spellings: a flag as a literal in a
    renderer and an environment token in a launcher. Both are reported, with file and line."""
    copy = tmp_path / "escha_deploy"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("*.json", "*.md", "*.yaml", "__pycache__"))
    flags = copy / "pipeline" / "argv.py"
    lines = flags.read_text(encoding="utf-8").count("\n")
    flags.write_text(flags.read_text(encoding="utf-8") + 'TP = "--tp-size"\n', encoding="utf-8")
    serve = copy / "launch" / "serve.py"
    n = serve.read_text(encoding="utf-8").count("\n")
    serve.write_text(serve.read_text(encoding="utf-8") + 'P2P = {"NCCL_P2P_DISABLE=1": 1}\n', encoding="utf-8")
    assert spelled_twice(copy) == [
        f"escha_deploy/launch/serve.py:{n + 1}: 'NCCL_P2P_DISABLE' is the setting of the profile key "
        "container.nccl_p2p_disable, declared in its SGLangFlag metadata; look it up with "
        "key_env('container.nccl_p2p_disable')",
        f"escha_deploy/pipeline/argv.py:{lines + 1}: '--tp-size' is the setting of the profile key runtime.tp_size, "
        "declared in its SGLangFlag metadata; look it up with key_flag('runtime.tp_size')",
    ]


def test_the_lookups_answer_each_key():
    from escha_deploy.profile import key_env, key_flag

    assert key_flag("runtime.tp_size") == "--tp-size"
    assert key_flag("hicache.l3.kind") == "--hicache-storage-backend"  # one flag for the union's three models
    assert key_env("hicache.l3.master") == "MOONCAKE_MASTER"  # a member of the union past the first
    for bad, lookup in (("runtime.tp_size", key_env), ("container.hf_token_file", key_flag), ("runtime.nope", key_flag)):
        try:
            lookup(bad)
        except LookupError as exc:
            assert bad in str(exc)
        else:
            raise AssertionError(f"{lookup.__name__}({bad!r}) answered")
