"""The GPU inventory: NVML through nvidia-ml-py (the ``gpu`` extra) when installed, else
``nvidia-smi``, else "no GPU" with the reason each source gave.

NVML is asked by ``escha_deploy.facts.nvml``; the inventory's models are ``facts.gpus``'s.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ..facts.gpus import GpuInventory, GpuRecord
from ..facts.nvml import nccl_wheel_version, query_nvml

#: ``nvidia-smi`` query used as the fallback; ``compute_cap`` needs driver 510 or newer.
NVIDIA_SMI_QUERY = "index,name,memory.total,compute_cap,driver_version"


def parse_nvidia_smi(csv_text: str) -> GpuInventory:
    """Parse ``nvidia-smi --query-gpu=<NVIDIA_SMI_QUERY> --format=csv,noheader,nounits``
    (memory.total in MiB). Raises ``ValueError`` on a malformed line."""
    gpus: list[GpuRecord] = []
    driver = None
    for line in csv_text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5:
            raise ValueError(f"nvidia-smi: expected 5 fields, got {line!r}")
        index, name, mib, cc, driver = fields
        gpus.append(GpuRecord(index=int(index), name=name, memory_total_bytes=int(float(mib)) * 2**20,
                              compute_capability=None if cc in ("", "[N/A]", "N/A") else cc,
                              driver_version=driver or None))
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
