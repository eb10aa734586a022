#!/usr/bin/env python3
"""Catalog the startup refusals of an SGLang release: every ``assert`` and ``raise`` in the modules
SGLang runs from ``launch_server`` to the first served request, with file, function and
condition, classified by committed annotations (``escha_deploy/catalog/releases/VERSION/
late-checks.yaml``, and the earlier releases' files by key), into the table
``releases/VERSION/late-checks.md``; VERSION is the wheel's (``--release`` checks it).

The scan reads the wheel's source with ``ast`` (nothing is imported or installed), so a new
SGLang version shows up as a diff of the generated table.

Scope (``scope()``, paths inside the wheel): argument resolution (``sglang/srt/server_args.py``,
``sglang/srt/arg_groups/**``), ``sglang/srt/configs/**``, ``sglang/srt/layers/attention/**``, the
``sglang/srt/layers/quantization/`` modules of the quantizations the shipped profiles
(``profiles/*.yaml``, ``model.quantization``) name (``QUANT_MODULES``, after SGLang's method table
in ``srt/layers/quantization/__init__.py``) plus the common ones, the model classes of the shipped
``model_type`` (``ARCH_MODULES``: ``srt/models/qwen3_5*.py``, ``qwen3_next.py``),
``sglang/srt/model_executor/**``, ``sglang/srt/distributed/**``, and the late set: the scheduler
(``managers/scheduler*.py``), the cache controller, ``mem_cache/**`` (pools, radix caches,
HiCache host pools and storage backends) and ``speculative/**``.

Import trace (``--trace``, writes ``releases/VERSION/startup-trace.json``): the pre-flight's
SGLang side (``escha_deploy/launch/sglang_preflight.py: sglang_side``: argument resolution,
model config, attention-backend choice and, with the plan's device figures as ``serve`` passes
them, the KV cache configurator and the host pools) for each shipped profile, in the release's flag-catalog
venv with the test-only CPU site hook (``tests/launch/preflight_cpu_site``), recording
``sys.modules`` after it and every SGLang function it called. The table's header names the
traced modules outside the scope; rows in traced modules are reviewed one by one (a module
note does not cover them); rows in other modules may be classified per module.

Per check: ``file`` (relative to ``sglang/``), ``function`` (``Class.method``, or
``<module>``), ``condition``: for ``assert`` its test; for ``raise`` the enclosing ``if``
tests from outermost to innermost (``not (...)`` in an ``else``), ``except T`` inside a
handler, ``always`` when nothing guards it. The key ``file:function:condition`` (``#2``, ... for
repeats in one function) is what the annotations are keyed by; line numbers are shown but
are not part of the key.

Classification (``late-checks.yaml``: ``checks`` by key, ``modules`` by file or glob): each maps to one of

- ``mirrored``: a ``plan`` rule refuses it first (exit 3, field named); ``test`` names the test
  (it must exist);
- ``degraded``: SGLang only degrades (logs, falls back); ``warning`` names the plan's warning;
- ``preflight``: SGLang's pre-flight refuses it before the server starts (``serve`` runs it, exit
  3): the trace shows its function ran for the shipped profiles, or it is argument resolution
  (``RESOLUTION``), which the pre-flight runs whole; ``why`` says which;
- ``not_reachable``: no profile can reach it; ``why`` says why. ``--reached FILE`` (the
  fuzz's refusal sites, ``[{"site": "file:function", "message": ...}]``) makes a
  ``not_reachable`` row at a reached site an error;
- ``open``: a profile can reach it and no rule mirrors it yet; ``why`` says what it needs.

Annotations carry over between releases by key: a release's classifications are those of every
supported release before it (``index.yaml``'s order) with its own file's on top, so a new
release's file holds only its new keys. A release being added may say ``review: incomplete``:
its rows without a reason are then ``unreviewed`` in the table (counted, not errors), and the
script writes ``late-checks-review.json`` beside the table (``REVIEW``: the unreviewed rows by
startup area), which every plan of that release names as a warning; the file goes once no row is
unreviewed.

Rows whose condition reads no configuration are marked ``no configuration input`` by this
rule, without an annotation: the condition names no server argument (a ``dest`` of the
release's committed flag catalog, ``flags.json``), no model-config or runtime-context accessor (``server_args``,
``model_config``, ``hf_config``, ``get_schedule()``, ... see ``CONFIG_NAMES``) and no
environment switch (``envs.``). Such a check guards an internal invariant (a tensor shape, a
state transition) that a configuration cannot choose. Every other row needs a reason; the
script exits 1 naming each row without one (and each of the release's own annotations whose
row is gone).

Usage::

    python scripts/gen_late_checks.py [--wheel WHEEL]          # rewrite the release's late-checks.md
    python scripts/gen_late_checks.py --check                   # exit 1 on a stale table
    python scripts/gen_late_checks.py --trace                   # rewrite startup-trace.json, then the table
    python scripts/gen_late_checks.py --stub-missing            # print YAML stubs for new rows

Exit codes: 0 written or up to date; 1 stale table or rows without annotation; 2 bad usage.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import functools
import json
import os
import re
import sys
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
RELEASES = REPO / "escha_deploy" / "catalog" / "releases"

#: Today's set: the late refusals proper (built after weight loading starts).
LATE_SCOPE = (
    "sglang/srt/managers/scheduler*.py",
    "sglang/srt/managers/cache_controller.py",
    "sglang/srt/model_executor/model_runner.py",
    "sglang/srt/model_executor/model_runner_components/*",
    "sglang/srt/mem_cache/*",
    "sglang/srt/speculative/*",
)

#: What SGLang runs from ``launch_server`` to the first served request besides: its argument
#: resolution (``srt/server_args.py``, the hooks of ``srt/arg_groups/``), the model and load
#: configs (``srt/configs/``), the attention backends (``srt/layers/attention/``), the model
#: executor and the distributed setup.
STARTUP_SCOPE = (
    "sglang/srt/server_args.py",
    "sglang/srt/arg_groups/*",
    "sglang/srt/configs/*",
    "sglang/srt/layers/attention/*",
    "sglang/srt/model_executor/*",
    "sglang/srt/distributed/*",
)

#: ``layers/quantization/`` modules every quantized or unquantized load goes through
#: (``srt/layers/quantization/__init__.py`` builds the method table from them).
QUANT_COMMON = ("__init__.py", "base_config.py", "base_scheme.py", "unquant.py", "utils.py", "kv_cache.py")

#: The modules of each quantization method (``--quantization``), after SGLang's method table
#: (``srt/layers/quantization/__init__.py``: ``"fp8": Fp8Config``, ``"gptq_marlin": GPTQMarlinConfig``).
#: A shipped quantization the wheel does not know (an overlay's, such as ``escha_w2``) has none.
QUANT_MODULES = {
    "fp8": ("fp8.py", "fp8_utils.py"),
    "gptq_marlin": ("gptq/*", "marlin_utils.py"),
    "gptq": ("gptq/*",),
}

#: The model classes of each shipped ``model_type`` (``srt/models/*.py``'s ``EntryClass``):
#: Qwen3-Next and the Qwen3.5 hybrid GDN family (escha_deploy/sglang/arch.py: HYBRID_GDN_MODEL_TYPES).
ARCH_MODULES = {
    "qwen3_next": ("qwen3_next.py",),
    "qwen3_5": ("qwen3_5.py",),
    "qwen3_5_moe": ("qwen3_5.py",),
    "qwen3_5_text": ("qwen3_5_text.py", "qwen3_5.py"),
    "qwen3_5_moe_text": ("qwen3_5_text.py", "qwen3_5.py"),
}


@functools.lru_cache(maxsize=1)
def shipped_profiles() -> list[dict]:
    """The shipped profiles (``profiles/*.yaml``) as raw YAML, their ``extends`` chain merged (a
    profile may extend one that extends another) per section, one level deep (what this script
    needs: ``model.quantization``, ``model.architecture``)."""
    raw = {f.stem: yaml.safe_load(f.read_text(encoding="utf-8")) or {} for f in sorted((REPO / "profiles").glob("*.yaml"))}

    def resolved(data: dict, seen: tuple[str, ...] = ()) -> dict:
        parent = data.get("extends", "")
        if not parent or parent in seen or parent not in raw:
            return data
        base = resolved(raw[parent], (*seen, parent))
        merged = {**base, **data}
        for section in ("model", "runtime"):
            merged[section] = {**(base.get(section) or {}), **(data.get(section) or {})}
        return merged

    return [resolved(data) for data in raw.values()]


def shipped_kinds() -> tuple[list[str], list[str]]:
    """The shipped profiles' quantizations (``model.quantization``) and model types, with every
    hybrid GDN type ``plan`` models (escha_deploy/sglang/arch.py: HYBRID_GDN_MODEL_TYPES, Qwen3-Next and
    the Qwen3.5 family)."""
    quants = sorted({str(p["model"].get("quantization")) for p in shipped_profiles() if p["model"].get("quantization")})
    sys.path.insert(0, str(REPO))
    from escha_deploy.sglang.arch import HYBRID_GDN_MODEL_TYPES

    types = {str((p["model"].get("architecture") or {}).get("model_type")) for p in shipped_profiles()}
    return quants, sorted(types | HYBRID_GDN_MODEL_TYPES)


def scope() -> tuple[str, ...]:
    """The catalog's scope (globs inside the wheel): today's set, the startup set, the
    ``layers/quantization/`` modules of the shipped quantizations and the shipped
    architectures' model classes."""
    quants, types = shipped_kinds()
    quant = [*QUANT_COMMON, *(m for q in quants for m in QUANT_MODULES.get(q, ()))]
    models = [m for t in types for m in ARCH_MODULES.get(t, ())]
    return (*LATE_SCOPE, *STARTUP_SCOPE, *(f"sglang/srt/layers/quantization/{m}" for m in dict.fromkeys(quant)),
            *(f"sglang/srt/models/{m}" for m in dict.fromkeys(models)))


#: Names that make a condition read configuration, besides the server arguments' dests.
CONFIG_NAMES = frozenset({
    "server_args", "args", "model_config", "hf_config", "hf_text_config", "config", "mambaish_config",
    "hybrid_gdn_config", "get_schedule", "get_memory", "get_exec", "get_parallel", "get_spec", "get_disagg",
    "get_model", "get_hicache", "get_mm", "get_lora", "get_context", "get_platform", "envs", "spec_algorithm",
    "layout", "mem_layout", "io_backend", "storage_backend", "host_to_device_ratio", "host_size",
})

CLASSES = ("mirrored", "degraded", "preflight", "not_reachable", "open")

TRACE = "startup-trace.json"

#: SGLang's argument resolution (``prepare_server_args``, ``ServerArgs.resolve_once`` and the
#: hooks it runs): the pre-flight runs it whole on the server's argv, so a refusal there is the
#: pre-flight's even where the shipped profiles' values do not reach the function.
RESOLUTION = ("srt/server_args.py", "srt/arg_groups/*")


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

    @property
    def module(self) -> str:
        """The dotted module name (``sglang.srt.configs.model_config``; a package's ``__init__``
        is the package)."""
        return ("sglang/" + self.file.removesuffix(".py")).replace("/", ".").removesuffix(".__init__")

    @property
    def site(self) -> str:
        """``file:function``, as the pre-flight and its trace name a place in SGLang."""
        return f"{self.file}:{self.function}"


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

    #: The fields that hold statements: only statements hold an ``assert`` or ``raise`` (an
    #: expression, a lambda's body included, holds none), so expressions are not walked.
    _BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")

    def generic_visit(self, node):
        for name in self._BLOCKS:
            block = getattr(node, name, None)
            if isinstance(block, list):
                for child in block:
                    if isinstance(child, ast.AST):
                        self.visit(child)

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
    """Every assert and raise in the scope of ``wheel``, keys made unique, in file order (read
    once per process and wheel)."""
    return list(_scan(Path(wheel).resolve()))


@functools.lru_cache(maxsize=4)
def _scan(wheel: Path) -> tuple[Check, ...]:
    config_names = CONFIG_NAMES | _dests(wheel_release(wheel))
    in_scope = re.compile("|".join(fnmatch.translate(g) for g in scope()))
    checks: list[Check] = []
    with zipfile.ZipFile(wheel) as zf:
        for name in sorted(zf.namelist()):
            if not name.endswith(".py") or not in_scope.match(name):
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
    return tuple(out)


# --------------------------------------------------------------------------- the import trace

#: Run in SGLang's interpreter (the flag-catalog venv): the pre-flight's SGLang side
#: (``escha_deploy/launch/sglang_preflight.py: sglang_side``) on each argv of stdin with its
#: plan's device figures (so the sizing stages run too), with a profile hook recording every
#: SGLang function called; then ``sys.modules``. Each argv runs with the environment variables
#: SGLang reads while resolving and sizing that its launch sets (the oracle case's ``env``, e.g.
#: ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN``), put back after it.
_TRACE_SIDE = r"""
import json, runpy, sys
import sglang
import os
request = json.loads(sys.stdin.read())
argvs, devices = request["argvs"], request["devices"]
envs = request.get("envs") or [{} for _ in argvs]
side = runpy.run_path(sys.argv[1])["sglang_side"]
def run(a, d, e):
    saved = dict(os.environ)
    os.environ.update(e)
    try:
        return side(a, d)
    finally:
        os.environ.clear()
        os.environ.update(saved)
called = set()
def hook(frame, event, arg):
    if event == "call":
        code = frame.f_code
        path = code.co_filename.replace("\\", "/")
        if "/sglang/srt/" in path:
            called.add((path[path.rindex("/sglang/") + len("/sglang/"):], code.co_qualname))
sys.setprofile(hook)
results = [run(a, d, e) for a, d, e in zip(argvs, devices, envs)]
sys.setprofile(None)
print(json.dumps({"results": results, "called": sorted(called),
                  "modules": sorted(m for m in sys.modules if m == "sglang" or m.startswith("sglang."))}))
"""


def shipped_requests(release: str) -> list[tuple[str, dict, list[str], dict[str, int]]]:
    """Per shipped profile (``tests/oracle/cases: shipped_cases``, each on its described host):
    ``(name, config.json, the server argv serve renders, the plan's device figures)``, the
    figures as ``serve`` passes them to the pre-flight's sizing stages, the host pools checked
    against the described host's RAM rather than this machine's."""
    sys.path.insert(0, str(REPO))
    from escha_deploy.facts.machine import described_host
    from escha_deploy.launch.sglang_preflight import device_figures
    from escha_deploy.planner import plan
    from escha_deploy.profile import load_profile
    from tests.oracle.cases import _release_overrides, build_case, shipped_cases

    out = []
    for case in shipped_cases():
        oracle, _planner = build_case(case, release)
        result = plan(load_profile(case.profile, list(_release_overrides(case, release))),
                      described_host(case.host_ram, case.platform), model_dir=None, release=release)
        out.append((case.profile, oracle["config"], list(oracle["argv"]), device_figures(result, host_budget=case.host_ram)))
    return out


def shipped_envs(release: str) -> dict[str, dict[str, str]]:
    """Per shipped profile, the environment its launch sets that SGLang reads while resolving and
    sizing (``tests/oracle/cases: build_case``'s ``env``; empty for most profiles)."""
    sys.path.insert(0, str(REPO))
    from tests.oracle.cases import build_case, shipped_cases

    return {case.profile: dict(build_case(case, release)[0].get("env") or {}) for case in shipped_cases()}


def trace(release: str, venv: Path) -> dict:
    """What SGLang imports and runs during its pre-flight for each shipped profile (argument
    resolution, model config, attention-backend choice and, with the plan's device figures, the
    KV cache configurator and the host pools), in the flag-catalog venv ``venv``
    with the test-only CPU site hook (tests/launch/preflight_cpu_site: the stand-ins it names).
    The argv is the one ``serve`` renders (``tests/oracle/cases``), on a model folder holding
    the profile's config.json. Returns the trace file's content: the profiles, each one's
    pre-flight verdict and attention backends, the ``sglang.*`` modules imported, and the
    functions called (``file:function`` as this script keys them)."""
    import subprocess
    import tempfile

    card = {"vram_bytes": 16 * 2**30 - 2**28, "name": "NVIDIA GeForce RTX 5060 Ti", "capability": "12.0"}
    with tempfile.TemporaryDirectory(prefix="escha-late-trace-") as tmp:
        names, argvs, devices = [], [], []
        envs_by_name = shipped_envs(release)
        for name, config, argv, device in shipped_requests(release):
            folder = Path(tmp) / name
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
            (folder / "model.safetensors").write_bytes(b"\0" * 64)
            model = argv[argv.index("--model-path") + 1]
            argv[argv.index("--model-path") + 1] = str(folder)
            if "--speculative-draft-model-path" in argv:  # a draft in the model's own folder (NEXTN's MTP layer)
                i = argv.index("--speculative-draft-model-path") + 1
                if argv[i] == model:
                    argv[i] = str(folder)
            names.append(name)
            argvs.append(argv)
            devices.append(device)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests" / "launch" / "preflight_cpu_site")]),
               "ESCHA_TEST_CARD": json.dumps(card), "ESCHA_ORACLE_SCRIPT": str(REPO / "scripts" / "sglang_oracle.py"),
               "HOME": tmp}
        proc = subprocess.run([str(venv / "bin" / "python"), "-c", _TRACE_SIDE,
                               str(REPO / "escha_deploy" / "launch" / "sglang_preflight.py")],
                              input=json.dumps({"argvs": argvs, "devices": devices,
                                                "envs": [envs_by_name.get(n, {}) for n in names]}),
                              capture_output=True, text=True, env=env, timeout=900, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the traced pre-flight failed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}")
    got = json.loads(lines[-1])
    faults = [f"{n}: {r.get('type')}: {r.get('message')} ({r.get('site')})"
              for n, r in zip(names, got["results"]) if r.get("fault") == "harness"]
    if faults:  # the pre-flight's own code failed: no trace of SGLang to record
        raise RuntimeError("the traced pre-flight failed in its own code: " + "; ".join(faults))
    functions = sorted({f"{path}:{qual.replace('.<locals>', '')}" for path, qual in got["called"]})
    return {
        "release": release,
        "how": "scripts/gen_late_checks.py --trace: SGLang's pre-flight (sglang_side) for each shipped profile, "
               "in the flag-catalog venv; modules: sys.modules after it; functions: every SGLang function it called",
        "profiles": {n: {k: r.get(k) for k in ("ok", "stage", "message", "site")}
                     | {"attention_backend": (r.get("answers") or {}).get("attention_backend"), "argv": traced_argv(a),
                        "device": d}
                     for n, r, a, d in zip(names, got["results"], argvs, devices)},
        "modules": got["modules"],
        "functions": functions,
    }


def traced_argv(argv: list[str]) -> list[str]:
    """``argv`` as the trace records it: the model folder (a temporary one) shown as ``MODEL``, and a
    draft in that same folder (NEXTN's MTP layer) too."""
    out = list(argv)
    if "--model-path" in out:
        i = out.index("--model-path") + 1
        model, out[i] = out[i], "MODEL"
        if "--speculative-draft-model-path" in out:
            j = out.index("--speculative-draft-model-path") + 1
            if out[j] == model:
                out[j] = "MODEL"
    return out


def load_trace(release: str) -> dict:
    """The release's committed trace (``startup-trace.json``); empty lists when it has none."""
    path = RELEASES / release / TRACE
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return {"modules": [], "functions": [], "profiles": {}, **data}


# --------------------------------------------------------------------------- annotations

@dataclass
class Notes:
    """A release's classifications: ``checks`` by key, ``modules`` by file glob (relative to
    ``sglang/``, for modules the shipped profiles' pre-flight does not import), ``own``: the keys
    and globs its own file holds (the rest came over from earlier releases)."""

    checks: dict[str, dict]
    modules: dict[str, dict]
    own_checks: frozenset[str] = frozenset()
    own_modules: frozenset[str] = frozenset()
    incomplete: bool = False

    def module_note(self, c: Check) -> tuple[str, dict] | None:
        """The module note covering ``c``'s file: its own file name first, else a glob."""
        if c.file in self.modules:
            return c.file, self.modules[c.file]
        for glob in self.module_globs:
            if fnmatch.fnmatch(c.file, glob):
                return glob, self.modules[glob]
        return None

    @functools.cached_property
    def module_globs(self) -> list[str]:
        """The module notes' keys that are patterns, not file names."""
        return [g for g in self.modules if any(ch in g for ch in "*?[")]


def _read(path: Path) -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where PyYAML has it
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader) if path.exists() else None  # noqa: S506
    return data or {}


def load_annotations(path: Path) -> dict[str, dict]:
    """The ``checks`` of one annotations file (no carry-over)."""
    return dict(_read(path).get("checks") or {})


def review_incomplete(path: Path) -> bool:
    """Whether the annotations file says its review is not done (``review: incomplete``): its
    configuration-reading rows without an annotation are then ``unreviewed`` (shown, counted,
    printed) instead of errors. A release being added starts so; every other check stays."""
    return _read(path).get("review") == "incomplete"


def _supported() -> list[str]:
    return [str(v) for v in yaml.safe_load((RELEASES / "index.yaml").read_text(encoding="utf-8"))["supported"]]


def release_notes(release: str, path: Path | None = None) -> Notes:
    """``release``'s classifications: those of every supported release before it
    (``index.yaml``'s order), then its own file (``path``, default its ``late-checks.yaml``),
    a later entry replacing an earlier one of the same key. So a new release's file holds only
    its new keys (and the few whose classification changed)."""
    chain = _supported()
    earlier = chain[:chain.index(release)] if release in chain else []
    checks: dict[str, dict] = {}
    modules: dict[str, dict] = {}
    for v in earlier:
        data = _read(RELEASES / v / "late-checks.yaml")
        checks.update(data.get("checks") or {})
        modules.update(data.get("modules") or {})
    own = _read(path or RELEASES / release / "late-checks.yaml")
    checks.update(own.get("checks") or {})
    modules.update(own.get("modules") or {})
    return Notes(checks, modules, frozenset(own.get("checks") or {}), frozenset(own.get("modules") or {}),
                 own.get("review") == "incomplete")


def _classify(c: Check, notes: Notes, trace_modules: frozenset[str]) -> tuple[str, str]:
    """(class, note text) of a row: its own annotation, else its module's (only outside the
    traced modules), else ``no configuration input`` / ``unreviewed``."""
    note = notes.checks.get(c.key)
    if note:
        cls = note.get("class", "no configuration input")
        return cls, note.get("test") or note.get("warning") or note.get("why") or ""
    mod = notes.module_note(c)
    if mod and c.reads_config and c.module not in trace_modules:
        glob, n = mod
        return n.get("class", "?"), f"(module `{glob}`) {n.get('why') or n.get('test') or ''}".strip()
    return ("unreviewed" if c.reads_config else "no configuration input"), ""


def problems(checks: list[Check], notes: Notes | dict[str, dict], incomplete: bool = False, *,
             trace: dict | None = None, reached: list[dict] | None = None) -> list[str]:
    """Everything wrong with a release's classification, one line each: a configuration-reading
    row without a reason (unless ``incomplete``; a row in a module the pre-flight imports needs
    its own, a module note does not cover it), a bad or stale annotation, a ``preflight`` row
    whose function the pre-flight does not run, a ``not_reachable`` row at a site the fuzz
    reached (``reached``: ``[{"site": "file:function", "message": ...}]``)."""
    if isinstance(notes, dict):
        notes = Notes(dict(notes), {}, frozenset(notes))
    trace = trace or {"modules": [], "functions": []}
    traced = frozenset(trace["modules"])
    ran = frozenset(trace["functions"])
    out = []
    keys = {c.key for c in checks}
    for c in checks:
        cls, _ = _classify(c, notes, traced)
        if cls == "unreviewed" and not incomplete:
            inside = " (its module is in the pre-flight's import trace: each row needs its own)" \
                if c.module in traced and notes.module_note(c) else ""
            out.append(f"{c.file}:{c.line}: no annotation for {c.key!r}{inside}")
        if cls == "preflight" and c.site not in ran and not any(fnmatch.fnmatch(c.file, g) for g in RESOLUTION):
            out.append(f"{c.key!r}: class preflight, but SGLang's pre-flight never runs {c.site} ({TRACE}) "
                       "and it is not argument resolution")
        if cls == "not_reachable":
            for r in reached or ():
                site = str(r.get("site", ""))
                site = site[site.index("srt/"):] if "srt/" in site else site  # "sglang/srt/..." as well
                if site == c.site and (not c.message or c.message[:40] in str(r.get("message", ""))):
                    out.append(f"{c.key!r}: not_reachable, but the fuzz reached it ({r.get('message', '')[:100]!r})")
                    break
    for key in sorted(notes.own_checks - keys):
        out.append(f"annotation for a check that is gone: {key!r}")
    files = {c.file for c in checks}
    for glob in sorted(notes.own_modules):
        if not any(fnmatch.fnmatch(f, glob) for f in files):
            out.append(f"module annotation matches no file in scope: {glob!r}")
    for where, note in [*((k, notes.checks[k]) for k in sorted(notes.own_checks & keys)),
                        *((f"module {g}", notes.modules[g]) for g in sorted(notes.own_modules))]:
        note = note or {}
        cls = note.get("class")
        if cls not in CLASSES:
            out.append(f"{where!r}: class must be one of {', '.join(CLASSES)} (got {cls!r})")
        elif cls == "mirrored" and not note.get("test"):
            out.append(f"{where!r}: a mirrored check names its test")
        elif cls == "degraded" and not note.get("warning"):
            out.append(f"{where!r}: a degraded check names the warning")
        elif cls in ("not_reachable", "open", "preflight") and not note.get("why"):
            out.append(f"{where!r}: a {cls} check says why")
        elif cls == "mirrored" and not _test_exists(note["test"]):
            out.append(f"{where!r}: its test {note['test']} does not exist")
    return out


def _test_exists(node_id: str) -> bool:
    """``tests/x.py::test_name`` names a file of this repository defining that test function."""
    path, _, name = node_id.partition("::")
    f = REPO / path
    return f.is_file() and f"def {name}(" in f.read_text(encoding="utf-8")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def counts(checks: list[Check], notes: Notes, trace: dict) -> Counter[str]:
    """Rows per class."""
    traced = frozenset(trace["modules"])
    return Counter(_classify(c, notes, traced)[0] for c in checks)


def _outside(checks: list[Check], trace: dict) -> dict[str, list[str]]:
    """The traced ``sglang.srt`` modules no scope glob covers, by package."""
    globs = scope()
    out: dict[str, list[str]] = {}
    for m in trace["modules"]:
        if not m.startswith("sglang.srt."):
            continue
        path = m.replace(".", "/")
        if any(fnmatch.fnmatch(path + ".py", g) or fnmatch.fnmatch(path + "/__init__.py", g) for g in globs):
            continue
        pkg, _, leaf = m.removeprefix("sglang.").rpartition(".")
        out.setdefault(pkg, []).append(leaf)
    return out


def render(checks: list[Check], notes: Notes, wheel_name: str, release: str, trace: dict) -> str:
    traced = frozenset(trace["modules"])
    n = counts(checks, notes, trace)
    shown = (*CLASSES, *(("unreviewed",) if n["unreviewed"] else ()), "no configuration input")
    in_trace = sum(1 for c in checks if c.module in traced)
    outside = _outside(checks, trace)
    lines = [
        f"# SGLang {release}'s startup refusals",
        "",
        "Generated by `scripts/gen_late_checks.py` from the wheel "
        f"`{wheel_name}` (do not edit; the classifications live in `late-checks.yaml` beside this file",
        "and in the earlier releases' files, carried over by key).",
        "Every `assert` and `raise` of the modules SGLang runs from `launch_server` to the first served request:",
        "argument resolution (`srt/server_args.py`, `srt/arg_groups/**`), `srt/configs/**`, `srt/layers/attention/**`,",
        "the `srt/layers/quantization/` modules of the shipped quantizations, the shipped architectures' model",
        "classes, `srt/model_executor/**`, `srt/distributed/**`, the scheduler, `srt/mem_cache/**`, the cache",
        "controller and `srt/speculative/**`, with the condition that guards it. A row is `mirrored` (a `plan`",
        "rule refuses it first, exit 3, with the rule's test), `degraded` (SGLang only degrades; the plan's",
        "warning), `preflight` (SGLang's pre-flight runs its function for the shipped profiles, so `serve`",
        "refuses before the server starts; the trace shows it), `not_reachable` (no profile reaches it; why),",
        "`open` (a profile reaches it and no rule mirrors it yet, with what it needs), or `no configuration",
        "input` (its condition reads no server argument, model config or environment switch: an internal",
        "invariant; the rule is in the script's docstring).",
        "",
        f"Shipped quantizations: {', '.join(f'`{q}`' + ('' if q in QUANT_MODULES else ' (not in the wheel: an overlay)') for q in shipped_kinds()[0])}; "
        f"model types: {', '.join(f'`{t}`' for t in shipped_kinds()[1])}; their modules: "
        + ", ".join(f"`{g.removeprefix('sglang/')}`" for g in scope() if "/quantization/" in g or "/models/" in g) + ".",
        "",
        f"{len(checks)} checks: " + ", ".join(f"{n[k]} {k}" for k in shown) + ".",
        *(["", f"The review of this release is not done: {n['unreviewed']} rows read configuration "
               "and have no annotation yet (`unreviewed`)."] if n["unreviewed"] else []),
        "",
        f"Import trace (`{TRACE}`, `--trace`): SGLang's pre-flight (all its stages, the sizing ones on the "
        "plan's device figures) for the shipped profiles "
        f"({', '.join(sorted(trace['profiles'])) or 'none'}) imports {len(traced)} `sglang` modules and calls "
        f"{len(trace['functions'])} of its functions; {in_trace} rows lie in imported modules (each row "
        "reviewed on its own); the other rows' modules are classified per module.",
    ]
    if outside:
        lines += ["", f"Imported by that pre-flight but outside the scope above ({sum(map(len, outside.values()))} modules):", ""]
        lines += [f"- `{pkg}`: " + ", ".join(sorted(leaves)) for pkg, leaves in sorted(outside.items())]
    lines.append("")
    by_file: dict[str, list[Check]] = {}
    for c in checks:
        by_file.setdefault(c.file, []).append(c)
    for file, rows in by_file.items():
        mark = " (imported by the pre-flight)" if rows[0].module in traced else ""
        lines += [f"## `{file}`{mark}", "", "| line | function | condition | class | note |", "|---|---|---|---|---|"]
        for c in rows:
            cls, detail = _classify(c, notes, traced)
            if c.message:
                detail = (detail + " " if detail else "") + f"(\"{c.message}\")"
            lines.append(f"| {c.line} | `{_cell(c.function)}` | `{_cell(c.condition[:200])}` | {cls} | {_cell(detail)} |")
        lines.append("")
    return "\n".join(lines)


#: The summary of an unfinished review (``review: incomplete``) that every plan of the release
#: reads (``sglang.releases.late_check_review``); absent for a release whose rows are all reviewed.
REVIEW = "late-checks-review.json"
#: SGLang's startup areas, in the order a start passes them: an unreviewed row counts in the first
#: whose prefix its file starts with ("other" when none does).
AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("argument resolution", ("srt/server_args", "srt/arg_groups/")),
    ("model config", ("srt/configs/",)),
    ("model classes", ("srt/models/",)),
    ("quantization", ("srt/layers/quantization/",)),
    ("attention backends", ("srt/layers/attention/",)),
    ("distributed", ("srt/distributed/",)),
    ("model executor and KV sizing", ("srt/model_executor/",)),
    ("memory pools and caches", ("srt/mem_cache/",)),
    ("scheduler", ("srt/managers/",)),
    ("speculative decoding", ("srt/speculative/",)),
)


def review_summary(checks: list[Check], notes: Notes, trace: dict, release: str) -> dict | None:
    """``{"release", "unreviewed", "areas": {area: rows}}`` for the rows no annotation reviews
    yet, by startup area (``AREAS``), or None when there are none."""
    traced = frozenset(trace["modules"])
    areas: Counter[str] = Counter()
    for c in checks:
        if _classify(c, notes, traced)[0] == "unreviewed":
            areas[next((name for name, pre in AREAS if c.file.startswith(pre)), "other")] += 1
    if not areas:
        return None
    order = [name for name, _ in AREAS] + ["other"]
    return {"release": release, "unreviewed": sum(areas.values()),
            "areas": {a: areas[a] for a in order if areas[a]}}


def _stub(c: Check, trace: dict) -> dict:
    """A starting annotation for a new row, from the trace's evidence (to be reviewed)."""
    if c.site in frozenset(trace["functions"]):
        return {"class": "preflight", "why": f"{c.function} runs in SGLang's pre-flight (argument resolution, "
                "model config, attention backend) before the server starts"}
    return {"class": "not_reachable", "why": "TODO"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, default=os.environ.get("ESCHA_SGLANG_WHEEL"),
                    help="the sglang wheel (default: $ESCHA_SGLANG_WHEEL)")
    ap.add_argument("--release", metavar="VERSION", help="the release the wheel must be (default: the wheel's)")
    ap.add_argument("--annotations", type=Path, help="default: the release folder's late-checks.yaml")
    ap.add_argument("--out", type=Path, help="default: the release folder's late-checks.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if the table or annotations are stale")
    ap.add_argument("--stub-missing", action="store_true", help="print YAML stubs for rows without annotation")
    ap.add_argument("--trace", action="store_true",
                    help=f"rewrite the release's {TRACE} by running SGLang's pre-flight for the shipped profiles")
    ap.add_argument("--venv", type=Path, help="--trace: the flag-catalog venv (default .cache/flagcat-venv[-VERSION])")
    ap.add_argument("--reached", type=Path, metavar="JSON",
                    help='sites the fuzz saw SGLang refuse at ([{"site": "file:function", "message": ...}], '
                         '"file" relative to sglang/): a not_reachable row there is an error')
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
    if args.trace:
        default = _supported()[0]
        venv = args.venv or REPO / ".cache" / ("flagcat-venv" if release == default else f"flagcat-venv-{release}")
        if not (venv / "bin" / "python").exists():
            print(f"error: --venv: no flag-catalog venv at {venv}", file=sys.stderr)
            return 2
        data = trace(release, venv)
        (folder / TRACE).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(f"late checks: sglang {release}: traced {len(data['modules'])} modules, {len(data['functions'])} functions",
              file=sys.stderr)
    reached = None
    if args.reached:
        try:
            reached = json.loads(args.reached.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"error: --reached: {args.reached}: {exc}", file=sys.stderr)
            return 2
    args.annotations = args.annotations or folder / "late-checks.yaml"
    args.out = args.out or folder / "late-checks.md"
    checks = scan(Path(args.wheel))
    notes = release_notes(release, args.annotations)
    tr = load_trace(release)
    if args.stub_missing:
        traced = frozenset(tr["modules"])
        for c in checks:
            if _classify(c, notes, traced)[0] == "unreviewed":
                print(yaml.safe_dump({c.key: _stub(c, tr)}, width=10_000, sort_keys=False), end="")
        return 0
    errs = problems(checks, notes, notes.incomplete, trace=tr, reached=reached)
    text = render(checks, notes, Path(args.wheel).name, release, tr)
    n = counts(checks, notes, tr)
    print(f"late checks: sglang {release}: {len(checks)} rows; " + ", ".join(f"{v} {k}" for k, v in sorted(n.items())),
          file=sys.stderr)
    for e in errs:
        print(f"error: {e}", file=sys.stderr)
    summary = review_summary(checks, notes, tr, release)
    review = args.out.with_name(REVIEW)
    review_text = json.dumps(summary, indent=1) + "\n" if summary is not None else None
    if args.check:
        old = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if old != text:
            print(f"error: {args.out} is stale; rerun scripts/gen_late_checks.py", file=sys.stderr)
            return 1
        old_review = review.read_text(encoding="utf-8") if review.exists() else None
        if old_review != review_text:
            print(f"error: {review} is stale; rerun scripts/gen_late_checks.py", file=sys.stderr)
            return 1
        return 1 if errs else 0
    args.out.write_text(text, encoding="utf-8")
    if review_text is not None:
        review.write_text(review_text, encoding="utf-8")
    elif review.exists():
        review.unlink()
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
