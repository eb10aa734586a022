"""TEST-ONLY, for the device machine: SGLang's pre-flight run against the real GPU with the
stock 0.5.19 wheel (superseded by the serving closure, scripts/gpu-closure.sh, which carries a
``sgl_kernel`` built for the machine's torch); where ``sgl_kernel`` or ``flashinfer`` do not import they stand in as modules that raise
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
