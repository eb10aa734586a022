"""An SGLang built from a commit as a base (docs/runtime.md, "A commit-built base"), on a tree made
from the real 0.5.19 wheel: its version set to a setuptools-scm post-release dev version
(``0.5.19.post1.dev7+g1a2b3c4``: METADATA and ``sglang/_version.py``, the one changed file) and one
file added. ``runtime lock`` pins it, ``runtime apply --base-lock`` (the image build's step)
applies our series, ``runtime verify --base-lock`` passes; ``plan`` plans it with its nearest
release's rules and says so once; ``serve --print`` renders it and SGLang's pre-flight accepts
the render in that tree's own package (the flag-catalog venv's interpreter with the tree first on
its path). One changed byte in the pinned tree fails the build's step and ``runtime verify``, each
naming the file; bad input is one line and a non-zero exit, with nothing written."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from escha_deploy.runtime import inventory as inv
from escha_deploy.runtime.description import read_description

from .conftest import REPO, rewrite

sys.path.insert(0, str(Path(__file__).parents[1]))
from inproc import run_main  # noqa: E402

pytestmark = pytest.mark.wheel

VERSION = "0.5.19.post1.dev7+g1a2b3c4"
EXTRA = "srt/escha_parent_backport_note.py"
UNTOUCHED = "srt/mem_cache/pool_host/mla.py"


def errors(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("error:")]


def make_built(site: Path, version: str = VERSION) -> Path:
    """The wheel's tree (``site``: hard links to the pristine one) turned into a commit-built one:
    ``version`` in the dist-info METADATA and in ``sglang/_version.py`` (setuptools-scm writes both
    for a build from git), and one file the release does not have. Returns the package folder."""
    meta = next(site.glob("sglang-*.dist-info")) / "METADATA"
    rewrite(meta, meta.read_text().replace("Version: 0.5.19\n", f"Version: {version}\n", 1))
    vfile = site / "sglang" / "_version.py"
    text = vfile.read_text()
    assert "'0.5.19'" in text
    rewrite(vfile, text.replace("'0.5.19'", repr(version)).replace("commit_id = None", "commit_id = 'g1a2b3c4'"))
    (site / "sglang" / EXTRA).write_text('"""A backport the parent carries beyond the tag."""\n')
    return site / "sglang"


@pytest.fixture
def built(site, tmp_path, monkeypatch):
    """``(package dir, lock file, state dir)``: the commit-built tree and where its lock and
    state go; this machine's description is the state's (``ESCHA_RUNTIME_DESCRIPTION``)."""
    state = tmp_path / "state"
    monkeypatch.setenv("ESCHA_RUNTIME_DESCRIPTION", str(state / "runtime.json"))
    return make_built(site), tmp_path / "sglang.lock.json", state


def _lock(pkg: Path, lock: Path, *extra: str):
    return run_main("runtime", "lock", "--sglang-dir", str(pkg), "--output", str(lock), *extra)


def _apply(pkg: Path, state: Path, lock: Path, *extra: str):
    return run_main("runtime", "apply", "--sglang-dir", str(pkg), "--state-dir", str(state), "--base-lock", str(lock),
                    *extra)


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    rewrite(path, bytes(data))


def preflight_python(tmp_path: Path, site: Path) -> tuple[str, dict[str, str]]:
    """The tree's own interpreter for SGLang's pre-flight on this GPU-less machine: the flag-catalog
    venv's Python (the parser's import chain, CPU torch) with the commit-built tree first on its path,
    in the test-only site environment the other pre-flight tests use (tests/launch/preflight_cpu_site)."""
    sys.path.insert(0, str(REPO / "tests"))
    from launch.sglang_preflight_cases import VENV_PY, site_env

    env = site_env(XDG_CACHE_HOME=str(tmp_path / "xdg"))
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    return str(VENV_PY), env


def tree_python(tmp_path: Path, python: str, site: Path) -> str:
    """An interpreter that imports the commit-built tree first (a wrapper, as ``--python`` and
    ``ESCHA_SGLANG_PYTHON`` take one): ``python`` with ``site`` first on PYTHONPATH."""
    wrapper = tmp_path / f"python-{Path(python).parent.parent.name}"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{python}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_commit_built_tree_is_pinned_applied_planned_rendered_and_preflighted(built, tmp_path, capsys):
    pkg, lock, state = built
    sys.path.insert(0, str(REPO / "tests"))
    from launch.sglang_preflight_cases import VENV_PY

    # pinned, its own parser and metric names read in its own interpreter (the flag-catalog venv's)
    r = run_main("runtime", "lock", "--python", tree_python(tmp_path, str(VENV_PY), pkg.parent), "--output", str(lock),
                 "--format", "json")
    assert r.code == 0, r.err
    out = json.loads(r.out)
    # the tree's parser is 0.5.19's (only its version differs), and it says so
    assert out["parser"]["flags"] == 504 and out["parser_differs"] == []
    tree_flags = json.loads((tmp_path / "sglang.flags.json").read_text())
    assert tree_flags["version"] == VERSION and len(tree_flags["actions"]) == 504
    assert json.loads((tmp_path / "sglang.metrics.json").read_text())["release"] == VERSION
    assert (out["version"], out["commit"], out["nearest_release"]) == (VERSION, "1a2b3c4", "0.5.19")
    assert out["series_applies"] == ["0001-hicache-host-reserve.patch", "0002-hicache-host-allocator.patch",
                                     "0003-transfer-geometry-check.patch", "0004-hicache-host-mamba-slots.patch"]
    # what differs from 0.5.19's committed inventory: the changed and the added file, each named
    assert out["differs"] == ["extra: sglang/" + EXTRA, "changed: sglang/_version.py"]
    assert "4372/4372" in r.err  # the progress bar counted every file
    data = json.loads(lock.read_text())
    files = {k: tuple(v) for k, v in data["files"].items()}
    assert data["kind"] == "sglang-base-lock" and data["file_count"] == len(files) == 4371 + 1
    assert files == inv.scan(pkg) and data["digest"] == inv.digest(files)

    r = _apply(pkg, state, lock)
    assert r.code == 0, r.err
    desc = read_description(state / "runtime.json")
    assert desc.sglang_version == VERSION and desc.planned_release == "0.5.19"
    assert desc.built.lock_digest == data["digest"] and desc.built.commit == "1a2b3c4"
    assert desc.built.differs_count == 2 and not desc.base_inventory_committed
    assert desc.base_inventory_digest == data["digest"]
    r = run_main("runtime", "verify", "--sglang-dir", str(pkg), "--state-dir", str(state), "--base-lock", str(lock))
    assert r.code == 0, r.err
    assert r.out.startswith("ok: 4376 files equal base lock:sglang.lock.json + 8 deltas")  # 0004 adds its hook

    # plan: this runtime, planned with 0.5.19's rules, and what it is said once
    r = run_main("plan", "--profile", "rtx5060ti-tp2-fp8", "--format", "json")
    plan = json.loads(r.out)
    assert plan["sglang_release"] == "0.5.19", plan
    assert VERSION in plan["sglang_release_source"] and "nearest release" in plan["sglang_release_source"]
    said = [w for w in plan["warnings"] if "is built from a commit" in w]
    assert len(said) == 1, plan["warnings"]
    assert "pinned by sglang.lock.json" in said[0] and "changed: sglang/_version.py" in said[0]
    assert "its parser's flags and its metric names are 0.5.19's" in said[0]
    assert "not checked: " not in said[0] or "parser" not in said[0].split("not checked: ", 1)[1]

    # serve renders it, and SGLang's pre-flight accepts the render in the tree's own package
    from launch.sglang_preflight_cases import model_folder, rendered

    from escha_deploy.launch import sglang_preflight as pf

    def cli(*args):
        res = run_main(*args)
        assert res.code == 0, res.err
        return res

    model = model_folder(tmp_path, "rtx5060ti-tp2-fp8")
    argv, device = rendered(cli, "rtx5060ti-tp2-fp8", model)
    printed = run_main("serve", "--print", "-p", "rtx5060ti-tp2-fp8", "--set", f"model.host_dir={model}")
    assert printed.code == 0 and printed.text.count("is built from a commit") == 1, printed.text
    assert "pinned by sglang.lock.json" in printed.text
    python, env = preflight_python(tmp_path, pkg.parent)
    res = pf.run(python, argv, env, device=device)
    assert res.ok is True, (res.stage, res.message, res.site, res.not_run)
    # the package it imported is the commit-built tree, patched: our host-reserve hook is in it
    assert (pkg / "srt/mem_cache/pool_host/escha_host_reserve.py").is_file()


def test_a_changed_file_in_the_pinned_tree_fails_the_build_step_and_verify_naming_it(built, site, tmp_path):
    pkg, lock, state = built
    assert _lock(pkg, lock).code == 0
    # the build's step: `runtime apply --base-lock` on a tree that is not the pinned one
    _flip_byte(pkg / UNTOUCHED)
    before = inv.scan(pkg)
    r = _apply(pkg, state, lock)
    assert r.code == 3, r.err
    assert errors(r.err) == [f"error: {lock}: changed: sglang/{UNTOUCHED}"]
    assert inv.scan(pkg) == before and not (state / "runtime.json").exists()  # nothing written
    # a missing and an extra file are named too
    (pkg / EXTRA).unlink()
    (pkg / "srt/escha_other.py").write_text("x = 1\n")
    r = _apply(pkg, state, lock)
    assert r.code == 3
    assert errors(r.err) == [f"error: {lock}: missing: sglang/{EXTRA}", f"error: {lock}: extra: sglang/srt/escha_other.py",
                             f"error: {lock}: changed: sglang/{UNTOUCHED}"]


def test_verify_names_a_file_changed_after_apply(built):
    pkg, lock, state = built
    assert _lock(pkg, lock).code == 0 and _apply(pkg, state, lock).code == 0
    _flip_byte(pkg / UNTOUCHED)
    r = run_main("runtime", "verify", "--sglang-dir", str(pkg), "--state-dir", str(state), "--base-lock", str(lock))
    assert r.code == 3
    assert errors(r.err) == [f"error: changed: sglang/{UNTOUCHED}"]


@pytest.mark.parametrize("version, code, says", [
    ("0.5.20.dev3+g1a2b3c4", 3, "is a commit before the release 0.5.20"),
    ("0.5.22.post1.dev2+g1a2b3c4", 3, "built after 0.5.22, not a supported release"),
    ("0.5.19-local-build", 2, "is not a PEP 440 version"),
])
def test_a_version_whose_nearest_release_cannot_be_told_is_one_line(site, tmp_path, version, code, says):
    pkg = make_built(site, version)
    lock = tmp_path / "sglang.lock.json"
    r = _lock(pkg, lock)
    assert r.code == code, r.err
    assert len(errors(r.err)) == 1 and says in errors(r.err)[0] and str(pkg) in errors(r.err)[0]
    assert not lock.exists()
    r = run_main("runtime", "apply", "--sglang-dir", str(pkg), "--state-dir", str(tmp_path / "state"))
    assert r.code == code and len(errors(r.err)) == 1 and not (tmp_path / "state" / "runtime.json").exists()


def test_a_tree_whose_sglang_cannot_be_imported_to_read_its_parser_is_one_line(built, tmp_path):
    """This test process's Python lacks what SGLang imports (numpy, torch): its parser cannot be imported there."""
    pkg, lock, _ = built
    python = tree_python(tmp_path, sys.executable, pkg.parent)
    r = run_main("runtime", "lock", "--python", python, "--output", str(lock))
    assert r.code == 3, r.err
    (line,) = errors(r.err)
    assert line.startswith(f"error: {python}: SGLang {VERSION} at {pkg} cannot be imported to read its parser: ")
    assert "ModuleNotFoundError: No module named" in line and not lock.exists()


def test_bad_lock_files_and_a_parent_named_two_ways_are_one_line(built, tmp_path):
    pkg, lock, state = built
    r = _lock(pkg, lock, "--commit", "9f8e7d6c")
    assert r.code == 2 and errors(r.err) == [
        f"error: --commit 9f8e7d6c: the tree's version {VERSION} names commit 1a2b3c4; name the parent one way"]
    assert _lock(pkg, lock).code == 0
    data = json.loads(lock.read_text())
    data["files"]["srt/server_args.py"][0] += 1  # edited by hand
    edited = tmp_path / "edited.lock.json"
    edited.write_text(json.dumps(data))
    r = _apply(pkg, state, edited)
    assert r.code == 2 and errors(r.err) == [f"error: {edited}: digest: does not match its files (edited by hand?)"]
    r = _apply(pkg, state, tmp_path / "nope.json")
    assert r.code == 2 and len(errors(r.err)) == 1 and "no such lock file" in r.err
    assert not (state / "runtime.json").exists()


def _context(tmp_path: Path, lock: Path) -> Path:
    """A build context with what `build` checks before it talks to the daemon: Dockerfile.hicache,
    a wheelhouse, the overlay and fork folders, and the lock where `build` looks by default."""
    import shutil

    ctx = tmp_path / "ctx"
    (ctx / "build" / "wheelhouse-py3.11").mkdir(parents=True)
    (ctx / "build" / "wheelhouse-py3.11" / "escha_deploy-0.1.0-py3-none-any.whl").write_bytes(b"")
    shutil.copy(REPO / "Dockerfile.hicache", ctx / "Dockerfile.hicache")
    for d in ("runtime_overlays", "runtime_fork", "runtime_base"):
        (ctx / d).mkdir()
    shutil.copy(lock, ctx / "runtime_base" / "sglang.lock.json")
    return ctx


def test_applys_hint_and_builds_options_agree(built, tmp_path):
    """apply, told the build promised the release, names the options for this base; build takes
    exactly those, and refuses (exit 2, before the daemon) a lock of another version."""
    pkg, lock, state = built
    assert _lock(pkg, lock).code == 0
    r = _apply(pkg, state, lock, "--expect-sglang-version", "0.5.19")
    assert r.code == 3
    hint = next(ln for ln in r.err.splitlines() if ln.startswith("hint:"))
    assert f"build with --sglang-version {VERSION} --base-lock runtime_base/sglang.lock.json" in hint
    ctx = _context(tmp_path, lock)
    base = "escha-sglang-base:commit-built"
    r = run_main("build", "--context", str(ctx), "--python-version", "3.11", "--base-image", base,
                 "--sglang-version", VERSION, "--base-lock", "runtime_base/sglang.lock.json")
    # every check of build's own passed: what stops it is the daemon (none, or it lacks this base)
    assert (r.code, errors(r.err)[0].startswith("error: docker:")) == (4, True) or (
        r.code == 3 and errors(r.err)[0] == f"error: --base-image {base}: not on this Docker daemon; build pulls "
        "nothing (the SGLang image is tens of GB)"), r.err
    r = run_main("build", "--context", str(ctx), "--python-version", "3.11", "--sglang-version", VERSION)
    assert r.code == 2 and "--base-image NAME@sha256:" in errors(r.err)[0]
    other = "0.5.19.post1.dev8+g5e6f7a8"
    r = run_main("build", "--context", str(ctx), "--python-version", "3.11", "--base-image", base,
                 "--sglang-version", other)
    assert r.code == 2 and errors(r.err) == [
        f"error: --base-lock runtime_base/sglang.lock.json: pins SGLang {VERSION}, but --sglang-version is {other}"]


# --------------------------------------------------------------------------- a fork on that parent

GIT_ENV = {"GIT_AUTHOR_NAME": "Fork Dev", "GIT_AUTHOR_EMAIL": "dev@example.com", "GIT_COMMITTER_NAME": "Fork Dev",
           "GIT_COMMITTER_EMAIL": "dev@example.com", "GIT_AUTHOR_DATE": "2026-12-01T09:00:00+00:00",
           "GIT_COMMITTER_DATE": "2026-12-01T09:00:00+00:00"}
MLA_OLD = "class MLATokenToKVPoolHost"


def make_fork(pkg: Path, out: Path, declaration: str, *, against: Path | None = None) -> dict[str, str]:
    """A fork made with real git on the parent ``pkg`` (``against``: another tree instead), in
    SGLang's repository layout, exported with ``git format-patch`` into ``out/patches`` with
    ``declaration`` (``{restore}`` and ``{mla}`` stand for the two commits' hashes) as its
    escha-fork.yaml: ``restore`` edits the file only the parent has (``EXTRA``), ``mla`` a file the
    release has too. Returns the hashes."""
    import shutil
    import subprocess

    base = against or pkg
    repo = out / "repo"
    env = {**os.environ, **GIT_ENV}
    for k in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(k, None)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                              env=env).stdout

    for rel in (EXTRA, "srt/mem_cache/pool_host/mla.py", "_version.py"):
        if (base / rel).is_file():
            (repo / "python/sglang" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(base / rel, repo / "python/sglang" / rel)
    git("init", "-q", "-b", "main")
    git("add", "-A")
    git("commit", "-q", "-m", "the parent's files")
    git("tag", "parent")
    hashes = {}
    extra = repo / "python/sglang" / EXTRA
    if extra.is_file():
        extra.write_text(extra.read_text() + "RESTORE_ORDER = ('target', 'draft')\n")
    else:  # made against the release: its _version.py instead
        v = repo / "python/sglang/_version.py"
        v.write_text(v.read_text().replace("__version__ = version = ", "# a fork note\n__version__ = version = "))
    git("commit", "-q", "-am", "qsa: restore target and draft state in order")
    hashes["restore"] = git("rev-parse", "HEAD").strip()
    mla = repo / "python/sglang/srt/mem_cache/pool_host/mla.py"
    mla.write_text(mla.read_text().replace(MLA_OLD, "# fork: unchanged behaviour\n" + MLA_OLD, 1))
    git("commit", "-q", "-am", "qsa: a note in the MLA host pool")
    hashes["mla"] = git("rev-parse", "HEAD").strip()
    git("format-patch", "-q", "parent..HEAD", "-o", str(out / "patches"))
    (out / "patches" / "escha-fork.yaml").write_text(declaration.format(**{k: v[:12] for k, v in hashes.items()}))
    return hashes


FORK_DECL = "parent: {{commit: 1a2b3c4}}\ncommits:\n  {restore}: [qsa.restore-order]\n"


def test_a_fork_on_the_parent_imports_applies_and_its_capability_reaches_the_labels(built, tmp_path):
    from escha_deploy.runtime.description import LABEL_CAPABILITIES

    pkg, lock, state = built
    assert _lock(pkg, lock).code == 0
    make_fork(pkg, tmp_path / "fork", FORK_DECL)
    r = run_main("runtime", "import", str(tmp_path / "fork" / "patches"), "--base-dir", str(pkg), "--base-lock",
                 str(lock), "--output", str(tmp_path / "imported"), "--format", "json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["capabilities"][-1] == "qsa.restore-order"
    r = _apply(pkg, state, lock, "--fork-dir", str(tmp_path / "imported"))
    assert r.code == 0, r.err
    desc = read_description(state / "runtime.json")
    assert desc.capabilities == ["hicache-host-reserve-env", "hicache-host-allocator", "transfer-geometry-check",
                                 "hicache-host-mamba-slots", "qsa.restore-order"]
    assert desc.labels()[LABEL_CAPABILITIES].endswith(",qsa.restore-order")
    assert [e.subject for e in desc.series if e.source == "fork"] == [
        "qsa: restore target and draft state in order", "qsa: a note in the MLA host pool"]
    assert run_main("runtime", "verify", "--sglang-dir", str(pkg), "--state-dir", str(state),
                    "--base-lock", str(lock)).code == 0
    r = run_main("runtime", "describe")
    assert r.code == 0 and "capabilities: hicache-host-reserve-env, hicache-host-allocator, " \
        "transfer-geometry-check, hicache-host-mamba-slots, qsa.restore-order" in r.out

    # it changes no plan figure (the planner given the description's capabilities with and without
    # it, on one described box); a profile key that asks for it is checked like ours
    from escha_deploy.facts.machine import described_host
    from escha_deploy.planner import plan
    from escha_deploy.profile import load_profile

    prof = load_profile("rtx5060ti-tp2-fp8", [])
    box = described_host(32 * 2**30, "linux")
    with_it = plan(prof, box, capabilities=frozenset(desc.capabilities)).model_dump(exclude={"capabilities"})
    without = plan(prof, box, capabilities=frozenset(desc.capabilities[:-1])).model_dump(exclude={"capabilities"})
    assert with_it == without
    sys.path.insert(0, str(REPO / "tests"))
    from launch.sglang_preflight_cases import model_folder

    model = model_folder(tmp_path, "rtx5060ti-tp2-fp8")
    asks = ("serve", "--print", "-p", "rtx5060ti-tp2-fp8", "--set", f"model.host_dir={model}",
            "--set", "runtime.needs=[qsa.restore-order]")
    r = run_main(*asks)
    assert r.code == 0, r.err
    data = json.loads((state / "runtime.json").read_text())
    data["capabilities"] = data["capabilities"][:-1]  # a runtime without it
    (state / "runtime.json").write_text(json.dumps(data))
    r = run_main(*asks)
    assert r.code == 3 and f"error: this runtime ({state / 'runtime.json'}): runtime lacks capability " \
        "'qsa.restore-order'" in r.err


def test_a_fork_made_on_the_parent_is_refused_on_another_base_naming_both(site, tmp_path, monkeypatch):
    """The stock release tree (no commit in its version) is not the parent the fork names."""
    monkeypatch.setenv("ESCHA_RUNTIME_DESCRIPTION", str(tmp_path / "state" / "runtime.json"))
    parent = tmp_path / "parent"
    import shutil

    shutil.copytree(site, parent, copy_function=os.link)
    make_built(parent)
    make_fork(parent / "sglang", tmp_path / "fork", FORK_DECL)
    r = run_main("runtime", "apply", "--sglang-dir", str(site / "sglang"), "--state-dir", str(tmp_path / "state"),
                 "--fork-dir", str(tmp_path / "fork" / "patches"))
    assert r.code == 3
    assert errors(r.err) == [f"error: {tmp_path / 'fork' / 'patches' / 'escha-fork.yaml'}: the fork's commits are made "
                             f"against the parent commit 1a2b3c4; {site / 'sglang'} is SGLang 0.5.19 (no commit named "
                             "in its version)"]


def test_a_patch_made_against_another_base_than_the_parent_named_says_so(built, site, tmp_path):
    """The fork declares the parent, but its commits were made on the stock release tree."""
    import zipfile

    from .conftest import find_wheel

    pkg, lock, state = built
    assert _lock(pkg, lock).code == 0
    stock = tmp_path / "stock"
    with zipfile.ZipFile(find_wheel()) as z:
        for rel in ("sglang/_version.py", "sglang/srt/mem_cache/pool_host/mla.py"):
            z.extract(rel, stock)
    make_fork(pkg, tmp_path / "fork", FORK_DECL.replace("qsa.restore-order", "qsa.note"), against=stock / "sglang")
    r = _apply(pkg, state, lock, "--fork-dir", str(tmp_path / "fork" / "patches"))
    assert r.code == 3
    assert len(errors(r.err)) == 1 and "_version.py" in errors(r.err)[0]
    hint = next(ln for ln in r.err.splitlines() if ln.startswith("hint:"))
    assert "made against another base than the one escha-fork.yaml names" in hint
    assert not (state / "runtime.json").exists()


@pytest.mark.parametrize("declaration, says", [
    ("parent: {{commit: 1a2b3c4, inventory: " + "ab" * 32 + "}}\ncommits: {{}}\n",
     "parent: the parent is named two ways (parent.commit and parent.inventory)"),
    ("release: 0.5.19\nparent: {{commit: 1a2b3c4}}\ncommits: {{}}\n",
     "parent: the parent is named two ways (parent.commit and release)"),
    (FORK_DECL.replace("qsa.restore-order", "escha.restore-order"), "'escha.restore-order' collides with escha-deploy's"),
    (FORK_DECL.replace("qsa.restore-order", "qsa.int2-kv"), "'qsa.int2-kv' collides with escha-deploy's"),
    (FORK_DECL.replace("qsa.restore-order", '"qsa.x\\e[31m"'), "'qsa.x\\x1b[31m' holds control characters"),
    (FORK_DECL.replace("qsa.restore-order", "restore-order"), "unknown capability 'restore-order'"),
])
def test_bad_fork_declarations_are_one_line_naming_it(built, tmp_path, declaration, says):
    pkg, lock, _ = built
    make_fork(pkg, tmp_path / "fork", declaration)
    r = run_main("runtime", "import", str(tmp_path / "fork" / "patches"), "--output", str(tmp_path / "imported"))
    assert r.code == 2, r.err
    (line,) = errors(r.err)
    assert line.startswith("error: ") and "escha-fork.yaml:" in line and says in line, line
    assert "\x1b" not in r.err and not (tmp_path / "imported").exists()


def test_build_takes_a_lock_only_from_the_folders_the_build_receives(built, tmp_path):
    """.dockerignore sends runtime_base/ and build/base-*/ to the daemon: a lock elsewhere in the
    context would be missing inside the build, so build refuses it first (exit 2)."""
    import shutil

    pkg, lock, _ = built
    assert _lock(pkg, lock).code == 0
    ctx = _context(tmp_path, lock)
    (ctx / "elsewhere").mkdir()
    shutil.copy(lock, ctx / "elsewhere" / "sglang.lock.json")
    r = run_main("build", "--context", str(ctx), "--python-version", "3.11", "--base-image", "b:1",
                 "--sglang-version", VERSION, "--base-lock", "elsewhere/sglang.lock.json")
    assert r.code == 2 and errors(r.err) == [
        f"error: --base-lock elsewhere/sglang.lock.json: must be a file in runtime_base/ or build/base-NAME/ of the "
        f"build context {ctx} (the folders .dockerignore sends to the build)"]


def test_plan_of_another_box_for_a_commit_built_version_names_the_rule_and_what_it_did_not_check(monkeypatch, tmp_path):
    """`plan --sglang-version VERSION` of a described box: the nearest release's plan, the same
    figures as for that release, and one line saying what was not checked (no description)."""
    monkeypatch.setenv("ESCHA_RUNTIME_DESCRIPTION", str(tmp_path / "none.json"))
    box = ("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "32GiB", "--linux", "--format", "json")
    built = json.loads(run_main(*box, "--sglang-version", VERSION).out)
    release = json.loads(run_main(*box, "--sglang-version", "0.5.19").out)
    assert built["sglang_release"] == "0.5.19" and built["recommended_ratio"] == release["recommended_ratio"]
    said = [w for w in built["warnings"] if "is built from a commit" in w]
    assert len(said) == 1 and "not checked: what differs from 0.5.19" in said[0]
    r = run_main(*box, "--sglang-version", "0.5.20.dev3+g1a2b3c4")
    assert r.code == 3 and len(errors(r.err)) == 1 and "its nearest release cannot be told" in r.err
