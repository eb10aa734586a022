"""Everything ``doctor`` gathers, as one value: the checks are pure functions of it.

``gather_facts`` reads the host (``escha_deploy.facts.machine`` and ``hostinfo``), asks Docker and the
GPU sources; the probes' answers are added by ``run`` (they are slow, and may be reused from
saved findings younger than a day).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from escha_deploy.facts.findings import RestoreBandwidth, StoreProbeResult
from escha_deploy.facts.host import Platform
from escha_deploy.facts.machine import detect_container, detect_platform, host_id

from .gpu import GpuInventory, gpu_inventory
from .kernel_archs import image_kernel_archs
from .hostinfo import (DockerFacts, ImageFacts, MemlockProbe, MemoryFacts, WslConfigFile, WslSignals, read_docker,
                       read_memlock, read_memory, read_shm_size, read_wsl_networking_mode, read_wsl_signals,
                       read_wslconfig)
from .probes import PinnedCeiling


class ProbeFacts(BaseModel):
    """The GPU probes' answers (``None``/empty: not run). ``source`` says whether they ran now
    or were reused from saved findings (with their time); ``unavailable`` why they were started
    and could not run (the answers they did give are kept; the rest are unknown)."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(default="not run", description="'ran now', 'saved at <time>' or 'not run'")
    store: list[StoreProbeResult] = Field(default_factory=list)
    device_attributes: dict[str, int] = Field(default_factory=dict)
    host_allocator: str | None = None
    pinned: PinnedCeiling | None = None
    nccl: list[dict] = Field(default_factory=list, description="smoke-test attempts, in order")
    restore: RestoreBandwidth | None = Field(default=None, description="the restore-bandwidth probe's answer")
    restore_error: str | None = Field(default=None, description="why the restore-bandwidth probe gave none")
    skipped: str | None = Field(default=None, description="why the probes did not run")
    unavailable: str | None = Field(
        default=None, description="why the probes were started but could not run in this Python (torch "
        "missing, no CUDA device visible to torch): every probe answer is then unknown, never a failure, "
        "and nothing is saved as a finding")

    @property
    def nccl_ok(self) -> bool | None:
        return None if not self.nccl else bool(self.nccl[-1].get("ok"))


class DoctorFacts(BaseModel):
    """The host as ``doctor`` saw it. Bytes are ``int``; ``memlock`` is (soft, hard), ``None``
    for unlimited; ``*_error`` fields hold why a reader could not answer."""

    model_config = ConfigDict(extra="forbid")

    host_id: str
    platform: Platform
    in_container: bool
    wsl: WslSignals
    wsl_networking_mode: str | None = Field(
        default=None, description="`wslinfo --networking-mode` (nat, mirrored, ...); None: not WSL or unknown")
    memory: MemoryFacts | None = None
    memory_error: str | None = None
    memlock: tuple[int | None, int | None] | None = None
    memlock_error: str | None = None
    shm_bytes: int | None = None
    docker: DockerFacts
    gpus: GpuInventory
    image: ImageFacts | None = Field(default=None, description="the server image on this daemon (id = digest)")
    wslconfig: list[WslConfigFile] = Field(default_factory=list, description="the Windows users' .wslconfig "
                                           "files this VM can read (/mnt/c/Users/*/.wslconfig)")
    memlock_probe: MemlockProbe | None = Field(default=None, description="whether the daemon can start a "
                                               "container with --ulimit memlock=-1 (None: not asked)")
    probes: ProbeFacts = Field(default_factory=ProbeFacts)
    kernel_archs: dict = Field(default_factory=dict, description="the image's sglang-kernel/torch architectures "
                               "(kernel_archs.image_kernel_archs)")
    kernel_gpu_lines: list[str] = Field(default_factory=list, description="the kernel log's GPU lines (Xid, a GPU "
                                        "off the bus, WSL2's dxgkrnl residency failures; doctor/kernel_log.py)")
    kernel_log: str = Field(default="", description="what read the kernel log (dmesg, journalctl -k), or why it "
                            "could not be read")


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def gather_facts(root: Path = Path("/"), environ: Mapping[str, str] | None = None, *,
                 docker: Callable[[], DockerFacts] = read_docker,
                 gpus: Callable[[], GpuInventory] = gpu_inventory,
                 networking_mode: Callable[[], str | None] = read_wsl_networking_mode,
                 image: Callable[[], ImageFacts | None] | None = None,
                 memlock_probe: Callable[[], MemlockProbe] | None = None,
                 kernel: Callable[[], tuple[list[str], str]] | None = None) -> DoctorFacts:
    """Read the host under ``root``; ``docker``, ``gpus``, ``networking_mode`` (asked only on
    WSL2) and ``image`` (the server image's digest, when given) are the sources to ask (tests
    pass recorded answers). ``kernel``: the kernel log's GPU lines (default: this machine's,
    ``kernel_log.gpu_lines``, only when ``root`` is ``/``). Never raises for a missing file:
    the reason goes in ``*_error``."""
    from .kernel_log import gpu_lines

    if kernel is None:
        kernel = gpu_lines if root == Path("/") else (lambda: ([], f"not read ({root} is not this machine's root)"))
    kernel_lines, kernel_how = kernel()
    try:
        memory, memory_error = read_memory(root), None
    except (OSError, KeyError, ValueError) as exc:
        memory, memory_error = None, _reason(exc)
    try:
        memlock, memlock_error = read_memlock(root), None
    except (OSError, ValueError) as exc:
        memlock, memlock_error = None, _reason(exc)
    platform = detect_platform(root)
    return DoctorFacts(
        host_id=host_id(root),
        platform=platform,
        in_container=detect_container(root),
        wsl=read_wsl_signals(root, environ),
        wsl_networking_mode=networking_mode() if platform == "wsl2" else None,
        memory=memory,
        memory_error=memory_error,
        memlock=memlock,
        memlock_error=memlock_error,
        shm_bytes=read_shm_size(root),
        docker=docker(),
        gpus=gpus(),
        image=image() if image is not None else None,
        memlock_probe=memlock_probe() if memlock_probe is not None else None,
        wslconfig=read_wslconfig(root) if platform == "wsl2" else [],
        kernel_archs=image_kernel_archs(),
        kernel_gpu_lines=kernel_lines,
        kernel_log=kernel_how,
    )
