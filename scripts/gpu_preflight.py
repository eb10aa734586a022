#!/usr/bin/env python3
"""SGLang's own pre-flight (escha_deploy/launch/sglang_preflight.py) for the shipped profiles on a
real GPU, natively, with the serving closure (scripts/gpu-closure.sh; SITE: its unpacked ``sg/``); prints and writes what
SGLang answered (attention backend, memory fraction, context length, the KV cache configurator's
and the host pools' sizing on the plan's figures, ...) or its refusal.

    python3 scripts/gpu_preflight.py --site SITE_PACKAGES --out FILE.json

Each profile is rendered by `serve --print` (native mode) against a model folder holding a
config.json SGLang's config classes accept for the profile's model (tests/oracle/cases.py:
config_json; a sparse safetensors file of the profile's weight size, so the plan counts them;
the pre-flight loads none), overlay flags replaced by their stock
stand-ins (tests/oracle/cases.py: stock_argv). Runs on the device machine (docs/runtime.md has
the command line and what it answered).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from escha_deploy.launch import sglang_preflight as pf  # noqa: E402
from escha_deploy.profile import load_profile  # noqa: E402
from tests.oracle.cases import config_json, stock_argv  # noqa: E402

PROFILES = ("rtx5060ti-tp2-fp8", "linux-tp2-l3", "rtx5060ti-tp2")
#: The host-pool stage's budget for the second pass (bytes, the whole box): room for every pool
HOST_BUDGET = 2**40


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", required=True, help="folder the wheelhouse was installed into (pip --target)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="escha-gpu-preflight-"))
    (tmp / "l3").mkdir()
    argvs: list[list[str]] = []
    names: list[str] = []
    devices: list[dict[str, int]] = []
    for name in PROFILES:
        d = tmp / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config_json(load_profile(name).model.architecture)))
        with open(d / "model.safetensors", "wb") as f:  # sparse: the plan counts the profile's weights
            f.truncate(load_profile(name).model.weights_total or 64)
        sets = ["model.host_dir=" + str(d)]
        if name == "linux-tp2-l3":
            sets += [f"hicache.l3.dir={tmp / 'l3'}", "hicache.l3.max_size=1GB"]
        cmd = [sys.executable, "-m", "escha_deploy.cli.main", "serve", "--print", "-p", name,
               *[a for s in sets for a in ("--set", s)]]
        env = {**os.environ, "XDG_CACHE_HOME": str(tmp / "xdg"), "ESCHA_RUNTIME_DESCRIPTION": str(tmp / "none.json")}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        printed = json.loads(proc.stdout)
        argvs.append(stock_argv(pf.server_flags_of(printed["argv"])))
        devices.append(printed["preflight_device"])  # the plan's figures here, for the sizing stages
        names.append(name)
    # each profile twice: the host-pool check against this machine's free memory (SGLang's own),
    # then against HOST_BUDGET (the stand-in for a box with room for the profile's pools)
    names += [f"{n} (host budget {HOST_BUDGET} B)" for n in names]
    argvs += argvs
    devices += [{**d, "host_budget": HOST_BUDGET} for d in devices]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([args.site, str(ROOT / "tests" / "launch" / "preflight_gpu_site")]),
           "ESCHA_GPU_PREFLIGHT_STANDINS": "1", "ESCHA_GPU_HOST_POOLS": str(ROOT / "tests" / "runtime" / "gpu_host_pools.py")}
    results = pf.run_many(sys.executable, argvs, env, timeout_s=540, devices=devices)
    out = {}
    for name, argv, device, r in zip(names, argvs, devices, results):
        out[name] = {"device": device, "ok": r.ok, "stage": r.stage, "type": r.type, "message": r.message, "site": r.site,
                     "flags": r.flags, "answers": r.answers, "seconds": r.seconds, "wall_s": round(r.wall_s, 2),
                     "not_run": r.not_run, "argv": argv}
        print(f"{name}: ok={r.ok} {r.stage} {r.type} {r.message[:200]} {r.site} {r.answers} {r.seconds} {r.not_run}")
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
