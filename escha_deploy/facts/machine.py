"""Host facts: the one place that reads the machine (psutil, /proc, cgroup, doctor findings).

``gather_host_facts()`` reads everything the planner needs into one frozen ``HostFacts`` up
front, so ``planner.plan()``'s signature lists every input and planner tests are tables of
facts. Every reader takes a ``root`` so tests can point it at
fixture trees of WSL2 and other hosts.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from escha_deploy.facts.gpus import GpuInventory
from escha_deploy.facts.host import HostFacts, Platform

if TYPE_CHECKING:
    from escha_deploy.facts.findings import DoctorFindings

_T = TypeVar("_T")

#: cgroup v1 reports "no limit" as a huge number (PAGE_COUNTER_MAX pages); anything at or
#: above 2**60 bytes is treated as unlimited.
_CGROUP_V1_UNLIMITED = 2**60


def read_meminfo(root: Path = Path("/")) -> dict[str, int]:
    """``/proc/meminfo`` as ``{key: bytes}`` (the ``kB`` there is KiB); HugePages_* are counts."""
    out: dict[str, int] = {}
    for line in (root / "proc/meminfo").read_text().splitlines():
        m = re.match(r"^(\S+):\s+(\d+)(?:\s+kB)?\s*$", line)
        if not m:
            continue
        key, num = m.group(1), int(m.group(2))
        out[key] = num * 1024 if line.rstrip().endswith("kB") else num
    return out


def hugetlb_bytes(mem: dict[str, int]) -> int:
    """Bytes held as huge pages, from ``read_meminfo``'s dict: ``Hugetlb`` (all page sizes,
    Linux 4.16+) or, when absent or smaller, ``HugePages_Total`` x ``Hugepagesize`` (the
    default size only). Documentation/filesystems/proc.rst, section meminfo."""
    by_count = mem.get("HugePages_Total", 0) * mem.get("Hugepagesize", 0)
    return max(mem.get("Hugetlb", 0), by_count)


def cgroup_memory_limit_file(root: Path = Path("/")) -> str | None:
    """The cgroup file ``read_cgroup_memory`` takes the limit from (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``), as an absolute path on the host; ``None`` without one."""
    for rel in ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes"):
        if (root / rel).exists():
            return "/" + rel
    return None


def read_cgroup_memory(root: Path = Path("/")) -> tuple[int | None, int | None]:
    """``(limit, usage)`` in bytes of this process's memory cgroup; ``None`` when unlimited/absent.

    cgroup v2: ``/sys/fs/cgroup/memory.max`` ("max" = unlimited) and ``memory.current``.
    cgroup v1: ``/sys/fs/cgroup/memory/memory.limit_in_bytes`` and ``memory.usage_in_bytes``.
    """
    v2 = root / "sys/fs/cgroup/memory.max"
    if v2.exists():
        raw = v2.read_text().strip()
        limit = None if raw == "max" else int(raw)
        cur = root / "sys/fs/cgroup/memory.current"
        usage = int(cur.read_text().strip()) if cur.exists() else None
        return limit, usage
    v1 = root / "sys/fs/cgroup/memory/memory.limit_in_bytes"
    if v1.exists():
        limit = int(v1.read_text().strip())
        cur = root / "sys/fs/cgroup/memory/memory.usage_in_bytes"
        usage = int(cur.read_text().strip()) if cur.exists() else None
        return (None if limit >= _CGROUP_V1_UNLIMITED else limit), usage
    return None, None


def read_oom_kill_count(root: Path = Path("/")) -> int | None:
    """How many processes of this cgroup the OOM killer has killed so far: ``oom_kill`` in
    cgroup v2 ``memory.events``, or in cgroup v1 ``memory/memory.oom_control`` (Linux 4.13+);
    ``None`` when neither is readable. A count that rose while the server ran is the proof
    ``diagnose`` needs to say "OOM killer" (Documentation/admin-guide/cgroup-v2.rst); native
    ``serve`` (``launch.native.supervise``) reads it before and after its child."""
    for rel in ("sys/fs/cgroup/memory.events", "sys/fs/cgroup/memory/memory.oom_control"):
        try:
            text = (root / rel).read_text()
        except OSError:
            continue
        m = re.search(r"^oom_kill (\d+)$", text, re.M)
        if m:
            return int(m.group(1))
    return None


def detect_platform(root: Path = Path("/")) -> Platform:
    """``wsl2`` when the kernel is Microsoft's WSL2 kernel, else ``linux``.

    WSL2 kernels name themselves in ``/proc/sys/kernel/osrelease`` (``5.15.167.4-microsoft-
    standard-WSL2``) and ``/proc/version``; both are visible from inside a container too, since
    containers share the kernel.
    """
    for rel in ("proc/sys/kernel/osrelease", "proc/version"):
        p = root / rel
        try:
            text = p.read_text().lower()
        except OSError:
            continue
        if "microsoft" in text or "wsl" in text:
            return "wsl2"
    return "linux"


def detect_container(root: Path = Path("/")) -> bool:
    """True inside a Docker/containerd/podman container (``/.dockerenv``, ``/run/.containerenv``
    or a container runtime named in ``/proc/1/cgroup``)."""
    if (root / ".dockerenv").exists() or (root / "run/.containerenv").exists():
        return True
    try:
        text = (root / "proc/1/cgroup").read_text()
    except OSError:
        return False
    return any(k in text for k in ("docker", "containerd", "kubepods", "libpod"))


def host_id(root: Path = Path("/")) -> str:
    """A stable id for this machine: sha256 of ``/etc/machine-id`` (or the boot id) and the
    hostname, first 16 hex digits. Identifies whose doctor findings these are."""
    seed = ""
    for rel in ("etc/machine-id", "proc/sys/kernel/random/boot_id"):
        try:
            seed = (root / rel).read_text().strip()
            if seed:
                break
        except OSError:
            continue
    return hashlib.sha256(f"{seed}:{socket.gethostname()}".encode()).hexdigest()[:16]


def described_host(mem_total_bytes: int, platform: Platform = "linux") -> HostFacts:
    """A host described by the user (``--host-ram SIZE [--wsl2|--linux]``), not read live.

    Doctor findings are ignored: they describe this machine, not the described one.
    """
    return HostFacts(source="described", platform=platform, mem_total_bytes=mem_total_bytes)


def read_gpu_facts() -> GpuInventory | None:
    """NVML's answers for this machine's GPUs (``nvml.query_nvml``), or ``None`` when NVML
    cannot be used here (no nvidia-ml-py, no driver library, no GPU)."""
    from escha_deploy.facts.nvml import query_nvml

    try:
        return query_nvml()
    except RuntimeError:
        return None


def gather_host_facts(*, platform: Platform | None = None, use_findings: bool = True, root: Path = Path("/"),
                      gpus: bool = True) -> HostFacts:
    """Read this machine into ``HostFacts`` (``read_this_host``'s facts, without the findings
    it read)."""
    return read_this_host(platform=platform, use_findings=use_findings, root=root, gpus=gpus)[0]


def read_this_host(*, platform: Platform | None = None, use_findings: bool = True, root: Path = Path("/"),
                   gpus: bool = True) -> tuple[HostFacts, DoctorFindings | None]:
    """Read this machine into ``HostFacts``: MemTotal, MemAvailable and the huge-page
    reservation (/proc/meminfo), the cgroup memory limit and usage (v1 or v2), WSL2 or Linux,
    container or not, doctor's findings for this host (pinned ceiling, host allocator) when
    present, and the GPUs as NVML reports them (``gpus=False``: not read); with the findings
    read (``None``: none for this host, or ``use_findings=False``), read once here.

    ``platform`` overrides the detected platform (``--wsl2``/``--linux``).
    """
    from escha_deploy.facts.saved import load_findings
    from escha_deploy.utils.paths import doctor_findings_path

    mem = read_meminfo(root)
    limit, usage = read_cgroup_memory(root)
    hid = host_id(root)
    findings = load_findings(doctor_findings_path(), host_id=hid) if use_findings else None
    from escha_deploy.facts.saved import load_last_prefill

    last = load_last_prefill() if use_findings else None
    return HostFacts(
        source="live",
        platform=platform or detect_platform(root),
        mem_total_bytes=mem["MemTotal"],
        mem_available_bytes=mem.get("MemAvailable"),
        hugetlb_bytes=hugetlb_bytes(mem),
        cgroup_limit_bytes=limit,
        cgroup_usage_bytes=usage,
        cgroup_limit_file=cgroup_memory_limit_file(root) if limit is not None else None,
        in_container=detect_container(root),
        host_id=hid,
        pinned_ceiling_bytes=findings.pinned_ceiling_bytes if findings else None,
        pinned_ceiling_reached=findings.pinned_ceiling_reached if findings else False,
        host_allocator=findings.host_allocator if findings else None,
        nccl_env=dict(findings.nccl_env) if findings and findings.nccl_smoke_ok else {},
        restore_bandwidth=findings.restore_bandwidth if findings else None,
        prefill_tokens_per_s=last.tokens_per_s if last else None,
        prefill_source=last.source if last else None,
        prefill_model=last.model if last else None,
        gpus=read_gpu_facts() if gpus else None,
    ), findings


def read_folder_facts(field: str, read: Callable[..., _T], *args: Any) -> _T:
    """``read(*args)`` (``arch.read_model_dir``, ``arch.read_draft_dir``), its problems under the
    profile key that named the folder: a ``BadInput`` (config.json unreadable or not JSON,
    jsonio) with each line prefixed by ``field``, a ``ValueError`` (a field of the wrong shape)
    or ``OSError`` (a weights file that cannot be read) as one ``BadInput`` line (exit 2)."""
    from escha_deploy.utils.errors import BadInput

    try:
        return read(*args)
    except BadInput as exc:
        raise BadInput(*(f"{field}: {p}" for p in exc.problems), hint=exc.hint) from None
    except (ValueError, OSError) as exc:
        raise BadInput(f"{field}: {exc}") from None


def read_draft_inputs(profile, *, draft_path: str | None = None, model_path: str | None = None):
    """What ``model.draft``'s folder says (``arch.read_draft_dir``), read as the model folder
    is: at ``draft_path`` as this process sees it (default ``model.draft.host_dir``; inside the
    container ``serve`` passes ``model.draft.path``), beside the model folder at ``model_path``
    (default ``model.host_dir``), by which a draft in the model's own folder (NEXTN/MTP) is
    known. ``None`` without the key or when the folder is not here (the plan then says the draft
    is not counted). Raises ``BadInput`` (exit 2) naming ``model.draft.*`` for an unreadable
    config.json or safetensors header, or one of the wrong shape."""
    from escha_deploy.sglang.arch import read_draft_dir

    draft = profile.model.draft
    if draft is None:
        return None
    field = "model.draft.path" if draft_path else "model.draft.host_dir"
    path = draft_path or draft.host_dir
    if not path:
        return None
    model = model_path or profile.model.host_dir
    facts = read_folder_facts(field, read_draft_dir, path, model)
    if facts is not None and not facts.own_folder and model and os.path.isdir(model):
        from escha_deploy.sglang.arch import draft_folder_mismatch
        from escha_deploy.utils.errors import BadInput
        from escha_deploy.profile.rules import speculative_algorithm

        mtp = speculative_algorithm(profile) == "NEXTN" or facts.nextn_layers > 0
        why = read_folder_facts(field, lambda: draft_folder_mismatch(path, model, mtp=mtp))
        if why:
            raise BadInput(f"{field}: {why}")
    return facts


def read_model_folder(profile, model_path: str | None = None):
    """What the model folder says (``arch.read_model_dir``), read where this process sees it:
    ``model_path`` (inside the container ``serve`` passes ``model.path``), default
    ``model.host_dir``; ``None`` when neither names a folder. A folder that is here is checked
    first (``folders.check_model_folder``: config.json and weights). Raises ``BadInput``
    (exit 2) for a folder without config.json or weights, or an unreadable config.json, each
    line naming the key (``model.path`` or ``model.host_dir``)."""
    from escha_deploy.sglang.arch import read_model_dir
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.facts.folders import check_model_folder

    field = "model.path" if model_path else "model.host_dir"
    path = model_path or profile.model.host_dir
    if path and os.path.isdir(path):  # never raises (Path.is_dir does for a name too long)
        problems = check_model_folder(path, field)
        if problems:
            raise BadInput(*problems)
        from escha_deploy.facts.folders import shard_problems
        from escha_deploy.utils.errors import Refused

        missing = shard_problems(path, field)
        if missing:
            raise Refused(*missing, hint="fetch those files again whole (`escha-deploy model pull PROFILE` "
                          "resumes), then `escha-deploy model adopt FOLDER` checks and pins a folder")
    return read_folder_facts(field, read_model_dir, path) if path else None


def l3_dir_problems(profile, l3_path: str | None = None, *, mla: bool = False):
    """The file L3 directory where the server runs (``folders.read_l3_dir``): ``(problems,
    reading)``, its refusals (missing, not a folder, not writable, its files unreadable; empty:
    fine) and its filesystem and the store's own files (for the plan, which weighs them against
    the tier's need), read at ``l3_path`` (the container's mount point in the container), default
    ``hicache.l3.dir``; ``None`` when the profile has no file L3 directory (not checked).
    ``mla``: the model's KV is rank-replicated (the model folder's ``kv_rank_replicated``)."""
    from escha_deploy.facts.folders import read_l3_dir

    l3 = profile.hicache.storage_dir if profile.hicache.storage_backend_is_file else None
    if not l3:
        return None
    return read_l3_dir(l3_path or l3, tp_size=profile.runtime.tp_size, mla=mla)
