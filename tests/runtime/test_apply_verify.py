"""``escha-deploy runtime apply | verify | inventory | describe`` on a real unpacked sglang
0.5.19 wheel: the patched tree equals base + deltas, and one changed byte (in a file the series
does not touch, and separately in one it does) makes ``verify`` name the file and exit 3."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from escha_deploy.sglang.capabilities import SERIES_CAPABILITIES
from escha_deploy.cli.main import main
from escha_deploy.utils.errors import Refused
from escha_deploy.runtime import inventory as inv
from escha_deploy.runtime import patching
from escha_deploy.runtime.description import (
    LABEL_CAPABILITIES,
    capabilities_from_labels,
    read_description,
    require_capabilities,
)

from .conftest import rewrite

pytestmark = pytest.mark.wheel

UNTOUCHED = "srt/mem_cache/pool_host/mla.py"
TOUCHED = "srt/mem_cache/pool_host/base.py"


def run(*args: str) -> int:
    try:
        return main(list(args))
    except SystemExit as exc:
        return int(exc.code or 0)


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    rewrite(path, bytes(data))


@pytest.fixture
def applied(site, tmp_path):
    """A test's own applied tree, for tests that change it (read-only tests use
    ``applied_shared``)."""
    state = tmp_path / "state"
    assert run("runtime", "apply", "--sglang-dir", str(site / "sglang"),
               "--state-dir", str(state)) == 0
    return site / "sglang", state


def _verify(pkg: Path, state: Path, *extra: str) -> int:
    return run("runtime", "verify", "--sglang-dir", str(pkg), "--state-dir", str(state), *extra)


def test_apply_then_verify_ok(applied_shared, capsys):
    pkg, state = applied_shared
    capsys.readouterr()
    assert _verify(pkg, state, "--format", "json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["files"] == 4371 + 4  # + our 4 hooks
    desc = read_description(state / "runtime.json")
    assert desc.capabilities == list(SERIES_CAPABILITIES)
    assert desc.base == "wheel:cp311-cp311-manylinux_2_34_x86_64"
    assert desc.base_inventory_committed and desc.sglang_version == "0.5.19"
    assert desc.inventory_digest == out["expected_digest"]
    assert desc.labels()[LABEL_CAPABILITIES] == ",".join(SERIES_CAPABILITIES)


@pytest.mark.parametrize("rel", [UNTOUCHED, TOUCHED])
def test_one_changed_byte_is_named(applied, capsys, rel):
    pkg, state = applied
    _flip_byte(pkg / rel)
    capsys.readouterr()
    assert _verify(pkg, state) == 3
    err = capsys.readouterr().err
    assert f"changed: sglang/{rel}" in err
    assert err.count("error:") == 1


def test_missing_and_extra_files_are_named(applied, capsys):
    pkg, state = applied
    (pkg / UNTOUCHED).unlink()
    (pkg / "srt" / "surprise.py").write_text("x = 1\n")
    (pkg / "srt" / "__pycache__").mkdir(exist_ok=True)
    (pkg / "srt" / "__pycache__" / "ignored.cpython-311.pyc").write_bytes(b"\0")
    capsys.readouterr()
    assert _verify(pkg, state) == 3
    err = capsys.readouterr().err
    assert f"missing: sglang/{UNTOUCHED}" in err and "extra: sglang/srt/surprise.py" in err
    assert "pycache" not in err


def test_verify_never_reads_deltas_from_the_tree(applied, capsys):
    """A tampered patched file AND a tampered saved copy: the clean copy is checked against the
    base inventory, so verify refuses instead of trusting either."""
    pkg, state = applied
    _flip_byte(state / "base-files" / TOUCHED)
    capsys.readouterr()
    assert _verify(pkg, state) == 3
    assert "clean copy does not match the base inventory" in capsys.readouterr().err


def test_verify_against_the_wheel_as_clean_base(applied_shared, sglang_wheel):
    pkg, state = applied_shared
    assert _verify(pkg, state, "--base-wheel", str(sglang_wheel)) == 0


def test_apply_twice_refuses_with_base_drift(applied_shared, capsys):
    pkg, state = applied_shared
    capsys.readouterr()
    assert run("runtime", "apply", "--sglang-dir", str(pkg), "--state-dir", str(state)) == 3
    err = capsys.readouterr().err
    assert f"base drift against cp311-cp311-manylinux_2_34_x86_64.json: changed: sglang/{TOUCHED}" in err


def test_unpatched_tree_fails_verify(site, tmp_path, capsys):
    pkg = site / "sglang"
    assert _verify(pkg, tmp_path / "none") == 3
    assert "no base inventory" not in capsys.readouterr().err  # the wheel's is committed


@pytest.mark.parametrize("where, reason", [
    ("no/such/state", "No such file or directory"),
    ("file", "Not a directory"),
])
def test_a_state_dir_that_cannot_be_made_is_refused_before_anything_is_written(
        site, tmp_path, capsys, where, reason):
    """It used to end in a traceback (or, for a missing parent, make the whole path); now one
    line naming --state-dir, exit 2, the package untouched (the site fixture checks that the
    pristine tree is unchanged) and no state written."""
    pkg = site / "sglang"
    (tmp_path / "file").write_text("keep\n")
    state = tmp_path / where
    before = inv.scan(pkg)
    assert run("runtime", "apply", "--sglang-dir", str(pkg), "--state-dir", str(state)) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"error: --state-dir {state}: cannot write: {reason}"]
    assert inv.compare(inv.scan(pkg), before).ok
    assert not (tmp_path / "no").exists() and (tmp_path / "file").read_text() == "keep\n"


def test_reject_writes_nothing(site, tmp_path, capsys):
    pkg = site / "sglang"
    target = pkg / "srt/mem_cache/hybrid_cache/hybrid_pool_assembler.py"
    rewrite(target, target.read_bytes().replace(b"kv_host_pool_cls(", b"kv_host_pool_klass(", 1))
    # an image built from git: no dist-info tag, so the base is recorded, not checked
    for d in site.glob("sglang-*.dist-info"):
        rewrite(d / "WHEEL", "Wheel-Version: 1.0\n")
    before = inv.scan(pkg)
    assert run("runtime", "apply", "--sglang-dir", str(pkg), "--state-dir",
               str(tmp_path / "s"), "--base-ref", "example/sglang:git") == 3
    err = capsys.readouterr().err
    assert "no committed base inventory for image:example/sglang:git" in err
    assert ("0003-transfer-geometry-check.patch: "
            "sglang/srt/mem_cache/hybrid_cache/hybrid_pool_assembler.py: hunk #") in err
    assert inv.scan(pkg) == before


def test_unknown_base_is_recorded_and_deltas_still_checked(site, tmp_path, capsys):
    pkg = site / "sglang"
    (pkg / "srt" / "local_fork_note.py").write_text("# a base built from git\n")
    for d in site.glob("sglang-*.dist-info"):
        rewrite(d / "WHEEL", "Wheel-Version: 1.0\n")
    state = tmp_path / "s"
    assert run("runtime", "apply", "--sglang-dir", str(pkg), "--state-dir", str(state),
               "--base-ref", "example/sglang@sha256:" + "0" * 64) == 0
    err = capsys.readouterr().err
    recorded = inv.read_inventory(state / "base-inventory.json")[0]
    assert f"digest {recorded['digest']}" in err
    desc = read_description(state / "runtime.json")
    assert not desc.base_inventory_committed and desc.base.startswith("image:example/sglang@")
    assert _verify(pkg, state) == 0
    _flip_byte(pkg / TOUCHED)
    assert _verify(pkg, state) == 3


OVERLAY = """\
Subject: example INT2 KV overlay (a stand-in for a fork's patch: one new file)
Capabilities: int2-kv

--- /dev/null
+++ b/sglang/srt/mem_cache/pool_host/int2_example.py
@@ -0,0 +1,1 @@
+INT2 = True
--- a/sglang/srt/mem_cache/pool_host/escha_transfer_geometry.py
+++ b/sglang/srt/mem_cache/pool_host/escha_transfer_geometry.py
@@ -1,1 +1,2 @@
+# int2 overlay was here
 \"\"\"Refuse a HiCache host pool whose per-token widths disagree with its device pool.
"""


def test_overlay_appends_capability_and_its_deltas(site, tmp_path, capsys):
    pkg = site / "sglang"
    ov = tmp_path / "overlays"
    ov.mkdir()
    (ov / "9001-int2-example.patch").write_text(OVERLAY)
    state = tmp_path / "s"
    assert run("runtime", "apply", "--sglang-dir", str(pkg), "--state-dir", str(state),
               "--overlay-dir", str(ov)) == 0
    desc = read_description(state / "runtime.json")
    assert desc.capabilities == [*SERIES_CAPABILITIES, "int2-kv"]
    assert desc.series[-1].source == "overlay"
    assert (pkg / "srt/mem_cache/pool_host/int2_example.py").is_file()
    # verify re-applies from the saved overlay copy onto clean base copies
    assert _verify(pkg, state) == 0
    # the overlay in the user's folder changed after the build: refused, named
    (ov / "9001-int2-example.patch").write_text(OVERLAY.replace("True", "False"))
    capsys.readouterr()
    assert _verify(pkg, state, "--overlay-dir", str(ov)) == 3
    assert "the patches differ from those applied" in capsys.readouterr().err


def test_expected_capabilities_must_match(site, tmp_path, capsys):
    assert run("runtime", "apply", "--sglang-dir", str(site / "sglang"), "--state-dir",
               str(tmp_path / "s"), "--expect-capabilities", "hicache-host-reserve-env") == 3
    assert "build argument capabilities" in capsys.readouterr().err


def test_expected_sglang_version_must_be_the_installed_one(site, tmp_path, capsys):
    """Dockerfile.hicache passes the release the build was asked for (SGLANG_VERSION): a base
    holding another release is refused before a byte is written, naming both releases."""
    state = tmp_path / "s"
    assert run("runtime", "apply", "--sglang-dir", str(site / "sglang"), "--state-dir", str(state),
               "--expect-sglang-version", "0.5.23") == 3
    err = capsys.readouterr().err
    assert f"error: build argument SGLANG_VERSION='0.5.23' but the installed sglang at {site / 'sglang'} is 0.5.19" in err
    assert "hint: build with --sglang-version 0.5.19, or on a base image that holds SGLang 0.5.23" in err
    assert not state.exists()


def test_inventory_of_wheel_and_deltas(sglang_wheel, capsys, tmp_path):
    out_file = tmp_path / "inv.json"
    assert run("runtime", "inventory", "--wheel", str(sglang_wheel), "--deltas", "--format",
               "json", "--output", str(out_file)) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["files"] == 4371 and data["bytes"] == 85_169_375
    assert data["matches_committed"] is True
    committed = json.loads((patching.series_dir() / "deltas.json").read_text())["deltas"]
    assert {k: [v["size"], v["sha256"]] for k, v in data["deltas"].items()} == committed
    assert inv.read_inventory(out_file)[0]["digest"] == data["digest"]


def test_inventory_output_says_what_it_wrote_where(sglang_wheel, capsys, tmp_path):
    out_file = tmp_path / "inv.json"
    assert run("runtime", "inventory", "--wheel", str(sglang_wheel), "-o", str(out_file)) == 0
    err = capsys.readouterr().err
    digest = inv.read_inventory(out_file)[0]["digest"]
    assert err.splitlines() == [f"runtime inventory: wrote the inventory of wheel:cp311-cp311-"
                                f"manylinux_2_34_x86_64 (4371 files, digest {digest[:12]}) to {out_file}"]


@pytest.mark.parametrize("where, reason", [
    ("{t}/no/such/i.json", "No such file or directory"),
    ("{t}", "Is a directory"),
    ("{t}/file/i.json", "Not a directory"),
    ("/proc/version", None),
])
def test_inventory_output_that_cannot_be_written_is_one_line_exit_2(sglang_wheel, capsys, tmp_path,
                                                                     where, reason):
    """A missing parent folder is refused, not made (as root it used to create /nonexistent/...),
    and so is a folder or an unwritable file: one line naming --output and the path, exit 2,
    before the wheel is read, nothing created."""
    (tmp_path / "file").write_text("keep\n")
    path = where.format(t=tmp_path)
    proc = open("/proc/version").read()
    assert run("runtime", "inventory", "--wheel", str(sglang_wheel), "-o", path, "--format", "json") == 2
    got = capsys.readouterr()
    assert "Traceback" not in got.err and got.out == ""
    [line] = got.err.splitlines()
    assert line.startswith(f"error: --output {path}: cannot write: "), line
    if reason:
        assert line == f"error: --output {path}: cannot write: {reason}"
    assert [p.name for p in tmp_path.iterdir()] == ["file"] and (tmp_path / "file").read_text() == "keep\n"
    assert open("/proc/version").read() == proc


def test_wheel_record_hashes_agree(sglang_wheel):
    assert inv.record_check(sglang_wheel) == 4371


def test_describe(applied_shared, capsys):
    pkg, state = applied_shared
    capsys.readouterr()
    assert run("runtime", "describe", "--description", str(state / "runtime.json")) == 0
    assert "capabilities: hicache-host-reserve-env" in capsys.readouterr().out
    assert run("runtime", "describe", "--description", str(state / "nope.json")) == 3


def test_require_capabilities_names_missing():
    require_capabilities(list(SERIES_CAPABILITIES), ["hicache-host-allocator"], "img")
    with pytest.raises(Refused) as exc:
        require_capabilities(None, ["int2-kv", "w2-weights"], "/etc/escha/runtime.json")
    assert exc.value.problems == (
        "/etc/escha/runtime.json: runtime lacks capability 'int2-kv'",
        "/etc/escha/runtime.json: runtime lacks capability 'w2-weights'",
    )
    assert capabilities_from_labels({}) is None
    assert capabilities_from_labels({LABEL_CAPABILITIES: "a,b"}) == ["a", "b"]


def test_locate_through_interpreter_without_importing(site, tmp_path):
    """``--python`` runs find_spec in SGLang's interpreter; an ``__init__`` that exits when
    imported proves locating never imports sglang."""
    import os
    import sys

    rewrite(site / "sglang" / "__init__.py", "raise SystemExit('imported!')\n")
    wrapper = tmp_path / "sglang-python"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    os.chmod(wrapper, 0o755)
    located = inv.locate(python=str(wrapper))
    assert located.package_dir == (site / "sglang").resolve()
    assert located.version == "0.5.19" and located.wheel_tag.startswith("cp311")


def test_version_without_dist_info_read_from_version_file(site):
    """An image built from git may have no dist-info beside the package: the version comes from
    ``sglang/_version.py``, read as text."""
    import shutil as _sh

    for d in site.glob("sglang-*.dist-info"):
        _sh.rmtree(d)
    located = inv.locate(site / "sglang")
    assert located.version == "0.5.19" and located.wheel_tag is None
    assert patching.base_id(located, "lmsysorg/sglang:v0.5.19") == "image:lmsysorg/sglang:v0.5.19"


def test_plan_inside_an_image_plans_the_runtime_it_is(applied_shared, capsys, monkeypatch):
    """`plan` of this machine reads /etc/escha/runtime.json (here: the one `runtime apply` wrote
    on the real wheel, our series only): the INT2 profile needs int2-kv and w2-weights, which
    this runtime lacks, so plan prints the plan of this runtime and refuses with exit 3 naming
    both, as `serve --print` does, never a flag error for the capabilities' flags; the fp8
    profile needs only the series and plans ok. A plan of another box does not read it."""
    import escha_deploy.sglang.capabilities as caps

    _pkg, state = applied_shared
    monkeypatch.setattr(caps, "RUNTIME_DESCRIPTION_PATH", str(state / "runtime.json"))
    capsys.readouterr()
    assert run("plan", "--profile", "rtx5060ti-tp2") == 3
    out = capsys.readouterr()
    print(out.out)
    assert "verdict:" in out.out  # the plan of the runtime that is here
    assert "runtime lacks capability 'int2-kv'" in out.err and "runtime lacks capability 'w2-weights'" in out.err
    assert "invalid choice" not in out.err
    assert run("plan", "--profile", "rtx5060ti-tp2-fp8") == 0
    assert "runtime lacks" not in capsys.readouterr().err
    # a described box (--host-ram) is another box: planned with the profile's needs, never
    # with this runtime's description, and the plan says so
    assert run("plan", "--profile", "rtx5060ti-tp2", "--host-ram", "32GB") == 0
    out = capsys.readouterr()
    assert "runtime lacks" not in out.err and "describes another box" in " ".join(out.out.split())


def test_recorded_series_reads_what_the_description_model_reads(applied_shared):
    """verify reads runtime.json's series without the pydantic model; both readers agree."""
    _, state = applied_shared
    desc = read_description(state / "runtime.json")
    assert patching.recorded_series(state / "runtime.json") == [(e.name, e.sha256) for e in desc.series]
    assert len(desc.series) == len(SERIES_CAPABILITIES)
    assert patching.recorded_series(state / "no-such.json") is None


@pytest.mark.parametrize(("text", "fragment"), [
    ("garbage", ":1: the runtime description is not JSON (Expecting value"),
    ('{"series": {"name": "x"}}', ": not a runtime description (series: expected a list)"),
    ('{"series": [{"name": "0001-hicache-host-reserve.patch"}]}',
     ": not a runtime description (series.0: expected an object with string name and sha256)"),
])
def test_verify_names_a_broken_runtime_json(applied_shared, tmp_path, capsys, text, fragment):
    pkg, state = applied_shared
    mine = tmp_path / "state"
    shutil.copytree(state, mine)
    (mine / "runtime.json").write_text(text)
    capsys.readouterr()
    assert _verify(pkg, mine) == 2
    err = capsys.readouterr().err
    assert f"{mine / 'runtime.json'}{fragment}" in err, err


def test_verify_imports_no_pydantic(applied_shared):
    """`runtime verify` hashes ~4,400 files; its start-up must not add pydantic's model
    machinery (about 0.1 s, docs/performance.md). Import graph of the real entry point."""
    from tests.cli.test_startup import modules_after

    pkg, state = applied_shared
    code, mods = modules_after("runtime", "verify", "--sglang-dir", str(pkg), "--state-dir", str(state))
    assert code == 0
    assert not mods & {"pydantic", "pydantic_core", "rich", "docker", "requests", "httpx"}, \
        sorted(mods & {"pydantic", "pydantic_core", "rich", "docker", "requests", "httpx"})
    assert "escha_deploy.runtime.patching" in mods
