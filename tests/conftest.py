"""Shared fixtures: run the real CLI entry point in-process and capture exit code and streams.

Every in-process CLI run and every ``EschaError`` made is also handed to ``hints.record``: the
``escha-deploy`` commands the suite sees are checked with the CLI's own parser, and the session
fails naming any that would not run as printed (tests/hints.py).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Under pytest-xdist (.ci/test runs ``-n N``) each worker is a copy of the suite of its own, as two
#: runs on one machine are: its worker id joins ``ESCHA_TEST_RUN`` (the names, tags and labels of
#: what the tests make on the Docker daemon, tests/launch/conftest.py) before any test module reads it.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER and not os.environ.get("ESCHA_TEST_RUN", "").endswith(XDIST_WORKER):
    os.environ["ESCHA_TEST_RUN"] = f"{os.environ.get('ESCHA_TEST_RUN') or f'r{os.getppid()}'}{XDIST_WORKER}"

sys.path.insert(0, str(Path(__file__).parent))
import session_state  # noqa: E402,F401  (first: the session's own state folders, before any test or subprocess)
import hints  # noqa: E402

from hypothesis import settings  # noqa: E402

#: Every Hypothesis test is the same run every time: a fixed seed and no example database (a
#: test's own ``@settings`` inherit this profile for what they do not set).
settings.register_profile("escha", derandomize=True, database=None)
settings.load_profile("escha")


class _Tee:
    """A text stream that keeps what is written and passes it on."""

    def __init__(self, stream) -> None:
        self._stream, self.parts = stream, []

    def write(self, text) -> int:
        self.parts.append(text.decode(errors="replace") if isinstance(text, bytes) else str(text))
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _record_cli_and_errors() -> None:
    import escha_deploy.cli.main as cli_main
    from escha_deploy.utils.errors import EschaError

    main = cli_main.main

    def recording_main(argv=None):
        out, err = _Tee(sys.stdout), _Tee(sys.stderr)
        sys.stdout, sys.stderr = out, err
        try:
            return main(argv)
        finally:
            sys.stdout, sys.stderr = out._stream, err._stream
            hints.record("".join(out.parts) + "".join(err.parts))

    init = EschaError.__init__

    def recording_init(self, *problems, hint=None):
        init(self, *problems, hint=hint)
        hints.record("\n".join(self.lines()))

    cli_main.main = recording_main
    EschaError.__init__ = recording_init


_record_cli_and_errors()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    hints.current["test"] = item.nodeid
    _wait_for_the_docker_side(item)


@pytest.fixture
def series_only_where_made(monkeypatch, tmp_path):
    """``runtime_patches/`` as committed less the series rebased onto other releases
    (``runtime_patches/<release>/series``): a copy of the real files, as they were before any
    ``runtime rebase --onto``, so a supported release has no series of ours. Returns that folder."""
    import shutil

    from escha_deploy.utils import paths

    real = paths.runtime_patches_dir()
    copy = tmp_path / "runtime_patches"
    shutil.copytree(real, copy, ignore=lambda d, names: [n for n in names if (Path(d) / n / "series").is_file()])
    monkeypatch.setattr(paths, "runtime_patches_dir", lambda: copy)
    return copy


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys, monkeypatch, tmp_path):
    """``cli("plan", "--profile", ...)`` runs ``escha_deploy.cli.main.main`` (the console
    script) and returns its exit code, stdout and stderr. The XDG cache points at a temp dir
    so no real doctor findings leak into a test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("COLUMNS", "200")

    def run(*args: str) -> CliResult:
        from escha_deploy.cli.main import main

        code = 0
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


#: Fixtures that start or reach a Docker daemon (tests/launch/conftest.py).
DOCKER_FIXTURES = frozenset({"docker_client"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Refuse a test that reaches Docker through a fixture but is not marked ``docker``:
    ``-m "not docker"`` must run without a daemon. Runs before ``-m`` deselects."""
    unmarked = [it.nodeid for it in items
                if DOCKER_FIXTURES & set(getattr(it, "fixturenames", ()))
                and it.get_closest_marker("docker") is None]
    if unmarked:
        raise pytest.UsageError("uses Docker but is not marked docker: " + ", ".join(unmarked))
    items.sort(key=_file_order(items))


def _file_order(items):
    """The sort key that hands the files out in this order, each file's tests in their own order
    (pytest-xdist's ``--dist loadfile`` hands out files in collection order with
    ``--no-loadscope-reorder``, which .ci/test passes; without it, the files with the most tests
    go first, whatever this order says): the files with no
    test marked ``docker`` first, then those with one; within each, ``LONGEST_FILES`` first,
    longest first. The longest first, because in a CI run the fuzz (440 s) started late and ran
    alone at the end while the other workers were idle; the Docker-free first, because .ci/test
    starts pytest while its images still build (``DOCKER_READY_ENV``)."""
    def path(it):
        return it.nodeid.split("::", 1)[0]

    docker = {path(it) for it in items if it.get_closest_marker("docker") is not None}
    first = {f: i for i, f in enumerate(LONGEST_FILES)}
    return lambda it: (path(it) in docker, first.get(path(it), len(first)))


#: The test files that took longest in the last clean-clone CI run (its per-file test times),
#: longest first (their order matters within the Docker-free and the Docker files: above).
LONGEST_FILES = ("tests/launch/test_up_signals.py", "tests/fuzz/test_differential.py",
                 "tests/launch/test_sglang_preflight_release_image.py",
                 "tests/launch/test_sglang_preflight_own_process.py", "tests/launch/test_sglang_preflight_image.py",
                 "tests/launch/test_up_faults.py", "tests/launch/test_one_plan.py",
                 "tests/launch/test_sglang_preflight_model_runner.py", "tests/launch/test_sglang_preflight.py",
                 "tests/launch/test_lifecycle.py", "tests/runtime/test_commit_built_base.py", "tests/corpus/test_corpus.py",
                 "tests/test_flag_catalog.py",
                 "tests/replay/test_tree_replay.py",
                 "tests/runtime/test_build_docker.py", "tests/runtime/test_first_use.py")


#: .ci/test builds its Docker images beside the first tests: this variable names the file its
#: Docker side writes when done (its exit status: "0" built and verified). A test marked
#: ``docker`` waits for the file before its fixtures reach the daemon (``pytest_runtest_setup``)
#: and fails when the status is not 0 (.ci/test prints the Docker side's log after pytest).
#: Unset (any other run): no wait.
DOCKER_READY_ENV = "ESCHA_TEST_DOCKER_READY"
#: The longest a test waits for that file (s): past it, the test fails saying so.
DOCKER_READY_TIMEOUT_S = 1800
_docker_ready: str | None = None  # the status read, once per process


def _wait_for_the_docker_side(item):
    """Before a test marked ``docker`` (``pytest_runtest_setup``): wait for ``DOCKER_READY_ENV``'s
    file, once per process, and fail the test when it says the images are not there."""
    global _docker_ready
    ready = os.environ.get(DOCKER_READY_ENV)
    if not ready or item.get_closest_marker("docker") is None:
        return
    if _docker_ready is None:
        import time

        t0 = time.monotonic()
        while not os.path.exists(ready) and time.monotonic() - t0 < DOCKER_READY_TIMEOUT_S:
            time.sleep(1)
        waited = time.monotonic() - t0
        status = Path(ready).read_text().strip() if os.path.exists(ready) else f"not done after {waited:.0f} s"
        _docker_ready = status
        item.user_properties.append(("docker_wait_s", waited))
    if _docker_ready != "0":
        pytest.fail(f"{DOCKER_READY_ENV}: the Docker side's images are not there (status {_docker_ready}); "
                    ".ci/test prints its log after pytest", pytrace=False)


#: .ci/test sets ESCHA_FAIL_ON_SKIP=1: there, a skip is a missing part, not a pass, unless the
#: test is marked ``gpu`` (no GPU on CI machines).
FAIL_ON_SKIP_ENV = "ESCHA_FAIL_ON_SKIP"
_bad_skips: list[str] = []


#: What the xdist workers found (``pytest_testnodedown``): their printed-command problems; the
#: controller reports them as its own, so a worker's finding fails the run.
_worker_hints: list[str] = []


#: Seconds per test file (setup + call + teardown of its tests), summed by the controller from
#: every worker's reports: the files that fill the workers, printed at the end of the run.
_file_seconds: dict[str, float] = {}


#: Seconds each process's first Docker test waited for .ci/test's images (``DOCKER_READY_ENV``).
_docker_waits: list[float] = []


def pytest_runtest_logreport(report):
    if not XDIST_WORKER:
        path = report.nodeid.split("::", 1)[0]
        _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration
        if report.when == "setup":
            _docker_waits.extend(v for k, v in report.user_properties if k == "docker_wait_s")
    if os.environ.get(FAIL_ON_SKIP_ENV) != "1" or not report.skipped or hasattr(report, "wasxfail"):
        return
    if "gpu" in report.keywords:
        return
    if XDIST_WORKER:  # the controller sees every worker's report and keeps the list
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    _bad_skips.append(f"{report.nodeid}: {reason}")


@pytest.hookimpl(optionalhook=True)  # an xdist hook: no error where xdist is not installed (the GPU machine)
def pytest_testnodedown(node, error):
    """xdist's controller: a worker ended; keep what its session found (``workeroutput``)."""
    _worker_hints.extend(getattr(node, "workeroutput", {}).get("escha_hint_problems", []))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The test files by their summed test time (s) and the sum over all files: with ``-n N``
    workers the run's wall time is at least that sum / N, and at least the longest file's time
    (``--dist loadfile`` runs a file on one worker)."""
    if XDIST_WORKER or not _file_seconds:
        return
    tr = terminalreporter
    total = sum(_file_seconds.values())
    tr.write_sep("=", f"test time per file: {total:.0f} s over {len(_file_seconds)} files, the longest 15")
    for path, sec in sorted(_file_seconds.items(), key=lambda kv: -kv[1])[:15]:
        tr.write_line(f"{sec:8.1f}s  {path}")
    if _docker_waits:
        tr.write_line(f"waiting for the Docker side's images ({DOCKER_READY_ENV}), counted in those times: "
                      + ", ".join(f"{w:.0f} s" for w in _docker_waits) + " (one figure per worker)")


def pytest_sessionfinish(session, exitstatus):
    bad_hints = hints.problems()
    if XDIST_WORKER and hasattr(session.config, "workeroutput"):  # handed to the controller
        session.config.workeroutput["escha_hint_problems"] = bad_hints
        return
    bad_hints = [*bad_hints, *_worker_hints]
    if bad_hints:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.write_line(f"{len(bad_hints)} printed escha-deploy command(s) would not run as printed "
                          "(tests/hints.py):", red=True)
            for line in bad_hints:
                tr.write_line(f"  {line}", red=True)
        session.exitstatus = 1
    if _bad_skips:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.write_line(f"{FAIL_ON_SKIP_ENV}=1: {len(_bad_skips)} test(s) skipped that are not marked gpu:", red=True)
            for line in _bad_skips:
                tr.write_line(f"  {line}", red=True)
        session.exitstatus = 1
