#!/usr/bin/env python3
"""Regenerate ``escha_deploy/catalog/kernel-archs.json``: the GPU architectures the CUDA
libraries of sglang-kernel and torch (the versions SGLang 0.5.19 pins) were built for.

Run once by hand, never in CI (the wheels are 377 MB and 527 MB):

    pip download --isolated --no-deps --only-binary=:all: -d .cache/kernel-wheel sglang-kernel==0.4.6.post1
    pip download --isolated --no-deps --only-binary=:all: -d .cache/torch-wheel torch==2.13.0
    python scripts/gen_gpu_arch_fixture.py .cache/kernel-wheel/sglang_kernel-*.whl \\
        .cache/torch-wheel/torch-2.13.0-*.whl > escha_deploy/catalog/kernel-archs.json

Reads each wheel's ``.so`` members' fat-binary headers (``escha_deploy.doctor.kernel_archs``).
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path

from escha_deploy.doctor.kernel_archs import wheel_archs


def _dist(wheel: Path) -> tuple[str, str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line and not line.startswith(" "))
    return fields["Name"], fields["Version"]


def main(wheels: list[str]) -> int:
    out = {"generated_by": "scripts/gen_gpu_arch_fixture.py", "wheels": {}}
    for w in map(Path, wheels):
        name, version = _dist(w)
        per_lib = wheel_archs(w)
        sass = sorted({s for a in per_lib.values() for s in a["sass"]})
        ptx = sorted({s for a in per_lib.values() for s in a["ptx"]})
        sha = hashlib.sha256(w.read_bytes()).hexdigest()
        out["wheels"][name] = {"version": version, "file": w.name, "sha256": sha,
                               "sass": sass, "ptx": ptx, "libraries": per_lib}
        if name == "torch":
            with zipfile.ZipFile(w) as z:
                ns: dict = {}
                exec(z.read("torch/version.py").decode(), ns)  # noqa: S102 - the wheel's own constants
                meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
            out["torch_cuda"] = ns.get("cuda")
            nccl = [ln.split("==")[1].split(";")[0].strip() for ln in meta.splitlines()
                    if ln.startswith("Requires-Dist: nvidia-nccl") and "==" in ln]
            out["torch_nccl"] = nccl[0] if nccl else None
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
