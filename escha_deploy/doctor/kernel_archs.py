"""Which GPU architectures a CUDA library was built for, read from its ELF fat-binary section
without ``cuobjdump``.

A CUDA shared object keeps its device code in the ``.nv_fatbin`` section (``.nv.fatbin`` in
relocatable objects): one or more fat
binary containers (magic ``0xBA55ED50``: 4-byte magic, 2-byte version, 2-byte header size,
8-byte size of the entries), each holding entries with a header of ``kind`` (u16: 1 PTX,
2 ELF/cubin), version (u16), header size (u32), padded payload size (u64) and, at byte 28,
the SM version (u32, e.g. ``90`` for sm_90). This is the layout CUDA's own ``fatbinary.h``
declares (``__cudaFatCudaBinary2Header``/``EntryHeader``) and that cuobjdump lists. The
reader seeks from header to header, so a 1 GB library is read in a few kilobytes.

Which code runs where (CUDA C++ Programming Guide, "Binary Compatibility" and "PTX
Compatibility"): a cubin built for ``sm_XY`` runs on devices of the same major ``X`` and minor
``>= Y``; PTX for ``compute_XY`` is JIT-compiled by the driver for any device of compute
capability ``>= X.Y``. Architecture-specific cubins (``sm_90a``, ``sm_100a``) run only on that
exact capability; this reader does not tell them apart (it records the SM number), so a
library built only for ``sm_90a`` is counted as ``sm_90``.
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

FATBIN_MAGIC = 0xBA55ED50
_KIND = {1: "ptx", 2: "sass"}


def _section(f: BinaryIO, name: bytes) -> tuple[int, int] | None:
    """``(offset, size)`` of the ELF64 little-endian section ``name``, or ``None``."""
    f.seek(0)
    ident = f.read(64)
    if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", ident, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
    f.seek(shoff)
    table = f.read(shentsize * shnum)
    if len(table) < shentsize * shnum or shstrndx >= shnum:
        return None
    def hdr(i: int) -> tuple[int, int, int]:
        name_off, = struct.unpack_from("<I", table, i * shentsize)
        off, size = struct.unpack_from("<QQ", table, i * shentsize + 0x18)
        return name_off, off, size
    _, str_off, str_size = hdr(shstrndx)
    f.seek(str_off)
    strtab = f.read(str_size)
    for i in range(shnum):
        n_off, off, size = hdr(i)
        end = strtab.find(b"\0", n_off)
        if strtab[n_off:end] == name:
            return off, size
    return None


def fatbin_archs(f: BinaryIO) -> dict[str, set[int]]:
    """``{"sass": {SM numbers}, "ptx": {SM numbers}}`` of the fat-binary section of the ELF
    file ``f`` (both empty when it has none)."""
    out: dict[str, set[int]] = {"sass": set(), "ptx": set()}
    sec = _section(f, b".nv_fatbin") or _section(f, b".nv.fatbin")
    if sec is None:
        return out
    pos, end = sec[0], sec[0] + sec[1]
    while pos + 16 <= end:
        f.seek(pos)
        magic, _ver, hsize, fsize = struct.unpack("<IHHQ", f.read(16))
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned; skip padding between them
            continue
        entry, stop = pos + hsize, pos + hsize + fsize
        while entry + 32 <= stop:
            f.seek(entry)
            head = f.read(32)
            kind, _ev, ehsize, payload = struct.unpack_from("<HHIQ", head, 0)
            sm, = struct.unpack_from("<I", head, 28)
            if kind in _KIND and 10 <= sm < 1000:
                out[_KIND[kind]].add(sm)
            if ehsize == 0:
                break
            entry += ehsize + payload
        pos = stop
    return out


def library_archs(paths: Iterable[Path]) -> dict[str, list[int]]:
    """The union of ``fatbin_archs`` over ``paths`` (``.so`` files), as sorted lists."""
    sass: set[int] = set()
    ptx: set[int] = set()
    for p in paths:
        with open(p, "rb") as f:
            a = fatbin_archs(f)
        sass |= a["sass"]
        ptx |= a["ptx"]
    return {"sass": sorted(sass), "ptx": sorted(ptx)}


def wheel_archs(wheel: Path, member_prefix: str = "") -> dict[str, dict[str, list[int]]]:
    """Per ``.so`` member of ``wheel`` (those under ``member_prefix``): its SASS and PTX SM
    numbers. Members are extracted one at a time to a temporary file (a wheel member cannot be
    seeked in place when compressed)."""
    import shutil
    import tempfile

    out = {}
    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as tmp:
        for info in z.infolist():
            if not info.filename.startswith(member_prefix) or ".so" not in info.filename.rsplit("/", 1)[-1]:
                continue
            target = Path(tmp) / "lib.so"
            with z.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            archs = library_archs([target])
            if archs["sass"] or archs["ptx"]:
                out[info.filename] = archs
            target.unlink()
    return out


#: The committed record of the pinned sglang-kernel and torch wheels' architectures
#: (``scripts/gen_gpu_arch_fixture.py`` writes it).
CATALOG = Path(__file__).resolve().parent.parent / "catalog" / "kernel-archs.json"


def image_kernel_archs(path: Path = CATALOG) -> dict:
    """The architectures the image's sglang-kernel and torch were built for:
    ``{"wheels": {name: {"version", "sass": [SM...], "ptx": [SM...], "libraries": {...}}},
    "torch_cuda": "13.0", "torch_nccl": "2.29.7"}`` (read from the committed record of the
    versions SGLang 0.5.19 pins; ``{}`` when the record is missing)."""
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
