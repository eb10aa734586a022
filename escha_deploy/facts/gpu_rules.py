"""What the GPU facts (NVML, ``facts.gpus``) decide: peer access between the TP GPUs, and
whether each GPU can run the image's kernels. Pure: no I/O.

Peer access: SGLang's custom all-reduce (``sglang/srt/distributed/device_communicators/
custom_all_reduce.py``) maps each rank's buffers into the others through CUDA IPC and needs
peer access between every pair of TP GPUs; without it the server dies at startup with "peer
access is not supported between these two devices" (sgl-project/sglang#4814, two RTX 4090).
So ``--disable-custom-all-reduce`` is rendered for TP >= 2 unless NVML's P2P read status is
``ok`` for every pair of TP GPUs; a card NVML brands GeForce or Titan counts as without peer
access whatever the driver claims (NVIDIA disabled PCIe P2P on the GeForce 40 and 50 series,
and a driver that still claims it can hang NCCL: NCCL_P2P_DISABLE=1 then, as for WSL2, whose
NVML answers are not trusted for P2P).

Compatibility: a cubin built for ``sm_XY`` runs on the same major with minor ``>= Y``
(CUDA C++ Programming Guide, "Binary Compatibility"); each architecture needs the CUDA release
that first compiles for it and that release's minimum driver (``ARCH_FLOORS``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from escha_deploy.facts.gpus import GpuInventory, runs_on

#: NVML brands (``nvmlBrandType_t``) of consumer cards: no PCIe P2P on the 40/50 series.
CONSUMER_BRANDS = frozenset({"GeForce", "GeForce RTX", "Titan", "Titan RTX"})


class PeerAccess(BaseModel):
    """The peer-access verdict for one TP group. ``proven``: NVML facts show P2P read status
    ``ok`` for every pair of the TP GPUs (always true for TP 1); ``consumer``: an NVML brand in
    ``CONSUMER_BRANDS`` among them (``None``: no NVML facts); ``denied``: the facts show no peer
    access (``proven`` false alone may mean "unknown"); ``detail``: the facts, one line."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    proven: bool
    denied: bool = Field(default=False, description="NVML shows no peer access: a consumer brand, a P2P status "
                         "other than ok, or WSL2 (not merely unknown)")
    consumer: bool | None = None
    nvml: bool = Field(default=False, description="whether NVML facts were read")
    detail: str


def tp_gpu_indices(tp: int, gpus: str | Sequence[int]) -> list[int]:
    """The NVML indices of the TP group: ``container.gpus`` ids when listed, else 0..tp-1."""
    return list(gpus)[:tp] if not isinstance(gpus, str) else list(range(tp))


def peer_access(inv: GpuInventory | None, indices: Sequence[int], platform: str) -> PeerAccess:
    """Peer access among the GPUs ``indices`` (module docstring), from the NVML inventory
    ``inv`` (``None`` or not from NVML: no facts, so not proven for 2+ GPUs)."""
    idx = list(indices)
    if len(idx) < 2:
        return PeerAccess(proven=True, nvml=inv is not None and inv.source == "nvml", detail="one GPU: no peers")
    if inv is None or inv.source != "nvml":
        why = "no NVML facts" if inv is None else f"GPU facts from {inv.source}, which cannot tell P2P"
        return PeerAccess(proven=False, detail=f"{why}: peer access between GPUs {idx} not proven")
    by_index = {g.index: g for g in inv.gpus}
    missing = [i for i in idx if i not in by_index]
    if missing:
        return PeerAccess(proven=False, nvml=True, detail=f"NVML lists no GPU {missing[0]} (of the TP group {idx})")
    brands = {by_index[i].brand for i in idx}
    consumer = bool(brands & CONSUMER_BRANDS)
    statuses = []
    pairs = inv.p2p_pairs
    for a in range(len(idx)):
        for b in range(a + 1, len(idx)):
            i, j = sorted((idx[a], idx[b]))
            statuses.append((f"{i}-{j}", pairs.get(f"{i}-{j}", "not asked")))
    bad = [(k, v) for k, v in statuses if v != "ok"]
    known_bad = [(k, v) for k, v in bad if v != "not asked"]
    names = ", ".join(sorted({f"{by_index[i].label} ({by_index[i].brand or 'brand unknown'})" for i in idx}))
    p2p = ", ".join(f"{k}: {v}" for k, v in statuses)
    if platform == "wsl2":
        return PeerAccess(proven=False, denied=True, consumer=consumer, nvml=True,
                          detail=f"WSL2: NVML's P2P answers are not trusted there ({p2p}); {names}")
    if consumer:
        return PeerAccess(proven=False, denied=True, consumer=True, nvml=True,
                          detail=f"consumer cards by NVML brand: {names}; P2P read {p2p}")
    if bad:
        return PeerAccess(proven=False, denied=bool(known_bad), consumer=False, nvml=True,
                          detail=f"NVML P2P read {p2p}; {names}")
    return PeerAccess(proven=True, consumer=False, nvml=True, detail=f"NVML P2P read {p2p}; {names}")


@dataclass(frozen=True)
class ArchFloor:
    """The oldest CUDA toolkit that compiles for an architecture, its minimum Linux driver, and
    the oldest NCCL known to run on it (``None``: no NCCL floor recorded), with the sources."""

    cuda: str
    driver: str
    nccl: str | None
    source: str
    nccl_source: str = "NCCL 2.25.1 release notes (Blackwell support)"


_CUDA_NOTES = "https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/ (Table 3, minimum driver)"
#: Per compute capability (CUDA release notes: the release adding the target; Table 3 the
#: driver). NCCL: 2.25.1 added Blackwell (sm_100; NCCL 2.25.1 release notes,
#: https://docs.nvidia.com/deeplearning/nccl/archives/nccl_2251/release-notes/). On consumer
#: Blackwell (sm_120/121: RTX 50, RTX PRO) 2.25.1 starts but multi-GPU collectives fail
#: (``all_reduce_perf`` errors with two RTX 5090s); NCCL 2.26.2 fixed it (NVIDIA/nccl-tests#287,
#: confirmed by the reporter), so it is the floor there. A later report of 2.26.2 failing
#: collectives of 512 KiB and more on two RTX PRO 6000s, not seen with 2.31.2, is
#: NVIDIA/nccl#2418.
_CONSUMER_BLACKWELL_NCCL = "2.25.1's collectives failed on RTX 5090s, 2.26.2 fixed them: NVIDIA/nccl-tests#287"
ARCH_FLOORS: dict[str, ArchFloor] = {
    "8.0": ArchFloor("11.0", "450.36.06", None, f"CUDA 11.0 added sm_80; {_CUDA_NOTES}"),
    "8.6": ArchFloor("11.1", "455.23", None, f"CUDA 11.1 added sm_86; {_CUDA_NOTES}"),
    "8.9": ArchFloor("11.8", "520.61.05", None, f"CUDA 11.8 added sm_89; {_CUDA_NOTES}"),
    "9.0": ArchFloor("11.8", "520.61.05", None, f"CUDA 11.8 added sm_90; {_CUDA_NOTES}"),
    "10.0": ArchFloor("12.8", "570.26", "2.25.1", f"CUDA 12.8 added sm_100 (Blackwell compatibility guide); {_CUDA_NOTES}"),
    "10.3": ArchFloor("12.9", "575.51.03", "2.25.1", f"CUDA 12.9 added sm_103; {_CUDA_NOTES}"),
    "12.0": ArchFloor("12.8", "570.26", "2.26.2", f"CUDA 12.8 added sm_120 (Blackwell compatibility guide); {_CUDA_NOTES}",
                       _CONSUMER_BLACKWELL_NCCL),
    "12.1": ArchFloor("12.9", "575.51.03", "2.26.2", f"CUDA 12.9 added sm_121; {_CUDA_NOTES}",
                       _CONSUMER_BLACKWELL_NCCL),
}
#: Minimum Linux driver of each CUDA major.minor an image's torch may be built with (CUDA
#: release notes, Table 3): the driver must be at least this for the image to start at all.
CUDA_MIN_DRIVER = {"12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06"}


def _ver(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdigit())


@dataclass(frozen=True)
class CompatRow:
    """One compatibility finding: ``status`` ok/warn/fail, ``id``, ``detail``, ``fix``."""

    status: str
    id: str
    detail: str
    fix: str = ""


def gpu_compat(inv: GpuInventory, indices: Sequence[int], *, profile_cc: str | None,
               image: dict, nccl_version: str | None = None) -> list[CompatRow]:
    """Per-GPU compatibility of the TP group ``indices``: compute capability against the
    profile's ``hardware.compute_capability``, against the architectures ``image``'s kernels and
    torch were built for (``catalog/kernel-archs.json``: ``{"wheels": {name: {"sass": [...],
    "ptx": [...], "version"}}, "torch_cuda": "13.0"}``), the driver each needs (``ARCH_FLOORS``
    and ``CUDA_MIN_DRIVER``), NCCL's floor, and mixed architectures in one TP group."""
    rows: list[CompatRow] = []
    by_index = {g.index: g for g in inv.gpus}
    group = [by_index[i] for i in indices if i in by_index]
    driver = inv.driver_version
    torch_cuda = image.get("torch_cuda")
    for g in group:
        cc = g.compute_capability
        tag = f"GPU {g.index} ({g.label}, cc {cc or '?'})"
        if cc is None:
            rows.append(CompatRow("warn", f"gpu.compat.{g.index}", f"{tag}: NVML gave no compute capability",
                                  "install nvidia-ml-py and a driver that answers nvmlDeviceGetCudaComputeCapability"))
            continue
        problems, fixes = [], []
        if profile_cc and cc != profile_cc:
            problems.append(f"the profile declares cc {profile_cc} (hardware.compute_capability)")
            fixes.append(f"use a profile written for cc {cc}, or set hardware.compute_capability: \"{cc}\"")
        for name, w in sorted(image.get("wheels", {}).items()):
            if not runs_on(w, cc):
                built = ", ".join(f"sm_{s}" for s in w.get("sass", [])) or "none"
                problems.append(f"{name} {w.get('version')} has no kernel image for sm_{cc.replace('.', '')} "
                                f"(built for {built}): \"no kernel image is available for execution on the device\"")
                fixes.append(f"use an image whose {name} is built for sm_{cc.replace('.', '')}")
        floor = ARCH_FLOORS.get(cc)
        need_driver = [v for v in ((floor.driver if floor else None), CUDA_MIN_DRIVER.get(torch_cuda or "")) if v]
        want = max(need_driver, key=_ver) if need_driver else None
        if want and driver and _ver(driver) < _ver(want):
            why = f"CUDA {torch_cuda} (torch)" if CUDA_MIN_DRIVER.get(torch_cuda or "") == want else f"sm_{cc.replace('.', '')}"
            problems.append(f"driver {driver} is older than {want}, the minimum for {why}")
            fixes.append(f"install NVIDIA driver {want} or newer")
        if floor and floor.nccl and nccl_version and _ver(nccl_version) < _ver(floor.nccl):
            problems.append(f"NCCL {nccl_version} is older than {floor.nccl}, the oldest known to work on cc {cc} "
                            f"({floor.nccl_source})")
            fixes.append(f"use NCCL {floor.nccl} or newer (torch's nvidia-nccl wheel)")
        if problems:
            rows.append(CompatRow("fail", f"gpu.compat.{g.index}", f"{tag}: " + "; ".join(problems), "; ".join(fixes)))
        else:
            src = f" (floor: CUDA {floor.cuda}, driver {floor.driver})" if floor else ""
            rows.append(CompatRow("ok", f"gpu.compat.{g.index}", f"{tag}: kernels for it in "
                                  f"{', '.join(sorted(image.get('wheels', {}))) or 'no image record'}; driver {driver or '?'}{src}"))
    ccs = sorted({g.compute_capability for g in group if g.compute_capability})
    if len(ccs) > 1:
        rows.append(CompatRow("fail", "gpu.compat.mixed", "one TP group mixes architectures: "
                              + ", ".join(f"GPU {g.index} cc {g.compute_capability}" for g in group),
                              "give the TP group GPUs of one architecture (container.gpus); kernels tuned and "
                              "compiled for one cc fail or differ on the other (sgl-project/sglang#38515)"))
    return rows
