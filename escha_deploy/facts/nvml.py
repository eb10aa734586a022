"""The GPUs of this machine as NVML reports them, through nvidia-ml-py (the ``gpu`` extra):
``query_nvml`` fills a ``facts.gpus.GpuInventory``. The one module that asks NVML; ``host``
(the plan's GPU facts) and ``doctor.gpu`` (doctor's inventory, with the ``nvidia-smi``
fallback) call it.

NVML under WSL2 lacks some queries (utilization, process lists; CUDA-on-WSL guide section 5),
and P2P status may error there: an NVML error is recorded as the P2P status text, never raised
(SGLang's ``custom_all_reduce_utils.is_full_nvlink`` degrades the same way).
"""

from __future__ import annotations

from escha_deploy.facts.gpus import GpuInventory, GpuRecord, with_pair_facts


#: NVML P2P status codes (nvml.h ``nvmlGpuP2PStatus_t``) as words.
_P2P_STATUS = {
    0: "ok",
    1: "chipset not supported",
    2: "GPU not supported",
    3: "IOH topology not supported",
    4: "disabled by regkey",
    5: "not supported",
    6: "unknown",
}

#: ``nvmlBrandType_t`` (nvml.h) as words.
BRANDS = {
    0: "unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "GRID", 5: "GeForce", 6: "Titan",
    7: "NVIDIA vApps", 8: "NVIDIA VPC", 9: "NVIDIA VCS", 10: "NVIDIA VWS", 11: "NVIDIA Cloud Gaming",
    12: "Quadro RTX", 13: "NVIDIA RTX", 14: "NVIDIA", 15: "GeForce RTX", 16: "Titan RTX",
}
#: ``nvmlDeviceArchitecture_t`` (nvml.h) as words.
ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere", 8: "Ada",
                 9: "Hopper", 10: "Blackwell", 13: "Rubin"}
#: ``nvmlGpuTopologyLevel_t`` (nvml.h) as words, nearest first.
TOPOLOGY = {0: "same board", 10: "one PCIe switch", 20: "several PCIe switches", 30: "one host bridge",
            40: "one NUMA node", 50: "across CPUs (SMP interconnect)"}


def nccl_wheel_version() -> str | None:
    """Version of the NCCL wheel torch uses (``nvidia-nccl-cu13`` or ``-cu12``), if installed.

    Cheap (package metadata only); the probes report ``torch.cuda.nccl.version()`` as well.
    """
    from importlib import metadata

    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(nvml, fn: str, *args):
    """``nvml.<fn>(*args)``, or ``None`` when this NVML lacks the call or answers an error."""
    import ctypes  # here, not at import: only NVML's answers need it (pynvml is ctypes-based)

    try:
        return getattr(nvml, fn)(*args)
    except (AttributeError, TypeError, ValueError, ctypes.ArgumentError) + _nvml_errors(nvml):
        return None


def _nvml_errors(nvml) -> tuple[type[BaseException], ...]:
    err = getattr(nvml, "NVMLError", None)
    return (err,) if isinstance(err, type) else ()


def query_nvml(pairs: list[tuple[int, int]] | None = None, nvml=None) -> GpuInventory:
    """Query NVML; raises ``RuntimeError`` with the reason when NVML cannot be used.

    ``pairs``: GPU index pairs to ask the P2P status and topology of (default: every pair).
    ``nvml``: the NVML binding (default ``pynvml``; tests pass a replay of recorded answers).
    """
    import ctypes

    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError as exc:
            raise RuntimeError("nvidia-ml-py not installed (from the escha-deploy checkout: pip install '.[gpu]')") from exc
    errors = _nvml_errors(nvml)
    try:
        nvml.nvmlInit()
    except errors as exc:
        raise RuntimeError(f"nvmlInit failed: {exc}") from exc
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = _optional(nvml, "nvmlSystemGetCudaDriverVersion_v2")
        cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        gpus = []
        for i, h in enumerate(handles):
            cc = _optional(nvml, "nvmlDeviceGetCudaComputeCapability", h)
            pci = _optional(nvml, "nvmlDeviceGetPciInfo", h)
            brand = _optional(nvml, "nvmlDeviceGetBrand", h)
            arch = _optional(nvml, "nvmlDeviceGetArchitecture", h)
            uuid = _optional(nvml, "nvmlDeviceGetUUID", h)
            gpus.append(GpuRecord(
                index=i, name=_text(nvml.nvmlDeviceGetName(h)),
                memory_total_bytes=int(nvml.nvmlDeviceGetMemoryInfo(h).total), driver_version=driver,
                compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
                brand=None if brand is None else BRANDS.get(int(brand), f"brand {brand}"),
                architecture=None if arch is None else ARCHITECTURES.get(int(arch), f"architecture {arch}"),
                uuid=None if uuid is None else _text(uuid),
                pci_bus_id=None if pci is None else _text(pci.busId),
                pci_device_id=None if pci is None else int(pci.pciDeviceId),
                pci_subsystem_id=None if pci is None else int(pci.pciSubSystemId)))
        if pairs is None:
            pairs = [(i, j) for i in range(len(handles)) for j in range(i + 1, len(handles))]
        p2p: dict[tuple[int, int], str] = {}
        topology: dict[tuple[int, int], str] = {}
        # Some pynvml builds define NVML_P2P_CAPS_INDEX_READ as a 1-tuple, which ctypes cannot
        # pass (seen on the 2 x H200 machine, 2026-11-29): pass the plain int.
        index = nvml.NVML_P2P_CAPS_INDEX_READ
        index = int(index[0] if isinstance(index, tuple) else index)
        for i, j in pairs:
            if i >= len(handles) or j >= len(handles):
                continue
            try:
                code = nvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], index)
                p2p[i, j] = _P2P_STATUS.get(int(code), f"status {code}")
            except (TypeError, ValueError, ctypes.ArgumentError) + errors as exc:
                # a P2P answer is informative; never let it sink the whole inventory
                p2p[i, j] = f"error: {exc}"
            level = _optional(nvml, "nvmlDeviceGetTopologyCommonAncestor", handles[i], handles[j])
            if level is not None:
                topology[i, j] = TOPOLOGY.get(int(level), f"level {level}")
    finally:
        nvml.nvmlShutdown()
    return GpuInventory(source="nvml", driver_version=driver, cuda_driver_version=cuda_text,
                        nccl_version=nccl_wheel_version(), gpus=with_pair_facts(gpus, p2p, topology))
