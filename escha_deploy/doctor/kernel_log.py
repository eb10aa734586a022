"""The kernel log's GPU lines, for ``escha-deploy diagnose --kernel-log``.

A GPU lost from the bus (NVIDIA's Xid 79), a GSP timeout (Xid 119) and WSL2's GPU
paravirtualization failing to make memory resident are written to the kernel log by the driver,
not to the server's log: a container sees only "CUDA error: unspecified launch failure". This
reads the kernel log with ``dmesg``, else ``journalctl -k`` (this boot), where the user may
(``kernel.dmesg_restrict`` and the journal's permissions decide), and keeps the lines the
diagnosis table's device rows read. I/O only: the matching is ``launch/diagnose.py``'s.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence

#: The lines kept: the NVIDIA driver's Xid reports and its "fallen off the bus", nvidia-smi's
#: "GPU is lost", and dxgkrnl's residency failure under WSL2 (its boot-time
#: ``dxgkio_query_adapter_info`` failures are harmless, microsoft/WSL#40715, and are not kept).
GPU_LINE = re.compile(r"NVRM: Xid|fallen off the bus|GPU is lost|dxgkio_make_resident")
#: At most this many of the last matching lines are kept.
KEEP_LINES = 200
#: The readers tried, in order.
READERS: tuple[tuple[str, ...], ...] = (("dmesg",), ("journalctl", "-k", "-b", "--no-pager", "-q"))


def gpu_lines(run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
              readers: Sequence[Sequence[str]] = READERS, timeout_s: float = 15) -> tuple[list[str], str]:
    """``(lines, how)``: the kernel log's GPU lines (``GPU_LINE``, the last ``KEEP_LINES``) and
    the command that read them; or ``([], why)`` when no reader could read the log (not
    installed, not permitted, timed out), ``why`` naming each reader's failure. Never raises."""
    failed: list[str] = []
    for cmd in readers:
        try:
            r = run(list(cmd), capture_output=True, text=True, timeout=timeout_s, errors="replace")
        except (OSError, subprocess.TimeoutExpired) as exc:
            failed.append(f"{cmd[0]}: {getattr(exc, 'strerror', None) or exc}")
            continue
        if r.returncode != 0:
            err = (r.stderr or "").strip().splitlines()
            failed.append(f"{cmd[0]}: {err[-1] if err else f'exit {r.returncode}'}")
            continue
        return [ln for ln in r.stdout.splitlines() if GPU_LINE.search(ln)][-KEEP_LINES:], " ".join(cmd)
    return [], "the kernel log could not be read (" + "; ".join(failed) + ")"
