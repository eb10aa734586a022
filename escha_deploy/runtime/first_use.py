"""What the server needs after "ready": the first-use check.

SGLang builds some of its parts on first use, long after the start and health checks passed.
With an L3 storage backend (``--hicache-storage-backend``), the cache controller hashes each
page through SGLang's HiCache hash extension, which ``mem_cache/cpp_utils/native_hash.py:
_load_native_hash_module`` compiles then with ``torch.utils.cpp_extension.load``:
``hash_binding.cpp`` includes ``<openssl/sha.h>`` and links ``-lcrypto``, in torch's extensions
folder (``TORCH_EXTENSIONS_DIR``, else ``$XDG_CACHE_HOME`` or ``~/.cache``, then
``torch_extensions``). An image without OpenSSL's headers passes every start check and the
scheduler dies on the first long request ("Failed to load HiCache native hash extension";
Tanguille/cluster PR #4213; SGLang's own image added libssl-dev in sglang PR #31064). FlashInfer,
Triton and SGLang compile kernels into their cache folders likewise.

FlashInfer's JIT compiles with the CUDA toolkit it finds (``CUDA_HOME`` or ``CUDA_PATH``, else
the ``nvcc`` on ``PATH``; flashinfer ``jit/cpp_ext.py: get_cuda_path``) and drops an architecture
that toolkit is too old for (SM 12.x needs CUDA 12.9, ``compilation_context.py``): a native venv
or a custom image with a local nvcc 12.8 beside a cu130 torch starts, then dies at init on sm_120
(``No supported CUDA architectures found for major versions [12].``, vllm#50705, flashinfer#2577).

``check(l3=...)`` answers, in the environment it runs in (the image: `up` runs it in a
throw-away container with the launch's JIT cache volume, ``runtime verify --first-use`` inside
the image at build):

- ``cache``: each cache folder the launch points at (``FLASHINFER_WORKSPACE_BASE``,
  ``TRITON_CACHE_DIR``, ``TORCH_EXTENSIONS_DIR``, ``SGLANG_CACHE_DIR``, else torch's default)
  can be created and written;
- ``toolkit`` (with the GPUs' compute capabilities, ``archs``): the nvcc a JIT would use,
  read with ``nvcc --version``, is new enough for each GPU (``MIN_TOOLKIT``);
- ``hash extension`` (with ``l3``): a C++ compiler, ``<openssl/sha.h>`` and libcrypto's link
  library are there, and the compiler compiles and links a one-line translation unit that
  includes the header with ``-lcrypto`` in the extensions folder, and it runs; where SGLang's
  Python has torch, SGLang's own ``_load_native_hash_module`` then builds and loads the
  extension there, so the server's first use finds it built.

Standard library only: `up` runs this file's source with the image's Python (``python -c``),
whatever escha-deploy the image carries. ``python first_use.py [--l3] [--python PY]`` prints
the answer as one JSON line and exits 0 when every check passed, 3 otherwise.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: The variables that name the JIT cache folders (launch_spec.JIT_CACHE_ENV sets them in a container).
CACHE_ENV = ("FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "SGLANG_CACHE_DIR")
#: The one-line translation unit: OpenSSL's SHA-256, as hash_binding.cpp uses it, of the empty
#: string, whose digest starts with 0xe3 (FIPS 180-4 test vector e3b0c442...).
HASH_TU = ('#include <openssl/sha.h>\n'
           'int main(void) { unsigned char d[SHA256_DIGEST_LENGTH]; '
           'SHA256((const unsigned char *)"", 0, d); return d[0] == 0xe3 ? 0 : 1; }\n')
#: Where Debian/Ubuntu and /usr/local installs put the header and libcrypto's link library.
HEADER_GLOBS = ("/usr/include/openssl/sha.h", "/usr/local/include/openssl/sha.h", "/usr/include/*/openssl/sha.h")
LIB_GLOBS = ("/usr/lib/*/libcrypto.so", "/usr/lib/libcrypto.so", "/usr/lib64/libcrypto.so",
             "/usr/local/lib/libcrypto.so", "/usr/local/lib64/libcrypto.so")
#: SGLang's own loader, run as the server would run it on first use.
LOAD_SNIPPET = ("from sglang.srt.mem_cache.cpp_utils.native_hash import _load_native_hash_module as load; "
                "m = load(); print(type(m).__name__)")
#: The fix a missing build dependency gets.
INSTALL = "install g++ and libssl-dev in the image (Dockerfile.hicache does; apt-get install g++ libssl-dev)"


#: The variable that carries the GPUs' compute capabilities (``12.0,12.0``) into the check.
ARCHS_ENV = "ESCHA_FIRST_USE_ARCHS"
#: The oldest CUDA toolkit FlashInfer's JIT keeps a GPU of this major compute capability with:
#: SM 12.x requires CUDA 12.9 (flashinfer compilation_context.py: _normalize_cuda_arch, quoted in
#: flashinfer#2577 and flashinfer PR #3633; vllm#50705).
MIN_TOOLKIT: dict[int, tuple[int, int]] = {12: (12, 9)}


def jit_nvcc(environ: dict[str, str] | None = None) -> str | None:
    """The nvcc a JIT build uses here: ``$CUDA_HOME/bin/nvcc`` (or ``$CUDA_PATH``'s) when it
    exists, else the first ``nvcc`` on ``PATH`` (flashinfer jit/cpp_ext.py: get_cuda_path); None
    when there is none."""
    env = os.environ if environ is None else environ
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            cand = Path(env[var]) / "bin" / "nvcc"
            if cand.is_file():
                return str(cand)
    return shutil.which("nvcc", path=env.get("PATH", os.defpath))


def toolkit(archs: list[str], environ: dict[str, str] | None = None, *,
            timeout_s: float = 60) -> tuple[list[str], str]:
    """``(problems, detail)`` for the CUDA toolkit a JIT would use (``jit_nvcc``) against the
    GPUs' compute capabilities ``archs`` (``"12.0"``): a problem, naming the nvcc and its release,
    when it is older than ``MIN_TOOLKIT`` for one of them."""
    import re

    nvcc = jit_nvcc(environ)
    if nvcc is None:
        return [], "no nvcc on CUDA_HOME, CUDA_PATH or PATH: the JIT compiles with none older than the GPU"
    try:
        r = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=timeout_s, errors="replace")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"{nvcc} --version did not run ({exc}): FlashInfer's JIT uses this toolkit (CUDA_HOME/PATH)"], ""
    m = re.search(r"release (\d+)\.(\d+)", r.stdout)
    if m is None:
        return [f"{nvcc} --version names no release (exit {r.returncode}): FlashInfer's JIT uses this toolkit "
                "(CUDA_HOME/PATH)"], ""
    have = (int(m.group(1)), int(m.group(2)))
    problems = []
    for cc in sorted(set(archs)):
        major = int(cc.split(".")[0]) if cc.split(".")[0].isdigit() else 0
        need = MIN_TOOLKIT.get(major)
        if need and have < need:
            problems.append(
                f"{nvcc} is CUDA {have[0]}.{have[1]}, below the {need[0]}.{need[1]} FlashInfer's JIT needs for "
                f"sm_{cc.replace('.', '')}: it reads this toolkit (CUDA_HOME, CUDA_PATH, else PATH), drops the "
                f"architecture and the server dies at init ('No supported CUDA architectures found for major "
                f"versions [{major}].', vllm#50705); point CUDA_HOME and PATH at CUDA {need[0]}.{need[1]} or newer, "
                "or take this nvcc off PATH")
    return problems, f"{nvcc} is CUDA {have[0]}.{have[1]}"


def extensions_dir(environ: dict[str, str] | None = None) -> Path:
    """torch's extensions folder: ``TORCH_EXTENSIONS_DIR``, else ``$XDG_CACHE_HOME`` (or
    ``~/.cache``) / ``torch_extensions`` (torch/utils/cpp_extension.py: get_default_build_root,
    through torch._appdirs.user_cache_dir)."""
    env = os.environ if environ is None else environ
    if env.get("TORCH_EXTENSIONS_DIR"):
        return Path(env["TORCH_EXTENSIONS_DIR"])
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torch_extensions"


def cache_dirs(environ: dict[str, str] | None = None) -> list[Path]:
    """The JIT cache folders the server will write: those ``CACHE_ENV`` names (FlashInfer's
    cache is ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer``), and torch's extensions folder."""
    env = os.environ if environ is None else environ
    out = []
    for var in CACHE_ENV:
        if env.get(var):
            p = Path(env[var])
            out.append(p / ".cache" / "flashinfer" if var == "FLASHINFER_WORKSPACE_BASE" else p)
    out.append(extensions_dir(env))
    return list(dict.fromkeys(out))


def writable_problem(folder: Path) -> str | None:
    """None when ``folder`` can be created and a file written in it, else why not."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".escha-first-use-"):
            pass
    except OSError as exc:
        return f"{folder} is not writable ({exc.strerror or exc}): a kernel compiled on first use cannot be saved"
    return None


def _compiler() -> str | None:
    cxx = os.environ.get("CXX")
    if cxx and shutil.which(cxx):
        return shutil.which(cxx)
    return shutil.which("c++") or shutil.which("g++")


def hash_extension(folder: Path, *, python: str | None = None, timeout_s: float = 600) -> tuple[list[str], str]:
    """``(problems, detail)`` for SGLang's HiCache hash extension built in ``folder`` (torch's
    extensions folder): each missing part named (compiler, ``<openssl/sha.h>``, libcrypto), the
    compiler's own error when the one-line unit does not build, and, when ``python`` (SGLang's
    interpreter) has torch, SGLang's own loader's failure. ``detail`` says what passed."""
    problems: list[str] = []
    cxx = _compiler()
    header = [p for g in HEADER_GLOBS for p in glob.glob(g)]
    lib = [p for g in LIB_GLOBS for p in glob.glob(g)]
    if cxx is None:
        problems.append("no C++ compiler (c++, g++ or $CXX): SGLang compiles its HiCache hash extension on first "
                        f"use (mem_cache/cpp_utils/native_hash.py); {INSTALL}")
    if not header:
        problems.append("<openssl/sha.h> is missing (OpenSSL's headers, libssl-dev): SGLang's hash_binding.cpp "
                        f"includes it; {INSTALL}")
    if not lib:
        problems.append("libcrypto.so is missing (the link library -lcrypto needs, libssl-dev); " + INSTALL)
    if cxx is None:
        return problems, ""
    bad = writable_problem(folder)
    if bad:
        return problems + [bad], ""
    with tempfile.TemporaryDirectory(dir=folder, prefix="escha-first-use-") as d:
        src, exe = Path(d) / "sha.cpp", Path(d) / "sha"
        src.write_text(HASH_TU)
        r = subprocess.run([cxx, str(src), "-o", str(exe), "-lcrypto"], capture_output=True, text=True,
                           timeout=timeout_s, errors="replace")
        if r.returncode != 0:
            err = [ln for ln in r.stderr.splitlines() if "error" in ln.lower()] or r.stderr.splitlines()[-1:]
            if not any("<openssl/sha.h>" in p for p in problems) or not any("libcrypto" in p for p in problems):
                problems.append(f"{cxx} cannot build a unit that includes <openssl/sha.h> with -lcrypto in {folder}: "
                                + (err[0].strip() if err else f"exit {r.returncode}") + f"; {INSTALL}")
            return problems, ""
        ran = subprocess.run([str(exe)], capture_output=True, timeout=60)
        if ran.returncode != 0:
            return problems + [f"the unit built with {cxx} -lcrypto gave a wrong SHA-256 (exit {ran.returncode})"], ""
    if problems:  # built anyway (headers elsewhere): the compiler's answer wins
        problems = []
    detail = f"{cxx} builds and runs a unit with <openssl/sha.h> and -lcrypto in {folder}"
    py = python or os.environ.get("ESCHA_SGLANG_PYTHON") or sys.executable
    probe = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('torch') and u.find_spec('sglang') else 1)"
    if subprocess.run([py, "-c", probe], capture_output=True, timeout=120).returncode != 0:
        return [], detail + f"; {py} lacks torch or SGLang, so SGLang's own build of the extension was not tried"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(folder)}
    r = subprocess.run([py, "-c", LOAD_SNIPPET], capture_output=True, text=True, env=env, timeout=timeout_s,
                       errors="replace")
    if r.returncode != 0:
        tail = [ln for ln in r.stderr.splitlines() if ln.strip()][-3:]
        return [f"SGLang's _load_native_hash_module failed in {folder}: " + " | ".join(tail)], ""
    return [], detail + f"; SGLang's _load_native_hash_module built and loaded it in {folder}"


def sglang_hash_source(python: str | None = None) -> tuple[Path | None, str]:
    """``(hash_binding.cpp, where)``: the source SGLang's loader compiles on first use, found
    through SGLang's interpreter without importing SGLang (``importlib.util.find_spec``), when
    that SGLang has the lazy build (``mem_cache/cpp_utils/native_hash.py`` calling
    ``_load_native_hash_module``); ``(None, why)`` when it has none, or no SGLang is there."""
    py = python or os.environ.get("ESCHA_SGLANG_PYTHON") or sys.executable
    code = ("import importlib.util as u; s = u.find_spec('sglang'); "
            "print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')")
    try:
        r = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{py} did not run ({exc})"
    pkg = r.stdout.strip()
    if r.returncode != 0 or not pkg:
        return None, f"{py} finds no SGLang"
    cpp = Path(pkg) / "srt" / "mem_cache" / "cpp_utils"
    if not (cpp / "native_hash.py").is_file() or "_load_native_hash_module" not in (cpp / "native_hash.py").read_text():
        return None, f"SGLang at {pkg} builds no hash extension on first use (no cpp_utils/native_hash.py)"
    return cpp / "hash_binding.cpp", f"SGLang at {pkg}"


def check(*, l3: bool, python: str | None = None, environ: dict[str, str] | None = None,
          archs: list[str] | None = None) -> dict[str, object]:
    """Every first-use check for a launch (``l3``: it turns an L3 storage backend on), as
    ``{"ok": bool, "checks": [{"name", "ok", "detail", "problems"}]}``. The hash extension is
    checked where SGLang's interpreter (``python``, else ``$ESCHA_SGLANG_PYTHON``, else this one)
    finds an SGLang whose code builds it on first use (``sglang_hash_source``); the toolkit
    where the GPUs' compute capabilities are known (``archs``, else ``$ESCHA_FIRST_USE_ARCHS``).
    Never raises for a missing part; each is a problem line."""
    env = dict(os.environ if environ is None else environ)
    rows = []
    bad = [p for p in (writable_problem(d) for d in cache_dirs(env)) if p]
    rows.append({"name": "cache", "ok": not bad, "problems": bad,
                 "detail": "" if bad else "writable: " + ", ".join(str(d) for d in cache_dirs(env))})
    if archs is None:
        archs = [a for a in env.get(ARCHS_ENV, "").split(",") if a.strip()]
    if archs:
        problems, detail = toolkit(archs, env)
        rows.append({"name": "toolkit", "ok": not problems, "problems": problems, "detail": detail})
    if l3:
        source, where = sglang_hash_source(python)
        if source is None:
            rows.append({"name": "hash extension", "ok": True, "problems": [], "detail": f"not needed: {where}"})
        else:
            problems, detail = hash_extension(extensions_dir(env), python=python)
            if "#include <openssl/sha.h>" not in (source.read_text() if source.is_file() else ""):
                detail += f"; note: {source} no longer includes <openssl/sha.h>"
            rows.append({"name": "hash extension", "ok": not problems, "problems": problems,
                         "detail": f"{where}: {detail}" if detail else where})
    return {"ok": all(r["ok"] for r in rows), "checks": rows}


#: The variable `up` sets instead of ``--l3`` (its entrypoint passes the source, no arguments).
L3_ENV = "ESCHA_FIRST_USE_L3"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    py = args[args.index("--python") + 1] if "--python" in args else None
    result = check(l3="--l3" in args or os.environ.get(L3_ENV) == "1", python=py)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0 if result["ok"] else 3


if __name__ == "__main__":
    raise SystemExit(main())
