"""The per-release data (``escha_deploy/catalog/releases/``) and its one loader.

The tests marked ``wheel`` compare a release's hand-written facts with that release's wheel
(``.cache/wheels/sglang-VERSION-*.whl``; for the default release ``$ESCHA_SGLANG_WHEEL``).
"""

from __future__ import annotations

import ast
import json
import os
import re
import zipfile
from pathlib import Path

import pytest

from escha_deploy import releases
from escha_deploy.errors import BadInput
from escha_deploy.flagcheck import load_catalog
from tests.script_module import load_script

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "escha_deploy"


def _wheel(version: str) -> Path:
    """The release's wheel file, or skip (CI downloads every supported release's)."""
    if version == releases.default_release() and os.environ.get("ESCHA_SGLANG_WHEEL"):
        found = [Path(os.environ["ESCHA_SGLANG_WHEEL"])]
    else:
        found = sorted((REPO / ".cache" / "wheels").glob(f"sglang-{version}-*.whl"))
    if not found or not found[0].is_file():
        pytest.skip(f"no sglang {version} wheel under .cache/wheels")
    return found[0]


def test_index_names_the_default_among_the_supported():
    assert releases.default_release() in releases.supported_releases()
    assert "0.5.19" in releases.supported_releases()
    folders = {p.name for p in releases.releases_dir().iterdir() if p.is_dir()}
    assert folders == set(releases.supported_releases())


@pytest.mark.parametrize("version", releases.supported_releases())
def test_each_release_folder_holds_its_data(version):
    folder = releases.release_dir(version)
    release = releases.load_release(version)
    assert release.version == version
    assert release.image.endswith(f":v{version}")
    names = ["facts.yaml", "flags.json", "parser-requirements.txt", "late-checks.yaml", "late-checks.md",
             "startup-trace.json"]
    if version != releases.supported_releases()[0]:
        names.append("flags-diff.json")
    for name in names:
        assert (folder / name).is_file(), name
    assert load_catalog(version).version == version
    assert json.loads((folder / "flags.json").read_text())["version"] == version
    tiers = release.memory_defaults.tiers
    assert tiers[-1].below_mib is None and all(t.below_mib for t in tiers[:-1])
    assert [t.below_mib for t in tiers[:-1]] == sorted(t.below_mib for t in tiers[:-1])


def test_an_unsupported_release_is_bad_input_naming_the_supported_ones():
    with pytest.raises(BadInput) as e:
        releases.load_release("0.4.0")
    assert "SGLang 0.4.0 is not a supported release" in str(e.value)
    assert "0.5.19" in str(e.value)


def test_memory_tier_lookup():
    md = releases.load_release("0.5.19").memory_defaults
    assert (md.tier(12 * 1024).chunked_prefill, md.tier(12 * 1024).decode_max_bs) == (2048, 8)
    assert md.tier(20 * 1024).decode_max_bs == 24  # the bound is exclusive (gpu_mem < 20 * 1024)
    assert md.tier(200 * 1024).chunked_prefill == 16384


def test_no_module_spells_a_release_string():
    """A string constant equal to a supported release lives in the data, not in the code."""
    allowed: set[Path] = set()
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in releases.supported_releases():
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found


@pytest.mark.wheel
@pytest.mark.parametrize("version", releases.supported_releases())
def test_facts_agree_with_the_wheel(version):
    """Pins from the wheel's METADATA, the host reserve from its ``pool_host/base.py``."""
    wheel = _wheel(version)
    release = releases.load_release(version)
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(f"sglang-{version}.dist-info/METADATA").decode()
        names = zf.namelist()
        guard_file = next(n for n in ("sglang/srt/mem_cache/host_memory.py", "sglang/srt/mem_cache/pool_host/base.py")
                          if n in names and "HICACHE_HOST_MEMORY_RESERVE_BYTES" in zf.read(n).decode())
        guard_src = zf.read(guard_file).decode()
    assert f"Requires-Python: {release.pins.python.value}" in meta
    assert f"Requires-Dist: torch=={release.pins.torch.value}\n" in meta
    assert f"Requires-Dist: transformers=={release.pins.transformers.value}\n" in meta
    m = re.search(r"^HICACHE_HOST_MEMORY_RESERVE_BYTES(?:: int)? = (.+)$", guard_src, re.M)
    assert m, guard_file
    assert eval(compile(ast.parse(m.group(1), mode="eval"), guard_file, "eval"), {"__builtins__": {}}) == release.host_guard.reserve_bytes
    assert guard_file.removeprefix("sglang/") in release.host_guard.source


def test_flags_diff_is_current_and_names_what_0_5_23_refuses(capsys):
    gen = load_script("gen_flags_diff")
    assert gen.supported() == list(releases.supported_releases())
    assert gen.main(["--check"]) == 0
    assert "flags 0.5.19 -> 0.5.23: 26 removed" in capsys.readouterr().err
    d = json.loads(releases.release_file("0.5.23", "flags-diff.json").read_text())
    removed = {r["flag"]: r for r in d["removed"]}
    # 0.5.23's parser: a prefix of the per-phase flags, refused as ambiguous (abbreviations on)
    assert removed["--cuda-graph-max-bs"]["ambiguous_with"] == ["--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"]
    assert {"--stream-output", "--mamba-scheduler-strategy", "--enable-breakable-cuda-graph"} <= set(removed)
    assert {"flag": "--enable-dp-attention", "new_flag": "--attn-dp-size <dp-size>", "old_still_accepted": True} in d["renamed"]
    assert "--hicache-host-memory-fraction" in d["added"]
    assert set(d["added"]).isdisjoint(removed)


def test_flags_diff_fails_on_a_stale_file(tmp_path, monkeypatch, capsys):
    gen = load_script("gen_flags_diff")
    fake = tmp_path / "releases"
    for v in releases.supported_releases():
        (fake / v).mkdir(parents=True)
        (fake / v / "flags.json").write_text(releases.release_file(v, "flags.json").read_text())
    (fake / "index.yaml").write_text((releases.releases_dir() / "index.yaml").read_text())
    (fake / releases.supported_releases()[1] / "flags-diff.json").write_text("{}\n")
    monkeypatch.setattr(gen, "RELEASES", fake)
    assert gen.main(["--check"]) == 1
    assert "flags-diff.json is stale" in capsys.readouterr().err


@pytest.mark.wheel
@pytest.mark.parametrize("version", releases.supported_releases())
def test_cuda_graph_config_keys_agree_with_the_wheel(version):
    wheel = _wheel(version)
    with zipfile.ZipFile(wheel) as zf:
        src = zf.read("sglang/srt/model_executor/cuda_graph_config.py").decode()
    tree = ast.parse(src)
    node = next(n for n in tree.body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", None) == "ALLOWED_KEYS_PER_PHASE")
    got = {k.attr.lower(): tuple(ast.literal_eval(v)) for k, v in zip(node.value.keys, node.value.values)}
    keys = releases.load_release(version).cuda_graph_config_keys
    assert got == {"decode": keys.decode, "prefill": keys.prefill}


@pytest.mark.wheel
def test_0_5_23_late_checks_are_current_with_the_inherited_annotations(capsys):
    wheel = _wheel("0.5.23")
    gen = load_script("gen_late_checks")
    assert gen.main(["--wheel", str(wheel), "--check", "--release", "0.5.23"]) == 0
    err = capsys.readouterr().err
    assert "late checks: sglang 0.5.23: 5317 rows;" in err and "unreviewed" not in err
    assert gen.main(["--wheel", str(wheel), "--check", "--release", "0.5.19"]) == 2
    assert "is sglang 0.5.23, not 0.5.19" in capsys.readouterr().err


def test_a_profile_names_a_supported_release_or_is_refused_naming_the_field():
    from escha_deploy.profile import load_profile

    assert load_profile("rtx5060ti-tp2-fp8").runtime.sglang_version is None  # unset: chosen at plan time
    assert load_profile("rtx5060ti-tp2-fp8", ["runtime.sglang_version=0.5.23"]).runtime.sglang_version == "0.5.23"
    with pytest.raises(BadInput) as e:
        load_profile("rtx5060ti-tp2-fp8", ["runtime.sglang_version=0.5.21"])
    assert "runtime.sglang_version" in str(e.value) and "SGLang 0.5.21 is not a supported release" in str(e.value)


def test_the_series_is_made_for_the_release_its_base_inventories_are_of():
    from escha_deploy.paths import runtime_patches_dir

    versions = {json.loads(p.read_text())["version"] for p in (runtime_patches_dir() / "base").glob("*.json")}
    assert versions == {releases.series_release()}
