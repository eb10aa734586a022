"""The first-use check reads the CUDA toolkit a JIT will use (vllm#50705, flashinfer#2577).

FlashInfer's JIT compiles with the toolkit at ``CUDA_HOME`` (or ``CUDA_PATH``), else the ``nvcc``
on ``PATH``, and drops SM 12.x below CUDA 12.9, so a native venv with a local nvcc 12.8 starts and
then dies at init on sm_120. A stand-in ``nvcc`` (a script printing nvcc's own ``--version``
lines) with an sm_120 facts file: a native ``serve --print`` refuses it at first use, naming it;
the in-image check `up` runs (``runtime/first_use.py`` as ``python -c`` source) exits 3 naming
it; 12.9 passes, and ``CUDA_HOME`` wins over ``PATH`` as it does for FlashInfer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from escha_deploy.facts.factsfile import FactsFile, GpuRecord, HostSection
from escha_deploy.runtime import first_use
from escha_deploy.utils.units import GiB
from tests.inproc import run_main


def _nvcc(root: Path, release: str) -> Path:
    """A toolkit folder whose bin/nvcc prints nvcc's ``--version`` for ``release``."""
    b = root / f"cuda-{release}" / "bin"
    b.mkdir(parents=True)
    nvcc = b / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                    f"echo 'Cuda compilation tools, release {release}, V{release}.93'\n")
    nvcc.chmod(0o755)
    return nvcc


def _facts(tmp_path: Path, cc: str) -> Path:
    facts = tmp_path / "box.json"
    facts.write_text(FactsFile(host=HostSection(platform="linux", mem_total_bytes=128 * GiB), gpus=[
        GpuRecord(index=i, name="NVIDIA GeForce RTX 5060 Ti", memory_total_bytes=16 * GiB,
                  compute_capability=cc) for i in range(2)]).model_dump_json())
    return facts


def _serve(tmp_path: Path, nvcc: Path, cc: str = "12.0", cuda_home: str = "") -> tuple[int, list[str], str]:
    """A native ``serve --print`` with the stand-in first on PATH: its exit code, the refusals it
    printed (the launch check's, the first-use line among them) and stderr. The model folder is
    not here, so the exit is bad input's; the refusals are printed whole."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": f"{nvcc.parent}:{os.environ.get('PATH', '')}",
           "CUDA_HOME": cuda_home, "CUDA_PATH": ""}
    r = run_main("serve", "--profile", "rtx5060ti-tp2-fp8", "--set", "runtime.needs=[]",
                 "--facts", str(_facts(tmp_path, cc)), "--print", env=env)
    return r.code, json.loads(r.out)["refusals"], r.err


def test_a_native_serve_with_nvcc_12_8_on_sm_120_is_refused_at_first_use_naming_it(tmp_path):
    nvcc = _nvcc(tmp_path, "12.8")
    code, refusals, err = _serve(tmp_path, nvcc)
    mine = [r for r in refusals if r.startswith("first use:")]
    assert code != 0 and len(mine) == 1, refusals
    assert f"{nvcc} is CUDA 12.8, below the 12.9" in mine[0] and "sm_120" in mine[0]
    assert "vllm#50705" in mine[0] and "CUDA_HOME" in mine[0]


@pytest.mark.parametrize("release,cc", [("12.9", "12.0"), ("12.8", "8.9")], ids=["nvcc-12.9", "sm_89"])
def test_a_new_enough_toolkit_or_an_older_gpu_passes(tmp_path, release, cc):
    _code, refusals, _err = _serve(tmp_path, _nvcc(tmp_path, release), cc)
    assert not [r for r in refusals if r.startswith("first use:")], refusals


def test_cuda_home_wins_over_path_as_it_does_for_flashinfer(tmp_path):
    old, new = _nvcc(tmp_path, "12.8"), _nvcc(tmp_path, "13.0")
    _code, refusals, _err = _serve(tmp_path, old, cuda_home=str(new.parent.parent))
    assert not [r for r in refusals if r.startswith("first use:")], refusals
    assert first_use.jit_nvcc({"CUDA_HOME": str(new.parent.parent), "PATH": str(old.parent)}) == str(new)


def test_the_in_image_check_exits_3_naming_the_nvcc(tmp_path):
    """What `up` runs in a throw-away container of the image: the module's source as ``python
    -c``, the planned GPUs' capabilities in ``ESCHA_FIRST_USE_ARCHS``."""
    nvcc = _nvcc(tmp_path, "12.8")
    env = {**os.environ, "PATH": f"{nvcc.parent}:{os.environ.get('PATH', '')}", "CUDA_HOME": "",
           first_use.ARCHS_ENV: "12.0,12.0", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    env.pop("CUDA_PATH", None)
    r = subprocess.run([sys.executable, "-c", Path(first_use.__file__).read_text()], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout.splitlines()[-1])["checks"]}
    assert not rows["toolkit"]["ok"] and f"{nvcc} is CUDA 12.8" in rows["toolkit"]["problems"][0]
    del env[first_use.ARCHS_ENV]  # no GPU capability known: no toolkit row
    r = subprocess.run([sys.executable, "-c", Path(first_use.__file__).read_text()], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "toolkit" not in r.stdout
