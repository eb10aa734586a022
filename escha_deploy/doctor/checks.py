"""The checks: pure functions from ``DoctorFacts`` (and a profile's needs) to ``Check`` rows.

No I/O here, so every check is tested as a table of facts in, status and fix out. Thresholds
and where they come from:

- page cache below 2 GiB warns: the safety policy's page-cache floor (a box that swapped
  showed page cache at 589 MB).
- swap in use above 256 MiB warns: the seed's failure was a swap storm; a little swap in use is
  normal on a long-running desktop.
- /dev/shm below 1 GiB warns: NCCL's SHM transport makes segments of ~9.6 MB each and Docker's
  64 MiB default fails at TP 2 (sglang#4259); SGLang's compose uses ``ipc: host``.
- VRAM at least 97 % of the profile's ``gpu_vram``: NVML's ``memory.total`` of a card reads a
  little under its marketed size (e.g. 16,303 MiB on a 16 GiB card).
"""

from __future__ import annotations

from dataclasses import dataclass

from escha_deploy.utils.units import GiB, MiB, fmt_gb, fmt_gib, fmt_mib

from escha_deploy.facts.gpu_rules import gpu_compat, peer_access, tp_gpu_indices

from .facts import DoctorFacts
from .report import Check, fail, ok, unknown, warn

#: The page-cache floor of the default safety policy (``profile.Safety.page_cache_floor``);
#: with ``--profile`` doctor uses that profile's ``safety.page_cache_floor`` instead.
PAGE_CACHE_FLOOR_BYTES = 2 * GiB
SWAP_WARN_BYTES = 256 * MiB
SHM_WARN_BYTES = 1 * GiB
VRAM_TOLERANCE = 0.97


@dataclass(frozen=True)
class ProfileNeeds:
    """What a profile needs of the box, taken from the profile and its plan.

    ``gpu_vram_bytes`` per GPU (profile ``hardware.gpu_vram``); ``pinned_per_rank_bytes`` the
    plan's per-rank host pools (``plan.per_rank.pinned_bytes``), ``None`` when not planned.
    ``ref``: the profile as the user named it (a name or a path), for hints that run as printed;
    ``page_cache_floor_bytes``: the profile's ``safety.page_cache_floor`` (bytes).
    """

    name: str
    gpu_count: int
    gpu_vram_bytes: int
    gpu_name: str
    tp_size: int
    hicache_enabled: bool
    pinned_per_rank_bytes: int | None = None
    plan_problems: tuple[str, ...] = ()
    ref: str = ""
    page_cache_floor_bytes: int = PAGE_CACHE_FLOOR_BYTES
    compute_capability: str | None = None
    gpu_ids: tuple[int, ...] | None = None
    #: Each per-rank host buffer the plan requests (``plan.per_rank.host_buffers``), bytes: the
    #: pinned ladder also pins each alone and reports what the kernel pinned for it.
    pinned_buffer_bytes: tuple[int, ...] = ()
    #: One KV page per rank (page_size x device bytes per token): the restore probe's small copy.
    kv_page_bytes: int | None = None
    #: What the plan commits on the host, all ranks (bytes): the pinned pools, the server
    #: processes, the OS reserve and an L3 store's memory (``planner.result.Budget``); the page
    #: cache floor is left out (it can be dropped). None when not planned.
    commit_bytes: int | None = None

    @property
    def profile_arg(self) -> str:
        """``--profile REF`` as a shell word, for hints."""
        import shlex

        return shlex.quote(self.ref or self.name)


def _gib(n: int | None) -> str:
    return "unknown" if n is None else fmt_gib(n)


def check_platform(f: DoctorFacts) -> Check:
    where = "in a container" if f.in_container else "on the host"
    kernel = f.wsl.osrelease or "unknown kernel"
    if f.platform != "wsl2":
        return ok("platform", f"Linux ({kernel}), {where}")
    parts = [f"WSL2 ({kernel}), {where}"]
    parts.append("GPU-PV /dev/dxg present" if f.wsl.dxg else "no /dev/dxg")
    if f.docker.reachable and f.docker.kind:
        parts.append("Docker Desktop" if f.docker.kind == "docker-desktop" else "Docker engine in the distro")
    # NAT (WSL's default) is fine for one box; a node of a multi-node instance needs mirrored
    # networking (learn.microsoft.com/windows/wsl/networking), which `fleet plan` checks
    parts.append(f"networking {f.wsl_networking_mode}" if f.wsl_networking_mode
                 else "networking mode unknown (no wslinfo)")
    detail = "; ".join(parts)
    if not f.wsl.dxg:
        fix = ("start the container with --gpus all (WSL2 passes GPUs only as 'all')" if f.in_container
               else "update WSL (wsl --update) and the Windows NVIDIA driver; gpuSupport must not be off in .wslconfig")
        return warn("platform", detail, fix)
    return ok("platform", detail)


def check_memory(f: DoctorFacts, page_cache_floor: int = PAGE_CACHE_FLOOR_BYTES) -> list[Check]:
    """MemTotal/MemAvailable, swap, the page cache against ``page_cache_floor`` (bytes: the
    profile's ``safety.page_cache_floor``, or the default policy's), huge pages."""
    if f.memory is None:
        return [warn("host.memory", f"cannot read memory: {f.memory_error}",
                     "run doctor where /proc/meminfo is readable")]
    m = f.memory
    limit = f"; cgroup limit {_gib(m.cgroup_limit_bytes)}" if m.cgroup_limit_bytes is not None else ""
    rows = [ok("host.memory", f"MemTotal {_gib(m.mem_total_bytes)}, MemAvailable "
               f"{_gib(m.mem_available_bytes)}{limit}")]
    if m.cgroup_limit_bytes is not None and m.cgroup_limit_bytes < m.mem_total_bytes:
        rows[0] = ok("host.memory", rows[0].detail + " (the server can have the cgroup limit, not MemTotal)")
    if m.swap_total_bytes == 0:
        rows.append(ok("host.swap", "no swap"))
    elif m.swap_used_bytes > SWAP_WARN_BYTES:
        rows.append(warn("host.swap", f"{_gib(m.swap_used_bytes)} of {_gib(m.swap_total_bytes)} swap in use",
                         "close memory-hungry programs before starting: pinned pools plus swap made the seed's box thrash"))
    else:
        rows.append(ok("host.swap", f"{_gib(m.swap_used_bytes)} of {_gib(m.swap_total_bytes)} swap in use"))
    if m.page_cache_bytes is not None and m.page_cache_bytes < page_cache_floor:
        rows.append(warn("host.page_cache", f"page cache {_gib(m.page_cache_bytes)}, under the "
                         f"{_gib(page_cache_floor)} floor (safety.page_cache_floor)", "free memory first: the seed's swap storm began with page cache at 589 MB"))
    else:
        rows.append(ok("host.page_cache", f"page cache {_gib(m.page_cache_bytes)}"))
    if m.hugetlb_bytes > 0:
        size = "unknown size" if m.hugepage_size_bytes is None else fmt_mib(m.hugepage_size_bytes, 0)
        rows.append(warn("host.hugepages", f"{_gib(m.hugetlb_bytes)} reserved as huge pages ({m.hugepages_total} x "
                         f"{size}, {m.hugepages_free} free): the plan subtracts it from MemTotal, since the host "
                         "pools cannot use huge pages",
                         "lower vm.nr_hugepages (sysctl) unless a program here uses huge pages"))
    else:
        rows.append(ok("host.hugepages", "no huge pages reserved"))
    return rows


def check_memlock(f: DoctorFacts) -> Check:
    if f.memlock is None:
        return warn("host.memlock", f"cannot read the memlock limit: {f.memlock_error}",
                    "check `ulimit -l`; set memlock to unlimited")
    soft, _hard = f.memlock
    daemon = f.memlock_probe
    if daemon is not None and daemon.ok is False:  # the usual advice cannot work: say what does
        from escha_deploy.launch.docker import MEMLOCK_DAEMON_FIX

        what = "unlimited" if soft is None else f"{soft:,} B"
        return warn("host.memlock", f"locked-memory limit {what} here; containers cannot get more: the Docker "
                    "daemon cannot raise memlock (docker.memlock)", MEMLOCK_DAEMON_FIX)
    if soft is None:
        note = " (on WSL2 this does not lift the pinned ceiling; the probe measures it)" if f.platform == "wsl2" else ""
        return ok("host.memlock", f"locked-memory limit unlimited{note}")
    fix = "run with --ulimit memlock=-1 (compose: ulimits: memlock: -1), as SGLang's compose does"
    if f.platform == "wsl2":
        fix += ("; under WSL2 this does not lift the pinned ceiling (microsoft/WSL#8447): the probe measures "
                "that ceiling and the plan sizes the pools under it")
    return warn("host.memlock", f"locked-memory limit {soft:,} B", fix)


def check_daemon_memlock(f: DoctorFacts) -> list[Check]:
    """Whether the Docker daemon can start a container with ``--ulimit memlock=-1``, as the
    probe saw it (``hostinfo.probe_memlock``); no row when it was not asked."""
    p = f.memlock_probe
    if p is None:
        return []
    if p.ok is None:
        # the probe needs the daemon first, then an image on it: the fix is the step missing
        fix = ("see docker.daemon: the probe runs once the daemon answers" if not f.docker.reachable
               else "build or load the image (`escha-deploy build --hicache`), then rerun `escha-deploy doctor`")
        return [warn("docker.memlock", f"not run: {p.not_run}", fix)]
    if p.ok:
        return [ok("docker.memlock", f"a container of {p.image} starts with --ulimit memlock=-1")]
    from escha_deploy.launch.docker import MEMLOCK_DAEMON_FIX, memlock_refusal_line

    return [fail("docker.memlock", memlock_refusal_line(p.image, p.error), MEMLOCK_DAEMON_FIX)]


#: How far MemTotal may sit below ``memory=`` of .wslconfig and still be that setting in effect
#: (the kernel keeps some memory for itself: 16 GiB gives a MemTotal of about 15.6 GiB).
WSLCONFIG_TOLERANCE = 0.10


def check_wslconfig(f: DoctorFacts) -> list[Check]:
    """Each .wslconfig this WSL2 VM can read: ignored by WSL (UTF-16 or a byte-order mark:
    microsoft/WSL#7851, #5383), or a ``memory=`` this VM's MemTotal does not reflect (not
    applied yet: `wsl --shutdown`; or set outside ``[wsl2]``)."""
    rows = []
    total = f.memory.mem_total_bytes if f.memory else None
    for w in f.wslconfig:
        if w.encoding_problem:
            rows.append(warn("wsl.wslconfig", f"{w.path} is {w.encoding_problem}: WSL reads .wslconfig as UTF-8 "
                             "without a byte-order mark and ignores this file (microsoft/WSL#7851, #5383), so "
                             "none of its settings apply" + (f" (memory={w.memory_text})" if w.memory_text else ""),
                             "save it as UTF-8 without a BOM (Notepad: Save as > Encoding 'UTF-8', not 'UTF-8 with "
                             "BOM' or 'Unicode'), then `wsl --shutdown`"))
        elif w.error:
            rows.append(warn("wsl.wslconfig", f"{w.path} does not parse as an INI file: {w.error}",
                             "fix the file (sections such as [wsl2], key=value lines), then `wsl --shutdown`"))
        elif w.memory_bytes and total and abs(total - w.memory_bytes) > WSLCONFIG_TOLERANCE * w.memory_bytes:
            rows.append(warn("wsl.wslconfig", f"{w.path} sets memory={w.memory_text} ({_gib(w.memory_bytes)}) but "
                             f"this VM has MemTotal {_gib(total)}: the setting is not in effect",
                             "run `wsl --shutdown` from Windows after editing .wslconfig, and keep memory= under "
                             "[wsl2]; the plan uses the MemTotal the VM has"))
        elif w.memory_bytes:
            rows.append(ok("wsl.wslconfig", f"{w.path}: memory={w.memory_text}, MemTotal "
                           f"{_gib(total) if total else 'unknown'}"))
        else:
            rows.append(ok("wsl.wslconfig", f"{w.path}: no memory= under [wsl2] (WSL's default: half of "
                           "Windows' memory)"))
    return rows


def check_shm(f: DoctorFacts) -> Check:
    if f.shm_bytes is None:
        return warn("host.shm", "no /dev/shm", "NCCL needs shared memory: use --ipc=host or --shm-size=16g")
    if f.shm_bytes < SHM_WARN_BYTES:
        return warn("host.shm", f"/dev/shm is {_gib(f.shm_bytes)}",
                    "NCCL needs shared memory at TP 2: use --ipc=host or --shm-size=16g (sglang#4259)")
    return ok("host.shm", f"/dev/shm is {_gib(f.shm_bytes)}")


def check_docker(f: DoctorFacts) -> list[Check]:
    d = f.docker
    if not d.reachable:
        if f.in_container:
            return [warn("docker.daemon", f"not reachable from inside this container ({d.error})",
                         "`escha-deploy up` needs a reachable daemon (mount /var/run/docker.sock or set "
                         "DOCKER_HOST); inside the serving container this is expected: `serve` needs none")]
        if f.platform == "wsl2" and not f.wsl.docker_desktop_socket:
            fix = ("start dockerd in the distro, or turn on Docker Desktop > Settings > Resources > "
                   "WSL integration for this distro")
        else:
            fix = "start the daemon (systemctl start docker) or set DOCKER_HOST; `escha-deploy serve` runs without Docker"
        return [warn("docker.daemon", f"daemon not reachable: {d.error}", fix)]
    what = "Docker Desktop" if d.kind == "docker-desktop" else f"Docker engine ({d.operating_system or 'unknown OS'})"
    kernel = "on a WSL2 kernel" if d.wsl_kernel else f"kernel {d.kernel_version or 'unknown'}"
    rows = [ok("docker.daemon", f"{what}, server {d.server_version or 'unknown'}, {kernel}")]
    if d.gpu_runtimes:
        rows.append(ok("docker.gpu", "GPU runtime: " + ", ".join(d.gpu_runtimes)))
    else:
        fix = ("update Docker Desktop (GPU support needs the WSL2 backend and a current NVIDIA driver)"
               if d.kind == "docker-desktop" else
               "install nvidia-container-toolkit, then `nvidia-ctk runtime configure --runtime=docker` and restart dockerd")
        rows.append(warn("docker.gpu", "no nvidia runtime and no nvidia.com/gpu CDI device", fix))
    return rows


def _no_gpu_detail(f: DoctorFacts) -> str:
    return "no GPU: " + "; ".join(f.gpus.reasons or ["no source found one"])


NO_GPU_FIX = "install the NVIDIA driver (WSL2: the Windows driver only) and `pip install '.[gpu]'` from the escha-deploy checkout"


def check_gpus(f: DoctorFacts) -> list[Check]:
    g = f.gpus
    if g.count == 0:
        return [warn("gpu.inventory", _no_gpu_detail(f), NO_GPU_FIX)]
    names: dict[str, int] = {}
    for gpu in g.gpus:
        key = f"{gpu.label} {_gib(gpu.memory_total_bytes)} cc {gpu.compute_capability or '?'}"
        names[key] = names.get(key, 0) + 1
    gpus = ", ".join(f"{n} x {k}" for k, n in names.items())
    rows = [ok("gpu.inventory", f"{gpus}; driver {g.driver_version or '?'}, NCCL {g.nccl_version or 'unknown'} "
               f"(via {g.source})")]
    pairs = g.p2p_pairs
    if pairs:
        p2p = ", ".join(f"{pair}: {status}" for pair, status in pairs.items())
        topo = ", ".join(f"{pair}: {level}" for pair, level in g.topology_pairs.items())
        rows.append(ok("gpu.p2p", f"NVML P2P read status {p2p}" + (f"; topology {topo}" if topo else "")))
    if g.count >= 2:
        pa = peer_access(g, range(g.count), f.platform)
        if pa.proven:
            rows.append(ok("gpu.peer_access", f"peer access between all GPUs: {pa.detail}"))
        else:
            rows.append(warn("gpu.peer_access", f"no proven peer access: {pa.detail}",
                             "TP launches render --disable-custom-all-reduce"
                             + (" and NCCL_P2P_DISABLE=1" if pa.denied or f.platform == "wsl2" else "")
                             + " (custom all-reduce needs peer access: sgl-project/sglang#4814)"))
    return rows


def probes_unavailable_fix(need: ProfileNeeds | None = None) -> str:
    """The two ways out when the probes could not run in this Python: the extra that brings the
    torch the default SGLang release pins (its ``facts.yaml: pins.torch``, read from the wheel's
    ``Requires-Dist: torch==``), or the image, which has it; naming the profile's ``up`` command
    when there is one."""
    from escha_deploy.sglang.releases import load_release

    release = load_release()
    up = "up" if need is None else f"`escha-deploy up --profile {need.profile_arg}`"
    return ("install the probes' torch into this Python (`pip install '.[probes]'` from the escha-deploy checkout: "
            f"torch {release.pins.torch.value}, as SGLang {release.version} pins) and rerun doctor, or let {up} "
            "run the probes inside the server image (it does before a start without fresh findings)")


def _unavailable_rows(f: DoctorFacts) -> list[Check]:
    """One unknown row per probe that did not get an answer because the probes could not run."""
    p = f.probes
    why = f"not run: {p.unavailable}; unknown, not failed"
    rows = [] if p.store else [unknown("probe.store", why, probes_unavailable_fix())]
    if p.pinned is None:
        rows.append(unknown("probe.pinned", why, probes_unavailable_fix()))
    if f.gpus.count >= 2 and not p.nccl:
        rows.append(unknown("probe.nccl", why, probes_unavailable_fix()))
    return rows


def check_probes(f: DoctorFacts) -> list[Check]:
    p = f.probes
    if p.unavailable and not p.store and p.pinned is None:
        return _unavailable_rows(f)
    if not p.store and p.pinned is None:
        if f.gpus.count == 0:
            return [warn("probe.store", "not run: no GPU (see gpu.inventory)", NO_GPU_FIX)]
        return [warn("probe.store", f"not run: {p.skipped or 'probes skipped'}",
                     "run `escha-deploy doctor` without --no-probes")]
    rows = []
    if p.store:
        seen = ", ".join(f"{r.case} {'ok' if r.ok else 'failed'}" for r in p.store)
        attr = p.device_attributes.get("CanUseHostPointerForRegisteredMem")
        attr_text = f"; CanUseHostPointerForRegisteredMem={attr}" if attr is not None else ""
        detail = f"{seen}{attr_text} ({p.source})"
        if p.host_allocator == "register":
            rows.append(ok("probe.store", f"host allocator register: {detail}"))
        elif p.host_allocator == "pinned":
            rows.append(warn("probe.store", f"host allocator pinned: {detail}",
                             "kernels cannot store into registered memory here (sglang#40232): use the patched "
                             "image, which sets ESCHA_HICACHE_HOST_ALLOCATOR=pinned"))
        else:
            rows.append(fail("probe.store", f"no host memory takes kernel stores: {detail}",
                             "HiCache cannot run here: disable it (hicache.enabled: false)"))
    c = p.pinned
    if c is not None:
        if c.reached:
            rows.append(warn("probe.pinned", f"pinning ({c.allocator}) failed past {fmt_gb(c.largest_bytes)} "
                             f"per process: {c.error} ({p.source})",
                             "the plan caps each rank's host pools at this ceiling; lower hicache_ratio to fit"))
        elif c.timed_out:
            rows.append(warn("probe.pinned", f"ladder ({c.allocator}) stopped by its timeout at "
                             f"{fmt_gb(c.largest_bytes)} of {fmt_gb(c.target_bytes)}",
                             "rerun doctor on an idle machine; the ceiling stays unmeasured"))
        else:
            rows.append(ok("probe.pinned", f"pinned {fmt_gb(c.largest_bytes)} ({c.allocator}) per process "
                           f"without a failure ({p.source})"))
        rows += check_pinned_buffers(c, p.source)
    rows += check_restore(p)
    if p.unavailable:
        rows += [r for r in _unavailable_rows(f) if r.id != "probe.nccl"]
    return rows


#: A buffer's pinned reading (the MemAvailable drop) may exceed its request by this share or
#: ``PINNED_READING_SLACK_BYTES``, whichever is larger: the reading's noise (about 2% of a GiB on
#: an H200 machine) and the kernel's page rounding, well below the 1.25-2x a power-of-two
#: allocator would pin.
PINNED_READING_TOLERANCE = 0.03
PINNED_READING_SLACK_BYTES = 32 * MiB


def check_pinned_buffers(c, source: str) -> list[Check]:
    """``probe.pinned_buffers``: what the kernel pinned (MemAvailable drop) for each of the
    plan's buffer sizes, pinned alone after the ladder (``pinned_ceiling --buffers``)."""
    readings = c.extra.get("buffers") or []
    if not readings:
        return []
    parts, over = [], []
    for r in readings:
        req, got = int(r["request"]), r.get("pinned")
        if got is None:
            parts.append(f"a request of {fmt_gb(req)} failed: {r.get('error')}")
            over.append(r)
            continue
        parts.append(f"pinned {fmt_gb(int(got))} for a request of {fmt_gb(req)}")
        if got > req + max(PINNED_READING_TOLERANCE * req, PINNED_READING_SLACK_BYTES):
            over.append(r)
    detail = f"{'; '.join(parts)} ({c.allocator}, MemAvailable drop; {source})"
    if over:
        return [warn("probe.pinned_buffers", detail,
                     "the allocator pins more than the plan counts: the plan's pinned totals are too low here; "
                     "lower hicache_ratio until the pinned figures fit the budget")]
    return [ok("probe.pinned_buffers", detail)]


def check_restore(p) -> list[Check]:
    """``probe.restore``: the host <-> device bandwidth of a host-tier hit (``restore_probe``)."""
    r = p.restore
    if r is None:
        if p.restore_error:
            return [warn("probe.restore", f"restore bandwidth not measured: {p.restore_error}",
                         "plan shows host_hit_cost as not measured; rerun `escha-deploy doctor` on an idle GPU")]
        return []
    page = (f"; one page ({r.page_bytes:,} B): load {r.page_load_gbps} GB/s, backup {r.page_backup_gbps} GB/s"
            if r.page_bytes and r.page_load_gbps else "")
    return [ok("probe.restore", f"load (host -> device) {r.load_gbps} GB/s, backup {r.backup_gbps} GB/s at "
               f"{fmt_gib(r.bytes)}{page}; {r.method} ({p.source})")]


def check_nccl(f: DoctorFacts) -> list[Check]:
    if not f.probes.nccl:
        if f.probes.unavailable and (f.probes.store or f.probes.pinned is not None):
            return [r for r in _unavailable_rows(f) if r.id == "probe.nccl"]
        return []
    last = f.probes.nccl[-1]
    env = " ".join(f"{k}={v}" for k, v in last.get("env", {}).items()) or "default NCCL environment"
    if last.get("ok"):
        return [ok("probe.nccl", f"all-reduce over {last['world_size']} GPUs correct in {last['seconds']} s "
                   f"with {env} ({len(f.probes.nccl)} attempt(s))")]
    return [fail("probe.nccl", f"all-reduce over {last['world_size']} GPUs failed with {env}: {last.get('error')}",
                 "raise /dev/shm (--ipc=host), then try NCCL_SHM_DISABLE=1; rerun with NCCL_DEBUG=INFO to see transports")]


def check_kernel_log(f: DoctorFacts) -> list[Check]:
    """The GPU's lines in the kernel log (``gpu.kernel_log``), read through the diagnosis
    table's device rows (launch/diagnose.py: gpu-lost, wsl2-gpu-resident): a GPU lost from the
    bus or a GSP timeout is the card, its power or its link, not the configuration; nothing when
    the log could not be read (the reason is shown)."""
    from escha_deploy.launch.diagnose import Facts, diagnose

    if not f.kernel_log:
        return []
    if f.kernel_log.startswith(("the kernel log could not", "not read")):
        return [unknown("gpu.kernel_log", f.kernel_log, "run `escha-deploy doctor` as root, or read "
                        "`dmesg | grep -i xid` yourself")]
    found = [m for m in diagnose(f.kernel_gpu_lines, Facts(platform=f.platform)).matches if m.kind == "device"]
    if not found:
        return [ok("gpu.kernel_log", f"no GPU error in the kernel log ({f.kernel_log})")]
    return [warn("gpu.kernel_log", f"{m.explanation}; the kernel log ({f.kernel_log}) has: {m.line}", m.fix)
            for m in found]


def host_checks(f: DoctorFacts, page_cache_floor: int = PAGE_CACHE_FLOOR_BYTES) -> list[Check]:
    """The checks that need no profile, in report order (``page_cache_floor``: bytes, the
    profile's safety policy when one was given)."""
    return [check_platform(f), *check_memory(f, page_cache_floor), check_memlock(f), check_shm(f), *check_docker(f),
            *check_daemon_memlock(f), *check_wslconfig(f),
            *check_gpus(f), *check_kernel_log(f), *check_probes(f), *check_nccl(f)]


def check_wsl_commit(f: DoctorFacts, need: ProfileNeeds) -> list[Check]:
    """Under WSL2, each readable .wslconfig whose ``memory=`` is below what the plan commits on
    the host (``ProfileNeeds.commit_bytes``): the plan is made against the VM's MemTotal, and
    pinned pools are committed Windows memory the VM never gives back (microsoft/WSL#8447), so
    a ``memory=`` below the commit (one not in effect yet, or about to be applied by the next
    `wsl --shutdown`) leaves the server without room. A warning: MemTotal is what the VM has."""
    if f.platform != "wsl2" or not need.commit_bytes:
        return []
    rows = []
    for w in f.wslconfig:
        if w.encoding_problem or w.error or not w.memory_bytes:
            continue
        if need.commit_bytes > w.memory_bytes:
            rows.append(warn("profile.wsl_commit",
                             f"{need.name} commits {_gib(need.commit_bytes)} of host memory (pinned pools, server "
                             f"processes, OS reserve) and {w.path} allows the VM memory={w.memory_text} "
                             f"({_gib(w.memory_bytes)}): once that setting is in effect the plan does not fit",
                             f"raise memory= under [wsl2] in {w.path} and run `wsl --shutdown`, or lower "
                             f"hicache.hicache_ratio (`escha-deploy plan --profile {need.profile_arg}`)", profile=True))
        else:
            rows.append(ok("profile.wsl_commit", f"{need.name} commits {_gib(need.commit_bytes)}, within "
                           f"memory={w.memory_text} of {w.path}", profile=True))
    return rows


def profile_checks(f: DoctorFacts, need: ProfileNeeds) -> list[Check]:
    """Whether this box satisfies ``need``, check by check (``profile=True``: a fail exits 3)."""
    rows: list[Check] = [*check_wsl_commit(f, need)]
    if f.memlock_probe is not None and f.memlock_probe.ok is False:
        from escha_deploy.launch.docker import MEMLOCK_DAEMON_FIX

        rows.append(fail("profile.memlock", f"`up` sets --ulimit memlock=-1 for {need.name} (pinned host pools) "
                         "and this Docker daemon refuses it (docker.memlock); `up` refuses before creating",
                         MEMLOCK_DAEMON_FIX, profile=True))
    g = f.gpus
    want = max(need.gpu_count, need.tp_size)
    if g.count == 0:
        rows.append(fail("profile.gpus", f"{need.name} needs {want} x {need.gpu_name}; {_no_gpu_detail(f)}",
                         NO_GPU_FIX, profile=True))
    elif g.count < want:
        rows.append(fail("profile.gpus", f"{need.name} needs {want} GPUs (tp_size {need.tp_size}); found {g.count}",
                         f"run on a box with {want} GPUs or use a profile with runtime.tp_size {g.count}", profile=True))
    else:
        rows.append(ok("profile.gpus", f"{g.count} GPU(s) for tp_size {need.tp_size}", profile=True))
    if g.count:
        # NVML and nvidia-smi always give the memory; a record without it is not judged
        small = [gpu for gpu in g.gpus[:want] if gpu.memory_total_bytes is not None
                 and gpu.memory_total_bytes < VRAM_TOLERANCE * need.gpu_vram_bytes]
        if small:
            rows.append(fail("profile.vram", f"GPU {small[0].index} has {_gib(small[0].memory_total_bytes)}; "
                             f"{need.name} plans for {_gib(need.gpu_vram_bytes)} each",
                             "use a profile whose hardware.gpu_vram matches these cards", profile=True))
        else:
            rows.append(ok("profile.vram", f"each GPU has at least {_gib(need.gpu_vram_bytes)}", profile=True))
    p = f.probes
    not_run = f"not run: {p.unavailable}; unknown, not failed"
    if need.hicache_enabled:
        if p.unavailable and p.host_allocator is None:
            rows.append(unknown("profile.host_allocator", not_run, probes_unavailable_fix(need), profile=True))
        elif p.store:
            if p.host_allocator is None:
                rows.append(fail("profile.host_allocator", "no host memory takes kernel stores",
                                 "set hicache.enabled: false in the profile", profile=True))
            else:
                rows.append(ok("profile.host_allocator", f"HiCache host pools via {p.host_allocator}", profile=True))
        elif g.count:
            rows.append(warn("profile.host_allocator", f"store probe not run ({p.skipped or 'skipped'})",
                             f"run `escha-deploy doctor --profile {need.profile_arg}` without --no-probes", profile=True))
        c = p.pinned
        planned = need.pinned_per_rank_bytes
        if c is None and p.unavailable and planned is not None:
            rows.append(unknown("profile.pinned", f"planned {fmt_gb(planned)} pinned per rank; the ladder was "
                                f"{not_run}", probes_unavailable_fix(need), profile=True))
        elif c is not None and planned is not None and c.reached and c.largest_bytes < planned:
            rows.append(warn("profile.pinned", f"planned {fmt_gb(planned)} pinned per rank; pinning fails past "
                             f"{fmt_gb(c.largest_bytes)}", "the plan caps the host pools at the ceiling "
                             "(smaller HiCache); `escha-deploy plan` shows the ratio it picks", profile=True))
        elif c is not None and planned is not None and not c.reached and c.largest_bytes < planned:
            rows.append(warn("profile.pinned", f"planned {fmt_gb(planned)} pinned per rank; only "
                             f"{fmt_gb(c.largest_bytes)} was tried", "free memory and rerun doctor to measure the "
                             "ceiling up to the planned pool", profile=True))
        elif c is not None and planned is not None:
            rows.append(ok("profile.pinned", f"{fmt_gb(planned)} pinned per rank fits (pinned "
                           f"{fmt_gb(c.largest_bytes)} in one process)", profile=True))
    if want >= 2 and g.count >= want:
        if f.probes.nccl_ok is None and p.unavailable:
            rows.append(unknown("profile.nccl", f"all-reduce smoke test {not_run}", probes_unavailable_fix(need),
                                profile=True))
        elif f.probes.nccl_ok is None:
            rows.append(warn("profile.nccl", "all-reduce smoke test not run",
                             f"run `escha-deploy doctor --profile {need.profile_arg}` without --no-probes", profile=True))
        elif f.probes.nccl_ok:
            env = " ".join(f"{k}={v}" for k, v in f.probes.nccl[-1].get("env", {}).items()) or "default env"
            rows.append(ok("profile.nccl", f"all-reduce passed; launch with {env}", profile=True))
        else:
            rows.append(fail("profile.nccl", f"all-reduce failed: {f.probes.nccl[-1].get('error')}",
                             "see probe.nccl; TP across these GPUs will not start", profile=True))
    if g.count:
        ids = tp_gpu_indices(want, need.gpu_ids if need.gpu_ids is not None else "all")
        for r in gpu_compat(g, ids, profile_cc=need.compute_capability, image=f.kernel_archs,
                            nccl_version=g.nccl_version):
            if r.status == "ok":
                rows.append(ok(f"profile.{r.id}", r.detail, profile=True))
            else:
                rows.append((fail if r.status == "fail" else warn)(f"profile.{r.id}", r.detail, r.fix, profile=True))
    for problem in need.plan_problems:
        rows.append(fail("profile.plan", problem, f"`escha-deploy plan --profile {need.profile_arg}` explains the budget", profile=True))
    return rows
