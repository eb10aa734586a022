"""All-reduce smoke test across N processes, one a GPU, with a timeout and a checked sum.

Run as ``python -m escha_deploy.doctor.nccl_smoke --world-size 2 [--backend nccl|gloo]
[--timeout 60] [--numel N] [--env NCCL_P2P_DISABLE=1 ...]``. The launcher starts
``world_size`` real processes (``--rank R``), each joining a ``torch.distributed`` group over
loopback (``MASTER_ADDR=127.0.0.1``, a free port), all-reducing ``numel`` float32 values
equal to ``rank + 1``, and checking every element equals ``N (N + 1) / 2``. It prints one JSON
summary line and exits 0 when every rank passed, 1 when one failed or the group hung past the
timeout (all ranks are then killed).

With ``nccl`` rank R uses ``cuda:R`` (of what ``CUDA_VISIBLE_DEVICES`` shows); ``gloo`` runs
on the CPU, which is how CI tests this module without a GPU. ``--env`` adds variables to
every rank (the P2P choice): microsoft/WSL#12467 (2 ranks, a few MB, 60 s).
Stdlib only at module level (torch is imported in the ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

DEFAULT_NUMEL = 1 << 20  # 4 MiB of float32, "a few MB" (microsoft/WSL#12467)
DEFAULT_TIMEOUT_S = 60.0
#: Seconds the other ranks get to report once one rank failed (they cannot finish without it).
FAILED_RANK_GRACE_S = 2.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, world_size: int, backend: str, numel: int, timeout_s: float) -> dict:
    """One rank: init, all-reduce, check. Returns this rank's JSON-able result."""
    import datetime

    import torch
    import torch.distributed as dist

    t0 = time.monotonic()
    if backend == "nccl" and not torch.cuda.is_available():
        return {"rank": rank, "ok": False, "ran": False, "error": "no CUDA device visible to torch"}
    if backend == "nccl":
        # rank R uses cuda:R; a rank that sees fewer GPUs (its own CUDA_VISIBLE_DEVICES, as a
        # node of a two-"node" run does) uses cuda:(R mod count)
        local = rank % max(torch.cuda.device_count(), 1)
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        x = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(x)
        if device.type == "cuda":
            torch.cuda.synchronize()
        want = world_size * (world_size + 1) / 2
        bad = int((x != want).sum().item())
        result = {"rank": rank, "ok": bad == 0, "sum": float(x[0].item()), "expected": want,
                  "wrong_elements": bad, "seconds": round(time.monotonic() - t0, 3)}
        if backend == "nccl":
            v = torch.cuda.nccl.version()
            result["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        return result
    finally:
        dist.destroy_process_group()


def _wait_ranks(procs: list[subprocess.Popen], deadline: float) -> int | None:
    """Poll the rank processes until all exited, one failed, or ``deadline`` (monotonic s).
    A failed rank (non-zero exit) means the all-reduce cannot complete: the others get
    ``FAILED_RANK_GRACE_S`` to report, then the caller kills them. Returns the first failed
    rank, or ``None`` (all exited 0, or the deadline passed with some still running)."""
    failed_at = None
    failed = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if failed is None:
            failed = next((r for r, p in enumerate(procs) if p.returncode not in (None, 0)), None)
            if failed is not None:
                failed_at = now
        if now >= deadline or (failed_at is not None and now - failed_at >= FAILED_RANK_GRACE_S):
            break
        time.sleep(0.05)
    if failed is None:
        failed = next((r for r, p in enumerate(procs) if p.returncode not in (None, 0)), None)
    return failed


def launch(world_size: int, backend: str = "nccl", timeout_s: float = DEFAULT_TIMEOUT_S,
           numel: int = DEFAULT_NUMEL, env: dict[str, str] | None = None,
           startup_grace_s: float = 30.0, rank_env: list[dict[str, str]] | None = None,
           master: tuple[str, int] | None = None) -> dict:
    """Start ``world_size`` rank processes and wait up to ``timeout_s`` plus
    ``startup_grace_s`` (importing torch and creating CUDA contexts).

    ``rank_env[R]`` is added to rank R's environment after ``env`` (a node's own settings, e.g.
    ``NCCL_HOSTID`` and ``CUDA_VISIBLE_DEVICES``); ``master`` is the rendezvous ``(host, port)``
    (default 127.0.0.1 and a free port). A rank that fails ends the wait: the others get
    ``FAILED_RANK_GRACE_S`` and are then stopped. Returns ``{"ok", "backend", "world_size", "env",
    "hung", "seconds", "ranks", "error"}``, plus ``nccl_info`` (per rank, NCCL's lines that name
    the nodes and the transport) when ``NCCL_DEBUG=INFO`` was set; ``hung`` is true when the
    ranks were killed at the deadline.
    """
    host, port = master or ("127.0.0.1", _free_port())
    base_env = dict(os.environ)
    base_env.update({"MASTER_ADDR": host, "MASTER_PORT": str(port),
                     "WORLD_SIZE": str(world_size), "PYTHONUNBUFFERED": "1"})
    base_env.update(env or {})
    t0 = time.monotonic()
    deadline = t0 + timeout_s + startup_grace_s
    ranks, errors, hung, info = [], [], False, []
    # each rank writes to its own files (a pipe left unread while another rank is awaited could
    # fill and stall it); the launcher polls every rank, so one that fails ends the wait
    with tempfile.TemporaryDirectory(prefix="escha-nccl-smoke-") as tmp:
        procs, outputs = [], []
        for rank in range(world_size):
            cmd = [sys.executable, "-m", "escha_deploy.doctor.nccl_smoke", "--rank", str(rank),
                   "--world-size", str(world_size), "--backend", backend,
                   "--timeout", str(timeout_s), "--numel", str(numel)]
            renv = {**base_env, **(rank_env[rank] if rank_env else {})}
            out = open(os.path.join(tmp, f"rank{rank}.out"), "w+", encoding="utf-8", errors="replace")
            err = open(os.path.join(tmp, f"rank{rank}.err"), "w+", encoding="utf-8", errors="replace")
            outputs.append((out, err))
            procs.append(subprocess.Popen(cmd, env=renv, stdout=out, stderr=err, text=True,
                                          start_new_session=True))
        failed = _wait_ranks(procs, deadline)
        hung = failed is None and any(p.returncode is None for p in procs)
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for rank, (p, (out_f, err_f)) in enumerate(zip(procs, outputs)):
            out_f.seek(0)
            err_f.seek(0)
            out, err = out_f.read(), err_f.read()
            out_f.close()
            err_f.close()
            info.append([ln.strip() for ln in (out + "\n" + err).splitlines() if "NCCL INFO" in ln
                         and any(k in ln for k in (" via ", "nNodes", "NET/Socket", "Using network"))][:40])
            line = next((ln for ln in reversed(out.splitlines()) if ln.startswith("{")), None)
            if line:
                ranks.append(json.loads(line))
            elif failed is not None and rank != failed and p.returncode == -signal.SIGKILL:
                errors.append(f"rank {rank} stopped: rank {failed} failed, so the all-reduce "
                              "could not finish")
            else:
                tail = [ln for ln in err.strip().splitlines() if ln.strip()][-1:] or ["no output"]
                errors.append(f"rank {rank} exited {p.returncode}: {tail[0]}")
    if hung:
        errors.insert(0, f"all-reduce did not finish within {timeout_s:g} s (ranks killed)")
    ok = not hung and len(ranks) == world_size and all(r.get("ok") for r in ranks)
    if not ok:  # what the failed ranks said first, then the ranks that said nothing
        errors = [f"rank {r['rank']}: sum {r.get('sum')} != {r.get('expected')}"
                  if "sum" in r else f"rank {r['rank']}: {r.get('error')}"
                  for r in ranks if not r.get("ok")] + errors
    # a rank that could not run (no torch, no CUDA device visible to it) makes the attempt
    # unknown, not failed: nothing was tried over the GPUs
    ran = not any(r.get("ran") is False for r in ranks)
    result = {"ok": ok, "ran": ran, "backend": backend, "world_size": world_size, "env": dict(env or {}),
              "hung": hung, "seconds": round(time.monotonic() - t0, 2), "ranks": ranks,
              "error": "; ".join(errors) or None}
    if any(info):
        result["nccl_info"] = info
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m escha_deploy.doctor.nccl_smoke",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds")
    parser.add_argument("--numel", type=int, default=DEFAULT_NUMEL, help="float32 elements")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set for every rank (repeatable), e.g. NCCL_P2P_DISABLE=1")
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        try:
            result = rank_main(args.rank, args.world_size, args.backend, args.numel, args.timeout)
        except ImportError as exc:  # no torch here: the smoke test did not run (unknown, not failed)
            result = {"rank": args.rank, "ok": False, "ran": False, "error": f"{type(exc).__name__}: {exc}"}
        except Exception as exc:
            result = {"rank": args.rank, "ok": False,
                      "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"}
        sys.stdout.write(json.dumps(result) + "\n")
        return 0 if result.get("ok") else 1
    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--env {item!r}: write NAME=VALUE")
        env[name] = value
    result = launch(args.world_size, args.backend, args.timeout, args.numel, env)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
