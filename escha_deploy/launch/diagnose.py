"""Failure diagnosis: match a server log (and a few facts) to a cause, its evidence and a fix.

Pure: takes lines (str) and ``Facts`` (exit code, the cgroup's OOM-kill count, HiCache on,
platform, what the ready probe saw) and returns a ``Diagnosis``; printing and the exit code
are the caller's (``up``/``serve``: 4; ``escha-deploy diagnose``: 0 for a known cause, 5 when
nothing conclusive matched).

The known failures are one table, ``SIGNATURES``: each row is data (a regular expression over
one log line, or facts only; the cause; the fix; where the message comes from; which facts it
needs). Rows are grouped by kind (``KINDS``). ``source`` names the file and line of the format
string in the pinned wheel that prints the message (SGLang 0.5.19, transformers 5.12.1, torch
2.13), or, for kernel, CUDA and NCCL lines printed by native code, the public report a real
line was quoted from. ``sglang_advice`` says where the advice SGLang prints next to the message
is wrong for the cause. Rows with the same ``id`` are variants: the first whose ``when`` holds
is used. ``{1}``, ``{2}`` in cause and fix are the pattern's groups.

The matcher is linear in the log's size whatever the lines hold (a 64 MB line without a blank,
random bytes, a pattern's bait repeated): a pattern sees at most ``SCAN_HEAD`` characters from
the start of each line and ``SCAN_TAIL`` from its end (``scan_windows``); each row is first
looked for by a literal every match of its pattern contains (``needles``, derived from the
pattern by Python's own regex parser, so a row needs no extra field), searched with ``str.find``
over all the windows at once, and the pattern runs only on the windows that hold one; no
pattern backtracks over more than one window. Lines kept for printing (evidence, the tail) are
cut at ``SHOW_CHARS``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: How many of the server's last lines a diagnosis keeps and prints.
TAIL_LINES = 40
#: Evidence lines printed per match (the matched line and the lines after it).
EVIDENCE_LINES = 3
#: Characters of a line the patterns see: its first ``SCAN_HEAD`` and its last ``SCAN_TAIL``
#: (``scan_windows``). SGLang's and its libraries' messages start a line after a short prefix
#: (``[2026-11-29 16:20:00 TP0] ``); the longest row line in the wheels is under 400 characters.
SCAN_HEAD = 4096
SCAN_TAIL = 1024
#: How far into a ``server_args=`` line ``log_facts`` looks for enable_hierarchical_cache: the
#: whole ``resolved_dict()`` repr of SGLang 0.5.19's ServerArgs is about 12,000 characters.
SERVER_ARGS_SCAN = 65536
#: Longest line kept for printing (evidence and tail); the rest is counted, not shown.
SHOW_CHARS = 2000

Kind = Literal["killed", "host-memory", "gpu-memory", "device", "radix-cache", "arch", "collective", "cuda-graph",
               "model-folder", "startup", "launch", "event"]

KINDS: dict[str, str] = {
    "killed": "the process was killed by a signal (the kernel's OOM killer, docker kill, a supervisor)",
    "host-memory": "host memory: SGLang's own check, pinned or registered allocation failures",
    "gpu-memory": "GPU memory: the static pools, out-of-memory, illegal accesses",
    "device": "the GPU itself or its driver (an Xid in the kernel log, a GPU lost from the bus, WSL2's GPU "
              "paravirtualization): not a configuration problem",
    "radix-cache": "SGLang's prefix cache finding its own tree corrupt under load (eviction assertions)",
    "arch": "kernel image and GPU architecture mismatches",
    "collective": "collectives between the GPUs: NCCL transports, peer access, watchdog timeouts",
    "cuda-graph": "CUDA graph capture",
    "model-folder": "the model folder and its loader",
    "startup": "SGLang's own refusals at start, before a weight loads (argument resolution, model config); "
               "serve's pre-flight asks SGLang these first",
    "launch": "the server process and its environment (ports, proxies, dependencies, GPUs)",
    "event": "this tool's own observations (a container signal, the Docker daemon, the API key)",
}

_SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


class Facts(BaseModel):
    """What the caller knows besides the log: used by rows whose cause or advice depends on it.

    ``exit_code``: the server's exit status: negative is ``subprocess``'s "killed by signal N",
    129..192 is the shell's and Docker's 128 + N. ``oom_kill``: whether the server cgroup's
    ``memory.events`` ``oom_kill`` count rose while it ran (Docker reports that as
    ``State.OOMKilled``); ``None`` when nobody could read it. ``hicache_enabled`` and
    ``platform`` are ``None`` when unknown (a log read on its own): a row that depends on an
    unknown one is reported as unproven, with what would settle it (``SETTLE``).
    """

    model_config = ConfigDict(frozen=True)
    exit_code: int | None = Field(default=None, description="the server's exit code, if it exited")
    oom_kill: bool | None = Field(default=None, description="the cgroup's oom_kill count rose (None: unknown)")
    hicache_enabled: bool | None = Field(default=None, description="HiCache was on (None: unknown)")
    platform: Literal["linux", "wsl2"] | None = Field(default="linux", description="where the server ran "
                                                       "(None: unknown, as for a log read on its own)")
    pinned_total_bytes: int | None = Field(default=None, description="the plan's pinned host pools, all ranks")
    timed_out: bool = Field(default=False, description="the ready wait ran out of time")
    health_ok: bool | None = Field(default=None, description="/health answered 200 at the end")
    generate_ok: bool | None = Field(default=None, description="the tiny generate succeeded")
    daemon_gone: bool = Field(default=False, description="the Docker daemon went away during the wait")
    http_status: int | None = Field(default=None, description="the status the server answered the probe with")
    launch: frozenset[str] | None = Field(default=None, description="what the rendered launch already sets "
                                          "(``launch_settings``): its argv flags, its environment as NAME and "
                                          "NAME=VALUE, its container settings (ipc=host, memlock=-1); None: "
                                          "unknown (a log read on its own)")
    register_buffer: tuple[str, int] | None = Field(default=None, description="the plan's largest host buffer "
                                                    "on the cudaHostRegister path, per rank: (name, bytes)")
    host_map_failed: bool = Field(default=False, description="the log (or the kernel log read with it) holds the "
                                  "driver's 'Cannot map memory' line: host memory ran short for a registration")
    tp_size: int | None = Field(default=None, description="the launch's tensor-parallel size (None: unknown; a "
                                "log's `server_args=` line shows it)")

    @property
    def signal(self) -> int | None:
        """The signal that ended the server, from ``exit_code`` (None: it exited by itself)."""
        c = self.exit_code
        if c is None:
            return None
        if c < 0:
            return -c
        if 128 < c <= 128 + 64:
            return c - 128
        return None


class Match(BaseModel):
    """One recognised cause: which row, the evidence, what it means, the fix, and whether the
    evidence proves it (``conclusive``)."""

    model_config = ConfigDict(frozen=True)
    id: str
    kind: str = ""
    line: str | None = Field(description="the first log line that matched (None for fact-only rows)")
    evidence: list[str] = Field(default_factory=list, description="the matched line and the lines after it, "
                                "or the facts that decided")
    explanation: str
    fix: str
    source: str = Field(description="the wheel file:line that prints the message, or the public report")
    sglang_advice: str = ""
    conclusive: bool = True


class Diagnosis(BaseModel):
    """The result: matches (log order: ``order_matches``), the log tail, and the server's exit
    code."""

    model_config = ConfigDict(frozen=True)
    exit_code: int | None
    timed_out: bool
    matches: list[Match]
    tail: list[str]

    @property
    def conclusive(self) -> bool:
        """True when at least one match proves its cause."""
        return any(m.conclusive for m in self.matches)

    def lines(self, *, tail: bool = True, source: str | None = None) -> list[str]:
        """Human lines for stderr: the tail (optional), then cause, evidence and fix per match.

        ``source``: what was read, in words (``"12 lines of server.log"``); it becomes the first
        line, ``diagnose: read 12 lines of server.log``, and stands in for the head line when
        the server's end (exit code, timeout) is unknown."""
        out = [f"--- last {len(self.tail)} server log lines ---", *self.tail, "---"] if tail else []
        if source is not None:
            out.append(f"diagnose: read {source}")
        if self.timed_out:
            head = "server did not become ready in time"
        elif self.exit_code is None:
            head = None if source is not None else "a log on its own (no exit code)"
        else:
            sig = Facts(exit_code=self.exit_code).signal
            head = f"server exited with code {self.exit_code}" + (
                f" (signal {sig}, {_SIGNAL_NAMES.get(sig, 'signal')})" if sig else "")
        if head is not None:
            out.append(f"diagnosis: {head}")
        if not self.matches:
            out.append("  no known signature in the log" + ("; read the lines above" if tail else ""))
        for m in self.matches:
            unproven = "" if m.conclusive or "unproven" in m.explanation else " (unproven)"
            out.append(f"  [{m.id}] {m.explanation}{unproven}")
            for ev in m.evidence:
                out.append(f"    evidence: {ev}")
            out.append(f"    fix: {m.fix}")
            if m.sglang_advice:
                out.append(f"    note: {m.sglang_advice}")
            out.append(f"    see: {m.source}")
        return out


@dataclass(frozen=True)
class Signature:
    """One row of the table. ``pattern``: a regex searched in each line's windows
    (``scan_windows``; None: facts only); write it so that it cannot backtrack over a window
    (start an unanchored ``(\\S+) `` with ``(?<!\\S)``), and with a literal every match
    contains, which ``needles`` finds.
    ``when``: facts that must hold, ``{name: value}`` or ``{name: (v1, v2)}`` for one of;
    names are ``Facts`` fields or ``signal``. ``unless``: ids of rows above whose match already
    explains this one. ``fix_if_set``: ``(setting, fix)`` pairs: when the launch already has the
    setting (``Facts.launch``: a flag, NAME or NAME=VALUE of its environment, a container
    setting such as ``ipc=host``), that fix replaces ``fix``, so the advice never says to set
    what is set (``fix_for``). ``fix_if_key``: the same, ``(profile key, fix)``, for a setting
    that a profile key renders (its ``SGLangFlag`` metadata names the flag or variable).
    ``{p2p}``, ``{chunk}``, ``{alloc}``, ``{hicache}``, ``{radix}`` and ``{register}`` in a fix
    are filled from the facts (``_fills``)."""

    id: str
    kind: Kind
    pattern: str | None
    cause: str
    fix: str
    source: str
    when: dict[str, object] = field(default_factory=dict)
    sglang_advice: str = ""
    conclusive: bool = True
    unless: tuple[str, ...] = ()  # rows (ids) above that, when matched, explain this line better
    fix_if_set: tuple[tuple[str, str], ...] = ()
    fix_if_key: tuple[tuple[str, str], ...] = ()

    def holds(self, f: Facts) -> bool | None:
        """True when every ``when`` fact holds, False when one does not, None when none fails
        but one it needs is unknown (a ``SETTLE`` fact that is None)."""
        unknown = False
        for name, want in self.when.items():
            have = getattr(f, name)
            if have is None and name in SETTLE:
                unknown = True
                continue
            if isinstance(want, tuple):
                if have not in want:
                    return False
            elif have != want:
                return False
        return None if unknown else True

    def needs_unknown(self, f: Facts) -> list[str]:
        """The ``SETTLE`` facts this row needs that ``f`` does not know."""
        return [n for n in self.when if n in SETTLE and getattr(f, n) is None]


#: Facts a log read on its own may not know, and what would settle each.
SETTLE: dict[str, str] = {
    "hicache_enabled": "pass --hicache or --no-hicache, or include the log's `server_args=` startup line "
    "(it shows enable_hierarchical_cache)",
    "platform": "pass --wsl2 or --no-wsl2",
}


_PLAN = "`escha-deploy plan` prints the pinned total and the largest safe ratio"
#: P2P off in profile keys (what renders NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce)
_P2P_OFF = "{p2p}"


def _image_archs() -> str:
    """The architectures the pinned image's kernels were built for, in words (the catalog
    ``catalog/kernel-archs.json`` that ``scripts/gen_gpu_arch_fixture.py`` reads from the
    wheels), for advice that names them; empty when the catalog is not there."""
    import json
    from pathlib import Path

    try:
        data = json.loads((Path(__file__).resolve().parent.parent / "catalog" / "kernel-archs.json").read_text())
        parts = [f"{name} {w.get('version', '?')}: " + ", ".join(f"sm_{s}" for s in sorted(set(w.get("sass", []))))
                 for name, w in sorted(data.get("wheels", {}).items())]
    except (OSError, ValueError, AttributeError):
        return ""
    return "; the pinned image's kernels are built for " + "; ".join(parts) if parts else ""


_ARCHS = _image_archs()
#: cudaHostRegister's failure in 0.5.19's and 0.5.23's pool_host/common.py (_cuda_host_register):
#: ``cudaHostRegister failed (rc=RC, TEXT) at offset=O size=S (total=T, chunk_limit=C)``;
#: groups: rc, offset, size. The offset/size part is optional (older builds end after rc).
_HOST_REGISTER = r"cudaHostRegister failed \(rc=(\d+)(?:, [^)]*\))?(?: at offset=(\d+) size=(\d+))?"
#: What to do when the GPU is lost: not a configuration fix, and never a restart loop.
_GPU_LOST_FIX = (
    "nothing in the profile causes or fixes this, and restarting the server does not help (the card stays lost "
    "until the machine is powered off; do not loop restarts on it): power the machine off and on (a warm "
    "reboot often leaves the card lost), then check the card's power cables and PSU, reseat it, try another PCIe slot or "
    "PCIe Gen 3/4 in the firmware, update the motherboard firmware and the NVIDIA driver; `nvidia-smi -q` "
    "and `dmesg | grep -i xid` show whether it recurs, and capping clocks (`nvidia-smi -lgc`) or power "
    "(`nvidia-smi -pl`) tells a power fault from a failing card")
_WSLCONFIG = "under WSL2 raise memory= under [wsl2] in %UserProfile%\\.wslconfig and run `wsl --shutdown`"

SIGNATURES: tuple[Signature, ...] = (
    # --- killed --------------------------------------------------------------------------------
    Signature(
        "oom-killer", "killed", None,
        "the kernel's OOM killer killed the server (SIGKILL, and the cgroup's memory.events oom_kill "
        "count rose): host memory ran out; pinned HiCache pools cannot be swapped out, so everything "
        "else had to fit beside them",
        f"lower hicache.hicache_ratio ({_PLAN}), stop other memory users, or give the box more memory; "
        + _WSLCONFIG,
        "Linux Documentation/admin-guide/cgroup-v2.rst (memory.events oom_kill); Docker State.OOMKilled",
        when={"signal": 9, "oom_kill": True},
    ),
    Signature(
        "killed-sigkill", "killed", None,
        "killed by signal 9 (SIGKILL), out of memory likely but unproven: the OOM killer sends SIGKILL, "
        "but so do `docker kill` and supervisors, and the cgroup's oom_kill count was not read",
        "read the kernel log (`dmesg | grep -i 'killed process'`) or the cgroup's memory.events; if it was "
        f"memory, lower hicache.hicache_ratio ({_PLAN}); " + _WSLCONFIG,
        "wait(2) exit status (signal 9); Linux Documentation/admin-guide/cgroup-v2.rst (memory.events)",
        when={"signal": 9, "oom_kill": None}, conclusive=False,
    ),
    Signature(
        "killed-sigkill", "killed", None,
        "killed by signal 9 (SIGKILL), out of memory likely but unproven: the cgroup's oom_kill count did "
        "not rise, so this cgroup's OOM killer did not do it; the host's OOM killer outside the cgroup, "
        "`docker kill` or a supervisor may have",
        "read the kernel log (`dmesg | grep -i 'killed process'`); look for a `docker kill` or an "
        "orchestrator's restart",
        "wait(2) exit status (signal 9); Linux Documentation/admin-guide/cgroup-v2.rst (memory.events)",
        when={"signal": 9, "oom_kill": False}, conclusive=False,
    ),
    Signature(
        "killed-line", "killed",
        r"(?:^|: )(?:line \d+: +)?\d* ?Killed(?:\s+\S.*)?$",
        "the shell reports the server was killed by SIGKILL ('Killed'), out of memory likely but unproven",
        "read the kernel log (`dmesg | grep -i 'killed process'`) or the cgroup's memory.events; if it was "
        f"memory, lower hicache.hicache_ratio ({_PLAN}); " + _WSLCONFIG,
        "bash job status 'Killed'; quoted in https://github.com/sgl-project/sglang/issues/5096",
        when={"signal": None}, conclusive=False,
    ),
    Signature(
        "kernel-oom-line", "killed",
        r"[Oo]ut of memory: Killed process (\d+) \(([^)]+)\)",
        "the kernel log shows its OOM killer killed process {2} (pid {1}); if that was the server, host "
        "memory ran out (pinned pools cannot be swapped out)",
        f"check the pid is the server's; lower hicache.hicache_ratio ({_PLAN}); " + _WSLCONFIG,
        "kernel mm/oom_kill.c; quoted in https://github.com/equinor/ert/issues/7797",
        conclusive=False,
    ),
    Signature(
        "child-failed", "killed",
        r"Received sigquit from a child process\. It usually means the child failed\.",
        "SGLang's launcher saw one of its processes (a scheduler rank or the detokenizer) die; the cause "
        "is that process's first error above, or, with no traceback, a signal from outside",
        "read the first error of each TP rank above; with no traceback, check `dmesg` for the OOM killer",
        "sglang/srt/entrypoints/engine.py:1730",
        conclusive=False,
    ),
    Signature(
        "killed-by-signal", "event", None,
        "the server was stopped by a signal other than SIGKILL (SIGTERM: `docker stop`, `escha-deploy "
        "down`, a host shutdown, or an orchestrator)",
        "nothing to fix in the server if the stop was intended; otherwise find who stopped it (`docker events`)",
        "wait(2) exit status; Docker's exit code 128 + signal",
        when={"signal": (1, 2, 15)},
    ),
    # --- host memory ---------------------------------------------------------------------------
    Signature(
        "python-memory-error", "host-memory",
        r"^(?:\[[^\]]*\] )?MemoryError(?::.*)?$",
        "a Python process of the server ran out of host memory: an allocation failed inside the "
        "interpreter (the address-space limit, `ulimit -v`, or the memory the host had left was reached)",
        "check `ulimit -v` and the container's memory limit; free host memory or lower "
        f"hicache.hicache_ratio ({_PLAN}); " + _WSLCONFIG,
        "CPython Objects/exceptions.c (MemoryError), printed as the traceback's last line",
    ),
    Signature(
        "host-memory-check", "host-memory",
        r"Not enough host memory available\. Requesting ([\d.]+) GB but only have ([\d.]+) GB free",
        "SGLang's HiCache host-memory check refused a host pool: it asked for {1} GB and saw {2} GB free "
        "(MemAvailable minus a fixed 10 GiB reserve; under TP a later rank also subtracts the pools its "
        "peers already pinned, sglang#38156)",
        "lower hicache.hicache_ratio to the safe ratio `escha-deploy plan` prints, or run the "
        "Dockerfile.hicache image (capability hicache-host-reserve-env), or turn HiCache off",
        "sglang/srt/mem_cache/pool_host/base.py:178 (HostKVCache.__init__), "
        "sglang/srt/mem_cache/pool_host/mamba.py:102; sglang#38156",
        sglang_advice="SGLang says 'Please reduce the size of the hierarchical cache'; with TP its check counts "
        "the peers' pools twice and keeps a fixed 10 GiB, so the pool may fit the host: `escha-deploy plan` "
        "computes the real budget",
    ),
    Signature(
        "host-register-failed", "host-memory", _HOST_REGISTER,
        "cudaHostRegister refused to pin {3} bytes of a HiCache host pool in one call (CUDA error {1}). Besides "
        "a locked-memory limit (and, under WSL2, a pinned ceiling far below RAM whatever memlock says, "
        "microsoft/WSL#8447), one large call can fail by itself: a 32 GiB call failed with rc=1 while memlock "
        "was unlimited and a 4 KiB call at the same pointer worked (sglang PR #39744). SGLang registers in "
        "calls of at most SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB GiB (default 256; srt/environ.py, "
        "pool_host/common.py: _cuda_host_register), so a smaller buffer is one call",
        "{register}",
        "sglang/srt/mem_cache/pool_host/common.py:162; sglang PR #39744",
    ),
    Signature(
        "host-map-failed", "host-memory",
        r"Cannot map memory with base addr (0x[0-9a-fA-F]+) and size of (0x[0-9a-fA-F]+) pages",
        "the NVIDIA driver could not map {2} pages at {1} for cudaHostRegister: host memory ran short (sglang PR "
        "#26301: on a box low on free memory cudaHostRegister failed with cudaErrorInvalidValue and the kernel "
        "log showed this line); pinned HiCache pools must fit in memory the host has free",
        "{register}",
        "NVIDIA driver (nv_register_user_pages); quoted in https://github.com/sgl-project/sglang/pull/26301",
        unless=("host-register-failed",),
    ),
    Signature(
        "pinned-alloc-failed", "host-memory",
        r"CUDA error: out of memory",
        "a pinned host allocation (pin_memory, cudaHostAlloc) failed: under WSL2 the per-process pinned "
        "ceiling is about 0.5 to 4 GB whatever the RAM (microsoft/WSL#8447, #14078), so HiCache's host "
        "pools hit it long before the GPU is full",
        "`escha-deploy doctor` measures the ceiling and `plan` then sizes the pools under it; memlock "
        "does not lift it; lower hicache.hicache_ratio",
        "CUDA cudaErrorMemoryAllocation; quoted in https://github.com/microsoft/WSL/issues/8447",
        when={"platform": "wsl2"},
    ),
    Signature(
        "pinned-alloc-failed", "host-memory",
        r"CUDA error: out of memory",
        "a CUDA allocation failed with cudaErrorMemoryAllocation (a device allocation outside the caching "
        "allocator, or pinned host memory)",
        "check the device budget in `escha-deploy plan`; if HiCache is on, lower hicache.hicache_ratio",
        "CUDA cudaErrorMemoryAllocation; quoted in https://github.com/microsoft/WSL/issues/8447",
    ),
    # --- the GPU itself ------------------------------------------------------------------------
    Signature(
        "gpu-lost", "device",
        r"Xid \(PCI:([0-9A-Fa-f:.]+)\): 79\b",
        "the GPU at PCI {1} fell off the bus (Xid 79): the driver lost the device, and every CUDA call "
        "after it fails (\"unspecified launch failure\", \"GPU is lost\"). This is the card, its power or "
        "its PCIe link, not the launch configuration (NVIDIA/open-gpu-kernel-modules#1151, #1247: consumer "
        "Blackwell cards under LLM load)",
        _GPU_LOST_FIX,
        "NVIDIA driver (NVRM) Xid 79; quoted in https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1151",
    ),
    Signature(
        "gpu-lost", "device",
        r"Xid \(PCI:([0-9A-Fa-f:.]+)\): (119|120|154)\b",
        "the driver lost contact with the GPU at PCI {1} (Xid {2}: 119 is a GSP firmware RPC timeout, 120 a "
        "GSP error, 154 a recovery action that needs a GPU reset or a reboot): the device, its firmware or "
        "the driver failed, not the launch configuration",
        _GPU_LOST_FIX,
        "NVIDIA driver (NVRM) Xid 119/154; quoted in https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1045",
    ),
    Signature(
        "gpu-lost", "device",
        r"GPU has fallen off the bus|Unable to determine the device handle for GPU ?(\S*): GPU is lost",
        "the GPU fell off the bus: the driver lost the device, and every CUDA call after it fails; this is "
        "the card, its power or its PCIe link, not the launch configuration",
        _GPU_LOST_FIX,
        "NVIDIA driver (NVRM) and nvidia-smi; quoted in https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1151",
    ),
    Signature(
        "wsl2-gpu-resident", "device",
        r"dxgkio_make_resident: Ioctl failed: (-\d+)",
        "WSL2's GPU paravirtualization (dxgkrnl) refused to make GPU memory resident ({1}; -12 is ENOMEM) "
        "while nvidia-smi still shows memory free: the Windows side keeps a hidden share of each GPU, so "
        "the server's CUDA calls then fail with \"CUDA driver error: device not ready\" (microsoft/WSL#41176)",
        "leave more of each GPU to Windows: lower runtime.mem_fraction_static (0.88 to 0.80 removed it in "
        "microsoft/WSL#41176; `escha-deploy plan` under WSL2 lowers SGLang's default by "
        "safety.wsl2_mem_fraction_drop only when runtime.mem_fraction_static is unset); keep "
        "PYTORCH_CUDA_ALLOC_CONF free of expandable_segments:True under WSL2 (its VMM calls take the same "
        "path); a display on another GPU frees the hidden share",
        "WSL2 dxgkrnl (drivers/hv/dxgkrnl/ioctl.c); quoted in https://github.com/microsoft/WSL/issues/41176",
    ),
    Signature(
        "wsl2-gpu-resident", "device",
        r"CUDA driver error: device not ready",
        "under WSL2 \"device not ready\" is the GPU paravirtualization failing, not the card: dxgkrnl could "
        "not make memory resident (microsoft/WSL#41176), or Windows reset the GPU after one kernel ran past "
        "its TdrDelay (2 s by default)",
        "lower runtime.mem_fraction_static (0.88 to 0.80 removed it in microsoft/WSL#41176) and read "
        "`dmesg | grep dxgkio_make_resident`; for resets, raise TdrDelay under "
        "HKLM\\System\\CurrentControlSet\\Control\\GraphicsDrivers on Windows and reboot",
        "CUDA driver CUDA_ERROR_NOT_READY; quoted in https://github.com/microsoft/WSL/issues/41176",
        when={"platform": "wsl2"},
    ),
    # --- the prefix (radix) cache -----------------------------------------------------------------
    Signature(
        "radix-cache-assert", "radix-cache",
        r"evict leaf node invalid",
        "SGLang's mamba radix cache found a leaf it was evicting still locked (an assertion in "
        "mamba_radix_cache.py: _evict_leaf_node, called from evict_mamba): a hybrid model's cache under load, "
        "with HiCache on in sglang#21379. That class (MambaRadixCache) is what builds before 0.5.19 used; "
        "0.5.19 and 0.5.23 build the unified radix tree for hybrid models (mem_cache/registry.py, its "
        "unified radix cache factory), so this image runs an older SGLang",
        "run SGLang 0.5.19 or later (runtime.base_image, or runtime.sglang_version where the profile needs no "
        "patch series); {radix}",
        "sglang/srt/mem_cache/mamba_radix_cache.py:818 (_evict_leaf_node); sglang#21379",
    ),
    Signature(
        "radix-cache-assert", "radix-cache",
        r"parent does not have child key",
        "SGLang's radix cache found its own tree corrupt while deleting a leaf (an assertion in "
        "_delete_tombstone_leaf or _delete_leaf): a node sits under a key its parent does not have. With a "
        "page size above 1 a page-rounded match can leave an empty node (key ()) that eviction later trips "
        "on (sglang PR #28692), and a split node can keep a stale key (PR #36696). These messages come from "
        "the cache classes builds before 0.5.19 used for hybrid models (MambaRadixCache)",
        "run SGLang 0.5.19 or later (runtime.base_image, or runtime.sglang_version where the profile needs no "
        "patch series); {radix}",
        "sglang/srt/mem_cache/mamba_radix_cache.py:1366 (_delete_tombstone_leaf); sglang PR #36696, #28692",
    ),
    Signature(
        "radix-cache-assert", "radix-cache",
        r'unified_tree_core\.py", line \d+, in (_remove_leaf_from_parent|_should_cascade_evict_component)$',
        "SGLang's unified radix tree failed one of its own eviction assertions in {1} (a node missing under "
        "its parent's key, or a locked node chosen for eviction): the tree is corrupt, the same class of "
        "fault as sglang#21379 and PR #36696 in the older mamba radix cache; not memory, not the launch",
        "{radix}",
        "sglang/srt/mem_cache/unified_cache/unified_tree_core.py (_remove_leaf_from_parent: assert v == node; "
        "_should_cascade_evict_component: assert cd.lock_ref == 0), 0.5.19 and 0.5.23; sglang#21379",
    ),
    # --- GPU memory ----------------------------------------------------------------------------
    Signature(
        "static-budget-too-small", "gpu-memory",
        r"Not enough memory\. Please try to increase --mem-fraction-static",
        "after the weights, the static budget (VRAM x mem_fraction_static) has no room left for a KV pool",
        "more VRAM per rank (a higher tp_size), smaller weights (a lower-bit quantization), or raise "
        "runtime.mem_fraction_static only up to SGLang's default for the card (`escha-deploy plan` prints it)",
        "sglang/srt/model_executor/pool_configurator.py:83",
        sglang_advice="SGLang says 'Please try to increase --mem-fraction-static'; past its own default for "
        "the card that leaves no room for CUDA graphs and activations, and startup then fails in CUDA graph "
        "capture instead (the same cause as vllm-project/vllm PR #57595)",
    ),
    Signature(
        "cuda-out-of-memory", "gpu-memory",
        r"CUDA out of memory\. Tried to allocate|torch\.OutOfMemoryError",
        "the GPU ran out of memory (weights + KV pool + CUDA graphs + activations exceed a GPU)",
        "lower runtime.mem_fraction_static or runtime.cuda_graph_max_bs, or a shorter runtime.context_length; "
        "`escha-deploy plan` shows the device budget",
        "torch CUDACachingAllocator; quoted in https://github.com/sgl-project/sglang/issues/4730",
    ),
    Signature(
        "illegal-memory-access", "gpu-memory",
        r"an illegal memory access was encountered|cudaErrorIllegalAddress",
        "an illegal memory access with HiCache on WSL2: the GPU cannot use registered host pointers there "
        "(CanUseHostPointerForRegisteredMem = 0), so HiCache transfers into the cudaHostRegister pool fault "
        "(sglang#40232)",
        "use an image with capability hicache-host-allocator and ESCHA_HICACHE_HOST_ALLOCATOR=pinned "
        "(auto picks it on WSL2), or retry with HiCache off (--set hicache.enabled=false) to isolate",
        "CUDA cudaErrorIllegalAddress; quoted in https://github.com/sgl-project/sglang/issues/18785 (HiCache)",
        when={"hicache_enabled": True, "platform": "wsl2"},
        fix_if_set=(("ESCHA_HICACHE_HOST_ALLOCATOR=pinned",
                     "the launch already allocates the host pools with cudaHostAlloc, so registered memory is not "
                     "the cause: retry with HiCache off (--set hicache.enabled=false) to isolate, and report the "
                     "image's SGLang commit (`docker image inspect` label io.escha.sglang)"),),
    ),
    Signature(
        "illegal-memory-access", "gpu-memory",
        r"an illegal memory access was encountered|cudaErrorIllegalAddress",
        "an illegal memory access with HiCache on; the same load without HiCache is the test that "
        "isolates it (sglang#16771; stream-race fixes #20611, #36738)",
        "retry without HiCache (--set hicache.enabled=false) to isolate, and report the image's SGLang "
        "commit (`docker image inspect` label io.escha.sglang)",
        "CUDA cudaErrorIllegalAddress; quoted in https://github.com/sgl-project/sglang/issues/18785 (HiCache)",
        when={"hicache_enabled": True},
    ),
    Signature(
        "illegal-memory-access", "gpu-memory",
        r"an illegal memory access was encountered|cudaErrorIllegalAddress",
        "an illegal memory access in a CUDA kernel (HiCache is off, so not the host pool)",
        "rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; check the model and quantization",
        "CUDA cudaErrorIllegalAddress; quoted in https://github.com/sgl-project/sglang/issues/18785 (HiCache)",
        when={"hicache_enabled": False},
    ),
    # --- architecture ----------------------------------------------------------------------------
    Signature(
        "no-kernel-image", "arch",
        r"no kernel image is available for execution on the device",
        "a CUDA kernel in the image was not built for this GPU's architecture (for example sm_120 cards "
        "on a build without Blackwell kernels, or a TP pair of two architectures where one is missing)",
        "run an image whose torch and sgl-kernel include every GPU's compute capability (`escha-deploy "
        "doctor` lists them); do not mix architectures in one TP group",
        "CUDA cudaErrorNoKernelImageForDevice; quoted in https://github.com/pytorch/pytorch/issues/149845",
        sglang_advice="the printed 'For debugging consider passing CUDA_LAUNCH_BLOCKING=1' does not help "
        "here: no kernel of that build can run on this GPU",
    ),
    Signature(
        "ptxas-arch-unknown", "arch",
        r"ptxas fatal\s*: Value '(sm_\d+[af]?)' is not defined for option 'gpu-name'",
        "the ptxas that compiles Triton's kernels does not know {1}: its CUDA toolkit (the one bundled with "
        "Triton, or the one TRITON_PTXAS_PATH names) is older than this GPU's architecture; CUDA graph capture "
        "compiles Triton kernels, so startup fails there. This is not memory: lowering mem_fraction_static or "
        "cuda_graph_max_bs does not help",
        "run an image whose Triton ships a ptxas that knows {1} (CUDA 12.8 or newer for sm_120, 12.9 for "
        "sm_121), or set TRITON_PTXAS_PATH to such a toolkit's bin/ptxas (triton-lang/triton#8539); "
        "`escha-deploy doctor` compares each GPU with the image's architectures" + _ARCHS,
        "ptxas (CUDA toolkit) via triton's PTXASError; quoted in https://github.com/triton-lang/triton/issues/8539 "
        "and https://github.com/gpustack/gpustack/issues/4372",
        sglang_advice="SGLang's capture error lists memory remedies (a smaller --mem-fraction-static or "
        "--cuda-graph-max-bs); none of them changes the compiler",
    ),
    Signature(
        "torch-arch-unsupported", "arch",
        r"with CUDA capability sm_(\d+) is not compatible with the current PyTorch installation",
        "the image's torch has no kernels for compute capability sm_{1}",
        "use an image whose torch build lists sm_{1} (or a compatible major version) in "
        "torch.cuda.get_arch_list()",
        "torch/cuda/__init__.py:427 (_check_cubins)",
    ),
    Signature(
        "jit-toolkit-too-old", "arch",
        r"No supported CUDA architectures found for major versions \[([\d, ]+)\]",
        "FlashInfer's JIT kept none of the GPU's architectures of major version {1} to compile for: it reads the "
        "CUDA toolkit a JIT build uses (CUDA_HOME or CUDA_PATH, else the nvcc on PATH; flashinfer jit/cpp_ext.py: "
        "get_cuda_path) and drops an architecture that toolkit is too old for (SM 12.x needs CUDA 12.9 or newer, "
        "compilation_context.py), so a local nvcc 12.8 beside a cu130 torch kills init on sm_120 (vllm#50705, "
        "flashinfer#2577). Not the driver and not the image's kernels",
        "point CUDA_HOME (and PATH) at a CUDA 12.9 or newer toolkit, or take the older nvcc off PATH and unset "
        "CUDA_HOME so the JIT finds none older than the GPU; `nvcc --version` where the server runs says which one "
        "the JIT reads, and the first-use check (`escha-deploy runtime verify --first-use`, `up`) refuses it",
        "flashinfer/compilation_context.py (get_nvcc_flags_list); https://github.com/vllm-project/vllm/issues/50705; "
        "quoted in https://github.com/vllm-project/vllm/pull/31740",
    ),
    # --- collectives ---------------------------------------------------------------------------
    Signature(
        "nccl-shared-memory", "collective",
        r"Error while creating shared memory segment|failed to extend /dev/shm/nccl"
        r"|/dev/shm/nccl-\S.*(No space left|Bus error)|^Bus error",
        "NCCL could not create its shared-memory segment in /dev/shm (Docker's default is 64 MB; TP 2 "
        "needs more)",
        "run with ipc=host or shm_size of at least 16 GB (escha-deploy up sets ipc=host; a hand-written "
        "docker run needs --ipc=host --ulimit memlock=-1)",
        "NCCL shm transport; quoted in https://github.com/NVIDIA/nccl/issues/342",
        fix_if_set=(("ipc=host", "the container already shares the host's IPC namespace, so its /dev/shm is the "
                     "host's: `df -h /dev/shm` on the host, free it (stale nccl-* segments of a killed server) or "
                     "enlarge it (`mount -o remount,size=16G /dev/shm`); as a last resort NCCL_SHM_DISABLE=1"),),
    ),
    Signature(
        "peer-access", "collective",
        r"peer access is not supported between these two devices",
        "the GPUs have no CUDA peer access (consumer cards, WSL2), and custom all-reduce needs it",
        _P2P_OFF,
        "CUDA cudaErrorPeerAccessUnsupported; quoted in https://github.com/sgl-project/sglang/issues/4814",
    ),
    Signature(
        "nccl-unhandled-cuda", "collective",
        r"NCCL error.*unhandled cuda error|NCCL WARN Cuda failure",
        "NCCL failed on a CUDA call between the two GPUs (often peer-to-peer access the driver claims but "
        "cannot use, as under WSL2 and on many consumer boards)",
        f"{_P2P_OFF}; check `nvidia-smi topo -m`",
        "torch ProcessGroupNCCL; quoted in https://github.com/pytorch/pytorch/issues/111187 (WSL2, 2 GPUs)",
        unless=("peer-access",),
    ),
    Signature(
        "nccl-watchdog-timeout", "collective",
        r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=\d+, OpType=(\w+)",
        "a collective ({1}) between the ranks did not finish before torch's NCCL timeout: one rank hung or "
        "died, or the GPUs' peer-to-peer path claims to work but does not move data{divergence_cause}",
        "{divergence}" f"read every rank's first error; on consumer cards {_P2P_OFF}; "
        "`escha-deploy doctor --profile PROFILE` runs an all-reduce smoke test{hicache}",
        "torch ProcessGroupNCCL watchdog; quoted in https://github.com/hiyouga/LlamaFactory/issues/7396",
    ),
    Signature(
        "sglang-watchdog-timeout", "collective",
        r"(?<!\S)(\S+) watchdog timeout \(self\.watchdog_timeout=",
        "SGLang's {1} watchdog fired: one forward batch took longer than --watchdog-timeout (default 300 s), "
        "usually a hang in a collective or a kernel{divergence_cause}",
        "{divergence}" f"read the lines before it for the stuck rank; on consumer cards {_P2P_OFF}; "
        "`escha-deploy doctor --profile PROFILE` runs an all-reduce smoke test{hicache}",
        "sglang/srt/utils/watchdog.py:154",
    ),
    Signature(
        "nccl-duplicate-gpu", "collective",
        r"Duplicate GPU detected : rank (\d+) and rank (\d+) both on CUDA device (\w+)",
        "NCCL found two ranks ({1} and {2}) on one GPU (bus id {3}): the server sees fewer GPUs than its "
        "tp_size, or one GPU twice (`--gpus device=0`, `device_ids: [0, 0]`, CUDA_VISIBLE_DEVICES=0,0)",
        "give the server tp_size distinct GPUs (container.gpus, or a compose file's device_ids) and check "
        "CUDA_VISIBLE_DEVICES; `escha-deploy doctor --profile PROFILE` lists the GPUs it sees",
        "NCCL init.cc (ncclInvalidUsage); quoted in https://github.com/NVIDIA/Megatron-LM/issues/661",
    ),
    Signature(
        "dist-init-unreachable", "collective",
        r"The client socket has timed out after (\d+)m?s while trying to connect to \((.+), (\d+)\)",
        "this rank could not reach rank 0's --dist-init-addr {2}:{3} within {1} ms (torch.distributed's "
        "TCPStore rendezvous): rank 0 is not started, the address is wrong, a firewall drops port {3}, or a "
        "container without host networking cannot reach it",
        "start rank 0 first; open port {3} (and NCCL's and Gloo's ports) between the boxes; check rank 0's "
        "boxes.N.address in the fleet file (`escha-deploy fleet plan` prints it) and that every node runs "
        "with host networking (`fleet compose` renders network_mode: host)",
        "torch/csrc/distributed/c10d/socket.cpp (throwTimeoutError), reproduced here with torch 2.13's "
        "TCPStore; quoted in https://github.com/sgl-project/sglang/issues/2561",
    ),
    Signature(
        "dist-init-unreachable", "collective",
        r"TCP client failed to connect/validate to host (\S+):(\d+)",
        "this rank could not connect to rank 0's --dist-init-addr {1}:{2} (torch.distributed's TCPStore "
        "rendezvous)",
        "start rank 0 first; open port {2} (and NCCL's and Gloo's ports) between the boxes; check rank 0's "
        "boxes.N.address in the fleet file (`escha-deploy fleet plan` prints it)",
        "torch/csrc/distributed/c10d/TCPStore.cpp; quoted in https://github.com/sgl-project/sglang/issues/2561",
    ),
    Signature(
        "dist-init-unreachable", "collective",
        r"torch\.distributed\.DistNetworkError: (.*)",
        "this rank's torch.distributed rendezvous with rank 0's --dist-init-addr failed ({1})",
        "start rank 0 first; open the dist-init port (and NCCL's and Gloo's ports) between the boxes; check "
        "rank 0's boxes.N.address in the fleet file (`escha-deploy fleet plan` prints it)",
        "torch/distributed (DistNetworkError); quoted in https://github.com/sgl-project/sglang/issues/2561",
    ),
    # --- CUDA graphs ---------------------------------------------------------------------------
    Signature(
        "cuda-graph-capture", "cuda-graph",
        r"Capture cuda graph failed: (.*)",
        "CUDA graph capture failed at startup ({1}): after the static pools the GPU had too little left "
        "for the graphs and their activations, or a kernel in the graph failed",
        "lower runtime.mem_fraction_static toward SGLang's default or runtime.cuda_graph_max_bs "
        "(`escha-deploy plan` compares the room left with SGLang's estimate)",
        "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py:492",
        sglang_advice="SGLang's third suggestion, disabling decode CUDA graphs, costs much decode speed; "
        "lower the static fraction first",
        unless=("ptxas-arch-unknown",),
    ),
    # --- model folder --------------------------------------------------------------------------
    Signature(
        "model-file-missing", "model-folder",
        r"(?<!\S)(\S+) does not appear to have a file named (\S+?)\.? Checkout",
        "the model folder {1} has no {2}: the mount is empty, or it points one level above or below the "
        "folder that holds config.json and the weights",
        "`ls` the folder; point model.host_dir at the folder that holds config.json (often a "
        "snapshots/<hash> folder one level down)",
        "transformers/utils/hub.py:396 (cached_files)",
    ),
    # --- startup: SGLang's own refusals before a weight loads (serve's pre-flight sees them first)
    Signature(
        "context-length-too-long", "startup",
        r"context_length \((\d+)\) is greater than the derived context_length \((\d+)\)",
        "SGLang refused the context length: {1} tokens is more than the {2} the model's config.json allows",
        "set runtime.context_length to at most {2}, or runtime.allow_longer_context_length: true to pass SGLang's "
        "override (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN; SGLang warns of incorrect outputs past the trained "
        "length); `escha-deploy plan` checks this against the model folder",
        "sglang/srt/configs/model_config.py:871 (ModelConfig._derive_context_length)",
        fix_if_key=(("runtime.allow_longer_context_length", "the launch already passes SGLang's override, "
                     "which this server did not read (an image whose environment drops it?): set "
                     "runtime.context_length to at most {2}"),),
    ),
    Signature(
        "mamba-no-buffer-page", "startup",
        r"no_buffer only supports page_size=1",
        "SGLang refused the mamba radix cache strategy no_buffer with a page size above 1",
        "set runtime.mamba_radix_cache_strategy to extra_buffer or auto, or runtime.page_size: 1",
        "sglang/srt/arg_groups/mamba_hook.py:144 (validate_mamba_no_buffer)",
    ),
    Signature(
        "hicache-without-radix", "startup",
        r"enable-hierarchical-cache and disable-radix-cache are mutually exclusive",
        "SGLang refused HiCache without the radix cache (a flag or an attention backend turned the radix "
        "cache off)",
        "set runtime.disable_radix_cache: false, drop the extra_args item that disables it (dual-chunk "
        "attention does), or turn HiCache off (hicache.enabled: false)",
        "sglang/srt/arg_groups/kv_cache_hook.py:169 (handle_cache_compatibility)",
    ),
    Signature(
        "trtllm-fp8-sm120", "startup",
        r"TRTLLM FMHAv2 prefill on SM120 does not support",
        "SGLang refused the trtllm_mha attention backend: on sm_120 its FMHAv2 prefill does not take an "
        "fp8_e4m3 KV cache",
        "unset runtime.attention_backend (SGLang picks one for the card), or use another "
        "runtime.kv_cache.dtype",
        "sglang/srt/arg_groups/attention_hook.py:152 (handle_attention_backend_compatibility)",
    ),
    Signature(
        "mooncake-no-master", "startup",
        r"Either the environment variable 'MOONCAKE_MASTER' or 'MOONCAKE_CLIENT' is not set",
        "the Mooncake L3 store has no master: SGLang stops at start",
        "set hicache.l3: {kind: mooncake, master: HOST:PORT}",
        "sglang/srt/mem_cache/storage/mooncake_store/mooncake_store.py:180 (MooncakeStoreConfig.load_from_env)",
    ),
    Signature(
        "model-path-not-found", "model-folder",
        r"(?<!\S)(\S+) is not a local folder and is not a valid model identifier",
        "the model path {1} does not exist inside the server (the mount is missing or names another path)",
        "check model.host_dir on the host and model.path in the container (`escha-deploy up --dry-run` "
        "shows the mount)",
        "transformers/utils/hub.py:470 (cached_files)",
    ),
    Signature(
        "model-type-missing", "model-folder",
        r"Unrecognized model in (\S+?)\. ",
        "config.json in {1} has no model_type that transformers knows",
        "check that config.json is the model's own (not an adapter's or a tokenizer's)",
        "transformers/models/auto/configuration_auto.py:422 (AutoConfig.from_pretrained)",
    ),
    Signature(
        "model-arch-unknown", "model-folder",
        r"but Transformers does not recognize this architecture",
        "the server's transformers is older than the model's architecture",
        "run the image built for {pins}; do not upgrade SGLang's pins by hand",
        "transformers/models/auto/configuration_auto.py:411 (AutoConfig.from_pretrained)",
    ),
    Signature(
        "no-weights", "model-folder",
        r"Cannot find any model weights with `([^`]+)`",
        "SGLang found no weight files (*.safetensors, *.bin) in {1}",
        "put the weights in the folder model.host_dir names, or fix the path",
        "sglang/srt/model_loader/loader.py:527 (DefaultModelLoader._prepare_weights)",
    ),
    # --- launch --------------------------------------------------------------------------------
    Signature(
        "address-in-use", "launch",
        r"\[Errno 98\] (error while attempting to bind on address .*: )?[Aa]ddress already in use",
        "a port the server needs is already bound: the HTTP port or one of SGLang's internal ZMQ/NCCL ports "
        "next to it, often a stale server from a crash",
        "`escha-deploy down` (or stop the owner `ss -ltnp` names), then start again; or choose another "
        "container.port",
        "uvicorn bind error on CPython's OSError errno 98 (EADDRINUSE); vllm#9763, sglang#9396",
    ),
    Signature(
        "zmq-address-in-use", "launch",
        r"zmq\.error\.ZMQError: Address already in use(?: \(addr='([^']*)'\))?",
        "an internal ZMQ port SGLang binds next to the HTTP port ({1}) is already bound: usually a server "
        "still running, or the processes of one that crashed or was killed, on the same ports",
        "`escha-deploy down` (or stop the owner `ss -ltnp` names) and wait until its processes are gone, then "
        "start again; or choose another container.port (the internal ports follow it)",
        "pyzmq zmq/sugar/socket.py Socket.bind (ZMQError on EADDRINUSE); sglang/srt/utils/network.py "
        "get_zmq_socket (socket.bind of the internal endpoints); sglang#9396",
    ),
    Signature(
        "warmup-through-proxy", "launch",
        r"Initialization failed\. warmup error|<Response \[(502|403)\]>",
        "SGLang's startup warmup request failed; with --host 0.0.0.0 it goes to 0.0.0.0 and an http_proxy "
        "in the environment answers it with 502/403 (sglang#9814, #16855)",
        "set NO_PROXY/no_proxy=localhost,127.0.0.1,0.0.0.0,::1 (escha-deploy sets it in the container) "
        "or unset the proxy variables",
        "sglang/srt/entrypoints/http_server.py:2221 (_execute_server_warmup); sglang#9814",
        fix_if_set=(("NO_PROXY", "the launch already exempts the loopback names from the proxy, yet the warmup "
                     "got 502/403: unset http_proxy, https_proxy and all_proxy where `escha-deploy up` runs (the "
                     "container inherits them), or check for a proxy the image itself configures"),),
    ),
    Signature(
        "hicache-hash-extension", "launch",
        r"Failed to load HiCache native hash extension",
        "SGLang could not build or load its HiCache hash extension: with an L3 storage backend it compiles "
        "hash_binding.cpp on first use (mem_cache/cpp_utils/native_hash.py: _load_native_hash_module, through "
        "torch.utils.cpp_extension.load), which needs a C++ compiler, OpenSSL's <openssl/sha.h> and libcrypto "
        "(-lcrypto), and a writable torch extensions folder (TORCH_EXTENSIONS_DIR, default "
        "~/.cache/torch_extensions). Startup and health checks pass; the scheduler dies on the first request "
        "long enough to reach the store (Tanguille/cluster PR #4213)",
        "run an image that has them: Dockerfile.hicache installs libssl-dev (as SGLang's own runtime image "
        "does since sglang PR #31064), and `escha-deploy runtime verify` in the image and `up`'s first-use "
        "check build the extension before the server starts; or turn the L3 store off (hicache.l3.kind: none)",
        "sglang/srt/mem_cache/cpp_utils/native_hash.py:42 (_load_native_hash_module); "
        "https://github.com/Tanguille/cluster/pull/4213",
    ),
    Signature(
        "jit-cache-not-writable", "launch",
        r"(?:Read-only file system|Permission denied): '([^']*flashinfer_cubin[^']*)'",
        "FlashInfer could not write {1}: its kernels for this GPU are not in the image's installed "
        "flashinfer_cubin package, so it fetches or builds them into that package's own folder, which the "
        "server's user cannot write (flashinfer-ai/flashinfer#2834; ai-dynamo/dynamo PR #11154 on sm120)",
        "run an image whose flashinfer-cubin (or flashinfer-jit-cache) package has this GPU's architecture, or "
        "whose server user owns that folder; `escha-deploy doctor` lists the GPUs' architectures",
        "CPython OSError errno 13/30; quoted in https://github.com/flashinfer-ai/flashinfer/issues/2834 and "
        "https://github.com/ai-dynamo/dynamo/pull/11154",
    ),
    Signature(
        "jit-cache-not-writable", "launch",
        r"(?:Read-only file system|Permission denied): '([^']*(?:flashinfer|torch_extensions|triton|sglang)[^']*)'",
        "a kernel library could not write its just-in-time cache at {1}: FlashInfer, Triton, torch extensions "
        "and SGLang's own JIT kernels compile on first use into the home folder's .cache (FlashInfer's "
        "cubins tree too), and the folder is read-only or not the server user's (ai-dynamo/dynamo PR #11154, "
        "Center-for-AI-Innovation/LLMFlux#124)",
        "give the server a writable cache folder: `escha-deploy up` and `compose` mount the named volume "
        "escha-PROFILE-jit at /var/cache/escha-jit and point FlashInfer, Triton, torch extensions and SGLang's "
        "cache there (an older launch or a hand-written one lacks it: launch again with `escha-deploy up`); "
        "natively, make ~/.cache writable by the user that runs serve",
        "CPython OSError errno 30/13; quoted in https://github.com/Center-for-AI-Innovation/LLMFlux/issues/124 "
        "and https://github.com/ai-dynamo/dynamo/pull/11154",
        fix_if_set=(("FLASHINFER_WORKSPACE_BASE", "the launch already points the caches at the named volume "
                     "escha-PROFILE-jit (/var/cache/escha-jit), so the folder above is outside it: a library that "
                     "ignores those variables, or a volume another user created; `docker volume rm` it to start "
                     "empty, or make the server user own it"),),
    ),
    Signature(
        "runtime-module-missing", "launch",
        r"ModuleNotFoundError: No module named '([\w.]+)'",
        "the server's Python cannot import '{1}': this runtime lacks part of SGLang's dependencies (its GPU "
        "stack: torch, CUDA libraries and their helpers), so SGLang stops before loading anything",
        "run on an image built from Dockerfile.hicache with its full wheelhouse, on a host with a GPU; "
        "`escha-deploy doctor` checks both",
        "CPython import system; sglang/launch_server.py imports sglang.srt before parsing arguments",
    ),
    Signature(
        "docker-no-gpu-driver", "launch",
        r'could not select device driver "([^"]*)" with capabilities: \[\[gpu\]\]',
        "Docker has no device driver for GPUs: the NVIDIA Container Toolkit is not installed or not "
        "registered with this daemon (docker info lists no nvidia runtime and no CDI spec), or Docker "
        "Desktop runs without WSL2 GPU support",
        "install nvidia-container-toolkit and run `sudo nvidia-ctk runtime configure --runtime=docker`, then "
        "restart Docker; Docker Desktop: use the WSL2 backend with a Windows NVIDIA driver that supports WSL; "
        "`escha-deploy doctor` checks the daemon's runtimes",
        "Docker daemon (daemon/devices.go); seen from docker-py here; quoted in "
        "https://github.com/NVIDIA/nvidia-docker/issues/1352",
    ),
    Signature(
        "memlock-rlimit-refused", "launch",
        r"error setting rlimits? (?:for ready process: )?(?:error setting rlimit )?type 8: operation not permitted"
        r"|error setting rlimit type 8",
        "the container runtime could not give the container --ulimit memlock=-1: this Docker daemon may not "
        "raise RLIMIT_MEMLOCK (rootless Docker, an unprivileged LXC container, some nested setups), and the "
        "pinned HiCache pools need memlock unlimited",
        "run rootful Docker, or give the daemon CAP_SYS_RESOURCE (systemd: LimitMEMLOCK=infinity in "
        "docker.service); the launch's unlimited memlock ulimit cannot help while the daemon itself may not "
        "raise the limit; `escha-deploy doctor` probes it (docker.memlock)",
        "runc libcontainer (setupRlimits); seen from this machine's daemon; quoted in "
        "https://github.com/tubearchivist/tubearchivist/issues/393 (Proxmox LXC)",
    ),
    Signature(
        "wsl-no-gpu-adapter", "launch",
        r"WSL environment detected but no adapters were found",
        "nvidia-container-cli runs under WSL but GPU-PV shows it no GPU: a WSL 1 distro, a Windows NVIDIA "
        "driver without WSL support, or a GPU the VM was not given",
        "run `nvidia-smi` in the WSL2 distro; if it fails, install the current Windows NVIDIA driver, run "
        "`wsl --update` and `wsl --shutdown`; `wsl -l -v` must show VERSION 2",
        "nvidia-container-cli (libnvidia-container dxcore); quoted in "
        "https://github.com/NVIDIA/nvidia-docker/issues/1786",
    ),
    Signature(
        "no-gpu", "launch",
        r"Found no NVIDIA driver|No CUDA GPUs are available|CUDA driver initialization failed"
        r"|libcuda\.so.*cannot open",
        "no usable CUDA GPU inside the server (no driver, no device, or the container was started without "
        "GPUs)",
        "install the NVIDIA driver and container toolkit; `escha-deploy doctor` checks both",
        "torch CUDA initialisation; quoted in https://github.com/jbilcke-hf/FacePoke/issues/12",
    ),
    # --- this tool's own events ------------------------------------------------------------------
    Signature(
        "health-without-generate", "event", None,
        "/health answered but a tiny generate request did not complete: a server relaunched on ports of "
        "one killed with SIGKILL can pass /health and still not serve (sglang#22779)",
        "`escha-deploy down` (SIGTERM with a grace period, waits until the ports are free), then "
        "`escha-deploy up` again",
        "sglang#22779",
        when={"timed_out": True, "health_ok": True, "generate_ok": False},
    ),
    Signature(
        "docker-daemon-gone", "event",
        r"Error while fetching server API version|Cannot connect to the Docker daemon",
        "the Docker daemon went away (or its socket closed) while waiting for the server: the container "
        "may still run, or may have died with the daemon",
        "start Docker again (`systemctl start docker`, or Docker Desktop), then `escha-deploy status`; "
        "under Docker Desktop on WSL2, re-enable the distro's WSL integration if /var/run/docker.sock is gone",
        "docker-py APIClient._retrieve_server_version (docker/api/client.py)",
    ),
    Signature(
        "docker-daemon-gone", "event", None,
        "the Docker daemon went away while waiting for the server",
        "start Docker again, then `escha-deploy status`",
        "docker-py connection errors",
        when={"daemon_gone": True},
    ),
    Signature(
        "unauthorized", "event",
        r"\{\"error\": ?\"Unauthorized\"\}|\b401\b.*Unauthorized",
        "the server refused the API key (HTTP 401): the client sent none, or not the key the server was "
        "started with",
        "send `Authorization: Bearer <key>` with the key in container.api_key_file; after changing the "
        "file, restart the server (`escha-deploy down` then `up`)",
        "sglang/srt/utils/auth.py:191 (the API-key middleware's 401 body)",
    ),
    Signature(
        "unauthorized", "event", None,
        "the server refused the API key (HTTP 401)",
        "send `Authorization: Bearer <key>` with the key in container.api_key_file",
        "sglang/srt/utils/auth.py:191",
        when={"http_status": 401},
    ),
)

_GiB = 2**30


def launch_settings(spec, *, native: bool = False) -> frozenset[str]:
    """What a rendered launch (``launch_spec.LaunchSpec``) already sets, as the strings a fix
    would name: each argv flag (``--disable-custom-all-reduce``) and, for a flag followed by a
    value, ``--flag=value``; each environment variable as NAME and NAME=VALUE (the server's and
    the container's); and, in a container (``native`` False), ``ipc=MODE``, ``shm_size=BYTES``
    and each ulimit as ``NAME=SOFT`` (``memlock=-1``). ``Facts.launch`` carries it."""
    out: set[str] = set()
    argv = list(spec.argv)
    for i, a in enumerate(argv):
        if a.startswith("--"):
            out.add(a)
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out.add(f"{a}={argv[i + 1]}")
    env = dict(spec.env)
    c = spec.container
    if not native:
        env.update(c.environment)
        if c.ipc_mode:
            out.add(f"ipc={c.ipc_mode}")
        if c.shm_size_bytes:
            out.add(f"shm_size={c.shm_size_bytes}")
        out.update(f"{name}={soft}" for name, (soft, _hard) in c.ulimits.items())
    for k, v in env.items():
        out.update((k, f"{k}={v}"))
    return frozenset(out)


def launch_facts(plan, spec, *, native: bool = False) -> dict[str, object]:
    """``Facts`` fields from a launch: what it already sets (``launch_settings``), HiCache and
    the platform as planned, and the plan's largest host buffer on the cudaHostRegister path
    per rank (``planner.result.HostBuffer`` with allocator ``register``; None without one).
    ``plan``: a ``planner.result.Plan``; ``spec``: its ``launch_spec.LaunchSpec``."""
    reg = [b for b in plan.per_rank.host_buffers if b.allocator == "register"] if plan.hicache.enabled else []
    big = max(reg, key=lambda b: b.requested_bytes, default=None)
    return {"launch": launch_settings(spec, native=native), "hicache_enabled": plan.hicache.enabled,
            "platform": plan.platform, "tp_size": plan.tp_size,
            "register_buffer": (big.name, big.requested_bytes) if big is not None else None}


def _fills(f: Facts) -> dict[str, str]:
    """The parts of fixes that depend on what the launch already does (``Signature.fix``'s
    ``{p2p}``, ``{chunk}``, ``{alloc}``, ``{hicache}``, ``{radix}``, ``{register}``): each names
    only settings the launch does not have (``Facts.launch``; unknown counts as not set); and
    ``{pins}``: the default release with its transformers pin (its ``facts.yaml``)."""
    from ..pipeline.argv import ENV_REGISTER_CHUNK, REGISTER_CHUNK_GIB
    from ..profile import key_env, key_flag
    from ..sglang.releases import load_release

    have = f.launch or frozenset()
    parts = []
    if f"{key_env('container.nccl_p2p_disable')}=1" not in have:
        parts.append("container.nccl_p2p_disable: true (NCCL_P2P_DISABLE=1)")
    if key_flag("runtime.disable_custom_all_reduce") not in have:
        parts.append("runtime.disable_custom_all_reduce: true (--disable-custom-all-reduce)")
    p2p = ("set " + " and ".join(parts) if parts else
           "peer-to-peer is already off in this launch (NCCL's P2P transport and custom all-reduce), so it is "
           "not that") + "; as a last resort NCCL_SHM_DISABLE=1 (NCCL over sockets, slower)"
    buf = f.register_buffer
    size = (f" (the plan's largest on this path: {buf[0]}, {buf[1] / 1e9:.2f} GB = {buf[1] / _GiB:.2f} GiB per "
            "rank)" if buf else "")
    chunk_set = next((t.split("=", 1)[1] for t in have if t.startswith(ENV_REGISTER_CHUNK + "=")), None)
    if chunk_set:
        chunk = (f"the launch already registers in calls of at most {chunk_set} GiB and one still failed: lower "
                 f"hicache.hicache_size or hicache.hicache_ratio{size}, or leave more GPU memory free (a lower "
                 "runtime.mem_fraction_static; PR #39744's failure had the GPUs about 75 % full)")
    else:
        chunk = (f"register in smaller calls: escha-deploy renders {ENV_REGISTER_CHUNK}={REGISTER_CHUNK_GIB} when "
                 f"the plan's largest buffer on this path is above {REGISTER_CHUNK_GIB} GiB{size}; below that, "
                 "lower hicache.hicache_size or hicache.hicache_ratio")
    if f"{key_flag('hicache.hicache_mem_layout')}=layer_first" in have:
        chunk += ("; in the layer_first layout SGLang registers the KV buffer in one call whatever the chunk "
                  "(pool_host/mha.py: init_kv_buffer passes a granularity only for page-first layouts): "
                  "hicache.hicache_mem_layout: page_first")
    if "ESCHA_HICACHE_HOST_ALLOCATOR=pinned" in have:
        alloc = ("the pools are already allocated with cudaHostAlloc in this launch, where each buffer must stay "
                 "within 4 GiB (sglang#7666): lower hicache.hicache_size or hicache.hicache_ratio")
    else:
        alloc = ("or allocate the pools with cudaHostAlloc instead of registering them (an image with capability "
                 "hicache-host-allocator and ESCHA_HICACHE_HOST_ALLOCATOR=pinned; `escha-deploy doctor` picks it "
                 "where registered memory fails), each buffer within 4 GiB (sglang#7666) through "
                 "hicache.hicache_size or hicache.hicache_ratio")
    hicache = ""
    if f.hicache_enabled or key_flag("hicache.enabled") in have:
        hicache = ("; with HiCache on a rank can also hang in HiCache's host transfers (the cache controller's "
                   "write-back and load-back streams) or on a host pool its GPU cannot use: retry with "
                   "hicache.enabled: false to isolate, lower hicache.hicache_ratio (`escha-deploy plan` prints the "
                   "safe one), and let `escha-deploy doctor --profile PROFILE` probe the host allocator "
                   "(CanUseHostPointerForRegisteredMem)")
    divergence = ""
    if f.hicache_enabled and (f.tp_size or 0) > 1:
        divergence = (f"with HiCache on at TP {f.tp_size}, first suspect the load-back divergence: each rank decides "
                      "from its own device pool how much of a prefix to load back from host memory, the ranks "
                      "disagree by a page under load and enter one all-reduce with different sizes, and both "
                      "wait for ever (sglang PR #33442, sglang#31425; no supported release agrees the decision "
                      "across ranks): retry with hicache.enabled: false to confirm; then ")
    radix = []
    if f.hicache_enabled is not False or key_flag("hicache.enabled") in have:
        radix.append("with HiCache on (sglang#21379) retry with hicache.enabled: false")
    if f"{key_flag('runtime.page_size')}=1" not in have:
        radix.append("runtime.page_size: 1 (a page-rounded prefix match can leave the empty node eviction trips "
                     "on, sglang PR #28692)")
    radix.append("runtime.disable_radix_cache: true avoids the tree at the cost of prefix reuse (HiCache needs "
                 "the radix cache, so it goes off too); a restart clears the tree until it corrupts again (sglang "
                 "PR #36696 fixes one cause; no supported release has it)")
    if "memlock=-1" in have:
        register = f"memlock is already unlimited in this launch, so the size of the one call is the suspect: {chunk}"
    else:
        register = f"give the server an unlimited memlock ulimit (`escha-deploy up` and `compose` do), then: {chunk}"
    if f.platform != "linux":
        register = ("under WSL2 `escha-deploy doctor` measures the pinned ceiling and `plan` keeps the pools under "
                    "it" + ("; otherwise " if f.platform is None else "; ") + register)
    register += f"; {alloc}"
    if f.host_map_failed:
        register = (f"free host memory (stop other memory users) or lower hicache.hicache_ratio ({_PLAN}) first: the "
                    "driver's 'Cannot map memory' line says host memory ran short for the registration (sglang PR "
                    "#26301); then " + register)
    release = load_release()
    pins = f"SGLang {release.version} (transformers {release.pins.transformers.value})"
    return {"p2p": p2p, "chunk": chunk, "alloc": alloc, "hicache": hicache, "radix": "; ".join(radix),
            "register": register, "pins": pins, "divergence": divergence,
            "divergence_cause": ("; with HiCache on at TP > 1, also the ranks disagreeing on a host load-back "
                                 "(sglang PR #33442)" if divergence else "")}


def cause_for(sig: Signature, f: Facts, found: re.Match[str] | None = None) -> str:
    """The cause ``sig`` prints for facts ``f``: ``_fills``' ``{divergence_cause}`` and the
    pattern's groups filled in."""
    text = sig.cause
    if "{divergence_cause}" in text:
        text = text.replace("{divergence_cause}", _fills(f)["divergence_cause"])
    return _fill(text, found)


def fix_for(sig: Signature, f: Facts, found: re.Match[str] | None = None) -> str:
    """The fix ``sig`` prints for facts ``f``: its ``fix_if_set`` (or ``fix_if_key``) text when the
    launch already has that setting, else its ``fix``; with ``_fills`` and the pattern's groups
    filled in."""
    text = sig.fix
    if f.launch is not None:
        settings = list(sig.fix_if_set)
        if sig.fix_if_key:
            from ..profile import key_metadata

            meta = key_metadata()
            settings += [(meta[key].env or meta[key].flag or "", alt) for key, alt in sig.fix_if_key]
        text = next((alt for setting, alt in settings if setting in f.launch), text)
    for k, v in _fills(f).items():
        text = text.replace("{" + k + "}", v)
    return _fill(text, found)


_TRACEBACK_START = "Traceback (most recent call last):"
#: Lines of the first traceback a crash-loop match prints.
TRACEBACK_LINES = 12
#: SGLang's startup line, printed once per start by the launching process
#: (sglang/srt/entrypoints/engine.py:265, ``server_args=``): a log with several has several starts.
_START = re.compile(r"\bserver_args=")
#: The rank tag in SGLang's log prefix (``[2026-11-30 09:00:00 TP1]``, ``... PP0 TP1]``;
#: sglang/srt/utils/common.py configure_logger).
_RANK_TAG = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{3})?\s*([^\]]*)\]")


def _repeating_traceback(lines: Sequence[str]) -> Match | None:
    """The same traceback (by its last line) ending three or more starts: a crash loop, not one
    fault. Starts, not lines, are counted: every TP rank prints the same traceback once per start,
    so with several ``server_args=`` lines the count is the starts whose part of the log holds it,
    and without them the most any one rank (log prefix tag) printed it. The match shows the first
    traceback (up to ``TRACEBACK_LINES`` lines) and the restart count. One pass over the lines,
    each looked at in its first ``SCAN_HEAD`` characters."""
    seen: list[tuple[int, str, int, int, str]] = []  # (start number, rank tag, first, last index, last line)
    run, begin, rank = 0, None, ""
    for i, line in enumerate(lines):
        head = line[:SCAN_HEAD]
        if _START.search(head):
            run += 1
        if _TRACEBACK_START in head:
            begin = i
            tag = _RANK_TAG.match(head)
            rank = tag.group(1).strip() if tag else ""
            continue
        if begin is not None and line and not line.startswith((" ", "\t")):
            seen.append((run, rank, begin, i, _shown_evidence(line)))
            begin = None
    if not seen:
        return None
    ends = Counter(s[4] for s in seen)
    last = ends.most_common(1)[0][0]
    mine = [s for s in seen if s[4] == last]
    if run > 1:
        count, unit = len({s[0] for s in mine}), "starts"
    else:
        count, unit = max(Counter(s[1] for s in mine).values()), "times"
    if count < 3:
        return None
    first, stop = mine[0][2], mine[0][3]
    if stop - first < TRACEBACK_LINES:
        shown = [_shown_evidence(x) for x in lines[first:stop + 1] if x.strip()]
    else:  # a long traceback: its head, then its last line
        shown = [_shown_evidence(x) for x in lines[first:first + TRACEBACK_LINES - 2] if x.strip()]
        shown += ["...", _shown_evidence(lines[stop])]
    ranks = sorted({s[1] for s in mine if s[1]})
    per = f" (each by {len(ranks)} ranks: {', '.join(ranks)})" if len(ranks) > 1 else ""
    return Match(
        id="repeating-traceback", kind="launch", line=last, evidence=shown,
        explanation=f"the same traceback ended the server {count} {unit}{per}: it is crash-looping on one "
        f"fault ({count - 1} restarts), so restarting will not help; the first traceback is below",
        fix="fix the fault the traceback names; escha-deploy never restarts a server that has not yet "
        "become ready",
        source="escha-deploy launch policy (no restart while starting)",
    )


#: SGLang's /health timeout: its health check sends a 1-token generate and answers 503 when the
#: scheduler gives no output for this long (``SGLANG_HEALTH_CHECK_TIMEOUT``, default 20 s;
#: sglang/srt/entrypoints/http_server.py, ``health_generate``), seconds.
HEALTH_TIMEOUT_S = 20
#: A request latency this many times the /health timeout is a stalled scheduler, not a slow
#: batch: every /health in between failed (sglang#30314 reports a 222 s TTFT, an 11-fold).
STALL_FACTOR = 5
#: /health failures in one log that make a run of them (one is a blip; the runtime's liveness
#: probe kills after several).
HEALTH_FAILURE_RUN = 2
#: SGLang's SIGTERM line (sglang/srt/managers/tokenizer_manager.py, ``SignalHandler.sigterm_handler``:
#: ``SIGTERM received. signum=... frame=... Draining requests and shutting down...``) and uvicorn's.
_SIGTERM = re.compile(r"SIGTERM received|Received signal 15|Shutting down\b")
#: SGLang's /health failure (http_server.py, ``health_generate``: ``Health check failed. Server
#: couldn't get a response from detokenizer for last N seconds``) and uvicorn's access line of a 503.
_HEALTH_FAILED = re.compile(r"Health check failed\. Server couldn't get a response|\"GET /health(?:_generate)? "
                            r"HTTP/[\d.]+\" 503")
#: A request's latency in a log line: SGLang's ``--log-requests`` finish line carries
#: ``'e2e_latency': S`` in its meta_info (tokenizer_manager.py, ``_handle_batch_output``), and
#: reports quote ``TTFT``/``e2e_latency: 225s``; group 2 is seconds.
_LATENCY = re.compile(r"\b(e2e_latency|ttft|TTFT|time_to_first_token)['\"]?\s*[:=]\s*([\d.]+)\s*s?\b")


def _stall_then_kill(lines: Sequence[str], facts: Facts) -> Match | None:
    """The stall-then-kill pattern of sglang#30314, weighed before memory: the server was killed
    by SIGKILL (and the cgroup's OOM count did not prove the OOM killer), SIGTERM came first (the
    OOM killer sends no SIGTERM: a container runtime or supervisor stopping it, then killing it
    when the grace period ran out), and the log shows the scheduler stalled: a request latency
    ``STALL_FACTOR`` times SGLang's /health timeout or more, or ``HEALTH_FAILURE_RUN`` /health
    failures. None otherwise. One pass, each line looked at in its first ``SCAN_HEAD`` characters."""
    if facts.signal != 9 or facts.oom_kill is True:
        return None
    sigterm: str | None = None
    failures: list[str] = []
    longest: tuple[float, str] | None = None
    for line in lines:
        head = line[:SCAN_HEAD]
        if sigterm is None and _SIGTERM.search(head):
            sigterm = line
        if _HEALTH_FAILED.search(head):
            failures.append(line)
        for m in _LATENCY.finditer(head):
            try:
                sec = float(m.group(2))
            except ValueError:
                continue
            if longest is None or sec > longest[0]:
                longest = (sec, line)
    stall_s = HEALTH_TIMEOUT_S * STALL_FACTOR
    stalled = longest is not None and longest[0] >= stall_s
    if sigterm is None or not (stalled or len(failures) >= HEALTH_FAILURE_RUN):
        return None
    evidence = [_shown_evidence(sigterm)]
    seen = []
    if stalled and longest is not None:
        evidence.append(_shown_evidence(longest[1]))
        seen.append(f"a request took {longest[0]:.0f} s, {longest[0] / HEALTH_TIMEOUT_S:.0f} times SGLang's "
                    f"{HEALTH_TIMEOUT_S} s /health timeout")
    if failures:
        evidence.append(_shown_evidence(failures[0]))
        seen.append(f"/health failed {len(failures)} time{'s' if len(failures) > 1 else ''}")
    return Match(
        id="stall-then-kill", kind="killed", line=show(sigterm), evidence=evidence,
        explanation="killed by SIGKILL after SIGTERM while the scheduler was stalled (" + "; ".join(seen) + "): "
        "a container runtime or supervisor stopped the server because /health stopped answering and killed it "
        "when the grace period ran out; the kernel's OOM killer sends no SIGTERM, so this is the stall, not "
        "memory (sglang#30314: a hybrid model with HiCache blocks its event loop on mamba eviction for minutes)",
        fix="do not lower the HiCache ratio for this; find what held the scheduler (the requests before the "
        "SIGTERM: a long-context request on a hybrid model with HiCache is sglang#30314's case), give the "
        "liveness probe more time than the longest stall (Docker's healthcheck retries, Kubernetes' "
        "failureThreshold) or shorten the context the server accepts (runtime.context_length), and read "
        "`dmesg | grep -i 'killed process'` to rule out the OOM killer",
        source="https://github.com/sgl-project/sglang/issues/30314; sglang/srt/managers/tokenizer_manager.py "
        "(SignalHandler.sigterm_handler); sglang/srt/entrypoints/http_server.py (health_generate)",
    )


_LOG_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{3})?[^\]]*\] ")


def _strip_prefix(line: str) -> str:
    """Drop SGLang's ``[%Y-%m-%d %H:%M:%S TP0]`` prefix (sglang/srt/utils/common.py
    configure_logger) so equal messages from different ranks compare equal."""
    return _LOG_PREFIX.sub("", line)


def _fill(text: str, m: re.Match[str] | None) -> str:
    if m is None:
        return text
    for i, g in enumerate(m.groups(), 1):
        text = text.replace("{" + str(i) + "}", g if g is not None else "?")
    return text


def _fact_evidence(sig: Signature, f: Facts) -> list[str]:
    out = []
    for name in sig.when:
        if name == "signal" and f.exit_code is None:
            continue  # no exit status given: nothing to show
        if name == "signal":
            out.append(f"exit status {f.exit_code}: signal {f.signal} ({_SIGNAL_NAMES.get(f.signal, '?')})")
        elif name == "oom_kill":
            out.append({True: "the cgroup's oom_kill count rose", False: "the cgroup's oom_kill count did not rise",
                        None: "the cgroup's oom_kill count was not read"}[f.oom_kill])
        else:
            out.append(f"{name} = {getattr(f, name)}")
    if sig.id == "host-register-failed" and f.register_buffer:
        name, size = f.register_buffer
        out.append(f"the plan's largest host buffer on the cudaHostRegister path: {name}, {size:,} B "
                   f"({size / 1e9:.2f} GB, {size / _GiB:.2f} GiB) per rank")
    if sig.kind == "killed" and f.pinned_total_bytes:
        out.append(f"the plan pins {f.pinned_total_bytes / 1e9:.2f} GB of host memory (all ranks)")
    return out


#: SGLang's startup line: ``server_args={...}`` (a dict repr; sglang/srt/entrypoints/engine.py:265,
#: ``logger.info(f"server_args={server_args.resolved_dict()}")``) or, in older releases,
#: ``server_args=ServerArgs(...)`` (a dataclass repr). Either shows enable_hierarchical_cache.
_SERVER_ARGS_HICACHE = re.compile(r"server_args=.*?\benable_hierarchical_cache'?\s*[:=]\s*(True|False)\b")


#: The same line's tensor-parallel size (``'tp_size': 2`` or ``tp_size=2``).
_SERVER_ARGS_TP = re.compile(r"server_args=.*?\btp_size'?\s*[:=]\s*(\d+)\b")


def log_facts(lines: Sequence[str]) -> dict[str, object]:
    """Facts the log itself shows: ``{"hicache_enabled": bool, "tp_size": int}`` from SGLang's
    ``server_args=`` startup line (the last one, if the log holds several starts); empty when it
    has none."""
    for ln in reversed(lines):
        k = ln.find("server_args=", 0, SCAN_HEAD)
        m = _SERVER_ARGS_HICACHE.match(ln, k, k + SERVER_ARGS_SCAN) if k >= 0 else None
        if m:
            out: dict[str, object] = {"hicache_enabled": m.group(1) == "True"}
            tp = _SERVER_ARGS_TP.match(ln, k, k + SERVER_ARGS_SCAN)
            if tp:
                out["tp_size"] = int(tp.group(1))
            return out
    return {}


#: The NVIDIA driver's kernel-log line when it cannot pin a user range for cudaHostRegister
#: (quoted in sglang PR #26301: ``Cannot map memory with base addr 0x7f134c660000 and size of 0xf179a0 pages``).
_HOST_MAP_FAILED = "Cannot map memory with base addr"


def _with_log_facts(facts: Facts, lines: Sequence[str]) -> Facts:
    """``facts`` with its unknowns filled from the log (a fact the caller gave wins), and
    ``host_map_failed`` when a line holds the driver's 'Cannot map memory' line."""
    found = {k: v for k, v in log_facts(lines).items() if getattr(facts, k) is None}
    if not facts.host_map_failed and any(_HOST_MAP_FAILED in ln[:SCAN_HEAD] for ln in lines):
        found["host_map_failed"] = True
    return facts.model_copy(update=found) if found else facts


def _unsettled(sig: Signature, f: Facts, found: re.Match[str] | None, line: str | None,
               evidence: list[str]) -> Match:
    """An unproven match for a row id whose variant depends on facts nobody knows: every
    variant the known facts allow, each with its condition, and what would settle it."""
    alts = [r for r in SIGNATURES if r.id == sig.id and r.holds(f) is not False]
    unknown = sorted({n for r in alts for n in r.needs_unknown(f)})

    def cond(r: Signature) -> str:
        parts = [f"{n}={v}" for n, v in r.when.items() if n in unknown]
        return "if " + ", ".join(parts) if parts else "otherwise"

    return Match(
        id=sig.id, kind=sig.kind, line=line,
        evidence=evidence + [f"{n} unknown: {SETTLE[n]}" for n in unknown],
        explanation="the cause depends on " + ", ".join(unknown) + ", which this log does not show: "
        + "; ".join(f"{cond(r)}: {cause_for(r, f, found)}" for r in alts),
        fix="settle it (" + "; ".join(SETTLE[n] for n in unknown) + "), then: "
        + "; ".join(f"{cond(r)}: {fix_for(r, f, found)}" for r in alts),
        source=sig.source, conclusive=False)


def show(line: str, more: int = 0) -> str:
    """``line`` cut at ``SHOW_CHARS`` characters for printing, with how many were left out
    (``more``: characters already cut off its end)."""
    if len(line) + more <= SHOW_CHARS:
        return line
    return f"{line[:SHOW_CHARS]} ... ({len(line) + more - SHOW_CHARS:,} more characters)"


def _shown_evidence(line: str) -> str:
    """An evidence line: SGLang's prefix dropped, cut for printing, without copying a long line."""
    head = line[:SHOW_CHARS + 256]
    return show(_strip_prefix(head), len(line) - len(head))


def scan_windows(line: str) -> tuple[str, ...]:
    """The parts of ``line`` the patterns see: the whole line when it is at most ``SCAN_HEAD``
    + ``SCAN_TAIL`` characters, else its first ``SCAN_HEAD`` and its last ``SCAN_TAIL``
    characters, searched apart (a match cannot span the cut)."""
    if len(line) <= SCAN_HEAD + SCAN_TAIL:
        return (line,)
    return (line[:SCAN_HEAD], line[-SCAN_TAIL:])


def _literal_runs(items, ignore_case: bool) -> list[str]:
    """The runs of literal characters that every match of the parsed sequence ``items``
    contains: consecutive literals at this level, and those of groups at this level (a group
    matches exactly once); repeats, alternations and lookarounds contribute none."""
    from re import _constants as c  # the parser's own opcodes (CPython Lib/re/_constants.py)

    runs: list[str] = []
    cur: list[str] = []
    for op, av in items:
        if op is c.LITERAL and not ignore_case:
            cur.append(chr(av))
            continue
        if cur:
            runs.append("".join(cur))
            cur = []
        if op is c.SUBPATTERN:
            _, add_flags, _, sub = av
            runs.extend(_literal_runs(sub, ignore_case or bool(add_flags & c.SRE_FLAG_IGNORECASE)))
    if cur:
        runs.append("".join(cur))
    return runs


def needles(pattern: str) -> tuple[str, ...] | None:
    """Literals one of which every match of ``pattern`` contains (the longest required run of
    each top-level alternative), or ``None`` when some alternative has none (then every window
    is searched). From CPython's regex parser (``re._parser.parse``, the one ``re.compile``
    uses), so the literal is the pattern's own: ``(?<!\\S)(\\S+) watchdog timeout \\(self`` gives
    ``' watchdog timeout (self.watchdog_timeout='``."""
    from re import _constants as c, _parser

    parsed = _parser.parse(pattern)
    ignore_case = bool(parsed.state.flags & c.SRE_FLAG_IGNORECASE)
    items = list(parsed)
    branches = items[0][1][1] if len(items) == 1 and items[0][0] is c.BRANCH else [items]
    out = []
    for branch in branches:
        runs = _literal_runs(branch, ignore_case)
        if not runs:
            return None
        out.append(max(runs, key=len))
    return tuple(out)


_COMPILED: dict[str, tuple[re.Pattern[str], tuple[str, ...] | None]] = {}


def _compiled(pattern: str) -> tuple[re.Pattern[str], tuple[str, ...] | None]:
    got = _COMPILED.get(pattern)
    if got is None:
        got = _COMPILED[pattern] = (re.compile(pattern), needles(pattern))
    return got


class _Windows:
    """Every line's ``scan_windows``, joined by newlines into one text that ``str.find``
    searches for a row's needles in one pass, with the window each offset falls in."""

    def __init__(self, lines: Sequence[str]) -> None:
        import bisect

        self._bisect = bisect.bisect_right
        self.parts: list[str] = []
        self.owner: list[int] = []
        for i, ln in enumerate(lines):
            for w in scan_windows(ln):
                self.parts.append(w)
                self.owner.append(i)
        self.starts: list[int] = []
        at = 0
        for w in self.parts:
            self.starts.append(at)
            at += len(w) + 1
        self.text = "\n".join(self.parts)
        self._first: dict[str, tuple[int, re.Match[str]] | None] = {}

    def first(self, pattern: str) -> tuple[int, re.Match[str]] | None:
        """The first window a pattern matches in: ``(line index, match)``, or ``None``; once
        per pattern (a row's variants share theirs)."""
        if pattern not in self._first:
            self._first[pattern] = self._search(pattern)
        return self._first[pattern]

    def _search(self, pattern: str) -> tuple[int, re.Match[str]] | None:
        rx, lits = _compiled(pattern)
        if lits is None:
            for j, w in enumerate(self.parts):
                m = rx.search(w)
                if m:
                    return self.owner[j], m
            return None
        nxt = {lit: self.text.find(lit) for lit in lits}  # each needle's next offset, -1: none left
        while True:
            live = [k for k in nxt.values() if k >= 0]
            if not live:
                return None
            j = self._bisect(self.starts, min(live)) - 1
            m = rx.search(self.parts[j])
            if m:
                return self.owner[j], m
            after = self.starts[j] + len(self.parts[j]) + 1  # the next window's start
            for lit, k in nxt.items():
                if 0 <= k < after:
                    nxt[lit] = self.text.find(lit, after)


def order_matches(matches: Sequence[Match], where: Sequence[tuple[int, int]]) -> list[Match]:
    """Matches in the order the log proves them: proven causes first, by where their line is in
    the log (``where[k]``: line index, then offset in the line, so ``Capture cuda graph failed:
    CUDA out of memory`` names the capture before the generic out-of-memory row), rows proven
    by facts alone (an exit code, the OOM killer) after the log's; then the unproven ones (a
    ``Killed`` from the shell, a child that died: consequences of the cause above), by the same
    order. Ties keep the table's order (Python's sort is stable)."""
    ranked = sorted(range(len(matches)), key=lambda k: (not matches[k].conclusive, where[k]))
    return [matches[k] for k in ranked]


def diagnose(lines: Sequence[str], facts: Facts | None = None) -> Diagnosis:
    """Match log lines and facts against ``SIGNATURES``.

    ``lines``: the server's output, oldest first (any length; all are searched, since a
    traceback's cause is often far above its end; the last ``TAIL_LINES`` are kept for
    printing, each cut at ``SHOW_CHARS``). Returns one match per row id whose pattern (and
    ``when``) hold, first proven cause first (``order_matches``), plus a repeating-traceback
    match when one fault repeats.
    Linear in the total length of ``lines`` (module docstring). Never raises for odd input.
    """
    facts = facts or Facts()
    text = [ln.rstrip("\n") for ln in lines]
    matches: list[Match] = []
    where: list[tuple[int, int]] = []  # per match: (line index, offset in it); fact-only rows last
    seen: set[str] = set()
    facts = _with_log_facts(facts, text)
    stall = _stall_then_kill(text, facts)
    if stall is not None:  # the stall explains the kill: the memory guesses for a bare SIGKILL do not lead
        seen.update({"killed-sigkill", "killed-line"})
    windows: _Windows | None = None
    for sig in SIGNATURES:
        if sig.id in seen or seen.intersection(sig.unless):
            continue
        held = sig.holds(facts)
        if held is False:
            continue
        found: re.Match[str] | None = None
        line: str | None = None
        evidence: list[str] = []
        if sig.pattern is not None:
            windows = windows or _Windows(text)
            hit = windows.first(sig.pattern)
            if hit is None:
                continue
            i, found = hit
            where.append((i, found.start()))
            line = show(text[i])
            evidence = [_shown_evidence(x) for x in text[i:i + EVIDENCE_LINES] if x.strip()]
        seen.add(sig.id)
        if sig.pattern is None:
            where.append((len(text), 0))
        if held is None:
            matches.append(_unsettled(sig, facts, found, line, evidence))
            continue
        evidence += _fact_evidence(sig, facts)
        matches.append(Match(id=sig.id, kind=sig.kind, line=line, evidence=evidence,
                             explanation=cause_for(sig, facts, found), fix=fix_for(sig, facts, found), source=sig.source,
                             sglang_advice=sig.sglang_advice, conclusive=sig.conclusive))
    matches = order_matches(matches, where)
    if stall is not None:
        matches.insert(0, stall)
    rep = _repeating_traceback(text)
    if rep is not None:
        matches.append(rep)
    return Diagnosis(exit_code=facts.exit_code, timed_out=facts.timed_out, matches=matches,
                     tail=[show(x) for x in text[-TAIL_LINES:]])
