#!/usr/bin/env bash
# Rebuild one SGLang release's flag catalog from its real parser and fail on any difference from
# the committed escha_deploy/catalog/releases/VERSION/flags.json.
#
# Usage: .ci/check-flag-catalog.sh [VERSION]   (default: the default release of
# escha_deploy/catalog/releases/index.yaml)
#
# Steps: find the release's wheel (below) or download it (pip download --no-deps); build a
# throwaway venv (.cache/flagcat-venv for the default release, .cache/flagcat-venv-VERSION for
# another, or $ESCHA_FLAGCAT_VENV); install torch pinned by a constraints file to the CPU build
# (torch==2.13.0: nothing may pull a CUDA torch), the wheel with --no-deps, and the import
# chain's packages (the release's parser-requirements.txt); run the generator with --check. The
# venv is kept afterwards so the pytest tests marked `wheel` (tests/test_flag_catalog.py) can
# use it in the same CI run.
#
# Measured on the 2-core CI machine (2026-11-29, shared with other jobs), 0.5.19: 114 s in all,
# of which 88 s installing the requirements (--no-compile; byte-compiling took 134 s), 3 s
# sglang, 14 s the first import. With uv the requirements took 19 s (2026-12-02, cold uv cache);
# docs/flag-catalog.md has more.
#
# Environment: PYTHON (default python3; must match a published sglang wheel: cp311 here),
# ESCHA_FLAGCAT_VENV (venv path), ESCHA_FLAGCAT_WHEEL (use this wheel file), else for the
# default release ESCHA_SGLANG_WHEEL (the wheel .ci/test downloads), else
# .cache/wheels/sglang-VERSION-*.whl when there is one; UV (uv's binary, else uv on PATH, else
# pip installs) and UV_FIND_LINKS (else pip's find-links: .ci/uv-env.sh).
# Exit status: 0 same, 1 different (the diff is printed), other: setup failed.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
python="${PYTHON:-python3}"
default="$(sed -n 's/^default: *"\(.*\)".*/\1/p' escha_deploy/catalog/releases/index.yaml)"
version="${1:-$default}"
if [[ "$version" == "$default" ]]; then
  venv="${ESCHA_FLAGCAT_VENV:-$repo/.cache/flagcat-venv}"
else
  venv="${ESCHA_FLAGCAT_VENV:-$repo/.cache/flagcat-venv-$version}"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$SECONDS

wheel="${ESCHA_FLAGCAT_WHEEL:-}"
if [[ -z "$wheel" && "$version" == "$default" ]]; then wheel="${ESCHA_SGLANG_WHEEL:-}"; fi
if [[ -z "$wheel" ]]; then wheel="$(ls "$repo"/.cache/wheels/sglang-"$version"-*.whl 2>/dev/null | head -1)"; fi
if [[ -z "$wheel" ]]; then
  "$python" -m pip download --quiet --no-deps --dest "$work/wheel" "sglang==$version"
  wheel="$(ls "$work"/wheel/sglang-"$version"-*.whl)"
fi
echo "flag catalog: wheel $(basename "$wheel")" >&2

# pip's resolver notes about sglang's other requirements are expected (--no-deps) and hidden.
quiet() { "$@" 2> >(grep -v -e "^sglang $version requires " -e "is ignored: it is neither" >&2); }
step() { echo "flag catalog: $1 ($((SECONDS - start)) s)" >&2; }

rm -rf "$venv"
# uv (UV, else on PATH; .ci/test installs it) makes the venv and installs the same pinned set as
# pip (byte-compiling neither: it costs more than it saves here) in a fraction of pip's time; its
# venv has no pip (nothing runs pip in it). pip where there is no uv.
uv="${UV:-$(command -v uv || true)}"
if [[ -n "$uv" ]]; then
  source "$repo/.ci/uv-env.sh"
  "$uv" venv --quiet --python "$python" "$venv"
  vinstall=("$uv" pip install --quiet --python "$venv/bin/python")
else
  "$python" -m venv "$venv"
  vinstall=("$venv/bin/python" -m pip --quiet --disable-pip-version-check install --no-compile)
fi
printf 'torch==2.13.0\n' >"$work/constraints.txt"
"$python" scripts/gen_flag_catalog.py --print-requirements --release "$version" >"$work/requirements.txt"
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

"$venv/bin/python" scripts/gen_flag_catalog.py --check --release "$version"
echo "flag catalog: sglang $version same as committed ($((SECONDS - start)) s in all)" >&2
