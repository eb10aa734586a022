"""Field reports, round four, the partly handled ones: a config.json quantization method the
release does not know is refused by `plan` from the release's own list (catalog data compared
with each supported release's wheel); under WSL2 a set mem_fraction_static above what the WSL2
drop would give is warned; doctor warns when a plan commits more host memory than a .wslconfig
memory= allows (the recorded WSL2 fixture tree, MemTotal 15.56 GiB, with a .wslconfig added)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest

from escha_deploy.sglang import releases
from escha_deploy.doctor.checks import ProfileNeeds, check_wsl_commit
from escha_deploy.doctor.facts import gather_facts
from escha_deploy.doctor.hostinfo import DockerFacts
from escha_deploy.facts.gpus import GpuInventory
from escha_deploy.facts.machine import described_host
from escha_deploy.pipeline import DescribedHost, ProfileTarget, decide, gather, resolve_runtime
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30
PROFILE = "rtx5060ti-tp2-fp8"


def _wheel(version: str) -> zipfile.ZipFile:
    env = os.environ.get("ESCHA_SGLANG_WHEEL")
    if version == releases.default_release() and env and Path(env).is_file():
        return zipfile.ZipFile(env)
    found = sorted((ROOT / ".cache" / "wheels").glob(f"sglang-{version}-*.whl"))
    if not found:
        pytest.skip(f"no sglang {version} wheel under .cache/wheels")
    return zipfile.ZipFile(found[0])


def registered_methods(src: str) -> list[str]:
    """Every key of a ``*QUANTIZATION_METHODS`` dict literal and of each ``.update({...})`` on
    one, in any branch of ``layers/quantization/__init__.py``."""
    names: set[str] = set()
    for n in ast.walk(ast.parse(src)):
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            target = n.targets[0] if isinstance(n, ast.Assign) else n.target
            if isinstance(target, ast.Name) and target.id.endswith("QUANTIZATION_METHODS") and isinstance(n.value, ast.Dict):
                names |= {k.value for k in n.value.keys if isinstance(k, ast.Constant)}
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "update"
                and isinstance(n.func.value, ast.Name) and n.func.value.id.endswith("QUANTIZATION_METHODS")):
            for a in n.args:
                if isinstance(a, ast.Dict):
                    names |= {k.value for k in a.keys if isinstance(k, ast.Constant)}
    return sorted(names)


@pytest.mark.wheel
@pytest.mark.parametrize("version", releases.supported_releases())
def test_the_catalogs_quantization_methods_are_the_wheels(version):
    src = _wheel(version).read("sglang/srt/layers/quantization/__init__.py").decode()
    known = releases.load_release(version).quantization_methods
    assert known is not None and list(known.known) == registered_methods(src)
    model_config = _wheel(version).read("sglang/srt/configs/model_config.py").decode()
    assert "Unknown quantization method" in model_config and "def _verify_quantization" in model_config


def _model(tmp_path: Path, quant_method: str | None) -> Path:
    from tests.oracle.cases import config_json

    m = tmp_path / "m"
    m.mkdir()
    config = config_json(load_profile(PROFILE).model.architecture)
    if quant_method is not None:
        config["quantization_config"] = {"quant_method": quant_method, "weight_block_size": [128, 128]}
    (m / "config.json").write_text(json.dumps(config))
    with open(m / "model.safetensors", "wb") as fh:
        fh.truncate(15 * 10**9)  # a sparse file: the checkpoint's size, no data
    return m


def _planned(model: Path, *sets: str):
    prof = load_profile(PROFILE, [f"model.host_dir={model}", *sets])
    g = gather(prof, DescribedHost(64 * GiB, "linux"))
    return decide(prof, g, resolve_runtime(prof, g, ProfileTarget()))


def test_an_unknown_quant_method_is_refused_naming_the_file_and_field(tmp_path):
    p = _planned(_model(tmp_path, "hqq"))
    assert p.verdict == "unsafe"
    (reason,) = [r for r in p.reasons if "quant_method" in r]
    assert f"{tmp_path / 'm'}/config.json: quantization_config.quant_method 'hqq'" in reason
    assert f"SGLang {releases.default_release()}" in reason and "fp8" in reason


@pytest.mark.parametrize("method", ["fp8", "FP8", "compressed-tensors", "gptq"])
def test_a_known_quant_method_passes(tmp_path, method):
    p = _planned(_model(tmp_path, method))
    assert not [r for r in p.reasons if "quant_method" in r]


def test_plan_command_exits_3_on_an_unknown_quant_method(cli, tmp_path):
    model = _model(tmp_path, "exl2")
    r = cli("plan", "-p", PROFILE, "--host-ram", "64GiB", "--linux", "--set", f"model.host_dir={model}")
    assert r.code == 3 and "quantization_config.quant_method 'exl2'" in r.out + r.err


def _fraction_warnings(p) -> list[str]:
    return [w for w in p.warnings if "runtime.mem_fraction_static" in w and "WSL2" in w]


def test_a_set_fraction_above_the_wsl2_drop_is_warned():
    """rtx5060ti-tp2 sets 0.8 on an sm_120 card: under WSL2 the drop would give SGLang's default
    minus 0.08; the set value is kept and warned. Not on Linux; not when it is unset (then the
    drop applies)."""
    prof = load_profile("rtx5060ti-tp2")
    wsl = plan(prof, described_host(32 * GiB, "wsl2"))
    (w,) = _fraction_warnings(wsl)
    default = wsl.device.sglang_default_mem_fraction_static
    assert f"above the {round(default - 0.08, 3):g}" in w and "microsoft/WSL#41176" in w
    assert wsl.device.mem_fraction_static == 0.8
    assert _fraction_warnings(plan(prof, described_host(32 * GiB, "linux"))) == []
    unset = load_profile("rtx5060ti-tp2", ["runtime.mem_fraction_static=null"])
    q = plan(unset, described_host(32 * GiB, "wsl2"))
    assert _fraction_warnings(q) == [] and q.device.mem_fraction_static == round(default - 0.08, 3)
    below = load_profile("rtx5060ti-tp2", [f"runtime.mem_fraction_static={round(default - 0.1, 3)}"])
    assert _fraction_warnings(plan(below, described_host(32 * GiB, "wsl2"))) == []


def _facts(tmp_path: Path, ini: bytes, tree: str = "wsl2-distro-engine"):
    root = tmp_path / "root"
    shutil.copytree(ROOT / "tests" / "doctor" / "fixtures" / tree, root, symlinks=True)
    d = root / "mnt" / "c" / "Users" / "alice"
    d.mkdir(parents=True)
    (d / ".wslconfig").write_bytes(ini)
    return gather_facts(root, {}, docker=lambda: DockerFacts(reachable=False, error="x"),
                        gpus=lambda: GpuInventory(source="none"))


def _need(commit: int) -> ProfileNeeds:
    return ProfileNeeds(name="p", gpu_count=2, gpu_vram_bytes=16 * GiB, gpu_name="x", tp_size=2,
                        hicache_enabled=True, commit_bytes=commit, ref="p")


def test_a_commit_above_the_wslconfig_memory_is_warned(tmp_path):
    f = _facts(tmp_path, b"[wsl2]\nmemory=12GB\n")
    (row,) = check_wsl_commit(f, _need(14 * GiB))
    assert row.status == "warn" and "memory=12GB" in row.detail and "14.00 GiB" in row.detail
    assert "wsl --shutdown" in row.fix and "hicache.hicache_ratio" in row.fix
    (fits,) = check_wsl_commit(f, _need(10 * GiB))
    assert fits.status == "ok"
    linux = _facts(tmp_path / "l", b"[wsl2]\nmemory=12GB\n", tree="linux-host")
    assert check_wsl_commit(linux, _need(14 * GiB)) == []


def test_doctor_needs_carry_the_plans_commit(tmp_path):
    from escha_deploy.doctor.run import needs_from_profile

    need = needs_from_profile("rtx5060ti-tp2-fp8")
    assert need.commit_bytes and need.commit_bytes > (need.pinned_per_rank_bytes or 0)
