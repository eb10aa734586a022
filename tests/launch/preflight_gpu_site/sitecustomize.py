"""TEST-ONLY, for the device machine: SGLang's pre-flight run against the real GPU with the
0.5.19 wheelhouse (scripts/gpu-wheelhouse.sh). ``sgl_kernel`` and ``flashinfer`` do not install
there (built for another torch); where they do not import they stand in as modules that raise
when called (tests/runtime/gpu_host_pools.py: install_standins, named there). Nothing else of SGLang, torch or the GPU is
replaced. Active only with ``ESCHA_GPU_PREFLIGHT_STANDINS=1``."""

import importlib.util
import os
import sys

if os.environ.get("ESCHA_GPU_PREFLIGHT_STANDINS") == "1":
    _spec = importlib.util.spec_from_file_location("escha_gpu_host_pools", os.environ["ESCHA_GPU_HOST_POOLS"])
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules["escha_gpu_host_pools"] = _mod
    _spec.loader.exec_module(_mod)
    _mod.install_standins()
