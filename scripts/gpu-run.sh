#!/usr/bin/env bash
# One run of the gpu tests on a GPU machine without a package index, from this checkout plus the
# serving closure (.closure/, built by scripts/gpu-closure.sh where PyPI is reachable).
#
#   bash scripts/gpu-run.sh [PHASES]       PHASES: comma list, default "serve"
#     serve     tests/runtime/test_real_server_gpu.py: native `serve --profile` of the tiny rig
#               (tests/gpu_rig/h200-tiny.yaml) -> ready -> drift check -> host-tier load-back -> SIGTERM
#     alloc     tests/runtime/test_host_alloc_lifetime_gpu.py: the pinned allocator's lifetime
#     pinned    tests/runtime/test_real_server_shape_gpu.py on the shape-true rig
#     register  (tests/gpu_rig/h200-shape-true.yaml), one server start each: pinned memory under
#               the real server with that allocator, against the plan
#     stock     the same shape-true argv on the stock SGLang tree (gpu_closure.py install --stock
#               into /tmp/escha-closure-stock): the series A/B
#     pools     tests/runtime/test_host_pools_gpu.py: SGLang's host pools on the real GPU
#     canary    tests/bench/test_canary_gpu.py (tiny rig): the default canary, first requests after ready
#     status    tests/watch/test_status_gpu.py (tiny rig): status --watch/--check/--record under load
#     ab        tests/bench/test_ab_gpu.py (tiny rig): bench --hicache-ab, native launcher
#     tier      scripts/gpu_tier_variants.py: the shape-true rig once per host-tier variant (write
#               policy, mamba strategy, ratio, chunk size; TIER_VARIANTS, TIER_PARALLEL at a time),
#               each driven by `canary` then `bench`, writing $OUT/tier.json
#     spec      tests/runtime/test_speculative_gpu.py: NEXTN on the tiny rig's model with one MTP
#               layer (make_model.py tiny-mtp) and HiCache on: the host and device pools against the plan
#     shape     pinned,register,stock
#     all       serve,alloc,pools,pinned,register,stock (more than one 10-minute call)
#   Two calls of about 8 minutes hold the whole of it: "serve,alloc,pinned", then "register,stock"
#   with the first call's jit-triton.tgz copied to .closure/cache/.
#   PYTEST_K  a pytest -k expression for the selected tests, e.g. PYTEST_K="not torch_caching"
#
# Steps: check and unpack the closure into /tmp/escha-closure (gpu_closure.py install: a closure
# for another Python, torch, CUDA, card or SGLang release is refused naming what differs, a
# missing piece is one line naming it), restore the JIT and Triton caches a previous run left
# (.closure/cache/jit-triton.tgz, when carried), make the rig's models, run
# `python3 -m pytest -m gpu -q` on the phases' tests, then write to $OUT (default
# /tmp/escha-gpu-out): run.log, report.json (ESCHA_GPU_REPORT: the tests' figures and the
# phases' times), junit.xml, logs.tgz (serve's and SGLang's logs) and jit-triton.tgz (copy it to
# .closure/cache/ for the next run: ready in about half the time).
#
# Deadline: DEADLINE seconds (default 540) for the whole run; pytest gets what is left less 45 s,
# then SIGTERM, then SIGKILL; every process this run started (marked by ESCHA_GPU_RUN in its
# environment: the server's tree included, whatever its session) is killed before the outputs
# are packed.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PHASES="${1:-serve}"
case ",$PHASES," in *,all,*) PHASES="$PHASES,serve,alloc,pools,pinned,register,stock";; esac
case ",$PHASES," in *,shape,*) PHASES="$PHASES,pinned,register,stock";; esac
OUT="${OUT:-/tmp/escha-gpu-out}"
DEADLINE="${DEADLINE:-540}"
CLOSURE="${CLOSURE:-$ROOT/.closure}"
DEST=/tmp/escha-closure
STOCK=/tmp/escha-closure-stock
RIG=/tmp/escha-rig
mkdir -p "$OUT" "$RIG/logs"
exec > >(tee -a "$OUT/run.log") 2>&1
export ESCHA_GPU_RUN="gpu-run-$$-$T0"  # after tee started: tee does not carry the mark
has() { case ",$PHASES," in *",$1,"*) return 0;; esac; return 1; }
shape_runs=""; for r in pinned register stock; do has $r && shape_runs="$shape_runs${shape_runs:+,}$r"; done
STEPS=""
step() { STEPS="$STEPS${STEPS:+,}$1=$(el)"; echo "== $1 $(el)s"; }

kill_ours() {  # every process whose environment carries this run's mark, but this shell's ancestors
    local sig="$1" pids=() p
    for p in /proc/[0-9]*; do
        p="${p#/proc/}"
        [ "$p" = $$ ] || [ "$p" = "$BASHPID" ] && continue
        if tr '\0' '\n' 2>/dev/null < "/proc/$p/environ" | grep -qx "ESCHA_GPU_RUN=$ESCHA_GPU_RUN"; then pids+=("$p"); fi
    done
    [ ${#pids[@]} -gt 0 ] && { echo "gpu-run: kill -$sig ${pids[*]}"; kill "-$sig" "${pids[@]}" 2>/dev/null; }
    return 0
}

echo "== gpu-run $ESCHA_GPU_RUN phases=$PHASES deadline=${DEADLINE}s commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"

step install
python3 "$ROOT/scripts/gpu_closure.py" install "$CLOSURE" "$DEST" > "$RIG/install.json" || {
    rc=$?; echo "gpu-run: the closure was not installed (exit $rc)"; exit $rc; }
if has stock; then
    python3 "$ROOT/scripts/gpu_closure.py" install --stock "$CLOSURE" "$STOCK" > "$RIG/install-stock.json" || {
        rc=$?; echo "gpu-run: the stock tree was not installed (exit $rc)"; exit $rc; }
    export ESCHA_GPU_STOCK_DIR="$STOCK"
fi
# shellcheck disable=SC1091
. "$DEST/env.sh"
export PYTHONPATH="$PYTHONPATH:$ROOT" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export SGLANG_JIT_CACHE_DIR=/tmp/escha-cache/jit TRITON_CACHE_DIR=/tmp/escha-cache/triton
export ESCHA_GPU_REPORT="$OUT/report.json" ESCHA_GPU_LOGS="$RIG/logs"
mkdir -p /tmp/escha-cache
if [ -f "$CLOSURE/cache/jit-triton.tgz" ]; then
    tar xzf "$CLOSURE/cache/jit-triton.tgz" -C /tmp/escha-cache && echo "caches restored: $(du -sh /tmp/escha-cache | cut -f1)"
fi
echo "runtime: $(python3 -c "import json,os; d=json.load(open(os.environ['ESCHA_RUNTIME_DESCRIPTION'])); print(d['kind'], d['sglang_version'], d['capabilities'])")"

step models
rc=0
make() { [ -f "$RIG/models/$1/config.json" ] || python3 "$ROOT/tests/gpu_rig/make_model.py" "$1" "$RIG/models/$1"; }
make tiny || rc=4
if { [ -n "$shape_runs" ] || has tier; } && [ $rc = 0 ]; then make shape-true || rc=4; fi
if has spec && [ $rc = 0 ]; then make tiny-mtp || rc=4; fi
[ $rc = 0 ] || echo "gpu-run: a model was not made (exit 4): no tests run"

tests=()
has serve && tests+=(tests/runtime/test_real_server_gpu.py)
if has alloc; then
    if [ -f "$ROOT/tests/runtime/test_host_alloc_lifetime_gpu.py" ]; then tests+=(tests/runtime/test_host_alloc_lifetime_gpu.py)
    else echo "gpu-run: alloc: tests/runtime/test_host_alloc_lifetime_gpu.py is not in this checkout"; fi
fi
has pools && tests+=(tests/runtime/test_host_pools_gpu.py)
# day two on the tiny rig, each a fresh server: the canary as the first requests after ready,
# status through a load that reaches the host tier, bench --hicache-ab with the native launcher
has canary && tests+=(tests/bench/test_canary_gpu.py)
has status && tests+=(tests/watch/test_status_gpu.py)
has ab && tests+=(tests/bench/test_ab_gpu.py)
has spec && tests+=(tests/runtime/test_speculative_gpu.py)
[ -n "$shape_runs" ] && tests+=(tests/runtime/test_real_server_shape_gpu.py)
export ESCHA_GPU_SHAPE_RUNS="$shape_runs"
if has tier && [ $rc = 0 ]; then
    step tier
    left=$(( DEADLINE - $(el) - 45 ))
    timeout --signal=TERM --kill-after=20 "$left" python3 "$ROOT/scripts/gpu_tier_variants.py" \
        --variants "${TIER_VARIANTS:-base,write_back,chunk2048,chunk8192,ratio8,ratio1,no_buffer}" \
        --parallel "${TIER_PARALLEL:-3}" --deadline $(( left - 30 )) --out "$OUT"
    rc=$?
    kill_ours TERM; sleep 3; kill_ours KILL
fi
if [ $rc = 0 ] && [ ${#tests[@]} -gt 0 ]; then
    left=$(( DEADLINE - $(el) - 45 ))
    step pytest
    echo "pytest: ${left}s left: ${tests[*]} (shape runs: ${shape_runs:-none})"
    if [ "$left" -lt 60 ]; then echo "gpu-run: ${left}s left, too little for the tests"; rc=5; else
        k=(); [ -n "${PYTEST_K:-}" ] && k=(-k "$PYTEST_K")
        (cd "$ROOT" && timeout --signal=TERM --kill-after=20 "$left" python3 -m pytest -m gpu -q -rsx -p no:cacheprovider --durations=0 \
            --junitxml="$OUT/junit.xml" -o junit_family=xunit2 "${k[@]}" "${tests[@]}")
        rc=$?
        [ $rc = 124 ] || [ $rc = 137 ] && echo "gpu-run: pytest ran past its ${left}s"
    fi
fi
kill_ours TERM; sleep 3; kill_ours KILL

step outputs
tar czf "$OUT/logs.tgz" -C "$RIG" logs $(cd "$RIG" && ls install*.json 2>/dev/null) 2>/dev/null
tar czf "$OUT/jit-triton.tgz" -C /tmp/escha-cache . 2>/dev/null
python3 - "$OUT/report.json" "$PHASES" "$rc" "$(el)" "$STEPS" "$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)" "$CLOSURE" "$OUT/junit.xml" <<'PY'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path
p = Path(sys.argv[1]); doc = json.loads(p.read_text()) if p.is_file() else {}
closure = Path(sys.argv[7])
size = sum(f.stat().st_size for f in closure.iterdir() if f.is_file()) if closure.is_dir() else None
tests = {}
if Path(sys.argv[8]).is_file():
    for case in ET.parse(sys.argv[8]).getroot().iter("testcase"):
        out = "failed" if case.find("failure") is not None or case.find("error") is not None else (
            "skipped" if case.find("skipped") is not None else "passed")
        tests[case.get("name")] = {"outcome": out, "seconds": round(float(case.get("time", 0)), 1)}
try:
    import torch
    machine = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
except Exception as exc:
    machine = f"unknown ({exc})"
doc["run"] = {"phases": sys.argv[2], "pytest_exit": int(sys.argv[3]), "seconds": int(sys.argv[4]),
              "steps": {k: int(v) for k, v in (s.split("=") for s in sys.argv[5].split(",") if s)},
              "commit": sys.argv[6], "closure_bytes": size, "machine": machine, "tests": tests}
p.write_text(json.dumps(doc, indent=1))
PY
ls -la "$OUT"
echo "== end $(el)s pytest exit $rc"
exit $rc
