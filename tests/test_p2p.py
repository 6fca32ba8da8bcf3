"""send/recv, isend/irecv, tags, any-source and batch exchange over world sizes 1–4."""

from __future__ import annotations

import pytest

from harness import RankPool
from in_rank import p2p as cases

WORLDS = [2, 3, 4]


def _no_failures(results: list[list[str]]) -> None:
    failures = [f"rank {r}: {f}" for r, fs in enumerate(results) for f in fs]
    assert not failures, "\n".join(failures[:40])


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize(
    "case",
    [cases.ring_every_dtype_and_shape, cases.tags_and_order, cases.a_message_passed_over_keeps_its_bytes,
     cases.mid_size_messages_out_of_order_every_byte_checked, cases.large_messages_come_back_through_kept_mappings,
     cases.any_source, cases.irecv_does_not_block_collectives,
     cases.batch_exchange, cases.bad_peers, cases.sends_are_buffered,
     cases.held_back_counts_never_block_a_capped_sender, cases.held_back_counts_of_an_irecv_reach_a_capped_sender],
    ids=lambda f: f.__name__,
)  # fmt: skip
def test_p2p(pool_factory, case, world: int) -> None:
    _no_failures(pool_factory(world).run(case))


def test_irecv_alone_in_world_of_one(pool_factory) -> None:
    _no_failures(pool_factory(1).run(cases.irecv_does_not_block_collectives))


def test_mismatched_recv_is_a_clear_error() -> None:
    pool = RankPool(2, group_timeout=20)
    try:
        results = pool.run(cases.mismatched_recv, "x")
    finally:
        pool.kill()
    assert results[1].startswith("DesyncError"), results[1]
    for rank, text in enumerate(results):  # the sender too, at its next operation
        assert "float32 [4]" in text and "int64 [5]" in text, f"rank {rank}: {text}"
    assert results[0].startswith("PeerFailedError"), results[0]


def test_buffered_sends_are_capped(pool_factory) -> None:
    from fsdist.defaults import MAX_UNRECEIVED_SENDS
    from fsdist.protocol.state_record import P2P_SLOTS

    results = pool_factory(2).run(cases.send_cap, MAX_UNRECEIVED_SENDS + 100)
    # the first P2P_SLOTS travel in the sender's record; the rest of the capped ones are files
    assert results[1] == [MAX_UNRECEIVED_SENDS - P2P_SLOTS], results


def test_a_send_ring_reuses_space_only_once_the_receiver_counted_it_received(tmp_path, monkeypatch) -> None:
    """Messages go in one after another, never wrap (a message that would cross the end starts
    the next lap), and take only space whose messages the receiver's counter shows received;
    no room, or a full filesystem, is None (the sender then writes a file)."""
    import errno
    import os

    from fsdist.transport.rings import SendRing

    ring = SendRing(str(tmp_path / "ring0-1"), capacity=1000)
    payload = [bytes(range(250)), b"x" * 50]  # 300 bytes, 320 with alignment
    assert [ring.place(i, payload, 300, received=0) for i in range(3)] == [0, 320, 640]
    assert ring.place(3, payload, 300, received=0) is None  # 960 + 320 > 1000: full until #0 is received
    assert ring.place(3, payload, 300, received=1) == 0  # the rest of the lap is skipped, #0's space reused
    assert ring.place(4, payload, 300, received=1) is None  # #1 still unreceived at 320
    with open(ring.path, "rb") as f:
        data = f.read()
    assert len(data) == 1000 and data[320:620] == b"".join(payload) and data[0:300] == b"".join(payload)
    assert ring.place(4, payload, 2000, received=5) is None  # larger than the ring

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", full)
    assert ring.place(5, payload, 300, received=5) is None and ring.broken
    ring.close()
