"""The serving closure, checked on a CPU machine without downloading it (scripts/gpu_closure.py).

The committed manifest (``tests/gpu_rig/closure-manifest.json``, written by the last
``scripts/gpu-closure.sh`` build) records each downloaded piece's file, size and sha256 (the
383 MB sglang-kernel wheel's among them) and each packed piece's: the budget, the pins, the
series and the departures are checked against it and against the script and docs here. The
install-time refusals run on a stand-in closure of small files made in a temp dir (a closure is
50 MiB of downloads; ``check`` reads only the manifest and the files' sizes and hashes).
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from tests.script_module import load_script

REPO = Path(__file__).resolve().parents[2]
gc = load_script("gpu_closure")
RECORDED = json.loads(gc.RECORDED.read_text())


def test_recorded_closure_is_within_budget():
    pieces = RECORDED["pieces"]
    assert [(p["name"], p["file"]) for p in pieces] == [(n, f) for n, f, _ in gc.PIECES]
    packed = sum(p["bytes"] for p in pieces)
    assert packed < RECORDED["total_bytes"] <= gc.BUDGET, (packed, RECORDED["total_bytes"])
    # the manifest and runtime.json are what the total adds to the pieces: a few kB
    assert RECORDED["total_bytes"] - packed < 64 * 1024


def test_recorded_sources_are_the_scripts_pins_with_size_and_hash():
    pins = [gc.SGLANG, gc.KERNEL, gc.FLASHINFER, *gc.WHEELS]
    assert [s["pin"] for s in RECORDED["sources"]] == pins
    for s in RECORDED["sources"]:
        name, version = gc._dist(s["pin"])
        assert s["file"].lower().startswith(f"{name.replace('-', '_').lower()}-{version}-"), s
        assert s["file"].endswith(".whl") and s["bytes"] > 0 and len(s["sha256"]) == 64, s
    by_pin = {s["pin"]: s for s in RECORDED["sources"]}
    # SGLang 0.5.19 for the target's CPython; the kernel wheel known by its metadata, never fetched in CI
    assert by_pin[gc.SGLANG]["file"].startswith("sglang-0.5.19-cp312-cp312-")
    assert by_pin[gc.KERNEL]["bytes"] > 300_000_000
    sizes = {p["name"]: p["bytes"] for p in RECORDED["pieces"]}
    assert sizes["sgl_kernel"] < 20 * gc.MiB  # the sm90 common ops and the Python files alone


def test_recorded_runtime_is_this_checkouts_series():
    from escha_deploy.runtime.series import capabilities_of, read_series
    from escha_deploy.utils.paths import runtime_patches_dir

    patches = read_series(runtime_patches_dir())
    rt = RECORDED["runtime"]
    assert rt["series"] == [p.name for p in patches], "the series changed: rebuild (scripts/gpu-closure.sh)"
    assert sorted(rt["capabilities"]) == sorted(capabilities_of(patches))
    assert rt["base"] == "wheel:cp312-cp312-manylinux_2_34_x86_64"


def test_departures_are_named_in_manifest_and_docs():
    assert RECORDED["departures"] == list(gc.DEPARTURES)
    assert RECORDED["env"] == gc.ENV == {"SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
                                         "SGLANG_IS_FLASHINFER_AVAILABLE": "false"}
    assert RECORDED["stubs"] == list(gc.STUBS)
    assert RECORDED["target"] == gc.TARGET
    docs = (REPO / "docs" / "runtime.md").read_text()
    section = docs[docs.index("## The serving closure"):]
    for needle in ("sglang-kernel 0.4.5", "0.4.6.post1", "sm90/common_ops.abi3.so", "flashinfer/data/",
                   "sgl_kernel/elementwise.py", "sgl_kernel/sampling.py", "multimodal_gen/",
                   *gc.STUBS, *(f"{k}={v}" for k, v in gc.ENV.items())):
        assert needle in section, needle
    edits = next(p for p in RECORDED["pieces"] if p["name"] == "sgl_kernel")["edits"]
    assert [e["file"] for e in edits] == [f for f, _, _ in gc.DISPATCH_EDITS]


def test_wheel_pins_match_sglangs_own(sglang_wheel):
    """Where SGLang 0.5.19's METADATA pins a version, the closure carries that version."""
    with zipfile.ZipFile(sglang_wheel) as z:
        meta = z.read("sglang-0.5.19.dist-info/METADATA").decode()
    pinned = {}
    for line in meta.splitlines():
        spec = line.split(":", 1)[1].split(";")[0].strip() if line.startswith("Requires-Dist:") else ""
        if "==" in spec and "extra ==" not in line:
            name, version = spec.split("==")
            pinned[name.split("[")[0].strip().lower().replace("_", "-")] = version.strip()
    ours = dict(gc._dist(s) for s in gc.WHEELS)
    common = {n: (v, pinned[n]) for n, v in ours.items() if n in pinned}
    assert {"transformers", "tokenizers", "apache-tvm-ffi", "compressed-tensors", "openai"} <= set(common)
    assert {n: v for n, v in common.items() if v[0] != v[1]} == {}
    # the two departures from SGLang's pins, each named in DEPARTURES
    assert pinned["sglang-kernel"] == "0.4.6.post1" and gc.KERNEL == "sglang-kernel==0.4.5"
    assert pinned["flashinfer-python"] == gc.FLASHINFER.split("==")[1]


@pytest.fixture
def sglang_wheel():
    from tests.runtime.conftest import find_wheel

    w = find_wheel()
    if w is None:
        pytest.skip("no sglang 0.5.19 wheel here (ESCHA_SGLANG_WHEEL)")
    return w


def _standin_closure(tmp_path: Path) -> Path:
    """A closure of small files (a stand-in for the 50 MiB one) with a manifest in the recorded shape."""
    c = tmp_path / "closure"
    c.mkdir()
    pieces = []
    for name, file, _ in gc.PIECES:
        (c / file).write_bytes(name.encode() * 10)
        pieces.append({"name": name, "file": file, "bytes": (c / file).stat().st_size,
                       "sha256": gc.sha256_file(c / file)})
    (c / "runtime.json").write_text(json.dumps({"series": _checkout_series()}))
    (c / "manifest.json").write_text(json.dumps(dict(RECORDED, pieces=pieces)))
    return c


def _checkout_series() -> list[dict]:
    from escha_deploy.utils.paths import runtime_patches_dir
    from escha_deploy.runtime.series import read_series

    return [{"name": p.name, "source": "series", "sha256": p.sha256} for p in read_series(runtime_patches_dir())]


def test_check_refuses_a_closure_of_another_series(tmp_path):
    c = _standin_closure(tmp_path)
    series = _checkout_series()
    series[1]["sha256"] = "0" * 64
    (c / "runtime.json").write_text(json.dumps({"series": series[:2]}))
    with pytest.raises(gc.ClosureError) as e:
        gc.check(c, here={k: v for k, v in gc.TARGET.items() if k != "sglang"})
    assert e.value.code == 3
    assert [p["name"] for p in series[2:]] == ["0003-transfer-geometry-check.patch",
                                              "0004-hicache-host-mamba-slots.patch"]
    assert e.value.lines[:3] == [
        f"{c}: patch {series[2]['name']} is in this checkout's series, not in the closure's",
        f"{c}: patch {series[3]['name']} is in this checkout's series, not in the closure's",
        f"{c}: patch {series[1]['name']} differs from this checkout's (sha256 000000000000... vs "
        f"{_checkout_series()[1]['sha256'][:12]}...)"]
    assert e.value.lines[-1].endswith("rebuild it from this checkout: scripts/gpu-closure.sh")



def test_check_accepts_the_target_machine(tmp_path):
    m = gc.check(_standin_closure(tmp_path), here={k: v for k, v in gc.TARGET.items() if k != "sglang"})
    assert m["target"] == gc.TARGET


def test_check_refuses_another_machine_naming_each_difference(tmp_path):
    here = dict(gc.TARGET, python="3.11", card="sm120")
    here.pop("sglang")
    with pytest.raises(gc.ClosureError) as e:
        gc.check(_standin_closure(tmp_path), here=here, sglang="0.5.23")
    assert e.value.code == 3
    assert len(e.value.lines) == 3, e.value.lines
    text = "\n".join(e.value.lines)
    for needle in ("python '3.12', this machine has '3.11'", "card 'sm90', this machine has 'sm120'",
                   "SGLang '0.5.19', '0.5.23' asked for"):
        assert needle in text, text


def test_check_names_a_missing_or_altered_piece_in_one_line(tmp_path):
    c = _standin_closure(tmp_path)
    (c / "sgl_kernel.tar.xz").unlink()
    (c / "site.tar.xz").write_bytes(b"other")
    with pytest.raises(gc.ClosureError) as e:
        gc.check(c, here={k: v for k, v in gc.TARGET.items() if k != "sglang"})
    assert e.value.code == 2
    assert e.value.lines == [f"{c}: missing piece sgl_kernel (sgl_kernel.tar.xz)",
                             f"{c}: piece site (site.tar.xz) differs from the manifest (size or sha256)"]


def test_check_cli_is_one_line_per_problem(tmp_path, capsys):
    assert gc.main(["check", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gpu_closure: {tmp_path / 'none'}: no manifest.json (build the closure: scripts/gpu-closure.sh)"]


def test_install_writes_a_description_native_serve_plans(tmp_path, monkeypatch):
    """``install`` of a stand-in closure whose sglang piece is a tiny package: the description
    it writes names the unpacked tree, and ``plan`` of the tiny rig reads it through
    ``$ESCHA_RUNTIME_DESCRIPTION`` as this machine's runtime (the closure's release and the
    series' capabilities, no ``runtime.needs`` override)."""
    import tarfile

    from escha_deploy.pipeline import BoxRuntime, Options, facts_source, plan_here
    from escha_deploy.profile import load_profile

    src = tmp_path / "src"
    (src / "sglang").mkdir(parents=True)
    (src / "sglang" / "__init__.py").write_text("")
    c = tmp_path / "closure"
    c.mkdir()
    pieces = []
    for name, file, _ in gc.PIECES:
        with tarfile.open(c / file, "w:xz") as tar:
            if name == "sglang":
                tar.add(src / "sglang", arcname="sglang")
        pieces.append({"name": name, "file": file, "bytes": (c / file).stat().st_size,
                       "sha256": gc.sha256_file(c / file)})
    desc = {"schema_version": 1, "sglang_version": "0.5.19", "base": RECORDED["runtime"]["base"], "python": "3.12",
            "base_inventory_digest": "stand-in", "base_inventory_committed": True, "sglang_dir": "",
            "capabilities": RECORDED["runtime"]["capabilities"], "inventory_digest": "stand-in",
            "kind": "closure", "departures": list(gc.DEPARTURES), "closure_env": gc.ENV}
    desc["series"] = _checkout_series()
    (c / "runtime.json").write_text(json.dumps(desc))
    (c / "manifest.json").write_text(json.dumps(dict(RECORDED, pieces=pieces)))
    dest = tmp_path / "dest"
    env = gc.install(c, dest, here={k: v for k, v in gc.TARGET.items() if k != "sglang"})
    assert env["ESCHA_RUNTIME_DESCRIPTION"] == str(dest / "runtime.json")
    assert env["PYTHONPATH"].split(":")[0] == str(dest / "sg")
    written = json.loads((dest / "runtime.json").read_text())
    assert written["sglang_dir"] == str((dest / "sg" / "sglang").resolve()) and written["kind"] == "closure"
    monkeypatch.setenv("ESCHA_RUNTIME_DESCRIPTION", env["ESCHA_RUNTIME_DESCRIPTION"])
    req = plan_here(load_profile(str(REPO / "tests" / "gpu_rig" / "h200-tiny.yaml"), []), facts_source(), BoxRuntime(),
                    Options(check_argv=False))
    plan = req.plan
    assert req.runtime.binding == (tuple(RECORDED["runtime"]["capabilities"]), f"this runtime ({dest / 'runtime.json'})")
    assert plan.sglang_release_source == f"this runtime ({dest / 'runtime.json'})"
    assert sorted(plan.capabilities) == sorted(RECORDED["runtime"]["capabilities"])


def test_stock_delta_and_install_stock_put_the_wheels_tree_back(tmp_path):
    """``_stock_delta`` against a small wheel (a stand-in for SGLang's: two files, one the series
    changes) and a tree as ``runtime apply`` leaves it (that file changed, one module added);
    ``to_stock`` on an installed copy restores the wheel's bytes and removes the added module."""

    whl = tmp_path / "sglang-0.5.19-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("sglang/__init__.py", "stock init\n")
        z.writestr("sglang/srt/base.py", "RESERVE = 10\n")
        z.writestr("sglang-0.5.19.dist-info/METADATA", "Name: sglang\n")
    sg = tmp_path / "sg"
    gc._unzip_wheel(whl, sg)
    (sg / "sglang/srt/base.py").write_text("RESERVE = env()\n")
    (sg / "sglang/srt/escha_hook.py").write_text("def env(): ...\n")
    out = tmp_path / "delta"
    out.mkdir()
    delta = gc._stock_delta(whl, sg, out)
    assert delta == {"restored": ["sglang/srt/base.py"], "added_by_series": ["sglang/srt/escha_hook.py"]}
    dest = tmp_path / "dest"
    shutil.copytree(sg, dest / "sg")
    shutil.copytree(out, dest / "stock")
    assert gc.to_stock(dest) == ["sglang/srt/escha_hook.py"]
    assert (dest / "sg/sglang/srt/base.py").read_text() == "RESERVE = 10\n"
    assert not (dest / "sg/sglang/srt/escha_hook.py").exists()
    assert (dest / "sg/sglang/__init__.py").read_text() == "stock init\n"


def test_report_to_docs_renders_a_run_once_and_replaces_it(tmp_path):
    r2d = load_script("gpu_report_to_docs")
    docs = tmp_path / "runtime.md"
    docs.write_text(f"# x\n\n{r2d.BEGIN}\n\n{r2d.END}\n\nafter\n")
    report = tmp_path / "report.json"
    doc = {"run": {"commit": "a" * 40, "phases": "register,stock", "seconds": 300, "pytest_exit": 0},
           "shape/register": {"measured_bytes": 5_800_000_000, "plan_pinned_bytes": 5_366_284_288,
                              "where": {"meminfo_delta": {"Shmem": 5_400_000_000, "AnonPages": 346_046_464}}},
           "shape/stock": {"measured_bytes": 5_390_000_000, "pools_bytes": 5_370_000_000,
                           "plan_pinned_bytes": 5_366_284_288,
                           "guard": {"stock": {"reserve_bytes": 10 * 2**30}, "patched": {"reserve_bytes": 2**31}},
                           "geometry": [{"event": "build_kv_host_pool", "pool": "P", "size": 3, "problems": []}]}}
    report.write_text(json.dumps(doc))
    assert r2d.main([str(report), "--docs", str(docs)]) == 0
    once = docs.read_text()
    assert once.count("<!-- run aaaaaaaaaaaa register,stock -->") == 1 and once.endswith("\n\nafter\n")
    # the pinned pools are the window's Shmem rise; MemTotal - MemAvailable and its AnonPages beside it
    assert "5,400,000,000 B" in once and "+33,715,712 B" in once and "10,737,418,240 B" in once
    assert "5,800,000,000 B" in once and "346,046,464 B" in once
    assert "no check ran" in once
    # the stock run's pools in the series table: its Shmem rise, MemTotal - MemAvailable in brackets
    assert "cudaHostRegister): 5,370,000,000 B (5.370 GB) (5,390,000,000 B (5.390 GB))" in once
    assert r2d.main([str(report), "--docs", str(docs), "--check"]) == 0
    doc["run"]["seconds"] = 301
    report.write_text(json.dumps(doc))
    assert r2d.main([str(report), "--docs", str(docs), "--check"]) == 1
    assert r2d.main([str(report), "--docs", str(docs)]) == 0
    again = docs.read_text()
    assert again.count("<!-- run aaaaaaaaaaaa") == 1 and "301 s in all" in again
    docs.write_text("no markers\n")
    assert r2d.main([str(report), "--docs", str(docs)]) == 2
    docs.write_text(f"# x\n\n{r2d.BEGIN}\n\n{r2d.END}\n")
    doc = {"run": {"commit": "b" * 40, "phases": "spec"}, "spec/nextn": {
        "plan": {"host_kv_bytes_per_token": 2048, "host_kv_tokens": 1_600_001, "host_kv_bytes": 3_276_802_048,
                 "pinned_bytes": 3_303_366_656}, "measured_bytes": 3_710_000_000, "pools_bytes": 3_310_000_000,
        "log": {"host_kv": ["Allocating bf16 hierarchical KV host pool: 1600001 tokens"], "kv_device": [],
                "mamba_device": []}}}
    report.write_text(json.dumps(doc))
    assert r2d.main([str(report), "--docs", str(docs)]) == 0
    spec = docs.read_text()
    assert "**NEXTN with HiCache**" in spec and "host KV 2048 B per token" in spec and "+6,633,344 B" in spec
    assert "`Allocating bf16 hierarchical KV host pool: 1600001 tokens`" in spec and "not in this run" in spec
