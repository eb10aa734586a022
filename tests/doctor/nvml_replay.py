"""A stand-in for the ``pynvml`` binding that answers from a recorded JSON file
(``scripts/record_nvml_facts.py`` writes them): no NVML library or GPU exists on the CI
machine, so the product's reader (``nvml.query_nvml``) is replayed over real answers.
An ``{"error": ...}`` value raises ``NVMLError`` as the real call would."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

FIXTURES = Path(__file__).parent / "fixtures"


class NVMLError(Exception):
    pass


class RecordedNvml:
    NVMLError = NVMLError
    NVML_P2P_CAPS_INDEX_READ = 0

    def __init__(self, record: dict | str):
        self.r = json.loads((FIXTURES / record).read_text()) if isinstance(record, str) else record

    @staticmethod
    def _v(value):
        if isinstance(value, dict) and "error" in value:
            raise NVMLError(value["error"])
        return value

    def _dev(self, h: int, key: str):
        return self._v(self.r["devices"][h].get(key, {"error": "Not Supported"}))

    def nvmlInit(self):
        return None

    def nvmlShutdown(self):
        return None

    def nvmlSystemGetDriverVersion(self):
        return self._v(self.r["nvmlSystemGetDriverVersion"])

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return self._v(self.r["nvmlSystemGetCudaDriverVersion_v2"])

    def nvmlDeviceGetCount(self):
        return self.r["nvmlDeviceGetCount"]

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self._dev(h, "nvmlDeviceGetName")

    def nvmlDeviceGetUUID(self, h):
        return self._dev(h, "nvmlDeviceGetUUID")

    def nvmlDeviceGetBrand(self, h):
        return self._dev(h, "nvmlDeviceGetBrand")

    def nvmlDeviceGetArchitecture(self, h):
        return self._dev(h, "nvmlDeviceGetArchitecture")

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return tuple(self._dev(h, "nvmlDeviceGetCudaComputeCapability"))

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=self._dev(h, "nvmlDeviceGetMemoryInfo.total"))

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(**self._dev(h, "nvmlDeviceGetPciInfo"))

    def nvmlDeviceGetP2PStatus(self, a, b, index):
        assert index == self.NVML_P2P_CAPS_INDEX_READ
        return self._v(self.r["nvmlDeviceGetP2PStatus"][f"{a}-{b}"]["NVML_P2P_CAPS_INDEX_READ"])

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return self._v(self.r["nvmlDeviceGetTopologyCommonAncestor"][f"{a}-{b}"])


def recorded_inventory(record: dict | str):
    """``query_nvml`` over the recorded answers."""
    from escha_deploy.facts.nvml import query_nvml

    return query_nvml(nvml=RecordedNvml(record))
