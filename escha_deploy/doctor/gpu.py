"""The GPU inventory: NVML through nvidia-ml-py (the ``gpu`` extra) when installed, else
``nvidia-smi``, else "no GPU" with the reason each source gave.

NVML under WSL2 lacks some queries (utilization, process lists; CUDA-on-WSL guide section 5),
and P2P status may error there: an NVML error is recorded as the P2P status text, never raised
(SGLang's ``custom_all_reduce_utils.is_full_nvlink`` degrades the same way).
"""

from __future__ import annotations

import ctypes

import shutil
import subprocess
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class GpuInfo(BaseModel):
    """One GPU. ``vram_bytes`` is NVML's ``memory.total`` (bytes); ``compute_capability`` as
    ``"9.0"``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int
    name: str
    vram_bytes: int
    compute_capability: str | None = None


class GpuInventory(BaseModel):
    """What the GPU sources said. ``source`` is ``none`` when no GPU was found; then
    ``reasons`` holds one line per source tried (``NVML: ...``, ``nvidia-smi: ...``).

    ``p2p`` maps ``"i-j"`` to NVML's P2P read status for that pair (``ok``, ``not supported``,
    ``chipset not supported``, ... or ``error: ...``). ``nccl_version`` is the version of the
    installed NCCL wheel (``nvidia-nccl-cu13``/``-cu12``), when one is installed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str = Field(description="nvml, nvidia-smi or none")
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nccl_version: str | None = None
    gpus: list[GpuInfo] = Field(default_factory=list)
    p2p: dict[str, str] = Field(default_factory=dict)
    reasons: list[str] = Field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.gpus)


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


def query_nvml(pairs: list[tuple[int, int]] | None = None) -> GpuInventory:
    """Query NVML; raises ``RuntimeError`` with the reason when NVML cannot be used.

    ``pairs``: GPU index pairs to ask the P2P status of (default: every pair).
    """
    try:
        import pynvml
    except ImportError as exc:
        raise RuntimeError("nvidia-ml-py not installed (pip install 'escha-deploy[gpu]')") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise RuntimeError(f"nvmlInit failed: {exc}") from exc
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
            cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except pynvml.NVMLError:
            cuda_text = None
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        gpus = []
        for i, h in enumerate(handles):
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                cc = f"{major}.{minor}"
            except pynvml.NVMLError:
                cc = None
            gpus.append(GpuInfo(index=i, name=_text(pynvml.nvmlDeviceGetName(h)),
                                vram_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                                compute_capability=cc))
        if pairs is None:
            pairs = [(i, j) for i in range(len(handles)) for j in range(i + 1, len(handles))]
        p2p = {}
        # Some pynvml builds define NVML_P2P_CAPS_INDEX_READ as a 1-tuple, which ctypes cannot
        # pass (seen on the 2 x H200 machine, 2026-11-29): pass the plain int.
        index = pynvml.NVML_P2P_CAPS_INDEX_READ
        index = int(index[0] if isinstance(index, tuple) else index)
        for i, j in pairs:
            if i >= len(handles) or j >= len(handles):
                continue
            try:
                code = pynvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], index)
                p2p[f"{i}-{j}"] = _P2P_STATUS.get(int(code), f"status {code}")
            except (pynvml.NVMLError, TypeError, ValueError, ctypes.ArgumentError) as exc:
                # a P2P answer is informative; never let it sink the whole inventory
                p2p[f"{i}-{j}"] = f"error: {exc}"
    finally:
        pynvml.nvmlShutdown()
    return GpuInventory(source="nvml", driver_version=driver, cuda_driver_version=cuda_text,
                        nccl_version=nccl_wheel_version(), gpus=gpus, p2p=p2p)


#: ``nvidia-smi`` query used as the fallback; ``compute_cap`` needs driver 510 or newer.
NVIDIA_SMI_QUERY = "index,name,memory.total,compute_cap,driver_version"


def parse_nvidia_smi(csv_text: str) -> GpuInventory:
    """Parse ``nvidia-smi --query-gpu=<NVIDIA_SMI_QUERY> --format=csv,noheader,nounits``
    (memory.total in MiB). Raises ``ValueError`` on a malformed line."""
    gpus: list[GpuInfo] = []
    driver = None
    for line in csv_text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5:
            raise ValueError(f"nvidia-smi: expected 5 fields, got {line!r}")
        index, name, mib, cc, driver = fields
        gpus.append(GpuInfo(index=int(index), name=name, vram_bytes=int(float(mib)) * 2**20,
                            compute_capability=None if cc in ("", "[N/A]", "N/A") else cc))
    return GpuInventory(source="nvidia-smi", driver_version=driver, gpus=gpus,
                        nccl_version=nccl_wheel_version())


def find_nvidia_smi() -> str | None:
    """``nvidia-smi`` on PATH, or WSL2's ``/usr/lib/wsl/lib/nvidia-smi`` (CUDA-on-WSL guide:
    root outside containers must use that path)."""
    found = shutil.which("nvidia-smi")
    if found:
        return found
    wsl = Path("/usr/lib/wsl/lib/nvidia-smi")
    return str(wsl) if wsl.exists() else None


def query_nvidia_smi(timeout_s: float = 15.0) -> GpuInventory:
    """Run ``nvidia-smi``; raises ``RuntimeError`` with the reason when it cannot answer."""
    exe = find_nvidia_smi()
    if exe is None:
        raise RuntimeError("nvidia-smi not found on PATH or in /usr/lib/wsl/lib")
    try:
        out = subprocess.run([exe, f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{exe} failed: {exc}") from exc
    if out.returncode != 0:
        msg = (out.stdout + out.stderr).strip().splitlines()
        raise RuntimeError(f"{exe} exited {out.returncode}: {msg[0] if msg else 'no output'}")
    try:
        return parse_nvidia_smi(out.stdout)
    except ValueError as exc:
        raise RuntimeError(str(exc)) from exc


def gpu_inventory(pairs: list[tuple[int, int]] | None = None) -> GpuInventory:
    """NVML, else nvidia-smi, else ``source="none"`` with one reason line per source tried."""
    reasons = []
    try:
        return query_nvml(pairs)
    except RuntimeError as exc:
        reasons.append(f"NVML: {exc}")
    try:
        inv = query_nvidia_smi()
        return inv.model_copy(update={"reasons": reasons})
    except RuntimeError as exc:
        reasons.append(f"nvidia-smi: {exc}")
    return GpuInventory(source="none", reasons=reasons, nccl_version=nccl_wheel_version())
