#!/usr/bin/env bash
# Build the wheelhouse the images install escha-deploy from, for a target Python, on the host
# (containers here cannot reach the package index; real users build offline the same way).
#
#   scripts/build-wheelhouse.sh PYTHON_VERSION [OUT]
#     PYTHON_VERSION  the base image's python3, e.g. 3.12 (official sglang image) or 3.11
#                     (the Debian test base)
#     OUT             default build/wheelhouse-pyPYTHON_VERSION (what the Dockerfiles copy)
#
# escha-deploy itself is built from this checkout (pure Python); its dependencies are
# downloaded as binary wheels for CPython PYTHON_VERSION on manylinux x86_64.
set -euo pipefail
py="${1:?usage: $0 PYTHON_VERSION [OUT]}"
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${2:-$root/build/wheelhouse-py$py}"
rm -rf "$out"
mkdir -p "$out"
python3 -m pip wheel --quiet --no-deps --wheel-dir "$out" "$root"
abi="cp${py/./}"
plats=()
for n in 17 24 27 28 31 34; do plats+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download --quiet --only-binary=:all: --python-version "$py" \
    --implementation cp --abi "$abi" --abi abi3 --abi none "${plats[@]}" \
    --platform manylinux2014_x86_64 --platform any \
    --dest "$out" "$out"/escha_deploy-*.whl
ls "$out" | wc -l | xargs -I{} echo "wheelhouse $out: {} wheels for Python $py" >&2
