"""The GPUs as the planner reads them: one shape per GPU (``GpuRecord``: what NVML, ``nvidia-smi``
or a facts file said of it, with its P2P status and topology towards each other GPU), the same
record in a facts file, a doctor report and a launch spec; a host's inventory (``GpuInventory``:
the records and where they came from); and which architectures a kernel build runs on
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


#: The largest byte count a fact may hold: the profile's cap on any size (``units.MAX_SIZE``,
#: 1 PiB), so a described host of 1e30 bytes is refused as a profile size of 1e30 is.
MAX_FACT_BYTES = 2**50
#: A GPU index as a key of ``p2p``/``topology`` (``"1"``).
GpuIndexKey = Annotated[str, StringConstraints(strict=True, pattern=r"^[0-9]{1,4}$")]


class GpuRecord(BaseModel):
    """One GPU, the one shape every reader fills and every consumer reads: NVML's answers
    (``nvml.query_nvml``: ``nvmlDeviceGetMemoryInfo``, ``nvmlDeviceGetCudaComputeCapability``,
    ``nvmlDeviceGetPciInfo``, ...), ``nvidia-smi``'s (index, name, memory, compute capability,
    driver) or a facts file's. Only ``index`` is required, so a hand-written file can list what
    it knows. ``p2p`` and ``topology`` hold this GPU's facts towards each other GPU (``"1"`` ->
    the word); a pair's fact is on both of its GPUs. ``brand`` is the ``nvmlBrandType_t`` word
    (``nvml.BRANDS``); ``pci_device_id``/``pci_subsystem_id`` are ``nvmlPciInfo_t``'s (device id
    in the high 16 bits, vendor id 0x10de in the low 16). The planner reads brand and P2P status
    (``gpu_facts.peer_access``: the launch flags follow them); in a facts file and a launch spec
    all of it is part of the digest."""

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

    @property
    def label(self) -> str:
        """The GPU's name, or ``GPU <index>`` where its source gave none."""
        return self.name or f"GPU {self.index}"


class GpuInventory(BaseModel):
    """What the GPU sources said of a host: one ``GpuRecord`` per GPU. ``source`` is ``none``
    when no GPU was found; then ``reasons`` holds one line per source tried (``NVML: ...``,
    ``nvidia-smi: ...``). ``nccl_version`` is the version of the installed NCCL wheel
    (``nvidia-nccl-cu13``/``-cu12``), when one is installed. The pair facts live on the records;
    ``p2p_pairs``/``topology_pairs`` list them by pair."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    source: str = Field(description="nvml, nvidia-smi or none")
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nccl_version: str | None = None
    gpus: list[GpuRecord] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)

    @property
    def count(self) -> int:
        """How many GPUs the inventory lists."""
        return len(self.gpus)

    @property
    def p2p_pairs(self) -> dict[str, str]:
        """``"i-j"`` (i < j) -> NVML's P2P read status of the pair (``ok``, ``not supported``,
        ``chipset not supported``, ... or ``error: ...``)."""
        return _by_pair(self.gpus, "p2p")

    @property
    def topology_pairs(self) -> dict[str, str]:
        """``"i-j"`` (i < j) -> ``nvmlDeviceGetTopologyCommonAncestor`` of the pair as a word
        (``nvml.TOPOLOGY``: same board, one PCIe switch, host bridge, NUMA node, across CPUs)."""
        return _by_pair(self.gpus, "topology")


def _by_pair(gpus: Sequence[GpuRecord], which: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for g in gpus:
        for other, fact in getattr(g, which).items():
            i, j = sorted((g.index, int(other)))
            out.setdefault(f"{i}-{j}", fact)
    return out


def facts_towards(index: object, pairs: Mapping[tuple[int, int], str]) -> dict[str, str]:
    """The pair facts (``(i, j)`` -> the word) that concern GPU ``index``, keyed by the other
    GPU's index as a record keeps them (``GpuRecord.p2p``/``topology``): a pair's fact goes on
    both of its GPUs. ``index`` may be a raw record's, not yet validated (``factsfile`` reads an
    earlier report's shape with it): the record's own validation judges it after."""
    return {str(j if index == i else i): fact for (i, j), fact in pairs.items() if index in (i, j)}


def with_pair_facts(gpus: Sequence[GpuRecord], p2p: Mapping[tuple[int, int], str],
                    topology: Mapping[tuple[int, int], str]) -> list[GpuRecord]:
    """``gpus`` with each pair's facts (``(i, j)`` -> the word, as NVML was asked them) put on
    both of the pair's records (``facts_towards``)."""
    return [g.model_copy(update={"p2p": facts_towards(g.index, p2p), "topology": facts_towards(g.index, topology)})
            for g in gpus]


def records_from_inventory(inv: GpuInventory | None) -> list[GpuRecord]:
    """The records of an NVML inventory, as a facts file, a launch spec and ``Gathered.gpus``
    keep them (an ``nvidia-smi`` inventory, which cannot tell brand or P2P, gives none)."""
    if inv is None or inv.source != "nvml":
        return []
    return list(inv.gpus)


def inventory_from_records(records: Sequence[GpuRecord]) -> GpuInventory | None:
    """The NVML inventory of a facts file's records (``None`` for no records), so a plan from a
    facts file decides peer access as a plan from NVML does: the records themselves, nothing
    converted; the driver is the first record's."""
    if not records:
        return None
    return GpuInventory(source="nvml", driver_version=records[0].driver_version, gpus=list(records))


def runs_on(archs: Mapping[str, Sequence[int]], cc: str) -> bool:
    """Whether code built for ``archs`` (``{"sass": [...], "ptx": [...]}``) has a kernel image for a
    device of compute capability ``cc`` (``"8.9"``): a cubin of the same major and a minor not
    above the device's, or PTX of a capability not above it (module docstring)."""
    major, minor = (int(x) for x in cc.split("."))
    dev = major * 10 + minor
    if any(s // 10 == major and s % 10 <= minor for s in archs.get("sass", ())):
        return True
    return any(p <= dev for p in archs.get("ptx", ()))
