#!/usr/bin/env bash
# Build the serving closure (.closure/, ignored by git) on a machine with PyPI: SGLang 0.5.19
# patched by escha-deploy's series, sglang-kernel 0.4.5 cut to its Python files and sm90 ops,
# flashinfer 0.6.18 without its JIT sources, the pinned wheels and the stub modules, at most
# 50 MiB. Every departure from a stock install is listed in scripts/gpu_closure.py's docstring,
# in docs/runtime.md ("The serving closure") and in the closure's runtime.json (departures).
#
#   [PYTHON=...] scripts/gpu-closure.sh [--out DIR] [--downloads DIR]
#     PYTHON: an interpreter with pip and escha-deploy's dependencies (default python3)
#
# On the GPU machine: bash scripts/gpu-run.sh (installs it into /tmp, runs the gpu tests).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
exec "${PYTHON:-python3}" "$root/scripts/gpu_closure.py" build "$@"
