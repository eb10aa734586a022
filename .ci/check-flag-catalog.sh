#!/usr/bin/env bash
# Rebuild the SGLang 0.5.19 flag catalog from the real parser and fail on any difference from
# the committed escha_deploy/catalog/sglang-0.5.19-flags.json.
#
# Steps: download the sglang wheel from the package index (pip download --no-deps); build a
# throwaway venv (.cache/flagcat-venv, or $ESCHA_FLAGCAT_VENV); install torch pinned by a
# constraints file to the CPU build (torch==2.13.0: nothing may pull a CUDA torch), the wheel
# with --no-deps, and the import chain's packages (scripts/gen_flag_catalog.py
# --print-requirements); run the generator with --check. The venv is kept afterwards so the
# pytest tests marked `wheel` (tests/test_flag_catalog.py) can use it in the same CI run.
#
# Measured on the 2-core CI machine (2026-11-29, shared with other jobs): 114 s in all, of
# which 88 s installing the requirements (--no-compile; byte-compiling took 134 s), 3 s sglang,
# 14 s the first import. docs/flag-catalog.md has more.
#
# Environment: PYTHON (default python3; must match a published sglang wheel: cp311 here),
# ESCHA_FLAGCAT_VENV (venv path), ESCHA_FLAGCAT_WHEEL or else ESCHA_SGLANG_WHEEL (the wheel
# .ci/test downloads; use this file instead of downloading one).
# Exit status: 0 same, 1 different (the diff is printed), other: setup failed.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
python="${PYTHON:-python3}"
venv="${ESCHA_FLAGCAT_VENV:-$repo/.cache/flagcat-venv}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$SECONDS

wheel="${ESCHA_FLAGCAT_WHEEL:-${ESCHA_SGLANG_WHEEL:-}}"
if [[ -z "$wheel" ]]; then
  "$python" -m pip download --quiet --no-deps --dest "$work/wheel" "sglang==0.5.19"
  wheel="$(ls "$work"/wheel/sglang-0.5.19-*.whl)"
fi
echo "flag catalog: wheel $(basename "$wheel")" >&2

# pip's resolver notes about sglang's other requirements are expected (--no-deps) and hidden.
quiet() { "$@" 2> >(grep -v -e "^sglang 0.5.19 requires " -e "is ignored: it is neither" >&2); }
step() { echo "flag catalog: $1 ($((SECONDS - start)) s)" >&2; }

rm -rf "$venv"
"$python" -m venv "$venv"
vpip=("$venv/bin/python" -m pip --quiet --disable-pip-version-check)
vinstall=("${vpip[@]}" install --no-compile)  # byte-compiling torch et al. costs more than it saves here
printf 'torch==2.13.0\n' >"$work/constraints.txt"
"$python" scripts/gen_flag_catalog.py --print-requirements >"$work/requirements.txt"
quiet "${vinstall[@]}" -c "$work/constraints.txt" -r "$work/requirements.txt"
step "parser requirements installed"
quiet "${vinstall[@]}" --no-deps "$wheel"
step "sglang installed"
"$venv/bin/python" - <<'EOF' >&2
import importlib.metadata as md
import torch
cuda = [d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia-")]
print(f"flag catalog: torch {torch.__version__} (CUDA {torch.version.cuda}), nvidia wheels: {cuda or 'none'}")
EOF

"$venv/bin/python" scripts/gen_flag_catalog.py --check
echo "flag catalog: same as committed ($((SECONDS - start)) s in all)" >&2
