"""The host-reserve hook: the variable parsed and applied; the once-per-group reading with a
real two-process gloo group (torch CPU build); the per-rank accounting."""

from __future__ import annotations

import socket

import pytest

from escha_deploy.sglang.capabilities import ENV_HOST_RESERVE
from escha_deploy.runtime.hooks import host_reserve as hr

GiB = 2**30


@pytest.fixture(autouse=True)
def _fresh():
    hr.reset()
    yield
    hr.reset()


def test_variable_name_matches_capabilities():
    assert hr.ENV_HOST_RESERVE == ENV_HOST_RESERVE


@pytest.mark.parametrize("text, expected", [
    (None, 10 * GiB), ("", 10 * GiB), ("  ", 10 * GiB), ("0", 0),
    ("4294967296", 4 * GiB), (" 1_073_741_824 ", GiB),
])
def test_parse_reserve(text, expected):
    assert hr.parse_reserve(text) == expected


@pytest.mark.parametrize("text", ["8GiB", "-1", "1.5", "ten", "0x10"])
def test_parse_reserve_refuses(text):
    with pytest.raises(hr.HostReserveError, match=ENV_HOST_RESERVE):
        hr.parse_reserve(text)


def test_reserve_bytes_reads_environment():
    assert hr.reserve_bytes({}) == 10 * GiB
    assert hr.reserve_bytes({ENV_HOST_RESERVE: str(2 * GiB)}) == 2 * GiB


def test_budget_single_rank_applies_reserve_and_accounts_locally():
    reads = []

    def read():
        reads.append(1)
        return 16 * GiB

    assert hr.budget_bytes(read, 1, reserve=2 * GiB) == 14 * GiB
    hr.record_accepted(5 * GiB)
    # the second pool sees the same snapshot minus what this rank accepted, no new reading
    assert hr.budget_bytes(read, 1, reserve=2 * GiB) == 9 * GiB
    assert len(reads) == 1


def test_budget_default_reserve_from_environment(monkeypatch):
    monkeypatch.setenv(ENV_HOST_RESERVE, str(3 * GiB))
    assert hr.budget_bytes(lambda: 16 * GiB, 2) == (13 * GiB) // 2


def test_seed_box_stock_refuses_patched_accepts():
    """The reference box: about 9 GiB available when the pools are built; stock 10 GiB
    reserve leaves nothing, a 1 GiB reserve leaves (9 - 1) / 2 = 4 GiB per rank, enough for the
    ratio-1 KV pool of 210,008 x 6,144 B = 1,290,289,152 B."""
    kv = 210_008 * 6_144
    assert hr.budget_bytes(lambda: 9 * GiB, 2, reserve=hr.STOCK_RESERVE_BYTES) < kv
    hr.reset()
    assert hr.budget_bytes(lambda: 9 * GiB, 2, reserve=GiB) >= kv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, available: list[int], out) -> None:
    import torch.distributed as dist

    from escha_deploy.runtime.hooks import host_reserve

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        group = dist.new_group(list(range(world)), backend="gloo")
        host_reserve.reset()
        reserve = 1 * GiB
        # pool 1 (KV): first check reads once, MIN across the group
        b1 = host_reserve.budget_bytes(lambda: available[rank], world, group=group,
                                       reserve=reserve)
        kv = 3 * GiB
        host_reserve.record_accepted(kv)
        # pool 2 (mamba): no second reading, no second collective; peers not charged
        b2 = host_reserve.budget_bytes(lambda: 0, world, group=group, reserve=reserve)
        out.put((rank, host_reserve.snapshot_available(lambda: -1), b1, b2))
    finally:
        dist.destroy_process_group()


def test_once_per_group_reading_with_real_gloo_group():
    torch = pytest.importorskip("torch")
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    port = _free_port()
    # rank 1 reads later, after rank 0's peer pinned 3 GiB: stock would see less and still
    # divide by 2; the patched rule takes the MIN once, before anyone pins
    available = [12 * GiB, 9 * GiB]
    procs = [ctx.Process(target=_rank_main, args=(r, 2, port, available, q)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    results = sorted(q.get() for _ in range(2))
    for rank, a0, b1, b2 in results:
        assert a0 == 9 * GiB
        assert b1 == (9 * GiB - GiB) // 2 == 4 * GiB
        assert b2 == 4 * GiB - 3 * GiB
    assert torch.__version__
