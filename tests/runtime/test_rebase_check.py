"""``runtime rebase --check VERSION``: our series and a synthetic fork's commits against the real
0.5.19 and 0.5.23 wheels (``.cache/wheels``; CI downloads both). Marked ``wheel``."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest

from escha_deploy.runtime.patching import series_dir
from escha_deploy.runtime.series import apply_series, read_series

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_fork import make_fork  # noqa: E402

pytestmark = pytest.mark.wheel


def _wheel(version: str) -> Path:
    found = sorted((REPO / ".cache" / "wheels").glob(f"sglang-{version}-*.whl"))
    if not found:
        pytest.skip(f"no sglang {version} wheel under .cache/wheels")
    return found[0]


def _check(cli, version: str, *extra: str):
    r = cli("runtime", "rebase", "--check", version, "--wheel", str(_wheel(version)), *extra, "-f", "json")
    return r, json.loads(r.out)


def test_the_series_applies_to_0_5_19(cli):
    r, out = _check(cli, "0.5.19")
    assert r.code == 0, r.err
    assert [v["status"] for v in out["verdicts"]] == ["applies"] * 4 and out["ok"]


def test_the_0_5_23_series_applies_to_0_5_23(cli):
    """``--check`` takes the release's own series (runtime_patches/0.5.23/) when committed."""
    r, out = _check(cli, "0.5.23")
    assert r.code == 0, r.err
    assert [v["name"] for v in out["verdicts"]] == [
        "0001-hicache-host-reserve.patch", "0002-hicache-host-allocator.patch",
        "0003-transfer-geometry-check.patch", "0004-hicache-host-mamba-slots.patch"]
    assert all(v["status"] == "applies" for v in out["verdicts"]) and out["ok"]


def test_the_0_5_19_series_fails_on_0_5_23_naming_file_and_hunk(cli):
    r, out = _check(cli, "0.5.23", "--series-of", "0.5.19")
    assert r.code == 3
    failing = {v["name"]: {f["file"] for f in v["failures"]} for v in out["verdicts"]}
    assert all(v["status"] == "fails" for v in out["verdicts"])
    # as `git apply --check -p1` reports in the unpacked wheel (the first file of each)
    assert "srt/mem_cache/pool_host/base.py" in failing["0001-hicache-host-reserve.patch"]
    assert failing["0002-hicache-host-allocator.patch"] == {"srt/mem_cache/pool_host/common.py"}
    assert failing["0003-transfer-geometry-check.patch"] == {"srt/mem_cache/hybrid_cache/hybrid_pool_assembler.py"}
    assert failing["0004-hicache-host-mamba-slots.patch"] == {"srt/mem_cache/pool_host/mamba.py"}
    hunk = out["verdicts"][2]["failures"][0]
    assert (hunk["hunk"], hunk["header"]) == (1, "@@ -18,6 +18,9 @@")
    assert "0003-transfer-geometry-check.patch (fails: srt/mem_cache/hybrid_cache/hybrid_pool_assembler.py)" in r.err


def test_a_synthetic_fork_made_against_0_5_19_names_its_failing_commits(cli, tmp_path):
    h = make_fork(_wheel("0.5.19"), tmp_path / "fork")
    r, out = _check(cli, "0.5.23", "--fork-dir", str(tmp_path / "fork" / "good"))
    assert r.code == 3
    fork = {v["label"]: v for v in out["verdicts"] if v["source"] == "fork"}
    int2 = next(v for k, v in fork.items() if k.startswith(f"commit {h['int2'][:12]}"))
    assert int2["status"] == "fails"
    assert [(f["file"], f["hunk"]) for f in int2["failures"]] == [("srt/mem_cache/memory_pool.py", 1)]
    jp = next(v for k, v in fork.items() if k.startswith(f"commit {h['jp'][:12]}"))
    assert jp["status"] == "fails" and jp["failures"][0]["file"] == "srt/mem_cache/pool_host/mha.py"
    r19, out19 = _check(cli, "0.5.19", "--fork-dir", str(tmp_path / "fork" / "good"))
    assert r19.code == 0 and all(v["status"] == "applies" for v in out19["verdicts"])


def test_a_patch_the_release_already_has_is_named_so(cli, tmp_path):
    """A wheel whose files already carry 0001's changes (made here by applying it)."""
    series = read_series(series_dir())
    src = zipfile.ZipFile(_wheel("0.5.19"))
    first = series[0]

    def read(path):
        name = f"sglang/{path}"
        return src.read(name) if name in src.namelist() else None

    patched = apply_series([first], read)
    wheel = tmp_path / "sglang-0.5.19-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in patched.items():
            zf.writestr(f"sglang/{path}", data)
    r = cli("runtime", "rebase", "--check", "0.5.19", "--wheel", str(wheel), "-f", "json")
    out = json.loads(r.out)
    assert r.code == 3
    assert out["verdicts"][0]["status"] == "already" and not out["verdicts"][0]["failures"]
    assert any(f["why"] == "the release has no such file" for f in out["verdicts"][1]["failures"])


def test_a_wheel_of_another_release_is_bad_input(cli):
    r = cli("runtime", "rebase", "--check", "0.5.23", "--wheel", str(_wheel("0.5.19")))
    assert r.code == 2
    assert "is sglang 0.5.19, not 0.5.23" in r.err


def test_series_of_a_release_without_one_is_bad_input(cli):
    from escha_deploy.sglang.releases import series_release
    from escha_deploy.runtime.patching import rebased_releases

    r = cli("runtime", "rebase", "--check", "0.5.23", "--wheel", str(_wheel("0.5.23")), "--series-of", "0.4.0")
    assert r.code == 2
    there = ", ".join([series_release(), *rebased_releases()])
    assert {"0.5.19", "0.5.23"} <= set(there.split(", "))  # a release added later joins the list
    assert f"--series-of 0.4.0: no patch series for that release (there are: {there})" in r.err


def test_check_and_onto_are_one_or_the_other(cli):
    assert cli("runtime", "rebase").code == 2
    r = cli("runtime", "rebase", "--check", "0.5.23", "--onto", "0.5.23")
    assert r.code == 2 and "give one of --check VERSION or --onto VERSION" in r.err
