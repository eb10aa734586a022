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

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "escha_deploy"


def _wheel(version: str) -> Path | None:
    if version == releases.default_release() and os.environ.get("ESCHA_SGLANG_WHEEL"):
        return Path(os.environ["ESCHA_SGLANG_WHEEL"])
    found = sorted((REPO / ".cache" / "wheels").glob(f"sglang-{version}-*.whl"))
    return found[0] if found else None


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
    for name in ("facts.yaml", "flags.json", "parser-requirements.txt", "late-checks.yaml", "late-checks.md"):
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
    allowed = {
        # runtime.sglang_version's Literal: it becomes a check against the supported releases
        # once the profile is a package.
        PACKAGE / "profile.py",
    }
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
    if wheel is None or not wheel.is_file():
        pytest.skip(f"no sglang {version} wheel under .cache/wheels")
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
