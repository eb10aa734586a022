"""``escha-deploy runtime import`` on a synthetic fork made with real git from the real sglang
0.5.19 wheel (``synthetic_fork.py``): headers decoded, refusals naming the commit, files outside
the package left out, declared capabilities, overlap decisions, one order with our series, and
the imported commits applied and verified file by file on an unpacked wheel.

The planner half: the capabilities the import gives decide which host check the plan models
(stock 0.5.19 without our 0001) and whether the server environment carries
``ESCHA_HICACHE_HOST_RESERVE_BYTES``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from escha_deploy.sglang.capabilities import ENV_HOST_RESERVE
from escha_deploy.cli.main import main
from escha_deploy.runtime import patching
from escha_deploy.runtime.description import read_description
from escha_deploy.runtime.fork import DECLARATION, read_commit
from escha_deploy.utils.ownedfolder import RECORD

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_fork import AUTHOR_JP, OURS_0001, SUBJECT_JP, declaration, make_fork  # noqa: E402

pytestmark = pytest.mark.wheel


def run(*args: str) -> int:
    try:
        return main(list(args))
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.fixture(scope="session")
def fork(sglang_wheel, tmp_path_factory):
    out = tmp_path_factory.mktemp("fork")
    hashes = make_fork(sglang_wheel, out)
    return out, hashes


def _dir(fork, tmp_path, which: str, declaration: str | None) -> Path:
    """A copy of an export (``all`` or ``good``) with ``declaration`` as its escha-fork.yaml."""
    out, _ = fork
    d = tmp_path / which
    shutil.copytree(out / which, d)
    if declaration is not None:
        (d / DECLARATION).write_text(declaration, encoding="utf-8")
    return d


def _decl(h: dict, decision: str | None = "drop-fork", caps: str = "[int2-kv, w2-weights]") -> str:
    return declaration(h, decision, caps)


def _import(capsys, d: Path, *extra: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = run("runtime", "import", str(d), *extra)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_headers_are_decoded_non_ascii_intact(fork):
    out, h = fork
    c, problems = read_commit(next((out / "good").glob("0002-*.patch")))
    raw = next((out / "good").glob("0002-*.patch")).read_bytes()
    assert b"=?UTF-8?q?" in raw and b"\n =?UTF-8?q?" in raw  # git encoded and folded it
    assert problems == []
    assert c.subject == SUBJECT_JP
    assert c.author == f"{AUTHOR_JP} <nakano@example.com>"
    assert c.commit == h["jp"] and c.date == "2026-03-03T09:00:00+09:00"
    assert [f.path for f in c.files] == ["srt/mem_cache/pool_host/mha.py"]


def test_rename_and_sgl_kernel_are_refused_naming_the_commit(fork, tmp_path, capsys):
    _, h = fork
    rc, _, err = _import(capsys, _dir(fork, tmp_path, "all", _decl(h)), "-o", str(tmp_path / "o"))
    assert rc == 3
    lines = err.splitlines()
    ren = [ln for ln in lines if h["ren"][:12] in ln]
    kern = [ln for ln in lines if h["kern"][:12] in ln]
    assert len(ren) == 1 and "renames python/sglang/srt/mem_cache/pool_host/mla.py" in ren[0]
    assert "(hicache: rename the MLA host pool module)" in ren[0]
    assert len(kern) == 1 and "sgl-kernel/csrc/x.cu" in kern[0]
    assert not (tmp_path / "o").exists()  # nothing copied


def test_mode_binary_and_pyproject_are_refused(fork, tmp_path, capsys):
    out, h = fork
    repo = tmp_path / "repo"
    shutil.copytree(out / "repo", repo)

    def git(*a):
        subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True)

    git("checkout", "-q", "-b", "more", "v0.5.19")
    pkg = repo / "python" / "sglang" / "srt" / "mem_cache"
    (pkg / "radix_cache.py").chmod(0o755)
    git("commit", "-qam", "chmod radix_cache")
    (pkg / "blob.bin").write_bytes(bytes(range(256)))
    git("add", "-A")
    git("commit", "-qm", "a binary file")
    (pkg / "run.sh").write_text("#!/bin/sh\n")
    (pkg / "run.sh").chmod(0o755)
    (repo / "tools").mkdir()
    (repo / "tools" / "repro.sh").write_text("#!/bin/sh\n")
    (repo / "tools" / "repro.sh").chmod(0o755)  # outside the package: left out, not refused
    git("add", "-A")
    git("commit", "-qm", "executable files")
    pp = repo / "python" / "pyproject.toml"
    pp.write_text(pp.read_text() + 'dependencies = ["oscar-kernels"]\n')
    git("commit", "-qam", "pyproject: a new dependency")
    git("format-patch", "-q", "-o", str(tmp_path / "more"), "v0.5.19..more")
    rc, _, err = _import(capsys, tmp_path / "more")
    assert rc == 3
    assert "(chmod radix_cache): python/sglang/srt/mem_cache/radix_cache.py" in err
    assert "changes the file mode 100644 -> 100755" in err
    assert "(a binary file): python/sglang/srt/mem_cache/blob.bin" in err and "binary diff" in err
    assert "(pyproject: a new dependency): python/pyproject.toml" in err
    assert "(executable files): python/sglang/srt/mem_cache/run.sh" in err
    assert "adds a file of mode 100755" in err and "tools/repro.sh" not in err
    assert err.count("error:") == 4


def test_overlap_without_decision_is_refused_naming_both_and_the_file(fork, tmp_path, capsys):
    _, h = fork
    rc, _, err = _import(capsys, _dir(fork, tmp_path, "good", _decl(h, decision=None)))
    assert rc == 3
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert OURS_0001 in line and "0003-hicache-read-host-memory-once-per-TP-group.patch" in line
    assert h["rsv"][:12] in line and "sglang/srt/mem_cache/pool_host/base.py" in line


def test_ours_first_is_refused_where_the_fork_commit_no_longer_applies(fork, tmp_path, capsys,
                                                                       sglang_wheel):
    _, h = fork
    d = _dir(fork, tmp_path, "good", _decl(h, "ours-first"))
    rc, _, err = _import(capsys, d, "--base-wheel", str(sglang_wheel), "-o", str(tmp_path / "o"))
    assert rc == 3
    assert ("error: 0003-hicache-read-host-memory-once-per-TP-group.patch: "
            "sglang/srt/mem_cache/pool_host/base.py: hunk #1") in err
    assert "hint: a fork commit was made against stock 0.5.19" in err


@pytest.mark.parametrize("decision,order", [
    ("drop-fork", [OURS_0001, "0002-hicache-host-allocator.patch",
                   "0003-transfer-geometry-check.patch", "0004-hicache-host-mamba-slots.patch",
                   "0001-escha-OSCAR-INT2-KV-cache.patch",
                   "0002-hicache-INT2-KV.patch", "0004-tools-mamba-transfer-repro.patch"]),
    ("drop-ours", ["0002-hicache-host-allocator.patch", "0003-transfer-geometry-check.patch",
                   "0004-hicache-host-mamba-slots.patch",
                   "0001-escha-OSCAR-INT2-KV-cache.patch", "0002-hicache-INT2-KV.patch",
                   "0003-hicache-read-host-memory-once-per-TP-group.patch",
                   "0004-tools-mamba-transfer-repro.patch"]),
])
def test_declared_drop_is_accepted_in_one_order(fork, tmp_path, capsys, sglang_wheel, decision,
                                                order):
    _, h = fork
    d = _dir(fork, tmp_path, "good", _decl(h, decision))
    out_dir = tmp_path / "o"
    rc, out, err = _import(capsys, d, "--base-wheel", str(sglang_wheel), "-o", str(out_dir),
                           "--format", "json")
    assert rc == 0, err
    data = json.loads(out)
    assert [r["name"] for r in data["order"]] == order
    assert len(data["dropped"]) == 1 and decision in data["dropped"][0]
    tools = [r for r in data["order"] if r["commit"] == h["tools"]]
    assert tools[0]["left_out"] == ["tools/x.py"] and tools[0]["files"] == []
    int2 = [r for r in data["order"] if r["commit"] == h["int2"]][0]
    assert int2["capabilities"] == ["int2-kv", "w2-weights"]
    assert ("hicache-host-reserve-env" in data["capabilities"]) == (decision == "drop-fork")
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(
        [p.name for p in d.glob("*.patch")] + [DECLARATION, RECORD])


@pytest.mark.parametrize("where, reason", [
    ("no/such/o", "No such file or directory"),
    ("file", "Not a directory"),
])
def test_an_output_folder_that_cannot_be_made_is_one_line_exit_2(fork, tmp_path, capsys, where,
                                                                 reason):
    """-o names a folder: made one level deep; a missing parent (not made, as before) or a
    file is refused first, one line naming --output and the path, exit 2, nothing copied."""
    _, h = fork
    d = _dir(fork, tmp_path, "good", _decl(h))
    (tmp_path / "file").write_text("keep\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    out = tmp_path / where
    rc, stdout, err = _import(capsys, d, "-o", str(out))
    assert rc == 2 and stdout == "" and "Traceback" not in err
    assert err.splitlines() == [f"error: --output {out}: cannot write: {reason}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "file").read_text() == "keep\n"


def test_fork_first_puts_the_commit_before_our_patch(fork, tmp_path):
    _, h = fork
    d = _dir(fork, tmp_path, "good", _decl(h, "fork-first"))
    names = [p.name for p in patching.fork_with_series(d).order]
    assert names.index("0003-hicache-read-host-memory-once-per-TP-group.patch") < names.index(OURS_0001)
    # the fork's other commits keep their order, ahead of it
    assert names[:3] == ["0001-escha-OSCAR-INT2-KV-cache.patch", "0002-hicache-INT2-KV.patch",
                         "0003-hicache-read-host-memory-once-per-TP-group.patch"]


@pytest.mark.parametrize("bad,expect", [
    ("commits:\n  {ren}: [int2-kv]\n", "no commit {ren} among the 4 patches"),
    ("commits:\n  {int2}: [hicache-host-reserve-env]\n",
     "'hicache-host-reserve-env' comes only from our series"),
    ("commits:\n  {int2}: [int3-kv]\n", "unknown capability 'int3-kv'"),
    ("drop: [{ren}]\n", "no commit {ren} among the 4 patches"),
    ("overlaps:\n  - {{ours: 0009-nope.patch, fork: {rsv}, decision: drop-fork}}\n",
     "'0009-nope.patch' is not a patch of our series"),
    ("overlaps:\n  - {{ours: " + OURS_0001 + ", fork: {rsv}, decision: both}}\n",
     "'both' is not one of ours-first, fork-first, drop-ours, drop-fork"),
])
def test_bad_declarations_exit_2_naming_line_and_key(fork, tmp_path, capsys, bad, expect):
    _, h = fork
    text = bad.format(**{k: v[:12] for k, v in h.items()})
    rc, _, err = _import(capsys, _dir(fork, tmp_path, "good", text))
    assert rc == 2, err
    assert expect.format(**{k: v[:12] for k, v in h.items()}) in err
    assert f"{DECLARATION}:" in err  # file:line named


def test_applied_fork_verifies_and_one_changed_byte_is_named(fork, tmp_path, site, capsys):
    """apply + verify on the real unpacked wheel with the imported commits: the fork's files
    are in the inventory, the description keeps each commit's provenance, a changed byte in a
    file only the fork adds is named."""
    _, h = fork
    d = _dir(fork, tmp_path, "good", _decl(h, "drop-fork"))
    state, pkg = tmp_path / "state", site / "sglang"
    assert run("runtime", "apply", "--sglang-dir", str(pkg), "--state-dir", str(state),
               "--fork-dir", str(d)) == 0
    desc = read_description(state / "runtime.json")
    fork_entries = [e for e in desc.series if e.source == "fork"]
    assert [e.commit for e in fork_entries] == [h["int2"], h["jp"], h["tools"]]
    assert fork_entries[1].subject == SUBJECT_JP and fork_entries[1].author.startswith(AUTHOR_JP)
    assert fork_entries[2].left_out == ["tools/x.py"]
    assert desc.dropped and h["rsv"][:12] in desc.dropped[0]
    label = json.loads(desc.labels()["io.escha.runtime.fork"])
    assert [x["subject"] for x in label][1] == SUBJECT_JP
    assert (pkg / "srt/mem_cache/int2_kv.py").is_file()
    assert "ホスト" in (pkg / "srt/mem_cache/pool_host/mha.py").read_text(encoding="utf-8")
    capsys.readouterr()
    assert run("runtime", "verify", "--sglang-dir", str(pkg), "--state-dir", str(state)) == 0
    assert "ok: 4377 files" in capsys.readouterr().out  # 4,371 + 4 hooks + 2 fork files
    data = bytearray((pkg / "srt/mem_cache/int2_kv.py").read_bytes())
    data[10] ^= 0x01
    (pkg / "srt/mem_cache/int2_kv.py").write_bytes(bytes(data))
    assert run("runtime", "verify", "--sglang-dir", str(pkg), "--state-dir", str(state)) == 3
    err = capsys.readouterr().err
    assert "error: changed: sglang/srt/mem_cache/int2_kv.py" in err and err.count("error:") == 1


@pytest.mark.parametrize("decision", ["drop-fork", "drop-ours"])
def test_plan_models_the_runtime_the_import_gives(fork, tmp_path, decision):
    """Without our 0001 the plan models stock 0.5.19's host check (10 GiB reserve) and the
    environment carries no ESCHA_HICACHE_HOST_RESERVE_BYTES; with it, the patched check."""
    from escha_deploy.pipeline.argv import server_env
    from escha_deploy.facts.machine import described_host
    from escha_deploy.planner import plan
    from escha_deploy.sglang.releases import load_release
    from escha_deploy.profile import load_profile

    _, h = fork
    caps = patching.capabilities_of(patching.fork_with_series(_dir(fork, tmp_path, "good",
                                                            _decl(h, decision))).order)
    prof = load_profile("rtx5060ti-tp2", [])
    p = plan(prof, described_host(32 * 2**30, "linux"), capabilities=frozenset(caps))
    env = server_env(p, prof)
    if decision == "drop-fork":
        assert p.runtime_check.applies == "patched"
        assert env[ENV_HOST_RESERVE] == str(p.runtime_check.patched_reserve_bytes)
    else:
        assert p.runtime_check.applies == "stock"
        assert p.runtime_check.stock_reserve_bytes == load_release("0.5.19").host_guard.reserve_bytes == 10 * 2**30
        assert ENV_HOST_RESERVE not in env
    assert not [k for k in env if k.startswith("ESCHA_") and k not in (
        ENV_HOST_RESERVE, "ESCHA_HICACHE_HOST_ALLOCATOR")]


def test_seed_box_stock_check_refuses_ratio_1_without_our_0001(fork, tmp_path):
    """What docs/runtime.md says follows on the seed's 16 GiB WSL2 VM: with the fork's reserve
    commit instead of our 0001, stock 0.5.19's check (10 GiB reserve) refuses ratio 1; with our
    0001 it is accepted."""
    from escha_deploy.facts.machine import described_host
    from escha_deploy.planner import plan
    from escha_deploy.profile import load_profile

    _, h = fork
    prof = load_profile("rtx5060ti-tp2", [])
    verdicts = {}
    for decision in ("drop-ours", "drop-fork"):
        caps = patching.capabilities_of(patching.fork_with_series(
            _dir(fork, tmp_path / decision, "good", _decl(h, decision))).order)
        p = plan(prof, described_host(16 * 2**30, "wsl2"), ratio=1.0, capabilities=frozenset(caps))
        verdicts[decision] = (p.verdict, p.runtime_check.applies, p.reasons)
    assert verdicts["drop-fork"][:2] == ("ok", "patched")
    assert verdicts["drop-ours"][:2] == ("unsafe", "stock")
    assert any("stock runtime's host-memory check would refuse" in r for r in verdicts["drop-ours"][2])


def test_empty_new_file_and_left_out_quoted_name(fork, tmp_path, capsys, sglang_wheel):
    """git writes no hunk for an empty new file (a package's empty ``__init__.py``): it is
    created, empty, and counted in the deltas. A file outside the package whose name git
    C-quotes (non-ASCII) is listed by its real name and left out."""
    out, _ = fork
    repo = tmp_path / "repo"
    shutil.copytree(out / "repo", repo)

    def git(*a):
        subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True)

    git("checkout", "-q", "-b", "pkg", "v0.5.19")
    new_pkg = repo / "python" / "sglang" / "srt" / "mem_cache" / "int2"
    new_pkg.mkdir()
    (new_pkg / "__init__.py").write_text("")
    (repo / "tools").mkdir()
    (repo / "tools" / "再現.py").write_text("print(1)\n")
    git("add", "-A")
    git("commit", "-qm", "int2: an empty package")
    git("format-patch", "-q", "-o", str(tmp_path / "pkg"), "v0.5.19..pkg")
    raw = next((tmp_path / "pkg").glob("*.patch")).read_bytes()
    assert b'"b/tools/\\345' in raw  # git quoted the name
    rc, stdout, err = _import(capsys, tmp_path / "pkg", "--base-wheel", str(sglang_wheel),
                              "-o", str(tmp_path / "o"), "--format", "json")
    assert rc == 0, err
    (row,) = [r for r in json.loads(stdout)["order"] if r["source"] == "fork"]
    assert row["files"] == ["sglang/srt/mem_cache/int2/__init__.py"]
    assert row["left_out"] == ["tools/再現.py"]
    deltas, contents = patching.compute_deltas(
        patching.fork_with_series(tmp_path / "pkg").order,
        lambda rel: __import__("escha_deploy.runtime.inventory", fromlist=["x"]).read_wheel_file(
            sglang_wheel, rel))
    assert contents["srt/mem_cache/int2/__init__.py"] == b""


def test_default_output_is_runtime_fork_of_the_checkout(fork, tmp_path, capsys, monkeypatch):
    _, h = fork
    d = _dir(fork, tmp_path, "good", _decl(h))
    ctx = tmp_path / "checkout"
    ctx.mkdir()
    (ctx / "Dockerfile.hicache").write_text("FROM scratch\n")
    monkeypatch.chdir(ctx)
    rc, _, err = _import(capsys, d)
    assert rc == 0, err
    assert sorted(p.name for p in (ctx / "runtime_fork").iterdir()) == sorted(
        [p.name for p in d.glob("*.patch")] + [DECLARATION, RECORD])
    assert "build with `escha-deploy build --hicache` there" in err


def test_inventory_deltas_cover_the_fork_files(fork, tmp_path, capsys, sglang_wheel):
    """`runtime inventory --deltas --fork-dir` computes the fork's files from the clean wheel in
    the declared order: the fork's new modules and edits, our hooks, not the dropped commit's."""
    _, h = fork
    d = _dir(fork, tmp_path, "good", _decl(h, "drop-fork"))
    capsys.readouterr()
    assert run("runtime", "inventory", "--wheel", str(sglang_wheel), "--deltas",
               "--fork-dir", str(d), "--format", "json") == 0
    deltas = json.loads(capsys.readouterr().out)["deltas"]
    assert {"srt/mem_cache/int2_kv.py", "srt/layers/quantization/escha_w2.py",
            "srt/mem_cache/memory_pool.py", "srt/mem_cache/pool_host/mha.py",
            "srt/mem_cache/pool_host/escha_host_reserve.py",
            "srt/mem_cache/pool_host/escha_host_mamba_slots.py"} <= set(deltas)
    assert len(deltas) == 12


def test_a_file_that_is_not_a_format_patch_mail_is_refused(fork, tmp_path, capsys):
    _, h = fork
    d = _dir(fork, tmp_path, "good", _decl(h))
    (d / "0009-notes.patch").write_text("--- a/sglang/srt/x.py\n+++ b/sglang/srt/x.py\n")
    rc, _, err = _import(capsys, d)
    assert rc == 3
    assert "error: 0009-notes.patch:1: not a `git format-patch` file" in err


def _wheel23() -> Path:
    found = sorted((Path(__file__).resolve().parents[2] / ".cache" / "wheels").glob("sglang-0.5.23-cp311-*.whl"))
    if not found:
        pytest.skip("no sglang 0.5.23 cp311 wheel under .cache/wheels")
    return found[0]


def test_commits_made_for_0_5_19_are_refused_on_0_5_23_naming_both(fork, tmp_path, capsys):
    """The export declares no release: it is made for the one our series is made for (0.5.19).
    Applied to an unpacked 0.5.23 wheel (a real one), and imported against its wheel: exit 3,
    one line naming both releases, nothing written."""
    import zipfile

    _, h = fork
    d = _dir(fork, tmp_path, "good", _decl(h, "drop-fork"))
    site = tmp_path / "site23"
    with zipfile.ZipFile(_wheel23()) as z:
        z.extractall(site)
    before = (site / "sglang/srt/mem_cache/pool_host/base.py").read_bytes()
    capsys.readouterr()
    rc = run("runtime", "apply", "--sglang-dir", str(site / "sglang"), "--state-dir", str(tmp_path / "st"),
             "--fork-dir", str(d))
    err = capsys.readouterr().err
    assert rc == 3, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert lines == [f"error: {d / DECLARATION}: the fork's commits are made for SGLang 0.5.19 (no release: "
                     "declared, so the one our series is made for); this runtime is SGLang 0.5.23"], err
    assert (site / "sglang/srt/mem_cache/pool_host/base.py").read_bytes() == before
    assert not (tmp_path / "st" / "runtime.json").exists()
    rc, _, err = _import(capsys, d, "--base-wheel", str(_wheel23()), "--output", str(tmp_path / "out"))
    assert rc == 3 and "made for SGLang 0.5.19" in err and "this runtime is SGLang 0.5.23" in err, err
    assert not (tmp_path / "out").exists()


def test_commits_declared_for_0_5_23_are_refused_on_0_5_19(fork, tmp_path, site, capsys):
    _, h = fork
    d = _dir(fork, tmp_path, "good", "release: 0.5.23\n" + _decl(h, "drop-fork"))
    capsys.readouterr()
    rc = run("runtime", "apply", "--sglang-dir", str(site / "sglang"), "--state-dir", str(tmp_path / "st"),
             "--fork-dir", str(d))
    err = capsys.readouterr().err
    assert rc == 3, err
    assert (f"error: {d / DECLARATION}: the fork's commits are made for SGLang 0.5.23 (declared as "
            "release); this runtime is SGLang 0.5.19") in err
    assert "release: 0.5.19" in err  # the hint says what to declare after rebasing


def test_commits_declared_for_the_runtime_release_apply(fork, tmp_path, site):
    _, h = fork
    d = _dir(fork, tmp_path, "good", "release: 0.5.19\n" + _decl(h, "drop-fork"))
    assert run("runtime", "apply", "--sglang-dir", str(site / "sglang"), "--state-dir", str(tmp_path / "st"),
               "--fork-dir", str(d)) == 0


def test_a_malformed_release_is_bad_input_naming_the_line(fork, tmp_path, capsys):
    _, h = fork
    d = _dir(fork, tmp_path, "good", _decl(h, "drop-fork") + "release: v0.5.19\n")
    rc, _, err = _import(capsys, d, "--base-wheel", str(_wheel23()), "--output", str(tmp_path / "out"))
    assert rc == 2, err
    assert f"{DECLARATION}:" in err and "release: expected the SGLang release the fork branch is on, X.Y.Z" in err


def test_a_subject_with_terminal_controls_prints_without_them(fork, tmp_path, capsys):
    """A commit's subject is a file's words: the apply-order table prints it without ESC
    sequences or bidi controls (``termtext.printable``)."""
    out, _ = fork
    repo = tmp_path / "repo"
    shutil.copytree(out / "repo", repo)

    def git(*a):
        subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True)

    git("checkout", "-q", "-b", "ctl", "v0.5.19")
    new_pkg = repo / "python" / "sglang" / "srt" / "mem_cache" / "int2"
    new_pkg.mkdir()
    (new_pkg / "__init__.py").write_text("x = 1\n")
    git("add", "-A")
    git("commit", "-qm", "int2: \x1b]0;PWNED\x07\x1b[31mred\u202eder [bold]x")
    git("format-patch", "-q", "-o", str(tmp_path / "ctl"), "v0.5.19..ctl")
    rc, stdout, err = _import(capsys, tmp_path / "ctl", "-o", str(tmp_path / "o"))
    assert rc == 0, err
    assert "int2: redder [bold]x" in stdout
    assert not any(c in stdout + err for c in ("\x1b", "\x07", "\u202e")), repr(stdout)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize("planted", ["0001-another-fork.patch", DECLARATION])
def test_import_over_files_it_did_not_write_refuses_and_keeps_them(fork, tmp_path, capsys, planted):
    """Another fork's patch or a hand-written escha-fork.yaml in -o: refused, one line naming
    it, exit 3, every file as it was (the first import's and the planted one)."""
    _, h = fork
    d = _dir(fork, tmp_path, "good", _decl(h))
    out = tmp_path / "o"
    assert _import(capsys, d, "-o", str(out))[0] == 0
    (out / planted).write_text("# written by hand\n")
    before = _files(out)
    rc, stdout, err = _import(capsys, d, "-o", str(out))
    assert rc == 3 and "Traceback" not in err, err
    assert f"holds {planted}, not written by runtime import" in err.splitlines()[0]
    assert _files(out) == before


def test_a_folder_an_earlier_version_filled_is_refused_with_the_command_that_clears_it(
        fork, tmp_path, capsys):
    _, h = fork
    d = _dir(fork, tmp_path, "good", _decl(h))
    out = tmp_path / "o"
    shutil.copytree(d, out)  # what an import without a record left
    before = _files(out)
    rc, _, err = _import(capsys, d, "-o", str(out))
    assert rc == 3 and "no record of who wrote them" in err.splitlines()[0], err
    assert f"rm -- {out}/*.patch {out / DECLARATION}" in re.sub(r"\s+", " ", err)
    assert _files(out) == before


def test_a_full_disk_at_the_rename_keeps_the_previous_import(fork, tmp_path, capsys, monkeypatch):
    """Fault injection: every rename (os.rename, os.replace) into or out of the folder fails
    with ENOSPC. The previous import stays whole; the error is one line naming --output."""
    import errno
    import os

    _, h = fork
    d = _dir(fork, tmp_path, "good", _decl(h))
    out = tmp_path / "o"
    assert _import(capsys, d, "-o", str(out))[0] == 0
    before = _files(out)

    real = {"rename": os.rename, "replace": os.replace}

    def full(call):
        def fn(src, dst, *a, **k):  # a rename into or out of the import's folder: the disk is full
            if any(str(p).startswith(str(out)) for p in (src, dst)):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real[call](src, dst, *a, **k)
        return fn

    monkeypatch.setattr(os, "rename", full("rename"))
    monkeypatch.setattr(os, "replace", full("replace"))
    rc, _, err = _import(capsys, d, "-o", str(out))  # the same import again
    monkeypatch.undo()
    assert rc == 2 and "Traceback" not in err, err
    assert err.splitlines()[0].startswith(f"error: --output {out}: cannot write: No space left on device")
    assert _files(out) == before
    assert sorted(os.listdir(tmp_path)) == ["good", "o"]
