"""``runtime rebase --onto VERSION``: our series re-derived on the real 0.5.23 wheel
(``.cache/wheels``), the committed ``runtime_patches/0.5.23/`` being exactly what it writes, and
``runtime apply``/``verify`` on an unpacked 0.5.23 wheel. Marked ``wheel``."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from escha_deploy.utils.errors import BadInput
from escha_deploy.runtime import inventory as inv
from escha_deploy.runtime.patching import series_dir
from escha_deploy.runtime.rebase import rebase_onto
from escha_deploy.runtime.series import apply_series, read_series
from tests.script_module import load_script

REPO = Path(__file__).resolve().parents[2]
RELEASE = "0.5.23"
pytestmark = pytest.mark.wheel


@pytest.fixture(scope="module")
def wheel23() -> Path:
    found = sorted((REPO / ".cache" / "wheels").glob(f"sglang-{RELEASE}-cp311-*.whl"))
    if not found:
        pytest.skip(f"no sglang {RELEASE} cp311 wheel under .cache/wheels")
    return found[0]


def test_the_committed_series_is_what_the_rebase_writes(wheel23):
    assert load_script("gen_release_series").main(["--check", "--wheels", str(wheel23.parent)]) == 0


def test_every_hunk_has_its_outcome_and_reason_in_the_rebased_patch():
    ours, rebased = read_series(series_dir()), read_series(series_dir(RELEASE))
    assert [p.name for p in ours] == [p.name for p in rebased]
    for src, dst in zip(ours, rebased):
        text = (series_dir(RELEASE) / dst.name).read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith("Rebase-Hunk: ")]
        assert len(lines) == sum(len(fp.hunks) for fp in src.files), dst.name
        for line in lines:
            outcome = line.split(": ")[2]
            assert outcome in {"applies", "moved", "already", "ported", "dropped"}, line
            assert len(line.split(": ", 3)[3]) > 10, line  # a reason, not a bare outcome
        assert f"(sha256 {src.sha256})" in text
        assert dst.capabilities == src.capabilities and dst.header["Subject"] == src.header["Subject"]


def test_what_0_5_23_does_itself_is_dropped_and_what_moved_is_ported():
    text = (series_dir(RELEASE) / "0003-transfer-geometry-check.patch").read_text()
    assert "hunk #2 @@ -157,7 +160,7 @@: dropped: " in text  # 0.5.23 names the pool itself
    assert "hunk #3 @@ -167,6 +170,10 @@: ported: " in text
    p23 = (series_dir(RELEASE) / "0001-hicache-host-reserve.patch").read_text()
    assert "available_host_memory_bytes(allow_cgroup_fallback=not auto_size)" in p23
    assert "hunk #1 @@ -11,6 +11,7 @@: moved: " in p23


def test_the_rebased_series_applies_and_compiles_on_the_wheel(wheel23):
    contents = apply_series(read_series(series_dir(RELEASE)), lambda rel: inv.read_wheel_file(wheel23, rel))
    hooks = REPO / "escha_deploy" / "runtime" / "hooks"
    assert contents["srt/mem_cache/pool_host/escha_host_reserve.py"] == (hooks / "host_reserve.py").read_bytes()
    assert contents["srt/mem_cache/pool_host/escha_host_alloc.py"] == (hooks / "host_alloc.py").read_bytes()
    for rel, data in contents.items():
        compile(data, f"sglang/{rel}", "exec", dont_inherit=True)
    committed = json.loads((series_dir(RELEASE) / "deltas.json").read_text())["deltas"]
    assert committed == {k: [len(v), inv.sha256_bytes(v)] for k, v in sorted(contents.items())}


def test_a_hunk_with_no_place_and_no_resolution_is_bad_input_naming_it(cli, wheel23, tmp_path):
    empty = tmp_path / "rebase.yaml"
    empty.write_text("hunks: []\n")
    r = cli("runtime", "rebase", "--onto", RELEASE, "--wheel", str(wheel23), "--resolutions", str(empty),
            "--output", str(tmp_path / "out"))
    assert r.code == 2
    assert ("0001-hicache-host-reserve.patch: sglang/srt/mem_cache/pool_host/base.py: hunk #3 "
            "@@ -48,15 +50,38 @@: neither it nor its change alone is in the release's file") in r.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("entry, message", [
    ("{patch: 0001-hicache-host-reserve.patch, file: srt/mem_cache/pool_host/base.py, hunk: 3, why: w,"
     " edits: [{replace: \"no such line\\n\", with: \"x\\n\"}]}",
     "hunks[0].edits[0]: its 'replace' text is not exactly once in the release's "
     "sglang/srt/mem_cache/pool_host/base.py"),
    ("{patch: 0009-none.patch, file: a.py, hunk: 1, why: w, drop: true}",
     "hunks[0]: 0009-none.patch a.py hunk 1 is not a hunk of the series"),
    ("{patch: p, file: f, hunk: 1, why: w}", "hunks[0]: give either 'drop: true' or 'edits'"),
])
def test_a_bad_resolution_is_bad_input_naming_the_entry(cli, wheel23, tmp_path, entry, message):
    res = tmp_path / "rebase.yaml"
    res.write_text(f"hunks:\n  - {entry}\n")
    r = cli("runtime", "rebase", "--onto", RELEASE, "--wheel", str(wheel23), "--resolutions", str(res),
            "--output", str(tmp_path / "out"))
    assert r.code == 2 and message in r.err, r.err


def test_a_release_that_already_has_a_patch_gets_already(tmp_path):
    """A wheel whose files carry 0001 already (made here by applying it to the 0.5.19 wheel)."""
    from tests.runtime.conftest import find_wheel

    w19 = find_wheel()
    if w19 is None:
        pytest.skip("no sglang 0.5.19 wheel")
    series = read_series(series_dir())
    src = zipfile.ZipFile(w19)

    def read(path):
        name = f"sglang/{path}"
        return src.read(name) if name in src.namelist() else None

    patched = apply_series(series[:1], read)
    wheel = tmp_path / "sglang-0.5.99-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name in src.namelist():
            rel = name[len("sglang/"):] if name.startswith("sglang/") else None
            zf.writestr(name, patched[rel] if rel in patched else src.read(name))
        for rel in set(patched) - {n[len("sglang/"):] for n in src.namelist()}:
            zf.writestr(f"sglang/{rel}", patched[rel])
    result = rebase_onto("0.5.99", wheel, series, "0.5.19", [])
    first = result.patches[0]
    assert {o.outcome for o in first.outcomes} == {"already"}
    assert first.text == b""  # nothing left to change: left out of the series
    written = __import__("escha_deploy.runtime.rebase", fromlist=["write_rebased"]).write_rebased(
        result, tmp_path / "out")
    assert "# 0001-hicache-host-reserve.patch: left out, sglang 0.5.99 has every change it made" in (
        tmp_path / "out" / "series").read_text()
    assert [p.name for p in read_series(tmp_path / "out")] == [p.name for p in series[1:]]
    assert tmp_path / "out" / "deltas.json" in written
    assert {o.outcome for p in result.patches[1:] for o in p.outcomes} == {"applies"}
    with pytest.raises(BadInput, match="nothing to rebase|0.5.19"):
        from escha_deploy.cli.runtime import _rebase_onto
        from escha_deploy.cli.options import OutputFormat

        _rebase_onto("0.5.19", wheel, None, tmp_path / "o", OutputFormat.json)


@pytest.fixture(scope="module")
def site23(wheel23, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site-0.5.23")
    with zipfile.ZipFile(wheel23) as z:
        z.extractall(site)
    return site


def test_apply_and_verify_on_0_5_23(cli, site23, tmp_path):
    state = tmp_path / "state"
    pkg = site23 / "sglang"
    r = cli("runtime", "apply", "--sglang-dir", str(pkg), "--state-dir", str(state), "-f", "json")
    assert r.code == 0, r.err
    desc = json.loads(r.out)
    assert desc["sglang_version"] == RELEASE and desc["base_inventory_committed"] is True
    assert [e["name"] for e in desc["series"]] == [p.name for p in read_series(series_dir(RELEASE))]
    assert [e["sha256"] for e in desc["series"]] == [p.sha256 for p in read_series(series_dir(RELEASE))]
    assert desc["capabilities"] == ["hicache-host-reserve-env", "hicache-host-allocator",
                                    "transfer-geometry-check", "hicache-host-mamba-slots"]
    assert b"_escha_host_reserve.budget_bytes(" in (pkg / "srt/mem_cache/pool_host/base.py").read_bytes()
    r = cli("runtime", "verify", "--sglang-dir", str(pkg), "--state-dir", str(state))
    assert r.code == 0 and r.out.startswith("ok: "), r.err
    target = pkg / "srt/mem_cache/pool_host/common.py"
    data = target.read_bytes()
    target.unlink()
    target.write_bytes(data.replace(b"alloc_with_escha_choice", b"alloc_with_host_register", 1))
    r = cli("runtime", "verify", "--sglang-dir", str(pkg), "--state-dir", str(state))
    assert r.code == 3 and "srt/mem_cache/pool_host/common.py" in r.err, r.err
