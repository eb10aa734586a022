"""What the SGLang pre-flight tests share (tests/launch/test_sglang_preflight*.py): the flag-catalog
venvs and the GPU-less site environment SGLang's interpreter runs in, the shipped profiles'
rendered argvs, SGLang's refusals per release, and ``SharedPreflight``: every test's argvs of one
test file and one release run in ONE SGLang process.

Why one process: a pre-flight process pays SGLang's import and its first argv's warm-up (the
modules the stages import on first use: on a quiet 2-core machine 1.9 s and 16.4 s of a 48.6 s run
of 12 argvs, then about 2.7 s per argv), so one process per test paid that start once per test and
release. ``sglang_preflight.run_many`` runs several argvs in one process, each in the environment
it found (``sglang_side`` puts back what SGLang's argument resolution writes), as `up`'s check
runs several in one throw-away container (``image_preflight.in_image_many``); so each test's
answers do not depend on which argvs ran before them, and a test that checks that (an earlier
argv's ``--mamba-ssm-dtype`` must not reach a later one) still checks it, with more argvs before.

A test takes part by naming the function that builds its cases (``@shares_process(builder)``)
and the ``preflight`` fixture (tests/launch/conftest.py), which gives it its own ``Cases`` with
its results. A builder that fails fails its own test only; a process that does not answer fails
every test of the process, with the reason. What needs a process of its own (a planted harness
fault, native ``serve``, an interpreter without SGLang) does not use this.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from escha_deploy.launch import sglang_preflight as pf
from escha_deploy.profile import load_profile
from tests.oracle.cases import config_json, stock_argv

ROOT = Path(__file__).resolve().parents[2]
VENV_PY = Path(os.environ.get("ESCHA_FLAGCAT_VENV", ROOT / ".cache" / "flagcat-venv")) / "bin" / "python"
VENV_0523 = ROOT / ".cache" / "flagcat-venv-0.5.23" / "bin" / "python"
SITE = ROOT / "tests" / "launch" / "preflight_cpu_site"
#: An RTX 5060 Ti 16 GB as NVML reports it (the shipped profiles' card class; sm_120)
CARD = {"vram_bytes": 16 * 2**30 - 2**28, "name": "NVIDIA GeForce RTX 5060 Ti", "capability": "12.0"}

#: The host-pool stage's memory budget in these tests (bytes, the whole box): room for the shipped
#: profiles' pools, as on the boxes they describe; this CI machine is not one of them.
HOST_BUDGET = 2**40

#: SGLang 0.5.19's refusals at the sizing stages: (stage, type, message, file:function, flag)
KV_REFUSAL = ("KV cache configurator", "ValueError", "Loaded weights leave no GPU memory for the KV cache under "
              "--mem-fraction-static=0.3", "srt/mem_cache/kv_cache_configurator.py:_profile_available_bytes",
              "--mem-fraction-static")
HOST_REFUSAL = ("host pools", "ValueError", "Not enough host memory available. Requesting",
                "srt/mem_cache/pool_host/base.py:__init__", "--hicache-size")

#: Per release: its flag-catalog venv and its host-pool refusal's site (0.5.23 moved the check
#: into ``HostKVCache._allocate_host_buffer``)
RELEASE_SIZING = {"0.5.19": (VENV_PY, HOST_REFUSAL),
                  "0.5.23": (VENV_0523, (*HOST_REFUSAL[:3], "srt/mem_cache/pool_host/base.py:_allocate_host_buffer",
                                         HOST_REFUSAL[4]))}
#: The release of a test with no ``release`` parameter: ``VENV_PY``'s (``ESCHA_FLAGCAT_VENV``)
UNPARAMETRIZED_RELEASE = "0.5.19"

#: The plan's figures the sizing stages answer, as ``plan --format json``'s ``per_rank`` names
#: them, by the pre-flight's answer key (bytes, tokens, slots per rank)
PLAN_KEYS = {"max_total_num_tokens": "device_kv_tokens", "kv_bytes_per_token": "device_kv_bytes_per_token",
             "mamba_slots": "device_mamba_slots", "mamba_pool_bytes": "device_mamba_bytes",
             "host_kv_tokens": "host_kv_tokens", "host_kv_bytes": "host_kv_bytes",
             "host_mamba_slots": "host_mamba_slots", "host_mamba_bytes": "host_mamba_bytes"}


def site_env(**extra: str) -> dict[str, str]:
    """The environment of SGLang's interpreter for the pre-flight on this GPU-less machine."""
    if not VENV_PY.exists():
        pytest.fail(f"no flag-catalog venv at {VENV_PY} (.ci/check-flag-catalog.sh makes it)")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SITE)]), "ESCHA_TEST_CARD": json.dumps(CARD),
            "ESCHA_ORACLE_SCRIPT": str(ROOT / "scripts" / "sglang_oracle.py"), **extra}


def release_python(release: str) -> Path:
    """``release``'s flag-catalog interpreter (``RELEASE_SIZING``); fails the test where it is missing."""
    python = RELEASE_SIZING[release][0]
    if not python.exists():
        pytest.fail(f"no flag-catalog venv at {python} (.ci/check-flag-catalog.sh {release} makes it)")
    return python


def rendered(cli, name: str, model: Path, *sets: str) -> tuple[list[str], dict[str, int]]:
    """What native `serve --print` renders for a shipped profile with ``model`` as its folder, and
    the plan's device figures it gives SGLang's pre-flight (``preflight_device``), with
    ``HOST_BUDGET`` as the host-pool stage's budget."""
    out = json.loads(cli("serve", "--print", "-p", name, "--set", f"model.host_dir={model}",
                         *[a for s in sets for a in ("--set", s)]).out)
    argv = pf.server_flags_of(out["argv"])
    assert argv[argv.index("--model-path") + 1] == str(model)
    # the overlays' own flags replaced by their stock stand-ins
    return stock_argv(argv), {**out["preflight_device"], "host_budget": HOST_BUDGET}


def model_folder(tmp_path: Path, name: str, **config) -> Path:
    """A model folder for profile ``name``: its config.json (``config`` overriding keys) and a
    sparse safetensors file of its weight size (the plan counts the weights; no disk is used)."""
    d = tmp_path / f"model-{name}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**config_json(load_profile(name).model.architecture), **config}))
    with open(d / "model.safetensors", "wb") as f:  # sparse: the plan counts the profile's weights, no disk
        f.truncate(load_profile(name).model.weights_total or 64)
    return d


def with_value(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value replaced by ``value`` (the flag itself unchanged)."""
    i = argv.index(flag) + 1
    return [*argv[:i], value, *argv[i + 1:]]


# --------------------------------------------------------------------------- one process per file and release


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@dataclass
class Cases:
    """One test's part of a shared pre-flight process. A builder fills ``argvs`` (case name ->
    (server flags, the sizing stages' device figures or None), in the order they run) and
    ``extra`` (what else the test asserts on: the plan's JSON ...); ``SharedPreflight`` fills
    ``results`` (case name -> SGLang's answer) and ``process`` (how many argvs the process ran,
    its wall seconds)."""

    argvs: dict[str, tuple[list[str], dict[str, Any] | None]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    results: dict[str, pf.PreflightResult] = field(default_factory=dict)
    process: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, argv: list[str], device: dict[str, Any] | None) -> None:
        assert name not in self.argvs, f"case {name!r} twice"
        self.argvs[name] = (list(argv), device)


#: A test's builder: (the CLI, run in-process; a folder of its own; the release) -> its Cases
Builder = Callable[[Callable[..., CliResult], Path, str], Cases]


def shares_process(builder: Builder) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Marks a test whose argvs ``builder`` makes: they run in its file's shared SGLang process of
    the test's release, and the ``preflight`` fixture hands the test its ``Cases``."""
    def mark(test: Callable[..., Any]) -> Callable[..., Any]:
        test.sglang_cases = builder  # type: ignore[attr-defined]
        return test
    return mark


def release_of(item: pytest.Item) -> str:
    """The release a test runs on: its ``release`` parameter, else ``UNPARAMETRIZED_RELEASE``."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("release", UNPARAMETRIZED_RELEASE) if callspec else UNPARAMETRIZED_RELEASE


class SharedPreflight:
    """The shared pre-flight processes of one test module: on the first test of a release that
    asks, every selected test of the module for that release builds its cases (the CLI run
    in-process, as the ``cli`` fixture runs it), and all their argvs run in one
    ``pf.run_many`` process of that release's interpreter; each test then gets its own."""

    def __init__(self, module: Any, items: list[pytest.Item], tmp_path_factory: pytest.TempPathFactory) -> None:
        self._items = [it for it in items if getattr(it, "module", None) is module
                       and getattr(getattr(it, "function", None), "sglang_cases", None)]
        self._tmp = tmp_path_factory
        self._done: dict[str, dict[str, Cases | BaseException]] = {}

    def cases_of(self, item: pytest.Item) -> Cases:
        """``item``'s Cases with SGLang's answers; raises what its builder raised."""
        builder = getattr(getattr(item, "function", None), "sglang_cases", None)
        assert builder is not None, f"{item.nodeid} is not marked @shares_process"
        release = release_of(item)
        if release not in self._done:
            self._done[release] = self._run(release)
        got = self._done[release][item.originalname]  # type: ignore[attr-defined]
        if isinstance(got, BaseException):
            raise got
        return got

    def _run(self, release: str) -> dict[str, Cases | BaseException]:
        python = release_python(release)
        built: dict[str, Cases | BaseException] = {}
        for it in self._items:
            if release_of(it) != release or it.originalname in built:  # type: ignore[attr-defined]
                continue
            name = it.originalname  # type: ignore[attr-defined]
            try:
                with _in_process_cli(self._tmp.mktemp("xdg")) as cli:
                    built[name] = it.function.sglang_cases(cli, self._tmp.mktemp(name[:40]), release)  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001  that test's own failure, raised in that test
                built[name] = exc
        order = [(name, case) for name, c in built.items() if isinstance(c, Cases) for case in c.argvs]
        argvs = [built[n].argvs[case] for n, case in order]  # type: ignore[union-attr]
        t0 = time.monotonic()
        # SGLang's import and the first argv's warm-up once, then each argv: the pre-flight's own
        # limit, and 20 s more per argv for a loaded 2-core machine (it took 8 s per argv there)
        answers = pf.run_many(str(python), [a for a, _ in argvs], site_env(), devices=[d for _, d in argvs],
                              timeout_s=pf.TIMEOUT_S + 20 * len(argvs))
        process = {"argvs": len(argvs), "wall_s": time.monotonic() - t0, "release": release,
                   "import_s": answers[0].seconds.get("import") if answers else None,
                   "first_s": answers[0].seconds.get("total") if answers else None}
        for (name, case), answer in zip(order, answers):
            c = built[name]
            assert isinstance(c, Cases)
            c.results[case] = answer
            c.process = process
        return built


class _in_process_cli:
    """``cli(...)``: ``escha_deploy.cli.main.main`` run in this process with its streams captured,
    the XDG cache in a folder of its own and 200 columns, as tests/conftest.py's ``cli`` fixture
    runs it (which is function-scoped; this is for a module's shared cases)."""

    def __init__(self, xdg: Path) -> None:
        self._xdg = xdg

    def __enter__(self) -> Callable[..., CliResult]:
        self._mp = pytest.MonkeyPatch()
        self._mp.setenv("XDG_CACHE_HOME", str(self._xdg))
        self._mp.setenv("COLUMNS", "200")
        return self._run

    def __exit__(self, *exc: object) -> None:
        self._mp.undo()

    @staticmethod
    def _run(*args: str) -> CliResult:
        from escha_deploy.cli.main import main

        out, err = io.StringIO(), io.StringIO()
        code = 0
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return CliResult(code, out.getvalue(), err.getvalue())
