"""Drive the GPU probes: each in its own process, with a timeout, read back as data.

The probe modules (``store_probe``, ``pinned_ceiling``, ``nccl_smoke``) run as
``python -m escha_deploy.doctor.<name>`` with this interpreter; ``up``'s preflight runs the
same commands inside the profile's image (``probe_argv``), since the container's limits are
what count. A crash, a kill or a timeout is a result, never an exception here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from escha_deploy.facts.findings import RestoreBandwidth, StoreProbeResult

#: Seconds one store-probe case may take (torch import + CUDA init + one kernel: ~5-10 s seen).
STORE_CASE_TIMEOUT_S = 120.0
#: Seconds the pinned ladder may take: 64 GiB in 1 GiB steps took 36 s (cudaHostAlloc) and
#: 43 s (cudaHostRegister) on the H200 machine, 2026-11-29 (docs/doctor.md).
PINNED_TIMEOUT_S = 300.0
DEFAULT_PINNED_STEP = 256 * 2**20


def probe_argv(module: str, *args: str, python: str | None = None) -> list[str]:
    """The command that runs probe ``module`` (``store_probe``, ``pinned_ceiling``,
    ``nccl_smoke``) with ``args``; ``python`` defaults to this interpreter (in an image: the
    image's ``python3``)."""
    return [python or sys.executable, "-m", f"escha_deploy.doctor.{module}", *args]


def _last_json(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def _tail(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def _import_failed(tail: str) -> bool:
    """True when a probe process died importing its own modules (escha_deploy, torch): the
    probe never ran, so its answer is unknown rather than failed."""
    return tail.startswith(("ModuleNotFoundError", "ImportError"))


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def run_store_case(case: str, method: str = "auto", timeout_s: float = STORE_CASE_TIMEOUT_S) -> tuple[StoreProbeResult, dict]:
    """Run one store-probe case in its own process; returns the result and the device
    attributes it read (only the ``device`` case reads them)."""
    try:
        out = subprocess.run(probe_argv("store_probe", "--case", case, "--method", method),
                             capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        return StoreProbeResult(case=case, ok=False, error=f"timed out after {timeout_s:g} s "
                                f"({_tail(_text(exc.stderr))})"), {}
    data = _last_json(out.stdout)
    if data is None:
        tail = _tail(out.stderr)
        return StoreProbeResult(case=case, ok=False, ran=not _import_failed(tail),
                                error=f"probe process exited {out.returncode}: {tail}"), {}
    return (StoreProbeResult(case=case, ok=bool(data.get("ok")), error=data.get("error"),
                             method=data.get("method"), ran=data.get("ran", True) is not False),
            data.get("attributes") or {})


def run_store_probe(cases: Sequence[str] | None = None, method: str = "auto",
                    timeout_s: float = STORE_CASE_TIMEOUT_S) -> tuple[list[StoreProbeResult], dict]:
    """Every case (default ``store_probe.CASES``), one process each, in order. Stops at a case
    that could not run (``ran`` false: no torch, no CUDA device visible to it): the later cases
    need the same torch."""
    from .store_probe import CASES

    results, attributes = [], {}
    for case in cases or CASES:
        result, attrs = run_store_case(case, method, timeout_s)
        results.append(result)
        attributes.update(attrs)
        if not result.ran:
            break
    return results, attributes


def pick_allocator(results: Sequence[StoreProbeResult]) -> str | None:
    """``register`` when kernel stores into ``cudaHostRegister(flags=0)`` memory work (SGLang
    0.5.19's host-pool path), else ``pinned`` when torch pinned (cudaHostAlloc) memory works,
    else ``None`` (no host memory the kernels can store into: HiCache cannot run)."""
    ok = {r.case: r.ok for r in results}
    if ok.get("host_register_flags_0"):
        return "register"
    if ok.get("torch_pinned"):
        return "pinned"
    return None


class PinnedCeiling(BaseModel):
    """The pinned ladder's answer. ``largest_bytes``: the largest pinned total that worked in
    one process; ``reached``: an allocation really failed (a ceiling); ``timed_out``: the ladder
    was killed first (``largest_bytes`` is then what it had reached)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allocator: str
    target_bytes: int
    step_bytes: int
    largest_bytes: int
    reached: bool
    timed_out: bool = False
    ran: bool = Field(default=True, description="False: the ladder could not run in that Python (no torch, or "
                      "no CUDA device visible to it); largest_bytes is then no measurement")
    error: str | None = None
    seconds: float | None = None
    extra: dict = Field(default_factory=dict)


def run_pinned_ceiling(target_bytes: int, allocator: str = "pinned", step_bytes: int = DEFAULT_PINNED_STEP,
                       timeout_s: float = PINNED_TIMEOUT_S, buffers: Sequence[int] = ()) -> PinnedCeiling:
    """Run the pinned ladder in its own process up to ``target_bytes``; then each of ``buffers``
    (the plan's per-rank host buffer sizes) alone: ``extra["buffers"]`` has what each pinned."""
    argv = probe_argv("pinned_ceiling", "--target", str(target_bytes), "--step", str(step_bytes),
                      "--allocator", allocator, *(["--buffers", ",".join(str(int(b)) for b in buffers)]
                                                  if buffers else []))
    timed_out = False
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        stdout, stderr, rc = out.stdout, out.stderr, out.returncode
    except subprocess.TimeoutExpired as exc:
        stdout, stderr, rc, timed_out = _text(exc.stdout), _text(exc.stderr), None, True
    largest, summary = 0, None
    for line in stdout.splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if "pinned" in data:
            largest = max(largest, int(data["pinned"]))
        if data.get("done"):
            summary = data
    common = dict(allocator=allocator, target_bytes=target_bytes, step_bytes=step_bytes)
    if summary is not None:
        extra = {k: v for k, v in summary.items()
                 if k not in ("done", "largest", "reached", "error", "seconds", "allocator", "ran")}
        return PinnedCeiling(**common, largest_bytes=int(summary["largest"]),
                             reached=bool(summary["reached"]), error=summary.get("error"),
                             ran=summary.get("ran", True) is not False,
                             seconds=summary.get("seconds"), extra=extra)
    why = f"timed out after {timeout_s:g} s" if timed_out else f"probe process exited {rc}: {_tail(stderr)}"
    # Killed mid-ladder (the OOM killer, say): what it printed is what worked; a kill by the
    # kernel is a real ceiling, a timeout is not.
    if not timed_out and _import_failed(_tail(stderr)):
        return PinnedCeiling(**common, largest_bytes=0, reached=False, ran=False, error=why)
    return PinnedCeiling(**common, largest_bytes=largest, reached=not timed_out and rc not in (0, None),
                         timed_out=timed_out, error=why)


def nccl_attempts(inv, platform: str, world_size: int = 2) -> list[dict[str, str]]:
    """NCCL environments to try, in order, for the first ``world_size`` GPUs of the NVML
    inventory ``inv`` (``facts.gpus.GpuInventory``; NVIDIA/nccl#1637, microsoft/WSL#12467).

    Under WSL2 or where NVML shows those GPUs without peer access (a GeForce/Titan brand or a
    P2P status other than ok: ``gpu_facts.peer_access``), P2P disabled first (a driver that
    claims P2P can hang NCCL there), then also shared memory off as the last resort. Elsewhere
    (peer access proven, or no NVML facts) P2P first, then P2P disabled when that hangs or sums
    wrong.
    """
    from escha_deploy.facts.gpu_rules import peer_access
    from escha_deploy.profile import key_env

    p2p_off = {key_env("container.nccl_p2p_disable"): "1"}  # what that profile key renders
    pa = peer_access(inv, range(world_size), platform)
    if platform == "wsl2" or pa.denied:
        return [p2p_off, {**p2p_off, "NCCL_SHM_DISABLE": "1"}]
    return [{}, p2p_off]


def run_nccl_smoke(world_size: int, attempts: Sequence[dict[str, str]], backend: str = "nccl",
                   timeout_s: float = 60.0) -> list[dict]:
    """Run the all-reduce smoke test with each environment in turn until one passes or one
    could not run (``ran`` false: no torch or no CUDA device in a rank; another environment
    would not help); returns every attempt's summary (the last one passed, did not run, or all
    failed)."""
    from .nccl_smoke import launch

    tried = []
    for env in attempts:
        result = launch(world_size, backend=backend, timeout_s=timeout_s, env=dict(env))
        tried.append(result)
        if result["ok"] or result.get("ran") is False:
            break
    return tried


#: Seconds the restore-bandwidth probe may take (torch import + CUDA init + 12 copies of 1 GiB).
RESTORE_TIMEOUT_S = 120.0


def run_restore_probe(page_bytes: int | None = None, nbytes: int | None = None,
                      timeout_s: float = RESTORE_TIMEOUT_S) -> tuple[RestoreBandwidth | None, str | None]:
    """Run ``restore_probe`` in its own process; ``(bandwidth, None)`` or ``(None, why not)``."""
    args = [*(["--page-bytes", str(page_bytes)] if page_bytes else []), *(["--bytes", str(nbytes)] if nbytes else [])]
    try:
        out = subprocess.run(probe_argv("restore_probe", *args), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s:g} s"
    data = _last_json(out.stdout)
    if data is None:
        return None, f"probe process exited {out.returncode}: {_tail(out.stderr)}"
    if not data.get("ok"):
        return None, str(data.get("error") or "failed")
    return RestoreBandwidth(**{k: v for k, v in data.items() if k != "ok"}), None
