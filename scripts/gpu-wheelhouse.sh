#!/usr/bin/env bash
# The wheels a GPU machine without a package index needs to build SGLang 0.5.19's real host
# pools from this checkout (tests/runtime/test_host_pools_gpu.py, marked gpu).
#
#   scripts/gpu-wheelhouse.sh PYTHON_VERSION [OUT]
#     PYTHON_VERSION  the GPU machine's python3, e.g. 3.12
#     OUT             default .cache/gpu-wheelhouse-pyPYTHON_VERSION (ignored by git)
#
# OUT holds the sglang 0.5.19 wheel for that Python (unzipped by the test, never installed)
# and deps/: escha-deploy's own dependencies the machine may lack, and the pins SGLang's
# host-pool import chain needs (sglang's METADATA: transformers==5.12.1, tokenizers==0.22.2,
# apache-tvm-ffi==0.1.11, compressed-tensors==0.18.0), installed ahead of the machine's own
# packages: a newer transformers breaks SGLang's config registry at import.
#
# Not carried: sglang-kernel (built for torch 2.13; 377 MB) and flashinfer, which the test
# replaces by named stand-ins that fail if called; kubernetes-validate and smg (the tests that
# need them skip).
#
# On the GPU machine (the test reads ESCHA_GPU_WHEELHOUSE):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site OUT/deps/*.whl
#   PYTHONPATH=/tmp/site:$PWD ESCHA_GPU_WHEELHOUSE=OUT python3 -m pytest -m gpu tests/runtime
set -euo pipefail
py="${1:?usage: $0 PYTHON_VERSION [OUT]}"
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${2:-$root/.cache/gpu-wheelhouse-py$py}"
abi="cp${py/./}"
rm -rf "$out"
mkdir -p "$out/deps"
plats=()
for n in 5 17 24 26 27 28 31 34; do plats+=(--platform "manylinux_2_${n}_x86_64"); done
fetch() {  # fetch DEST SPEC...: binary wheels only, no dependency resolution (each pin is named)
    local dest="$1"; shift
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$py" \
        --implementation cp --abi "$abi" --abi abi3 --abi none "${plats[@]}" \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
        --dest "$dest" "$@"
}
fetch "$out" sglang==0.5.19
# escha-deploy's dependencies the GPU image lacks (pyproject.toml), pinned to what was tested
fetch "$out/deps" pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    typing-extensions==4.16.0 typer==0.28.0 annotated-doc==0.0.4 docker==7.2.0
# SGLang 0.5.19's import chain from srt/mem_cache/pool_host and srt/mem_cache/memory_pool
fetch "$out/deps" transformers==5.12.1 tokenizers==0.22.2 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 \
    orjson==3.13.0 pybase64==1.5.1 msgspec==0.23.0 pyzmq==27.3.0 starlette==1.10.0 fastapi==0.165.0 \
    opentelemetry-api==1.45.2 importlib-metadata==10.2.0 dill==0.4.1 setproctitle==1.3.8 loguru==0.7.3 \
    gguf==0.19.0 partial-json-parser==0.2.1.1.post7 interegular==0.3.3 distro==1.9.0 easydict==1.14 \
    ipython==9.18.1 ipython-pygments-lexers==1.1.1 decorator==5.3.1 jedi==0.20.1 parso==0.8.7 \
    matplotlib-inline==0.2.2 pexpect==4.9.0 ptyprocess==0.7.0 prompt-toolkit==3.0.53 wcwidth==0.9.4 \
    stack-data==0.6.3 executing==2.3.0 asttokens==3.0.2 pure-eval==0.2.4 traitlets==5.16.1
bytes=$(du -sb "$out" | cut -f1)
echo "gpu wheelhouse $out: $(ls "$out"/deps | wc -l) wheels + $(cd "$out" && ls sglang-*.whl), $bytes B" >&2
