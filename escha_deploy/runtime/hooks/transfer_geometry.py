"""Refuse a HiCache host pool whose per-token widths disagree with its device pool.

escha-deploy runtime hook (capability ``transfer-geometry-check``). Patch
``runtime_patches/0003-transfer-geometry-check.patch`` copies this file byte for byte into
``sglang/srt/mem_cache/pool_host/escha_transfer_geometry.py``; SGLang's
``hybrid_cache/hybrid_pool_assembler.py: build_kv_host_pool`` calls ``check_host_pool`` on
every KV host pool it builds. Standard library only.

Why: the HiCache transfer kernels copy, per token and layer, ``element_dim`` elements between a
device row and a host slot whose stride is ``token_stride_size``. When the host pool disagrees
with itself or with the device pool, the first transfer reads or writes past a row and the
server dies later with an asynchronous "illegal memory access". An INT2 pool of a fork did this
(the reference box): host stride 192 B, element_dim 512, device row 128 B.

The rule, per tensor the transfer moves (K/V, or an overlay's codes and scales/zeros):

- ``element_dim * element_bits`` is a whole number of bytes, and that many bytes equal the
  device row (bytes per token per layer of the device buffer);
- the host stride (bytes per token per layer in the host buffer) equals the device row.

A pool can describe its tensors itself with a method ``escha_transfer_geometry()`` returning a
list of ``TensorGeometry`` (an overlay's INT2 pool does: codes, and scales/zeros in their own
tensor with their own stride). Otherwise the stock MHA attributes are read: ``token_stride_size``,
``element_dim``, ``dtype.itemsize`` and the device pool's ``k_buffer[0]`` row. A pool with
neither (MLA, for example) is not checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional


@dataclass(frozen=True)
class TensorGeometry:
    """Per-token, per-layer widths of one tensor the HiCache transfer moves.

    ``host_stride_bytes``: bytes between two tokens of one layer in the host buffer;
    ``element_dim``: elements the kernel copies per token and layer; ``element_bits``: bits per
    element (16 for bf16, 8 for fp8/uint8, 2 for INT2 codes); ``device_row_bytes``: bytes per
    token per layer of the device buffer.
    """

    tensor: str
    host_stride_bytes: int
    element_dim: int
    element_bits: int
    device_row_bytes: int

    def problems(self) -> list[str]:
        """The mismatches, one line each; empty when consistent."""
        out = []
        bits = self.element_dim * self.element_bits
        element_bytes = bits // 8
        shown = (
            f"host stride {self.host_stride_bytes} B, element_dim {self.element_dim} "
            f"({self.element_bits}-bit = {bits / 8:g} B), device row {self.device_row_bytes} B"
        )
        if bits % 8:
            out.append(f"{self.tensor}: element_dim x element_bits is not whole bytes ({shown})")
        elif element_bytes != self.device_row_bytes:
            out.append(
                f"{self.tensor}: elements copied per token ({element_bytes} B) != device row "
                f"({shown})"
            )
        if self.host_stride_bytes != self.device_row_bytes:
            out.append(f"{self.tensor}: host stride != device row ({shown})")
        return out


class TransferGeometryError(ValueError):
    """A host pool's per-token widths disagree with its device pool (startup refusal)."""


def check(pool_label: str, geometries: Iterable[TensorGeometry]) -> None:
    """Raise ``TransferGeometryError`` listing every mismatch of ``geometries``.

    The message names the pool and prints the three widths of each failing tensor.
    """
    problems = [p for g in geometries for p in g.problems()]
    if problems:
        raise TransferGeometryError(
            f"HiCache {pool_label} host pool disagrees with its device pool, refusing to start "
            f"(escha transfer-geometry-check): " + "; ".join(problems)
        )


def geometry_of(host_pool: Any, device_pool: Any) -> Optional[list[TensorGeometry]]:
    """The geometries of ``host_pool`` against ``device_pool``; ``None`` when not describable.

    Reads ``host_pool.escha_transfer_geometry()`` when present, else the stock MHA attributes
    (``MHATokenToKVPoolHost`` in ``pool_host/mha.py``: ``token_stride_size``, ``element_dim``,
    ``dtype.itemsize``; device row = ``k_buffer[0].stride(0) * k_buffer[0].element_size()`` of
    ``MHATokenToKVPool``).
    """
    describe = getattr(host_pool, "escha_transfer_geometry", None)
    if callable(describe):
        return list(describe())
    stride = getattr(host_pool, "token_stride_size", None)
    element_dim = getattr(host_pool, "element_dim", None)
    dtype = getattr(host_pool, "dtype", None)
    k_buffer = getattr(device_pool, "k_buffer", None)
    if stride is None or element_dim is None or dtype is None or not k_buffer:
        return None
    row = k_buffer[0]
    return [
        TensorGeometry(
            tensor="k/v",
            host_stride_bytes=int(stride),
            element_dim=int(element_dim),
            element_bits=int(dtype.itemsize) * 8,
            device_row_bytes=int(row.stride(0)) * int(row.element_size()),
        )
    ]


def check_host_pool(host_pool: Any, device_pool: Any, pool_label: str = "kv") -> None:
    """``check`` the pool's geometry when it can be described; return quietly otherwise."""
    geometries = geometry_of(host_pool, device_pool)
    if geometries:
        check(pool_label, geometries)
