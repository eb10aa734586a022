"""The GPUs as the planner reads them: NVML's inventory (``GpuInventory``, one ``GpuInfo`` per
GPU, P2P status and topology per pair), one GPU as a facts file and the launch spec record it
(``GpuRecord``; ``facts.file`` converts between the two) and which architectures a kernel build runs on
(``runs_on``). Pure: no I/O; ``nvml.query_nvml`` and ``doctor.gpu`` fill the inventory,
``doctor.kernel_archs`` reads the architectures out of a library's fat binary.

Which code runs where (CUDA C++ Programming Guide, "Binary Compatibility" and "PTX
Compatibility"): a cubin built for ``sm_XY`` runs on devices of the same major ``X`` and minor
``>= Y``; PTX for ``compute_XY`` is JIT-compiled by the driver for any device of compute
capability ``>= X.Y``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, StringConstraints


#: A pair of GPU indexes as ``p2p``/``topology`` keys: ``"0-1"``.
GpuPairKey = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,4}-[0-9]{1,4}$")]


class GpuInfo(BaseModel):
    """One GPU as NVML reports it. ``vram_bytes`` is ``nvmlDeviceGetMemoryInfo().total``
    (bytes); ``compute_capability`` as ``"9.0"``; ``brand`` the ``nvmlBrandType_t`` word
    (``nvml.BRANDS``: GeForce, Titan, NVIDIA RTX, Tesla, NVIDIA, ...); ``pci_device_id`` and
    ``pci_subsystem_id`` are ``nvmlPciInfo_t.pciDeviceId``/``pciSubSystemId`` (device id in the
    high 16 bits, vendor id 0x10de in the low 16); ``architecture`` the
    ``nvmlDeviceArchitecture_t`` word. ``nvidia-smi`` fills only the first four fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    index: int
    name: str
    vram_bytes: int
    compute_capability: str | None = None
    brand: str | None = None
    architecture: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    pci_device_id: int | None = None
    pci_subsystem_id: int | None = None


class GpuInventory(BaseModel):
    """What the GPU sources said. ``source`` is ``none`` when no GPU was found; then
    ``reasons`` holds one line per source tried (``NVML: ...``, ``nvidia-smi: ...``).

    ``p2p`` maps ``"i-j"`` to NVML's P2P read status for that pair (``ok``, ``not supported``,
    ``chipset not supported``, ... or ``error: ...``); ``topology`` maps ``"i-j"`` to
    ``nvmlDeviceGetTopologyCommonAncestor`` as a word (``nvml.TOPOLOGY``: same board, one PCIe
    switch, host bridge, NUMA node, across CPUs). ``nccl_version`` is the version of the
    installed NCCL wheel (``nvidia-nccl-cu13``/``-cu12``), when one is installed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    source: str = Field(description="nvml, nvidia-smi or none")
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nccl_version: str | None = None
    gpus: list[GpuInfo] = Field(default_factory=list)
    p2p: dict[GpuPairKey, str] = Field(default_factory=dict)
    topology: dict[GpuPairKey, str] = Field(default_factory=dict)
    reasons: list[str] = Field(default_factory=list)

    @property
    def count(self) -> int:
        """How many GPUs the inventory lists."""
        return len(self.gpus)


#: The largest byte count a fact may hold: the profile's cap on any size (``units.MAX_SIZE``,
#: 1 PiB), so a described host of 1e30 bytes is refused as a profile size of 1e30 is.
MAX_FACT_BYTES = 2**50
#: A GPU index as a key of ``p2p``/``topology`` (``"1"``).
GpuIndexKey = Annotated[str, StringConstraints(strict=True, pattern=r"^[0-9]{1,4}$")]


class GpuRecord(BaseModel):
    """One GPU as NVML reports it (``nvmlDeviceGetMemoryInfo``, ``nvmlDeviceGetCudaComputeCapability``,
    ``nvmlDeviceGetPciInfo``). Only ``index`` is required, so a hand-written file can list what it
    knows. The planner reads brand and P2P status (``gpu_facts.peer_access``: the launch flags
    follow them); all of it is part of the digest."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    index: StrictInt = Field(ge=0, le=4095, description="CUDA/NVML device index")
    name: StrictStr | None = Field(default=None, description="nvmlDeviceGetName, e.g. NVIDIA GeForce RTX 5060 Ti")
    uuid: StrictStr | None = Field(default=None, description="nvmlDeviceGetUUID (GPU-...)")
    pci_bus_id: StrictStr | None = Field(default=None, description="nvmlDeviceGetPciInfo busId")
    memory_total_bytes: StrictInt | None = Field(default=None, gt=0, le=MAX_FACT_BYTES,
                                           description="nvmlDeviceGetMemoryInfo total (bytes)")
    compute_capability: StrictStr | None = Field(default=None, description='major.minor, e.g. "12.0"')
    driver_version: StrictStr | None = Field(default=None, description="nvmlSystemGetDriverVersion")
    brand: StrictStr | None = Field(default=None, description="nvmlDeviceGetBrand as a word (GeForce, NVIDIA RTX, ...)")
    architecture: StrictStr | None = Field(default=None, description="nvmlDeviceGetArchitecture as a word")
    pci_device_id: StrictInt | None = Field(default=None, description="nvmlPciInfo_t.pciDeviceId (device << 16 | vendor)")
    pci_subsystem_id: StrictInt | None = Field(default=None, description="nvmlPciInfo_t.pciSubSystemId")
    p2p: dict[GpuIndexKey, StrictStr] = Field(default_factory=dict, description="other GPU index -> "
                                        "nvmlDeviceGetP2PStatus (read) as a word: ok, not supported, ...")
    topology: dict[GpuIndexKey, StrictStr] = Field(default_factory=dict, description="other GPU index -> "
                                             "nvmlDeviceGetTopologyCommonAncestor as a word")


def runs_on(archs: Mapping[str, Sequence[int]], cc: str) -> bool:
    """Whether code built for ``archs`` (``{"sass": [...], "ptx": [...]}``) has a kernel image for a
    device of compute capability ``cc`` (``"8.9"``): a cubin of the same major and a minor not
    above the device's, or PTX of a capability not above it (module docstring)."""
    major, minor = (int(x) for x in cc.split("."))
    dev = major * 10 + minor
    if any(s // 10 == major and s % 10 <= minor for s in archs.get("sass", ())):
        return True
    return any(p <= dev for p in archs.get("ptx", ()))
