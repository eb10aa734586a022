"""Failure diagnosis: match the server's last log lines to a short explanation and a fix.

Pure: takes lines (str) and a few facts (exit code, HiCache on, platform, what the ready probe
saw) and returns a ``Diagnosis``; printing and the exit code (4) are the caller's job.

Each signature cites where its message comes from: an SGLang 0.5.19 file and function (the
wheel unzipped, ``sglang/srt/...``) or the upstream report it was seen in. Field reports
(shared/research/field-reports.md) B01, B06, B17, B18, B22, B29, B30 and B31 are tests in
``tests/launch/test_diagnose.py`` with log lines in those formats.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: How many of the server's last lines a diagnosis keeps and prints.
TAIL_LINES = 40


class Facts(BaseModel):
    """What the caller knows besides the log: used by signatures whose advice depends on it."""

    model_config = ConfigDict(frozen=True)
    exit_code: int | None = Field(default=None, description="the server's exit code, if it exited")
    hicache_enabled: bool = False
    platform: Literal["linux", "wsl2"] = "linux"
    timed_out: bool = Field(default=False, description="the ready wait ran out of time")
    health_ok: bool | None = Field(default=None, description="/health answered 200 at the end")
    generate_ok: bool | None = Field(default=None, description="the tiny generate succeeded")


class Match(BaseModel):
    """One recognised signature: which, the log line that showed it, what it means, the fix."""

    model_config = ConfigDict(frozen=True)
    id: str
    line: str | None = Field(description="the first log line that matched (None for fact-only)")
    explanation: str
    fix: str
    source: str = Field(description="SGLang 0.5.19 file or upstream report behind the message")


class Diagnosis(BaseModel):
    """The result: matches (most specific first), the log tail, and the server's exit code."""

    model_config = ConfigDict(frozen=True)
    exit_code: int | None
    timed_out: bool
    matches: list[Match]
    tail: list[str]

    def lines(self) -> list[str]:
        """Human lines for stderr: the tail, then one block per match (or 'no known cause')."""
        out = [f"--- last {len(self.tail)} server log lines ---", *self.tail, "---"]
        head = (
            "server did not become ready in time"
            if self.timed_out
            else f"server exited with code {self.exit_code}"
        )
        out.append(f"diagnosis: {head}")
        if not self.matches:
            out.append("  no known signature in the log; read the lines above")
        for m in self.matches:
            out.append(f"  [{m.id}] {m.explanation}")
            out.append(f"    fix: {m.fix}")
            out.append(f"    see: {m.source}")
        return out


@dataclass(frozen=True)
class Signature:
    """A known failure: a pattern over log lines, and advice that may depend on ``Facts``."""

    id: str
    pattern: re.Pattern[str] | None
    explain: Callable[[re.Match[str] | None, Facts], tuple[str, str] | None]
    source: str
    when: Callable[[Facts], bool] = lambda f: True


def _host_memory(m: re.Match[str] | None, f: Facts) -> tuple[str, str]:
    req, have = (m.group(1), m.group(2)) if m else ("?", "?")
    return (
        f"SGLang's HiCache host-memory check refused the host pool: it asked for {req} GB and "
        f"saw {have} GB free (MemAvailable minus its 10 GiB reserve; under TP a later rank also "
        "subtracts the pools its peers already pinned, sglang#38156)",
        "lower hicache.hicache_ratio to the safe ratio `escha-deploy plan` prints, or run the "
        "Dockerfile.hicache image (capability hicache-host-reserve-env), or turn HiCache off",
    )


def _illegal_access(m: re.Match[str] | None, f: Facts) -> tuple[str, str]:
    if f.hicache_enabled and f.platform == "wsl2":
        return (
            "an illegal memory access with HiCache on WSL2: the GPU cannot use registered host "
            "pointers there (CanUseHostPointerForRegisteredMem = 0), so HiCache transfers into the "
            "cudaHostRegister pool fault (sglang#40232)",
            "use an image with capability hicache-host-allocator and "
            "ESCHA_HICACHE_HOST_ALLOCATOR=pinned (auto picks it on WSL2), or retry with HiCache "
            "off (--set hicache.enabled=false) to isolate",
        )
    if f.hicache_enabled:
        return (
            "an illegal memory access with HiCache on; the same load without HiCache is the "
            "test that isolates it (sglang#16771; stream-race fixes #20611, #36738)",
            "retry without HiCache (--set hicache.enabled=false) to isolate, and report the "
            "image's SGLang commit (`docker image inspect` label io.escha.sglang)",
        )
    return (
        "an illegal memory access in a CUDA kernel (HiCache is off, so not the host pool)",
        "rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; check the model and quantization",
    )


def _oom(m: re.Match[str] | None, f: Facts) -> tuple[str, str]:
    return (
        "the GPU ran out of memory (weights + KV pool + CUDA graphs exceed a GPU)",
        "lower runtime.mem_fraction_static or cuda graph batch sizes, or a shorter context; "
        "`escha-deploy plan` shows the device budget",
    )


def _nccl_shm(m: re.Match[str] | None, f: Facts) -> tuple[str, str]:
    return (
        "NCCL could not create its shared-memory segment in /dev/shm (Docker's default is "
        "64 MB; TP 2 needs more) (sglang#4259, NVIDIA/nccl#342)",
        "run with ipc=host or shm_size of at least 16 GB (escha-deploy up sets ipc=host; "
        "a hand-written docker run needs --ipc=host --ulimit memlock=-1)",
    )


def _nccl_p2p(m: re.Match[str] | None, f: Facts) -> tuple[str, str]:
    if f.platform == "wsl2":
        fix = (
            "set NCCL_P2P_DISABLE=1 and pass --disable-custom-all-reduce (the wsl2 profiles do); "
            "as a last resort NCCL_SHM_DISABLE=1"
        )
    else:
        fix = "set NCCL_P2P_DISABLE=1 and retry; check `nvidia-smi topo -m` for P2P support"
    return (
        "NCCL failed between the two GPUs (peer-to-peer access is not supported here, as under "
        "WSL2 and on many consumer boards) (microsoft/WSL#12467)",
        fix,
    )


def _addr_in_use(m: re.Match[str] | None, f: Facts) -> tuple[str, str]:
    return (
        "a port the server needs is already bound: the HTTP port or one of SGLang's internal "
        "ZMQ/NCCL ports next to it, often a stale server from a crash (vllm#9763, sglang#9396)",
        "`escha-deploy down` (or stop the owner `ss -ltnp` names), then start again; or choose "
        "another container.port",
    )


def _warmup_proxy(m: re.Match[str] | None, f: Facts) -> tuple[str, str]:
    return (
        "SGLang's startup warmup request failed; with --host 0.0.0.0 it goes to 0.0.0.0 and an "
        "http_proxy in the environment answers it with 502/403 (sglang#9814, #16855)",
        "set NO_PROXY/no_proxy=localhost,127.0.0.1,0.0.0.0,::1 (escha-deploy sets it in the "
        "container) or unset the proxy variables",
    )


def _module_missing(m: re.Match[str] | None, f: Facts) -> tuple[str, str]:
    mod = m.group(1) if m else "?"
    return (
        f"the server's Python cannot import {mod!r}: this runtime lacks part of SGLang's "
        "dependencies (its GPU stack: torch, CUDA libraries and their helpers), so SGLang stops "
        "before loading anything",
        "run on an image built from Dockerfile.hicache with its full wheelhouse, on a host with "
        "a GPU; `escha-deploy doctor` checks both",
    )


def _no_gpu(m: re.Match[str] | None, f: Facts) -> tuple[str, str]:
    return (
        "no usable CUDA GPU inside the server (no driver, no device, or the container was "
        "started without GPUs)",
        "install the NVIDIA driver and container toolkit; `escha-deploy doctor` checks both",
    )


def _health_only(m: re.Match[str] | None, f: Facts) -> tuple[str, str] | None:
    return (
        "/health answered but a tiny generate request did not complete: a server relaunched "
        "on ports of one killed with SIGKILL can pass /health and still not serve (sglang#22779)",
        "`escha-deploy down` (SIGTERM with a grace period, waits until the ports are free), "
        "then `escha-deploy up` again",
    )


SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "host-memory-check",
        # sglang/srt/mem_cache/pool_host/base.py HostKVCache.__init__ and pool_host/mamba.py
        re.compile(r"Not enough host memory available\. Requesting ([\d.]+) GB but only have "
                   r"([\d.]+) GB free"),
        _host_memory,
        "sglang/srt/mem_cache/pool_host/base.py (HostKVCache.__init__); sglang#38156",
    ),
    Signature(
        "illegal-memory-access",
        re.compile(r"an illegal memory access was encountered|cudaErrorIllegalAddress"),
        _illegal_access,
        "sglang#16771 (HiCache), sglang#40232 (WSL2 registered host memory)",
    ),
    Signature(
        "cuda-out-of-memory",
        re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError: CUDA"),
        _oom,
        "torch.OutOfMemoryError (torch/cuda/memory.py)",
    ),
    Signature(
        "nccl-shared-memory",
        re.compile(r"Error while creating shared memory segment|failed to extend /dev/shm/nccl"
                   r"|/dev/shm/nccl-\S+.*(No space left|Bus error)|^Bus error"),
        _nccl_shm,
        "sglang#4259; NVIDIA/nccl#342",
    ),
    Signature(
        "nccl-p2p",
        re.compile(r"NCCL error.*unhandled cuda error|peer access is not supported|"
                   r"NCCL WARN Cuda failure.*peer"),
        _nccl_p2p,
        "microsoft/WSL#12467; vllm#5161",
    ),
    Signature(
        "address-in-use",
        re.compile(r"\[Errno 98\] (error while attempting to bind on address .*: )?"
                   r"[Aa]ddress already in use"),
        _addr_in_use,
        "vllm#9763; sglang#9396",
    ),
    Signature(
        "warmup-through-proxy",
        # sglang/srt/entrypoints/http_server.py _execute_server_warmup: "Initialization failed.
        # warmup error: {last_traceback}", the traceback carrying res=<Response [502]>
        re.compile(r"Initialization failed\. warmup error|<Response \[(502|403)\]>"),
        _warmup_proxy,
        "sglang/srt/entrypoints/http_server.py (_execute_server_warmup); sglang#9814",
    ),
    Signature(
        "runtime-module-missing",
        re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'"),
        _module_missing,
        "sglang/launch_server.py imports sglang.srt (torch, pybase64, ...) before parsing args",
    ),
    Signature(
        "no-gpu",
        re.compile(r"Found no NVIDIA driver|No CUDA GPUs are available|"
                   r"CUDA driver initialization failed|libcuda\.so.*cannot open"),
        _no_gpu,
        "torch.cuda initialisation errors",
    ),
    Signature(
        "health-without-generate",
        None,
        _health_only,
        "sglang#22779",
        when=lambda f: bool(f.timed_out and f.health_ok and f.generate_ok is False),
    ),
)

_TRACEBACK_START = "Traceback (most recent call last):"


def _repeating_traceback(lines: Sequence[str]) -> Match | None:
    """The same traceback (by its last line) three or more times: a crash loop, not one fault."""
    ends: list[str] = []
    in_tb = False
    for i, line in enumerate(lines):
        if _TRACEBACK_START in line:
            in_tb = True
            continue
        if in_tb and line and not line.startswith((" ", "\t")):
            ends.append(_strip_prefix(line))
            in_tb = False
    if not ends:
        return None
    last, count = Counter(ends).most_common(1)[0]
    if count < 3:
        return None
    return Match(
        id="repeating-traceback",
        line=last,
        explanation=f"the same traceback repeated {count} times: the server (or one of its "
        "processes) is crash-looping on one fault, so restarting will not help",
        fix="fix the fault the traceback names; escha-deploy never restarts a server that has "
        "not yet become ready",
        source="escha-deploy launch policy (no restart while starting)",
    )


_LOG_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{3})?[^\]]*\] ")


def _strip_prefix(line: str) -> str:
    """Drop SGLang's ``[%Y-%m-%d %H:%M:%S TP0]`` prefix (sglang/srt/utils/common.py
    configure_logger) so equal messages from different ranks compare equal."""
    return _LOG_PREFIX.sub("", line)


def diagnose(lines: Sequence[str], facts: Facts | None = None) -> Diagnosis:
    """Match the last log lines against ``SIGNATURES``.

    ``lines``: the server's output, oldest first (any length; the last ``TAIL_LINES`` are kept
    for printing, but all are searched, since a traceback's cause is often far above its end).
    Returns every signature that matched, in ``SIGNATURES`` order, plus a repeating-traceback
    match when one fault repeats. Never raises for odd input.
    """
    facts = facts or Facts()
    text_lines = [ln.rstrip("\n") for ln in lines]
    matches: list[Match] = []
    for sig in SIGNATURES:
        if not sig.when(facts):
            continue
        found: re.Match[str] | None = None
        line: str | None = None
        if sig.pattern is not None:
            for ln in text_lines:
                found = sig.pattern.search(ln)
                if found:
                    line = ln
                    break
            if found is None:
                continue
        advice = sig.explain(found, facts)
        if advice is None:
            continue
        matches.append(Match(id=sig.id, line=line, explanation=advice[0], fix=advice[1],
                             source=sig.source))
    rep = _repeating_traceback(text_lines)
    if rep is not None:
        matches.append(rep)
    return Diagnosis(exit_code=facts.exit_code, timed_out=facts.timed_out, matches=matches,
                     tail=text_lines[-TAIL_LINES:])
