#!/usr/bin/env python3
"""Record NVML's raw answers on this machine as JSON (a test fixture for ``escha_deploy/facts/nvml.py``).

Usage: ``python scripts/record_nvml_facts.py > tests/doctor/fixtures/nvml-<machine>.json``.
Needs only ``pynvml`` (the ``nvidia-ml-py`` wheel). Every value is what the NVML call named in
its key returned, unconverted (enum codes as ints), so the product's reader can be replayed
over it: ``tests/doctor/test_gpu_facts.py`` does. Errors are recorded as ``{"error": "..."}``.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import sys

import pynvml as N


def _call(fn, *args):
    try:
        v = fn(*args)
    except Exception as exc:  # noqa: BLE001 - an error is an answer here
        return {"error": f"{type(exc).__name__}: {exc}"}
    return v.decode() if isinstance(v, bytes) else v


def _p2p_index(name: str) -> int:
    v = getattr(N, name)
    return int(v[0] if isinstance(v, tuple) else v)


P2P_INDEXES = ("NVML_P2P_CAPS_INDEX_READ", "NVML_P2P_CAPS_INDEX_WRITE", "NVML_P2P_CAPS_INDEX_NVLINK",
               "NVML_P2P_CAPS_INDEX_ATOMICS")


def record() -> dict:
    N.nvmlInit()
    try:
        n = N.nvmlDeviceGetCount()
        hs = [N.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        devices = []
        for h in hs:
            pci = _call(N.nvmlDeviceGetPciInfo, h)
            devices.append({
                "nvmlDeviceGetName": _call(N.nvmlDeviceGetName, h),
                "nvmlDeviceGetUUID": _call(N.nvmlDeviceGetUUID, h),
                "nvmlDeviceGetBrand": _call(N.nvmlDeviceGetBrand, h),
                "nvmlDeviceGetArchitecture": _call(N.nvmlDeviceGetArchitecture, h),
                "nvmlDeviceGetCudaComputeCapability": list(_call(N.nvmlDeviceGetCudaComputeCapability, h)),
                "nvmlDeviceGetMemoryInfo.total": _call(lambda x: int(N.nvmlDeviceGetMemoryInfo(x).total), h),
                "nvmlDeviceGetPciInfo": pci if isinstance(pci, dict) else {
                    "busId": pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId,
                    "pciDeviceId": int(pci.pciDeviceId), "pciSubSystemId": int(pci.pciSubSystemId)},
            })
        p2p, topo = {}, {}
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                p2p[f"{i}-{j}"] = {k: _call(N.nvmlDeviceGetP2PStatus, hs[i], hs[j], _p2p_index(k)) for k in P2P_INDEXES}
                topo[f"{i}-{j}"] = _call(N.nvmlDeviceGetTopologyCommonAncestor, hs[i], hs[j])
        return {
            "recorded_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.node(), "kernel": platform.release(), "pynvml": getattr(N, "__version__", None),
            "nvmlSystemGetDriverVersion": _call(N.nvmlSystemGetDriverVersion),
            "nvmlSystemGetCudaDriverVersion_v2": _call(N.nvmlSystemGetCudaDriverVersion_v2),
            "nvmlDeviceGetCount": n, "devices": devices,
            "nvmlDeviceGetP2PStatus": p2p, "nvmlDeviceGetTopologyCommonAncestor": topo,
        }
    finally:
        N.nvmlShutdown()


if __name__ == "__main__":
    json.dump(record(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
