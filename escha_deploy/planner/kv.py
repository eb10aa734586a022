"""KV bytes per token per rank, device and host, for every KV dtype the planner knows.

Notation (as in SGLang 0.5.19's ``srt/mem_cache/memory_pool.py``): ``n`` KV heads per rank, ``D`` head_dim
(``Dv = D`` for the hybrid full-attention pool), ``L`` full-attention layers on this rank.

- bf16 (and ``auto`` on a bf16 model): ``n * 2D * L * 2`` (``DefaultPoolConfigurator._compute_cell_size``)
- fp8_e4m3 / fp8_e5m2: ``n * 2D * L * 1`` (stored as uint8)
- mxfp8: ``n*2D*L + n*2D*L // 32``; nvfp4 / fp4_mx_block16: ``n*2D*L//2 + n*D*L*2//16 + 2*n*D``
- int2 (OSCAR, our overlay's layout): per layer and per K or V,
  codes ``n * D/4`` bytes plus (scale, zero) pairs ``n * 2 * (D/group) * itemsize(scale)``.
  The reference box's figure: 16 x 2 x (128 + 64) = 6,144 B per token per rank.

Host bytes per token (``size_per_token`` of the host pool, ``pool_host/*.py``): the device
width for bf16/fp8; for INT2 our host pool mirrors codes and scales/zeros (two tensors).
The FP4/MXFP8 pools keep scales the host pool never copies: ``None`` (HiCache unsupported).
"""

from __future__ import annotations

from ..sglang.arch import DTYPE_BYTES, RankShapes
from ..profile.models import normalize_kv_dtype


def int2_parts(shapes: RankShapes, group_size: int, scale_dtype: str) -> tuple[int, int]:
    """``(codes, scales_zeros)`` bytes per token per layer for K (the same again for V)."""
    n, d = shapes.kv_heads_per_rank, shapes.head_dim
    codes = n * d // 4
    scales_zeros = n * 2 * (d // group_size) * DTYPE_BYTES[scale_dtype]
    return codes, scales_zeros


def device_bytes_per_token(shapes: RankShapes, dtype: str, *, group_size: int = 64,
                           scale_dtype: str = "float32") -> int:
    """Device KV bytes per token per rank for ``dtype`` (see the module docstring)."""
    n, d, layers = shapes.kv_heads_per_rank, shapes.head_dim, shapes.full_layers
    dt = normalize_kv_dtype(dtype)
    if dt == "bf16":
        return n * 2 * d * layers * 2
    if dt in ("fp8_e4m3", "fp8_e5m2"):
        return n * 2 * d * layers
    if dt == "mxfp8":
        return n * 2 * d * layers + n * 2 * d * layers // 32
    if dt in ("nvfp4", "fp4_mx_block16"):
        return n * 2 * d * layers // 2 + n * d * layers * 2 // 16 + 2 * n * d
    if dt == "int2":
        codes, sz = int2_parts(shapes, group_size, scale_dtype)
        return layers * 2 * (codes + sz)
    raise ValueError(f"unknown KV dtype {dtype!r}")


def host_bytes_per_token(shapes: RankShapes, dtype: str, *, group_size: int = 64,
                         scale_dtype: str = "float32") -> int | None:
    """Host pool ``size_per_token`` per rank, or ``None`` when HiCache cannot mirror ``dtype``."""
    dt = normalize_kv_dtype(dtype)
    if dt in ("mxfp8", "nvfp4", "fp4_mx_block16"):
        return None
    return device_bytes_per_token(shapes, dt, group_size=group_size, scale_dtype=scale_dtype)


def int2_hp_arena_bytes(shapes: RankShapes, *, prefix_tokens: int, recent_tokens: int,
                        page_size: int, max_running_requests: int, hp_dtype: str) -> int:
    """INT2's high-precision arena per rank: the shared sink prefix plus one recent-window ring
    of ``recent + page - 1`` slots per request, K and V, in ``hp_dtype`` (the OSCAR
    overlay's ``UnifiedInt2HPKVPool``)."""
    slots = prefix_tokens + max_running_requests * (recent_tokens + page_size - 1)
    return slots * shapes.full_layers * 2 * shapes.kv_heads_per_rank * shapes.head_dim * DTYPE_BYTES[hp_dtype]
