"""Render a gpu run's ``report.json`` (``scripts/gpu-run.sh`` writes it to ``$OUT``) into
docs/runtime.md, section "Real-server runs on the GPU machine", between the markers
``<!-- gpu-runs:begin -->`` and ``<!-- gpu-runs:end -->``.

    python3 scripts/gpu_report_to_docs.py REPORT.json [--docs docs/runtime.md] [--date YYYY-MM-DD]
        [--commit SHA] [--note TEXT] [--check]

One block per run, keyed by its commit and phases (``run.commit``, ``run.phases``): rendering the
same report again replaces its block, another run's block is added after the others. ``--commit``
names the commit where the report has none (runs before ``run.commit`` was recorded). ``--check``
exits 1 when the docs' block differs from what the report renders (nothing written).

What is rendered, from which keys: the run (``run``: commit, machine, closure bytes, phases, the
command, per-step and per-test seconds, pytest's exit); the tiny server (``real_server/ready``,
``real_server/preflight``, ``real_server/drift``, ``real_server/load_back``: every request with
its seconds, the first being the first forward, ``real_server/sigterm``); pinned memory under the
shape-true server (``shape/pinned``, ``shape/register``, ``shape/stock``, ``shape/ratio``); the
series A/B (``shape/stock`` beside ``shape/pinned`` and ``shape/register``); NEXTN with HiCache
on the tiny rig's MTP model (``spec/nextn``: the plan's and SGLang's host and device pools, the
pinned cost and the MemAvailable drop). A figure the report
lacks prints as "not in this run". Bytes are printed exactly, with GB (1e9) or MiB (2**20) as named.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- gpu-runs:begin -->", "<!-- gpu-runs:end -->"
NA = "not in this run"
MiB = 2**20


def _b(n) -> str:
    return NA if n is None else f"{n:,} B ({n / 1e9:.3f} GB)"


def _s(n) -> str:
    return NA if n is None else f"{n} s"


def _g(d: dict, *path, default=None):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def _run_block(doc: dict, commit: str | None, date: str | None, note: str | None) -> tuple[str, str]:
    run = doc.get("run", {})
    sha = (commit or run.get("commit") or "unknown")[:12]
    phases = run.get("phases", "serve")
    key = f"{sha} {phases}"
    out = [f"<!-- run {key} -->", f"### Run at {sha}: `{phases}`" + (f" ({date})" if date else ""), ""]
    if note:
        out += [note, ""]
    out += [f"- machine: {run.get('machine', NA)}; closure {_b(run.get('closure_bytes'))} carried (`.closure`)",
            f"- command: `bash scripts/gpu-run.sh {phases}` (device call, carry `[\".closure\"]`); "
            f"{run.get('seconds', NA)} s in all, pytest exit {run.get('pytest_exit', NA)}"]
    steps = run.get("steps") or {}
    if steps:
        out.append("- steps (seconds from the start): " + ", ".join(f"{k} {v}" for k, v in steps.items()))
    tests = run.get("tests") or {}
    if tests:
        out += ["", "| test | outcome | seconds |", "|---|---|---|"]
        out += [f"| `{n}` | {t['outcome']} | {t['seconds']} |" for n, t in tests.items()]
    out += _tiny(doc) + _shape(doc) + _ab(doc) + _spec(doc) + ["<!-- /run -->"]
    return key, "\n".join(out)


def _tiny(doc: dict) -> list[str]:
    if not any(k.startswith("real_server/") for k in doc):
        return []
    pre, lb = doc.get("real_server/preflight", {}), doc.get("real_server/load_back", {})
    drift, term = doc.get("real_server/drift"), doc.get("real_server/sigterm", {})
    steps = lb.get("steps") or []
    out = ["", "**Tiny rig** (`h200-tiny`, native `serve --profile`):", "",
           f"- ready {_g(doc, 'real_server/ready', 'seconds', default=NA)} s after `serve` started "
           f"({_g(doc, 'real_server/ready', 'processes', default=NA)} processes); SGLang's pre-flight "
           f"{_s(pre.get('preflight_seconds'))}, host pools {_b(pre.get('preflight_host_kv_bytes'))} KV + "
           f"{_b(pre.get('preflight_host_mamba_bytes'))} mamba (plan {_b(pre.get('plan_host_kv_bytes'))} + "
           f"{_b(pre.get('plan_host_mamba_bytes'))})"]
    if drift is not None:
        out.append(f"- drift check at ready: {len(drift.get('drift', []))} `drift:` lines; {drift.get('log')} figures "
                   f"from the log and {drift.get('server_info')} from /server_info agreed; /server_info beside "
                   f"the plan: {drift.get('server_info_vs_plan')}")
    if steps:
        out.append(f"- first forward (the first request, {steps[0][1].get('prompt_tokens')} tokens): "
                   f"{steps[0][1].get('seconds')} s")
        out += ["", "| request | prompt tokens | cached | cached_tokens_details | seconds |", "|---|---|---|---|---|"]
        out += [f"| {n} | {r.get('prompt_tokens')} | {r.get('cached_tokens')} | {r.get('details')} | {r.get('seconds')} |"
                for n, r in steps]
        kv = lb.get("load_back_kv")
        if kv is None and "load_back_kv_after" in lb:  # reports before the mamba pool was read
            kv = lb["load_back_kv_after"] - lb["load_back_kv_before"]
        out += ["", f"- host hit {lb.get('host_hit', NA)} tokens (expected {lb.get('expected_host_hit', NA)}); "
                f"`load_back_tokens_total` rose kv {NA if kv is None else kv}, mamba {lb.get('load_back_mamba', NA)}"]
    if term:
        out.append(f"- SIGTERM: exit {term.get('exit')} in {term.get('seconds')} s, tree of {term.get('tree')} "
                   f"processes, left {term.get('left')}")
    return out


def _moved(fig: dict) -> dict:
    """The /proc/meminfo fields that moved by 8 MiB or more across a run's host-pool window."""
    return (fig.get("where") or {}).get("meminfo_delta") or {}


def _pools(fig: dict) -> int | None:
    """The pinned pools of a run: the window's Shmem rise (tests/runtime/test_real_server_shape_gpu.py)."""
    return fig.get("pools_bytes", _moved(fig).get("Shmem"))


def _shape(doc: dict) -> list[str]:
    runs = [(n, doc[f"shape/{n}"]) for n in ("pinned", "register", "stock") if f"shape/{n}" in doc]
    if not runs:
        return []
    ratio = _g(doc, "shape/ratio", "recommended_ratio", default=NA)
    out = ["", f"**Shape-true rig** (`h200-shape-true` at ratio {ratio}, what `plan -p rtx5060ti-tp2-fp8 "
           "--host-ram 16GiB --wsl2` recommends; one server start per run):", "",
           "| run | ready s | plan pinned per rank | pinned pools (Shmem across the Allocating lines) | "
           "MemTotal - MemAvailable over the same window (of it AnonPages) | "
           "cudaHostAlloc buffers | drift lines / figures agreed | SIGTERM | not returned |",
           "|---|---|---|---|---|---|---|---|---|"]
    for n, f in runs:
        d = f.get("drift") or {}
        pools = _pools(f)
        diff = pools - f["plan_pinned_bytes"] if pools is not None and "plan_pinned_bytes" in f else None
        t = f.get("sigterm") or {}
        out.append(
            f"| {n} | {f.get('ready_seconds', NA)} | {_b(f.get('plan_pinned_bytes'))} | {_b(pools)}"
            + (f", {diff:+,} B ({diff / MiB:+.1f} MiB)" if diff is not None else "")
            + f" | {_b(f.get('measured_bytes'))} ({_b(_moved(f).get('AnonPages'))}) | {f.get('escha_buffers') or 'none'} | "
            f"{len(d.get('drift', []))} / {d.get('log', 0)} log + {d.get('server_info', 0)} /server_info | "
            f"exit {t.get('exit')} in {t.get('seconds')} s, left {t.get('left')} | "
            f"{_b(f.get('not_returned_bytes'))} |")
    return out


def _closure_release() -> str:
    """The SGLang release of the serving closure the GPU runs use (its recorded manifest,
    ``tests/gpu_rig/closure-manifest.json: target.sglang``, written by ``scripts/gpu_closure.py``)."""
    return json.loads((REPO / "tests" / "gpu_rig" / "closure-manifest.json").read_text(encoding="utf-8"))["target"]["sglang"]


def _pools_cell(fig: dict) -> str:
    """A run's host pools as it measured them (``_pools``: the Shmem rise) and, in brackets,
    the MemTotal - MemAvailable rise."""
    return f"{_b(_pools(fig))} ({_b(fig.get('measured_bytes'))})"


def _ab(doc: dict) -> list[str]:
    stock = doc.get("shape/stock")
    if not stock:
        return []
    g = stock.get("guard") or {}
    s, p = g.get("stock", {}), g.get("patched", {})
    pinned, register = doc.get("shape/pinned", {}), doc.get("shape/register", {})

    def checks(fig: dict) -> str:
        c = [x for x in fig.get("geometry", []) if x.get("event") == "check_host_pool"]
        return f"{len(c)} check(s), errors {[x.get('error') for x in c]}" if c else "no check ran"

    def geo(fig: dict) -> str:
        b = [x for x in fig.get("geometry", []) if x.get("event") == "build_kv_host_pool"]
        return "; ".join(f"{x.get('pool')} {x.get('size')} tokens, {x.get('geometry')}, problems {x.get('problems')}"
                         for x in b) or NA

    return ["", "**The series, stock against patched, on the shape-true server** (same argv; the stock tree "
            "from `gpu_closure.py install --stock`):", "",
            f"| patch | stock {_closure_release()} | patched |", "|---|---|---|",
            f"| 0001 host guard (`pool_host/base.py: host_memory_budget_bytes`, read here) | reserve "
            f"{_b(s.get('reserve_bytes'))}, budget per rank {_b(s.get('budget_bytes'))} of MemAvailable "
            f"{_b(s.get('mem_available'))} | reserve {_b(p.get('reserve_bytes'))} (the plan's), budget per rank "
            f"{_b(p.get('budget_bytes'))} of {_b(p.get('mem_available'))}; TP 1: one reading either way |",
            f"| 0002 allocator and its bytes (the window's /proc/meminfo Shmem rise across the host pools; "
            f"MemTotal - MemAvailable, which adds the process heap, in brackets) | register (mmap + "
            f"cudaHostRegister): {_pools_cell(stock)} | pinned (cudaHostAlloc, buffers "
            f"{pinned.get('escha_buffers') or NA}): {_pools_cell(pinned)}; register: "
            f"{_pools_cell(register)}; plan {_b(stock.get('plan_pinned_bytes'))} |",
            f"| 0003 geometry check on the KV host pool the server built | {checks(stock)}; pool: {geo(stock)} | "
            f"{checks(pinned or register)}; pool: {geo(pinned or register)} |"]


def render(docs: str, key: str, block: str) -> str:
    """``docs`` with ``block`` in the runs section: replacing the block of the same ``key``, else
    appended after the others. Raises ``ValueError`` when the markers are missing."""
    if BEGIN not in docs or END not in docs:
        raise ValueError(f"no {BEGIN} ... {END} section")
    head, rest = docs.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    rx = re.compile(rf"<!-- run {re.escape(key)} -->.*?<!-- /run -->", re.S)
    if rx.search(body):
        body = rx.sub(lambda _: block, body)
    else:
        body = body.rstrip("\n") + "\n\n" + block + "\n"
    return head + BEGIN + body.rstrip("\n") + "\n\n" + END + tail


def _spec(doc: dict) -> list[str]:
    f = doc.get("spec/nextn")
    if not f:
        return []
    plan, log, pre = f.get("plan") or {}, f.get("log") or {}, f.get("preflight") or {}
    moved, pools = _moved(f), _pools(f)
    diff = pools - plan["pinned_bytes"] if pools is not None and "pinned_bytes" in plan else None
    d, t = f.get("drift") or {}, f.get("sigterm") or {}
    out = ["", "**NEXTN with HiCache** (`h200-tiny` with the model's own MTP layer as the draft, "
           "`tests/runtime/test_speculative_gpu.py`):", "",
           f"- plan: host KV {plan.get('host_kv_bytes_per_token', NA)} B per token (the draft's layer packed), "
           f"{plan.get('host_kv_tokens', NA)} tokens, {_b(plan.get('host_kv_bytes'))}; host mamba "
           f"{_b(plan.get('host_mamba_bytes'))}; pinned {_b(plan.get('pinned_bytes'))} per rank; device KV "
           f"{plan.get('device_kv_tokens', NA)} tokens x {plan.get('device_kv_bytes_per_token', NA)} B, the draft's "
           f"{_b(plan.get('device_draft_kv_bytes'))}, intermediate mamba states "
           f"{_b(plan.get('device_mamba_intermediate_bytes'))}, {plan.get('device_mamba_slots', NA)} mamba slots",
           f"- `serve`'s pre-flight: host pools {_b(pre.get('host_kv_bytes'))} KV + {_b(pre.get('host_mamba_bytes'))} "
           f"mamba per rank",
           "- SGLang's log: " + "; ".join(f"`{x.strip()}`" for x in
                                         [*log.get("host_kv", []), *log.get("kv_device", []), *log.get("mamba_device", [])])
           if log else f"- SGLang's log: {NA}",
           f"- pinned pools (/proc/meminfo Shmem across the host pools' allocation): {_b(pools)}"
           + (f", {diff:+,} B against the plan" if diff is not None else "")
           + f"; MemTotal - MemAvailable over the same window {_b(f.get('measured_bytes'))}, of it the "
           f"processes' heap (AnonPages) {_b(moved.get('AnonPages'))}",
           f"- drift: {len(d.get('drift', []))} lines, {d.get('log', 0)} log + {d.get('server_info', 0)} /server_info "
           f"figures agreed; request: {f.get('generate', NA)}",
           f"- ready {f.get('ready_seconds', NA)} s; SIGTERM exit {t.get('exit')} in {t.get('seconds')} s, left "
           f"{t.get('left')}; not returned {_b(f.get('not_returned_bytes'))}"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--docs", type=Path, default=REPO / "docs" / "runtime.md")
    ap.add_argument("--commit")
    ap.add_argument("--date")
    ap.add_argument("--note")
    ap.add_argument("--machine", help="the machine, where the report has none")
    ap.add_argument("--closure-bytes", type=int, help="the closure's size, where the report has none")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    try:
        doc = json.loads(a.report.read_text())
        run = doc.setdefault("run", {})
        if a.machine and not run.get("machine"):
            run["machine"] = a.machine
        if a.closure_bytes and not run.get("closure_bytes"):
            run["closure_bytes"] = a.closure_bytes
        key, block = _run_block(doc, a.commit, a.date, a.note)
        old = a.docs.read_text()
        new = render(old, key, block)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"gpu_report_to_docs: {a.report}: {exc}", file=sys.stderr)
        return 2
    if a.check:
        return 0 if new == old else 1
    a.docs.write_text(new)
    print(f"gpu_report_to_docs: {a.docs}: run {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
