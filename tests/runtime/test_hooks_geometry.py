"""The transfer-geometry hook: the seed's widths refused, consistent ones accepted, and the
stock MHA attributes read from real torch tensors (CPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from escha_deploy.runtime.hooks.transfer_geometry import (
    TensorGeometry,
    TransferGeometryError,
    check,
    check_host_pool,
    geometry_of,
)

#: The reference box's crash: host stride 192 B, element_dim 512, device row 128 B
#: (512 two-bit elements pack into 128 B).
SEED_CRASH = TensorGeometry("int2 codes", host_stride_bytes=192, element_dim=512,
                            element_bits=2, device_row_bytes=128)
#: The consistent INT2 pool: a 128 B code row matching the device row, and 64 B of scales/zeros
#: in their own tensor with their own stride (group 64, fp32 scale and zero: 512 / 64 x 2 = 16
#: fp32 = 64 B).
CONSISTENT = [
    TensorGeometry("int2 codes", 128, 512, 2, 128),
    TensorGeometry("scales/zeros", 64, 16, 32, 64),
]


def test_seed_geometry_refused_with_widths_named():
    with pytest.raises(TransferGeometryError) as exc:
        check("kv", [SEED_CRASH])
    msg = str(exc.value)
    assert "host stride 192 B" in msg and "element_dim 512" in msg and "device row 128 B" in msg
    assert "HiCache kv host pool" in msg


def test_seed_geometry_as_uint8_elements_names_both_mismatches():
    g = TensorGeometry("k/v", 192, 512, 8, 128)
    assert len(g.problems()) == 2


def test_consistent_int2_geometry_passes():
    check("kv", CONSISTENT)


def test_fractional_bytes_refused():
    assert TensorGeometry("x", 1, 3, 3, 1).problems()


class _Int2Pool:
    def escha_transfer_geometry(self):
        return [SEED_CRASH]


def test_pool_describing_itself_is_checked():
    with pytest.raises(TransferGeometryError):
        check_host_pool(_Int2Pool(), object())


def test_stock_mha_attributes_from_real_tensors():
    torch = pytest.importorskip("torch")
    head_num, head_dim = 2, 256
    device_pool = SimpleNamespace(
        k_buffer=[torch.zeros((64, head_num, head_dim), dtype=torch.bfloat16)])
    host = SimpleNamespace(token_stride_size=head_num * head_dim * 2,
                           element_dim=head_num * head_dim, dtype=torch.bfloat16)
    (g,) = geometry_of(host, device_pool)
    assert (g.host_stride_bytes, g.element_dim, g.element_bits, g.device_row_bytes) == (
        1024, 512, 16, 1024)
    check_host_pool(host, device_pool)
    # an fp4-packed device row (half the bytes) behind a full-width host pool is refused
    device_fp4 = SimpleNamespace(k_buffer=[torch.zeros((64, head_num, head_dim // 2),
                                                       dtype=torch.uint8)])
    host_u8 = SimpleNamespace(token_stride_size=head_num * head_dim, element_dim=head_num * head_dim,
                              dtype=torch.uint8)
    with pytest.raises(TransferGeometryError, match="device row 256 B"):
        check_host_pool(host_u8, device_fp4)


def test_pool_without_geometry_is_skipped():
    check_host_pool(SimpleNamespace(), SimpleNamespace())
