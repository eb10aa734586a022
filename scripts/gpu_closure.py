"""The serving closure: what a GPU machine without a package index needs to run SGLang 0.5.19,
patched by escha-deploy's series, on that machine's own torch 2.11 (``scripts/gpu-closure.sh``).

    python3 scripts/gpu_closure.py build [--out .closure] [--downloads .cache/closure-dl]
        On a machine with PyPI: download the pinned pieces, unzip SGLang's wheel, patch it with
        ``escha-deploy runtime apply``, trim, cut down sglang-kernel and flashinfer, pack, write
        ``manifest.json`` and the runtime description, print the total (at most ``BUDGET``).
    python3 scripts/gpu_closure.py install CLOSURE DEST
        On the GPU machine: refuse a closure built for another Python, torch, CUDA, card or SGLang
        release, or from another patch series than this checkout's (each difference named, exit 3) or one with a piece missing or altered (one line
        per piece, exit 2); unpack into DEST, write DEST/runtime.json (the description native
        ``serve`` plans with, through ``$ESCHA_RUNTIME_DESCRIPTION``) and DEST/env.sh.
    python3 scripts/gpu_closure.py install --stock CLOSURE DEST
        The same, then SGLang's tree put back to the stock 0.5.19 wheel's: the files the series
        changed restored and the files it added removed (the ``sglang-stock`` piece), with the
        same trim and departures, for the series' A/B on the real server; its description has
        no series and no capabilities (``stock: true``).
    python3 scripts/gpu_closure.py check CLOSURE
        The target and piece checks of ``install`` alone.

Departures from a stock ``pip install sglang==0.5.19`` (each also in the manifest, in the runtime
description's ``departures`` and in docs/runtime.md, "The serving closure"):

- sglang-kernel 0.4.5, not the 0.4.6.post1 SGLang 0.5.19 pins: 0.4.6.post1's C++ ops are built
  for torch 2.13 and do not load on torch 2.11; 0.4.5 (SGLang 0.5.17's pin) is built for torch
  2.11 and CUDA 13. Only its Python files and ``sm90/common_ops.abi3.so`` travel: ``flash_ops``
  (FA3, 1.1 GB unpacked), ``flashmla_ops``, ``infllm_ops``, ``spatial_ops`` and ``sm100/`` are
  not loaded by a triton-attention server on an sm90 card. SGLang's version check is skipped
  (``SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1``, ``srt/environ.py``).
- sgl_kernel 0.4.5 sends rmsnorm and the sampling renorms to flashinfer whenever
  ``flashinfer.norm`` / ``flashinfer.sampling`` import (``sgl_kernel/elementwise.py``,
  ``sgl_kernel/sampling.py``: the ``try: import flashinfer.norm`` at the top); flashinfer's JIT
  then needs ``flashinfer/data/``, which is not carried. One line in each makes that import fail,
  so sgl_kernel's own kernels run (``DISPATCH_EDITS``).
- flashinfer-python 0.6.18 without ``flashinfer/data/`` (its JIT sources, 4,471 files):
  importable, its JIT cannot build. ``SGLANG_IS_FLASHINFER_AVAILABLE=false``.
- ``IPython``, ``xgrammar``, ``zstandard``: imported at module level on the server path, unused
  with ``--grammar-backend none``; filled by empty modules only where the real one is missing
  (``stubs/sitecustomize.py``).
- SGLang's tree trimmed after the series is applied: every ``*.so`` (the Rust router, gRPC and
  multimodal extensions and ``rust_tree_core``, loaded lazily), ``multimodal_gen/`` and
  ``test/`` dropped; so ``runtime verify`` reports those files missing on the installed tree.
- SGLang's other requirements (``Requires-Dist``) are not carried: the machine's own packages
  (torch, triton, numpy, ...) serve, and what the triton-attention server path does not import
  (flash-attn-4, tilelang, quack-kernels, cutlass, ...) is absent.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MiB = 2**20
#: The closure's whole size: what travels to the GPU machine with the checkout must stay under
#: 64 MiB (the device tool's carry limit), the checkout and the JIT caches included.
BUDGET = 50 * MiB
SCHEMA = 1
#: Every packed file's mtime (1980-01-01, the zip epoch): the pieces' sha256 depend on content only.
PACK_MTIME = 315532800
#: The committed copy of the last build's manifest, which the CPU test reads (no download there).
RECORDED = REPO / "tests" / "gpu_rig" / "closure-manifest.json"

#: The SGLang the closure carries: a pin of the recipe, like every pin below (WHEELS, KERNEL and
#: DEPARTURES were measured with it on the GPU machine), so it moves with the recipe, not with
#: the release index. 0.5.19, the release escha-deploy's series is made for.
SGLANG = "sglang==0.5.19"
#: The machine the closure is built for: its python3 (3.12.3), torch 2.11.0+cu130, triton 3.6.0,
#: one NVIDIA H200 (compute capability 9.0: sgl_kernel's ``sm90`` ops); and SGLANG's release.
TARGET = {"python": "3.12", "torch": "2.11", "cuda": "13", "triton": "3.6", "card": "sm90",
          "sglang": SGLANG.split("==", 1)[1]}

KERNEL = "sglang-kernel==0.4.5"
FLASHINFER = "flashinfer-python==0.6.18"
#: The wheels unpacked into ``site/``: SGLang 0.5.19's pins the machine's own versions break
#: (its METADATA: transformers==5.12.1, tokenizers==0.22.2, apache-tvm-ffi==0.1.11,
#: compressed-tensors==0.18.0, openai==2.6.1, soundfile==0.13.1), what its server path imports
#: that the machine lacks (fastapi, uvicorn, pyzmq, msgspec, ...), escha-deploy's own
#: dependencies the machine lacks (pydantic, docker; pyproject.toml), each dependency named (no
#: resolution: ``pip download --no-deps``). What the machine has: ``python3 -m pip list`` there.
WHEELS = (
    "transformers==5.12.1", "tokenizers==0.22.2", "apache-tvm-ffi==0.1.11", "compressed-tensors==0.18.0",
    "fastapi==0.165.0", "starlette==1.10.0", "opentelemetry-api==1.45.2", "importlib-metadata==10.2.0",
    "uvicorn==0.54.0", "python-multipart==0.0.34", "orjson==3.13.0", "pyzmq==27.3.0", "msgspec==0.23.0",
    "pybase64==1.5.1", "setproctitle==1.3.8", "dill==0.4.1", "easydict==1.14", "interegular==0.3.3",
    "partial-json-parser==0.2.1.1.post7", "loguru==0.7.3", "distro==1.9.0", "gguf==0.19.0",
    "openai==2.6.1", "jiter==0.19.0", "sniffio==1.3.1",
    "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1", "referencing==0.37.0", "rpds-py==2026.9.1",
    "soundfile==0.13.1", "cffi==2.1.1", "pycparser==3.12",
    # escha-deploy (pyproject.toml) and pydantic's own
    "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
    "typing-extensions==4.16.0", "typer==0.28.0", "docker==7.2.0",
)
#: sgl_kernel's files that travel: all but the compiled ops, plus the sm90 common ops.
KERNEL_KEEP_SO = ("sgl_kernel/sm90/common_ops.abi3.so",)
#: ``(file, the stock line, its replacement)``: the flashinfer dispatch (see the module doc).
DISPATCH_EDITS = (
    ("sgl_kernel/elementwise.py", "    import flashinfer.norm as _flashinfer_norm",
     '    raise ImportError("escha closure: flashinfer JIT sources (flashinfer/data) not carried")'),
    ("sgl_kernel/sampling.py", "    import flashinfer.sampling as _flashinfer_sampling",
     '    raise ImportError("escha closure: flashinfer JIT sources (flashinfer/data) not carried")'),
)
STUBS = ("IPython", "xgrammar", "zstandard")
ENV = {"SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1", "SGLANG_IS_FLASHINFER_AVAILABLE": "false"}
#: What the trim drops from SGLang's patched tree (paths under ``sglang/``; ``*.so`` anywhere).
TRIM_DIRS = ("multimodal_gen", "test")
DEPARTURES = (
    "sglang-kernel 0.4.5 instead of SGLang 0.5.19's pin 0.4.6.post1 (built for torch 2.13, whose ops do not load on "
    "torch 2.11): its Python files and sm90/common_ops.abi3.so only (no flash_ops, flashmla_ops, infllm_ops, "
    "spatial_ops, sm100); SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1",
    "sgl_kernel/elementwise.py and sgl_kernel/sampling.py: the optional flashinfer.norm/flashinfer.sampling "
    "import made to fail (one line each), so sgl_kernel's own rmsnorm and sampling kernels run",
    "flashinfer-python 0.6.18 without flashinfer/data/ (its JIT cannot build); SGLANG_IS_FLASHINFER_AVAILABLE=false",
    "IPython, xgrammar, zstandard: empty modules where the real one is missing (imported at module level, unused "
    "with --grammar-backend none)",
    "SGLang's tree trimmed after the series: every *.so (Rust router, gRPC, multimodal, rust_tree_core), "
    "multimodal_gen/ and test/ dropped",
    "SGLang's other requirements not carried: the machine's torch, triton and numpy serve; kernels a "
    "triton-attention server does not import are absent",
)
#: The packed pieces, in install order: ``(name, file, where it unpacks under DEST)``.
PIECES = (
    ("sglang", "sglang.tar.xz", "sg"),
    ("sgl_kernel", "sgl_kernel.tar.xz", "sg"),
    ("flashinfer", "flashinfer.tar.xz", "fi"),
    ("site", "site.tar.xz", "site"),
    ("stubs", "stubs.tar.xz", "stubs"),
    ("sglang-stock", "sglang-stock.tar.xz", "stock"),
)
#: In the ``sglang-stock`` piece: the paths (under ``sg/``) the series added, one a line.
STOCK_ADDED = "escha-stock-added.txt"
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64", "any")

STUB_SOURCE = '''"""Empty modules for {names} where the real one is missing (escha-deploy's serving closure,
scripts/gpu_closure.py). SGLang 0.5.19 imports them at module level on the server path and does
not use them with --grammar-backend none. Appended to sys.meta_path: a real module wins."""
import importlib.abc
import importlib.machinery
import os
import sys
import types

NAMES = frozenset(n for n in os.environ.get("ESCHA_CLOSURE_STUBS", "{csv}").split(",") if n)


class _StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Stub


class Stub(Exception, metaclass=_StubMeta):
    """Any attribute of a stub module: a class (subclassable, raisable, callable)."""

    def __init__(self, *a, **k):
        pass

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        # openai/protocol code in SGLang uses a stubbed class as a pydantic field type
        from pydantic_core import core_schema
        return core_schema.any_schema()

    def __call__(self, *a, **k):
        return Stub()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Stub


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__escha_stub__ = True

        def _getattr(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Stub
        m.__getattr__ = _getattr
        return m

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in NAMES:
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        return None


def install():
    if NAMES and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
'''

SITECUSTOMIZE = '''"""escha-deploy's serving closure: the stub finder (escha_closure_stubs), then the machine's own
sitecustomize, if one is further down sys.path."""
import importlib.machinery
import importlib.util
import os
import sys

import escha_closure_stubs

escha_closure_stubs.install()
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _spec is not None and _spec.loader is not None:
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
'''


class ClosureError(Exception):
    """One line per problem; ``code``: 2 bad input (a missing or altered piece), 3 refused (the
    closure was built for another machine or release)."""

    def __init__(self, lines: list[str], code: int) -> None:
        super().__init__("\n".join(lines))
        self.lines, self.code = lines, code


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _dist(spec: str) -> tuple[str, str]:
    name, version = spec.split("==")
    return name, version


def _wheel_prefix(spec: str) -> str:
    name, version = _dist(spec)
    return f"{name.replace('-', '_').lower()}-{version}-"


def _find_wheel(downloads: Path, spec: str) -> Path | None:
    prefix = _wheel_prefix(spec)
    return next((p for p in sorted(downloads.glob("*.whl")) if p.name.lower().startswith(prefix)), None)


def download(downloads: Path, specs: list[str]) -> dict[str, Path]:
    """Each pin's wheel for ``TARGET``'s Python on x86-64 Linux (``pip download --no-deps``),
    reusing one already in ``downloads``. Raises ``ClosureError`` naming a pin pip cannot find."""
    downloads.mkdir(parents=True, exist_ok=True)
    py = TARGET["python"]
    abi = "cp" + py.replace(".", "")
    missing = [s for s in specs if _find_wheel(downloads, s) is None]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", py, "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none",
               *[a for p in PLATFORMS for a in ("--platform", p)], "--dest", str(downloads), *missing]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            tail = [ln for ln in r.stderr.splitlines() if "ERROR" in ln][-3:]
            raise ClosureError([f"pip download failed: {ln}" for ln in tail] or [f"pip download exit {r.returncode}"], 2)
    found = {s: _find_wheel(downloads, s) for s in specs}
    lost = [s for s, p in found.items() if p is None]
    if lost:
        raise ClosureError([f"no wheel for {s} in {downloads}" for s in lost], 2)
    return {s: p for s, p in found.items() if p is not None}


def _pack(out: Path, root: Path, members: list[str]) -> None:
    """``members`` (paths relative to ``root``) into ``out`` (tar, xz preset 6), sorted, with
    fixed owner and mtime: two builds of the same inputs give the same bytes."""
    with tarfile.open(out, "w:xz", preset=6) as tar:
        for rel in sorted(members):
            info = tar.gettarinfo(str(root / rel), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = PACK_MTIME
            if info.isfile():
                with open(root / rel, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)


def _files_under(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()]


def _unzip_wheel(whl: Path, dest: Path, keep=lambda name: True) -> list[str]:
    """Unzip a wheel's members that ``keep`` accepts into ``dest``; ``NAME.data/purelib|platlib/``
    go to the top, other ``.data`` parts (scripts, headers) are dropped. Returns the paths written."""
    written = []
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            name = info.filename
            if name.endswith("/") or not keep(name):
                continue
            parts = name.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                name = "/".join(parts[2:])
            if parts[0].endswith(".dist-info") and parts[-1] == "RECORD":
                continue  # lists files that are not carried
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            if (info.external_attr >> 16) & 0o111:
                target.chmod(0o755)
            written.append(name)
    return written


def _apply_series(sg: Path, state: Path) -> dict:
    """``escha-deploy runtime apply`` on the unzipped tree (this checkout's escha-deploy); the
    description it wrote."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    r = subprocess.run([sys.executable, "-m", "escha_deploy", "runtime", "apply", "--sglang-dir", str(sg / "sglang"),
                        "--python", TARGET["python"], "--state-dir", str(state), "--format", "json"],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    if r.returncode != 0:
        raise ClosureError([f"runtime apply failed (exit {r.returncode}): {ln}" for ln in
                            (r.stderr.strip().splitlines() or ["no output"])[-5:]], 3)
    return json.loads((state / "runtime.json").read_text())


def _stock_delta(whl: Path, sg: Path, out: Path) -> dict:
    """What turns the patched tree ``sg`` back into the wheel's: the wheel's copy of every file
    under ``sg/sglang`` the series changed, and the list of files it added (``STOCK_ADDED``),
    written under ``out``. Compared before the trim, byte for byte against the wheel."""
    changed, present = [], set()
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            name = info.filename
            if not name.startswith("sglang/") or name.endswith("/"):
                continue
            present.add(name)
            stock = z.read(info)
            mine = sg / name
            if mine.is_file() and mine.read_bytes() == stock:
                continue
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_bytes(stock)
            changed.append(name)
    added = sorted(str(f.relative_to(sg)) for f in (sg / "sglang").rglob("*")
                   if f.is_file() and "__pycache__" not in f.parts and str(f.relative_to(sg)) not in present)
    (out / STOCK_ADDED).write_text("".join(f"{a}\n" for a in added))
    return {"restored": sorted(changed), "added_by_series": added}


def _trim(sg: Path) -> list[str]:
    """Drop ``TRIM_DIRS`` and every ``*.so`` from the patched ``sg/sglang``; the paths dropped."""
    pkg = sg / "sglang"
    dropped = []
    for d in TRIM_DIRS:
        if (pkg / d).is_dir():
            dropped.append(f"sglang/{d}/")
            shutil.rmtree(pkg / d)
    for so in sorted(pkg.rglob("*.so")):
        dropped.append(str(so.relative_to(sg)))
        so.unlink()
    for cache in list(pkg.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)
    return dropped


def _edit_dispatch(kernel_root: Path) -> list[dict]:
    """Apply ``DISPATCH_EDITS``; each stock line must be there exactly once."""
    done = []
    for rel, old, new in DISPATCH_EDITS:
        p = kernel_root / rel
        text = p.read_text()
        lines = text.split("\n")
        hits = [i for i, ln in enumerate(lines) if ln == old]
        if len(hits) != 1:
            raise ClosureError([f"{rel}: expected the line {old.strip()!r} once, found {len(hits)}"], 3)
        lines[hits[0]] = new
        p.write_text("\n".join(lines))
        done.append({"file": rel, "line": hits[0] + 1, "was": old.strip(), "now": new.strip()})
    return done


def build(out: Path, downloads: Path, record: bool = True) -> dict:
    """Build the closure into ``out`` (its pieces replaced, its ``cache/`` kept); returns the manifest, also written to
    ``RECORDED`` when ``record``. Raises ``ClosureError``."""
    t0 = time.monotonic()
    wheels = download(downloads, [SGLANG, KERNEL, FLASHINFER, *WHEELS])
    sources = [{"pin": s, "file": p.name, "bytes": p.stat().st_size, "sha256": sha256_file(p)}
               for s, p in wheels.items()]
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():  # the pieces of an earlier build; cache/ (the JIT caches a run left) stays
        if old.is_file() or old.is_symlink():
            old.unlink()
    pieces = []
    with tempfile.TemporaryDirectory(prefix="escha-closure-") as tmp:
        work = Path(tmp)
        # SGLang: unzip, patch with the series, trim
        sg = work / "sg"
        _unzip_wheel(wheels[SGLANG], sg)
        desc = _apply_series(sg, work / "state")
        stock = work / "stock"
        stock.mkdir()
        delta = _stock_delta(wheels[SGLANG], sg, stock)
        dropped = _trim(sg)
        _pack(out / "sglang.tar.xz", sg, _files_under(sg))
        pieces.append(("sglang", "sglang.tar.xz", {"dropped": dropped}))
        # sglang-kernel: Python files + sm90 common ops, the dispatch edits
        kr = work / "kernel"
        _unzip_wheel(wheels[KERNEL], kr, keep=lambda n: not n.endswith(".so") or n in KERNEL_KEEP_SO)
        edits = _edit_dispatch(kr)
        _pack(out / "sgl_kernel.tar.xz", kr, _files_under(kr))
        pieces.append(("sgl_kernel", "sgl_kernel.tar.xz", {"kept_so": list(KERNEL_KEEP_SO), "edits": edits}))
        # flashinfer without its JIT sources
        fi = work / "fi"
        _unzip_wheel(wheels[FLASHINFER], fi, keep=lambda n: not n.startswith("flashinfer/data/"))
        _pack(out / "flashinfer.tar.xz", fi, _files_under(fi))
        pieces.append(("flashinfer", "flashinfer.tar.xz", {"dropped": ["flashinfer/data/"]}))
        # the pinned wheels, unpacked into one site folder
        site = work / "site"
        for spec in WHEELS:
            _unzip_wheel(wheels[spec], site)
        _pack(out / "site.tar.xz", site, _files_under(site))
        pieces.append(("site", "site.tar.xz", {"wheels": list(WHEELS)}))
        st = work / "stubs"
        st.mkdir()
        (st / "escha_closure_stubs.py").write_text(STUB_SOURCE.format(names=", ".join(STUBS), csv=",".join(STUBS)))
        (st / "sitecustomize.py").write_text(SITECUSTOMIZE)
        _pack(out / "stubs.tar.xz", st, _files_under(st))
        pieces.append(("stubs", "stubs.tar.xz", {"modules": list(STUBS)}))
        # the stock tree's files the series changed, and the list of those it added
        for so in [f for f in _files_under(stock) if f.endswith(".so")]:
            (stock / so).unlink()  # the trim drops them from both trees
        _pack(out / "sglang-stock.tar.xz", stock, _files_under(stock))
        pieces.append(("sglang-stock", "sglang-stock.tar.xz", delta))
    desc.update(kind="closure", python=TARGET["python"], sglang_dir="", departures=list(DEPARTURES),
                closure_env=dict(ENV))
    (out / "runtime.json").write_text(json.dumps(desc, indent=2) + "\n")
    packed = [{"name": n, "file": f, "bytes": (out / f).stat().st_size, "sha256": sha256_file(out / f), **extra}
              for n, f, extra in pieces]
    manifest = {
        "schema": SCHEMA, "target": TARGET, "env": ENV, "stubs": list(STUBS), "departures": list(DEPARTURES),
        "sources": sources, "pieces": packed,
        "runtime": {"capabilities": desc.get("capabilities"), "series": [e["name"] for e in desc.get("series", [])],
                    "inventory_digest": desc.get("inventory_digest"), "base": desc.get("base")},
    }
    manifest["total_bytes"] = 0
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    manifest["total_bytes"] = total
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if record:
        RECORDED.write_text(json.dumps(manifest, indent=1) + "\n")
    for p in packed:
        print(f"  {p['file']:<20} {p['bytes']:>12,} B", file=sys.stderr)
    print(f"closure {out}: {total:,} B ({total / MiB:.1f} MiB of {BUDGET / MiB:.0f}), "
          f"built in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    if total > BUDGET:
        raise ClosureError([f"closure {out}: {total:,} B is over the {BUDGET:,} B budget"], 3)
    return manifest


def machine() -> dict:
    """This machine, as ``TARGET`` names it (torch imported: on the GPU machine only)."""
    import torch
    import triton

    cap = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None
    return {"python": "%d.%d" % sys.version_info[:2], "torch": ".".join(torch.__version__.split("+")[0].split(".")[:2]),
            "cuda": (torch.version.cuda or "none").split(".")[0], "triton": ".".join(triton.__version__.split(".")[:2]),
            "card": f"sm{cap[0]}{cap[1]}" if cap else "no CUDA device"}


def series_differences(series: list[dict], patches_dir: Path | None = None) -> list[str]:
    """How the series a closure was patched with (its description's ``series``: name, sha256)
    differs from this checkout's ``runtime_patches/`` (its ``series`` file, each patch's bytes):
    one line per patch added, missing or changed; ``[]`` when they agree. Reads files only
    (no escha-deploy import: it runs before the closure's packages are on the path)."""
    d = patches_dir or REPO / "runtime_patches"
    names = [ln.strip() for ln in (d / "series").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    ours = {n: sha256_file(d / n) for n in names}
    theirs = {e.get("name"): e.get("sha256") for e in series if e.get("source", "series") == "series"}
    lines = [f"patch {n} is in this checkout's series, not in the closure's" for n in ours if n not in theirs]
    lines += [f"patch {n} is in the closure's series, not in this checkout's" for n in theirs if n not in ours]
    lines += [f"patch {n} differs from this checkout's (sha256 {theirs[n][:12]}... vs {ours[n][:12]}...)"
              for n in ours if n in theirs and theirs[n] != ours[n]]
    if not lines and list(theirs) != names:
        lines.append(f"the closure's series order {list(theirs)} is not this checkout's {names}")
    return lines


def check(closure: Path, here: dict | None = None, *, sglang: str | None = None) -> dict:
    """The closure's manifest, after refusing a closure built for another machine or release
    (``here``: this machine, ``machine()`` when ``None``; ``sglang``: the release asked for,
    default the series' ``TARGET``) and one with a piece missing or altered. Raises
    ``ClosureError``: code 2 naming each missing or altered piece, 3 naming each difference
    (machine, release, or the patch series against this checkout's: ``series_differences``)."""
    mpath = closure / "manifest.json"
    if not mpath.is_file():
        raise ClosureError([f"{closure}: no manifest.json (build the closure: scripts/gpu-closure.sh)"], 2)
    try:
        manifest = json.loads(mpath.read_text())
    except ValueError as exc:
        raise ClosureError([f"{mpath}: not JSON ({exc})"], 2) from None
    from concurrent.futures import ThreadPoolExecutor

    def problem(p: dict) -> str | None:
        f = closure / p["file"]
        if not f.is_file():
            return f"{closure}: missing piece {p['name']} ({p['file']})"
        if f.stat().st_size != p["bytes"] or sha256_file(f) != p["sha256"]:
            return f"{closure}: piece {p['name']} ({p['file']}) differs from the manifest (size or sha256)"
        return None

    with ThreadPoolExecutor(4) as pool:  # hashlib releases the GIL
        bad = [b for b in pool.map(problem, manifest.get("pieces", [])) if b]
    if not (closure / "runtime.json").is_file():
        bad.append(f"{closure}: missing piece runtime description (runtime.json)")
    if bad:
        raise ClosureError(bad, 2)
    stale = series_differences(json.loads((closure / "runtime.json").read_text()).get("series", []))
    if stale:
        raise ClosureError([f"{closure}: {d}" for d in stale]
                           + [f"{closure}: rebuild it from this checkout: scripts/gpu-closure.sh"], 3)
    built = manifest.get("target", {})
    here = machine() if here is None else here
    want = dict(here, sglang=sglang or TARGET["sglang"])
    differs = [f"closure built for {k} {built.get(k)!r}, this machine has {want[k]!r}"
               if k != "sglang" else f"closure holds SGLang {built.get(k)!r}, {want[k]!r} asked for"
               for k in TARGET if built.get(k) != want.get(k)]
    if differs:
        raise ClosureError([f"{closure}: {d}" for d in differs], 3)
    return manifest


def to_stock(dest: Path) -> list[str]:
    """Put the installed tree ``dest/sg/sglang`` back to the stock wheel's: the ``sglang-stock``
    piece's files (unpacked in ``dest/stock``) over it, the files the series added removed.
    Returns the paths removed."""
    stock = dest / "stock"
    for rel in _files_under(stock):
        if rel == STOCK_ADDED:
            continue
        target = dest / "sg" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(stock / rel, target)
    removed = [ln for ln in (stock / STOCK_ADDED).read_text().splitlines() if ln]
    for rel in removed:
        (dest / "sg" / rel).unlink(missing_ok=True)
    return removed


def install(closure: Path, dest: Path, here: dict | None = None, *, stock: bool = False) -> dict:
    """Check, then unpack the closure into ``dest`` and write ``dest/runtime.json`` (its
    ``sglang_dir`` the unpacked tree) and ``dest/env.sh``. Returns the environment to set.
    ``stock``: SGLang's tree put back to the stock wheel's (``to_stock``); the description then
    has no series and no capabilities and says ``stock: true``."""
    from concurrent.futures import ThreadPoolExecutor

    manifest = check(closure, here)
    dest.mkdir(parents=True, exist_ok=True)

    def unpack(piece: tuple[str, str, str]) -> None:
        with tarfile.open(closure / piece[1], "r:xz") as tar:
            tar.extractall(dest / piece[2], filter="data")

    with ThreadPoolExecutor(len(PIECES)) as pool:  # lzma and the file writes release the GIL
        list(pool.map(unpack, PIECES))
    desc = json.loads((closure / "runtime.json").read_text())
    if stock:
        desc.update(stock=True, series=[], capabilities=[], inventory_digest=None,
                    removed_series_files=to_stock(dest))
    desc["sglang_dir"] = str((dest / "sg" / "sglang").resolve())
    desc["python"] = "%d.%d.%d" % sys.version_info[:3]
    (dest / "runtime.json").write_text(json.dumps(desc, indent=2) + "\n")
    env = {"PYTHONPATH": os.pathsep.join(str(dest / d) for d in ("sg", "fi", "site", "stubs")),
           "ESCHA_CLOSURE_STUBS": ",".join(manifest["stubs"]),
           "ESCHA_RUNTIME_DESCRIPTION": str(dest / "runtime.json"), **manifest["env"]}
    lines = [f"export PYTHONPATH={env['PYTHONPATH']}${{PYTHONPATH:+:$PYTHONPATH}}\n"]
    lines += [f"export {k}={v}\n" for k, v in env.items() if k != "PYTHONPATH"]
    (dest / "env.sh").write_text("".join(lines))
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", type=Path, default=REPO / ".closure")
    b.add_argument("--downloads", type=Path, default=REPO / ".cache" / "closure-dl")
    b.add_argument("--no-record", action="store_true", help=f"do not update {RECORDED.relative_to(REPO)}")
    i = sub.add_parser("install")
    i.add_argument("--stock", action="store_true", help="SGLang's tree as the stock wheel's (no series)")
    i.add_argument("closure", type=Path)
    i.add_argument("dest", type=Path)
    c = sub.add_parser("check")
    c.add_argument("closure", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            build(args.out, args.downloads, record=not args.no_record)
        elif args.cmd == "install":
            env = install(args.closure, args.dest, stock=args.stock)
            print(json.dumps(env))
        else:
            m = check(args.closure)
            print(f"{args.closure}: closure for {m['target']} ok, {m['total_bytes']:,} B")
    except ClosureError as exc:
        for line in exc.lines:
            print(f"gpu_closure: {line}", file=sys.stderr)
        return exc.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
