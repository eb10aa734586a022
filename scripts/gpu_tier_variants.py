#!/usr/bin/env python3
"""Does the host tier pay on a hybrid model, and what decides it: one real SGLang server per
variant of the shape-true rig (tests/gpu_rig/h200-shape-true.yaml), each changed in one setting,
each driven by escha-deploy's own instruments, for the GPU machine (scripts/gpu-run.sh, phase
``tier``).

Per variant: ``escha-deploy serve --print`` of the rig with the variant's ``--set`` keys gives the
argv and environment; SGLang's own launcher runs them (the serving closure's patched tree), with
``tests/gpu_rig/tier_trace`` on ``PYTHONPATH`` (a test-only sitecustomize recording the radix
tree's backups, evictions, mamba states and matches). Once ``/health`` answers:

1. ``escha-deploy canary -e URL --format json`` with its defaults, the first requests after
   ready (a 4,096-token prefix asked twice, fillers past the device pool, the prefix again);
2. ``escha-deploy bench -e URL --prefixes N --prefix-tokens T --format json``: N distinct
   prefixes of T tokens sent at once, then each again with another question (the first seed's
   "8 concurrent, distinct 18K prefixes, second pass", scaled to one rig rank's device pool);

``/metrics`` is read before and after each step (the ``sglang:`` series of the radix cache and
the host tier, summed over label sets but ``pool`` and ``cache_source``), then SIGTERM.

Writes ``$OUT/tier.json``: per variant the argv's changes, the canary's and bench's JSON, the
metric deltas per step, the trace's counts per step, seconds to ready; the logs and traces go
to ``$ESCHA_GPU_LOGS``. Variants run ``--parallel`` at a time (separate ports; the rig's pools
are a few GB of a GPU and of host RAM each), so the counts are this script's evidence and the
seconds are not benchmarks.

Usage: python3 scripts/gpu_tier_variants.py [--variants a,b,...] [--parallel K] [--deadline S]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "tests" / "gpu_rig" / "h200-shape-true.yaml"
TRACE_SITE = ROOT / "tests" / "gpu_rig" / "tier_trace"

#: Each variant changes one setting of the rig (write_through, extra_buffer from auto, ratio 4,
#: chunked prefill 1024), by profile keys (``--set``).
VARIANTS: dict[str, list[str]] = {
    "base": [],
    "write_back": ["hicache.hicache_write_policy=write_back"],
    "chunk2048": ["runtime.chunked_prefill_size=2048"],
    "chunk8192": ["runtime.chunked_prefill_size=8192"],
    "ratio8": ["hicache.hicache_ratio=8"],
    "ratio1": ["hicache.hicache_ratio=1"],
    # no_buffer refuses the overlap scheduler (arg_groups/mamba_hook.py: validate_mamba_no_buffer)
    "no_buffer": ["runtime.mamba_radix_cache_strategy=no_buffer",
                  "runtime.extra_args=[--grammar-backend, none, --skip-server-warmup, --cuda-graph-backend-decode, "
                  "disabled, --cuda-graph-backend-prefill, disabled, --disable-overlap-schedule]"],
    "wb_chunk8192": ["hicache.hicache_write_policy=write_back", "runtime.chunked_prefill_size=8192"],
    # patch 0004 (ESCHA_HICACHE_HOST_MAMBA_SLOTS): host mamba states apart from the ratio. The CPU
    # replay (tests/replay) predicts 8 of 8 prefixes back at 5,120 tokens each with ratio 2 and
    # 48 states, and none with ratio 1 and 48 states (host KV 28,673 tokens < 8 x 6,000)
    "r2_slots48": ["hicache.hicache_ratio=2", "env:ESCHA_HICACHE_HOST_MAMBA_SLOTS=48"],
    # what the plan's reachability (planner/reach.py) guarantees for 8 x 6,000: 56 states, 55,424
    # host KV tokens (ratio 2 gives 57,345)
    "r2_slots56": ["hicache.hicache_ratio=2", "env:ESCHA_HICACHE_HOST_MAMBA_SLOTS=56"],
    # the plan's own choice for the bench's workload (hicache.host_mamba_slots auto, the ratio auto):
    # ratio 1.95 and 56 host mamba states, all 8 prefixes back at 5,120 tokens each (plan's
    # host_tier_reach, recorded in tier.json beside what the server did)
    "planned": ["hicache.workload=8x6000", "hicache.host_mamba_slots=auto", "hicache.hicache_ratio=auto"],
    "r1_slots48": ["hicache.hicache_ratio=1", "env:ESCHA_HICACHE_HOST_MAMBA_SLOTS=48"],
}

SERIES = re.compile(r"^(sglang:[a-z_]+)(?:\{([^}]*)\})?\s+([0-9.eE+-]+|NaN)$")
KEEP = ("hicache", "load_back", "evicted", "cached_tokens", "mamba", "host_used", "backup", "dropped")


def metrics(base: str, save: Path | None = None) -> dict[str, float]:
    """The radix cache's and host tier's series, summed over labels but ``pool``/``cache_source``;
    the whole exposition is written to ``save`` when given (the status alarm's fixtures:
    watch/alerts.py, inert_host_tier)."""
    import httpx

    out: dict[str, float] = {}
    text = httpx.get(base + "/metrics", timeout=20).text
    if save is not None:
        save.write_text(text)
    for line in text.splitlines():
        m = SERIES.match(line.strip())
        if not m or not any(k in m.group(1) for k in KEEP) or m.group(3) == "NaN":
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        key = m.group(1) + "".join(f"{{{k}={labels[k]}}}" for k in ("pool", "cache_source") if k in labels)
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: round(b.get(k, 0.0) - a.get(k, 0.0), 3) for k in sorted(set(a) | set(b))
            if b.get(k, 0.0) != a.get(k, 0.0)}


def trace_counts(path: Path, t0: float, t1: float) -> dict[str, int]:
    """The trace's events between ``t0`` and ``t1``, counted by kind and outcome."""
    c: Counter[str] = Counter()
    if not path.is_file():
        return {}
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if not t0 <= e.get("t", 0) < t1:
            continue
        ev = e["event"]
        if ev == "backup":
            c[f"backup{'_mamba' if e['mamba'] else '_kv_only'}_{'ok' if e['ok'] else 'failed'}"] += 1
            c["backup_kv_tokens_ok" if e["ok"] else "backup_kv_tokens_failed"] += e["kv"]
        elif ev == "evict_leaf":
            c["evict_leaf_" + ("demoted" if e.get("backuped") else
                               "deferred_backup" if e.get("deferred_backup") else "deleted_unbacked")] += 1
            if not e.get("backuped") and not e.get("deferred_backup"):
                c["tokens_deleted_unbacked"] += e.get("tokens") or 0
        elif ev == "evict_host":
            c[f"evict_host_{e['pool']}_calls"] += 1
            c[f"evict_host_{e['pool']}_short"] += int(e["freed"] < e["asked"])
        elif ev == "mamba_state":
            if e["attached"]:
                c["mamba_state_" + ("chunk" if e["chunked"] else "final")] += 1
        elif ev == "mamba_evict":
            c[f"mamba_evict_{e['layer']}_{'leaf' if e['leaf'] else 'inner'}"
              f"{'_had_host' if e['host'] else ''}"] += 1
        elif ev == "match":
            c["match_calls"] += 1
            c["match_host_tokens"] += e["host"]
            c["match_with_host"] += int(e["host"] > 0)
        else:
            c[ev] += 1
    return dict(sorted(c.items()))


def escha(*args: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "escha_deploy", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


def run_variant(name: str, sets: list[str], port: int, logs: Path, prefixes: int, prefix_tokens: str,
                deadline: float) -> dict:
    import httpx

    rec: dict = {"variant": name, "sets": sets, "port": port}
    env = dict(os.environ)
    args = ["serve", "--profile", str(PROFILE), "--set", f"container.port={port}"]
    server_env = {}
    for s in sets:
        if s.startswith("env:"):  # a variable for the server only (a patch's knob no profile key sets yet)
            k, _, v = s[4:].partition("=")
            server_env[k] = v
        else:
            args += ["--set", s]
    r = escha(*args, "--print", env=env, timeout=300)
    if r.returncode != 0:
        rec["error"] = f"serve --print exit {r.returncode}: {r.stderr[-1500:]}"
        return rec
    spec = json.loads(r.stdout)
    rec["argv"] = spec["argv"]
    if any(x.startswith("hicache.workload=") for x in sets):  # the plan's prediction, beside what the server does
        pr = escha("plan", *args[1:], "--format", "json", env=env, timeout=300)
        try:
            rec["predicted"] = json.loads(pr.stdout).get("host_tier_reach")
        except ValueError:
            rec["predicted"] = {"exit": pr.returncode, "stderr": pr.stderr[-1500:]}
    rec["server_env"] = server_env
    trace = logs / f"tier-{name}.jsonl"
    trace.unlink(missing_ok=True)
    log = logs / f"tier-{name}.log"
    senv = dict(env, **spec["env"], **server_env, ESCHA_GPU_TIER_TRACE=str(trace),
                PYTHONPATH=os.pathsep.join([str(TRACE_SITE), env.get("PYTHONPATH", "")]))
    t_start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(spec["argv"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=senv,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                rec["error"] = f"server exited {proc.returncode} before ready: {log.read_text(errors='replace')[-3000:]}"
                return rec
            if time.monotonic() > deadline:
                rec["error"] = "not ready before the deadline"
                return rec
            try:
                if httpx.get(base + "/health", timeout=3).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        rec["ready_seconds"] = round(time.monotonic() - t_start, 1)
        info = httpx.get(base + "/server_info", timeout=20).json()
        rec["server"] = {k: info.get(k) for k in (
            "max_total_num_tokens", "max_mamba_cache_size", "chunked_prefill_size", "hicache_ratio",
            "hicache_write_policy", "mamba_radix_cache_strategy", "page_size", "max_running_requests")}
        steps = [
            ("canary", ["canary", "-e", base, "--format", "json"]),
            ("bench", ["bench", "-e", base, "--prefixes", str(prefixes), "--prefix-tokens", prefix_tokens,
                       "--decode-tokens", "32", "--answer-tokens", "8", "--format", "json"]),
        ]
        for step, cmd in steps:
            left = deadline - time.monotonic()
            if left < 30:
                rec[step] = {"skipped": f"{left:.0f} s left"}
                continue
            m0, t0 = metrics(base, logs / f"tier-{name}.{step}-before.metrics.txt"), time.time()
            s0 = time.monotonic()
            try:
                rr = escha(*cmd, env=env, timeout=left - 10)
                try:
                    body = json.loads(rr.stdout) if rr.stdout.strip() else None
                except ValueError:
                    body = {"stdout": rr.stdout[-2000:]}
                res = {"exit": rr.returncode, "report": body, "stderr": rr.stderr[-1500:]}
            except subprocess.TimeoutExpired:
                res = {"exit": None, "error": "timed out"}
            res["seconds"] = round(time.monotonic() - s0, 1)
            time.sleep(1.0)  # write-through acks and the metrics collector
            m1, t1 = metrics(base, logs / f"tier-{name}.{step}-after.metrics.txt"), time.time()
            res["metrics"] = delta(m0, m1)
            res["trace"] = trace_counts(trace, t0, t1)
            rec[step] = res
        rec["metrics_end"] = metrics(base)
    except Exception as exc:  # noqa: BLE001 - one variant's failure is recorded, the others go on
        rec["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except Exception:  # noqa: BLE001
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        rec["log_tail"] = [ln for ln in log.read_text(errors="replace").splitlines()
                           if "hierarchical" in ln or "mamba" in ln.lower() or "Error" in ln][-12:]
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="base,write_back,chunk2048,chunk8192,ratio8,ratio1,no_buffer")
    ap.add_argument("--parallel", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=480, help="seconds for the whole run")
    ap.add_argument("--prefixes", type=int, default=8)
    ap.add_argument("--prefix-tokens", default="6K")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/escha-gpu-out"))
    ns = ap.parse_args()
    names = [v for v in ns.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        print(f"gpu_tier_variants: unknown variant(s) {unknown}; known: {sorted(VARIANTS)}", file=sys.stderr)
        return 2
    logs = Path(os.environ.get("ESCHA_GPU_LOGS", "/tmp/escha-rig/logs"))
    logs.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + ns.deadline
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    with cf.ThreadPoolExecutor(max_workers=ns.parallel) as pool:
        futs = {pool.submit(run_variant, v, VARIANTS[v], 31000 + i, logs, ns.prefixes, ns.prefix_tokens,
                            deadline): v for i, v in enumerate(names)}
        for f in cf.as_completed(futs):
            rec = f.result()
            results.append(rec)
            print(f"== variant {rec['variant']}: ready {rec.get('ready_seconds')} s, "
                  f"error {rec.get('error', '-')[:300]}", flush=True)
            for step in ("canary", "bench"):
                s = rec.get(step) or {}
                print(f"   {step}: exit {s.get('exit')} in {s.get('seconds')} s; metrics {s.get('metrics')}; "
                      f"trace {s.get('trace')}", flush=True)
            (out / "tier.json").write_text(json.dumps(sorted(results, key=lambda r: names.index(r["variant"])),
                                                      indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
