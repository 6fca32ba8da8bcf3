"""The transport's parts in one process: record reads, message readers, spares, the waiter.

Record reads: on local filesystems a rank reads its peers' state records without the lock first. A read torn
by the peer's concurrent write must never be acted on: the checksums find it, or a newer header
points at a step whose slot still holds an older message, and the record is read again under
the lock. These tests hand the reader torn bytes and check it recovers the written values.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest
import torch

from fsdist.errors import FsdistError, ProtocolError
from fsdist.files.direct import DirectRecord
from fsdist.files.io import publish
from fsdist.files.locks import LockedRecord, OptimisticRecord
from fsdist.files.mapped import MappedFiles
from fsdist.files.seal import seal
from fsdist.protocol import layout, message, state_record
from fsdist.transport.group import GroupTransport
from fsdist.transport.incoming import FileMessage
from fsdist.transport.locality import Locality
from fsdist.transport.progress import Progress
from fsdist.transport.spares import SparePool

from record_support import AliveWatch, direct_io_folder, position_bytes, publish_inline, queue_reads

CRC = seal("test")  # the check without FSDIST_SECRET_FILE


def _one_client(tmp_path, rank: int, size: int) -> GroupTransport:
    """Rank ``rank`` of a group whose ranks share one client (this process)."""
    return GroupTransport(str(tmp_path), rank, size, AliveWatch(), 5.0, locality=Locality.of(str(tmp_path), True))


def _pair(tmp_path, optimistic: bool = True) -> tuple[Progress, Progress]:
    kind = OptimisticRecord if optimistic else LockedRecord
    make = lambda rank: Progress(str(tmp_path), rank, 2, AliveWatch(), 5.0, record_kind=kind)  # noqa: E731
    return make(0), make(1)


@pytest.fixture
def torn_reads(monkeypatch):
    """Make the next unlocked reads return the given bytes (then the file's own again)."""
    return queue_reads(monkeypatch, LockedRecord, "read_unlocked")


def test_a_record_read_without_the_lock_is_used_when_it_is_whole(tmp_path, torn_reads) -> None:
    _, calls = torn_reads
    reader, writer = _pair(tmp_path)
    sent = publish_inline(writer, 1, 1, 3.0)
    reader.enter(1, writer.description)
    assert reader.peer_state(1).position == (1, 1)
    assert reader.inline_message(1, 1) == sent
    assert len(calls) == 1  # one read, no lock, found both the step and its message


@pytest.fixture(params=["locked", "direct"])
def torn(request, tmp_path, monkeypatch):
    """A reader and a writer (ranks 0 and 1) whose reader's next reads are handed torn bytes: a
    locked record read without the lock first (then under it), or a direct record (FSDIST_IO=direct:
    read again, directly, on tmpfs). (directory, reader, writer, the queue of torn reads)."""
    direct = request.param == "direct"
    if direct:
        directory = direct_io_folder()
        request.addfinalizer(lambda: shutil.rmtree(directory, ignore_errors=True))
    else:
        directory = str(tmp_path)
    queued, _ = queue_reads(monkeypatch, *((DirectRecord, "read") if direct else (LockedRecord, "read_unlocked")))
    kind = DirectRecord if direct else OptimisticRecord
    make = lambda rank: Progress(directory, rank, 2, AliveWatch(), 5.0, record_kind=kind)  # noqa: E731
    return directory, make(0), make(1), queued


def test_a_header_torn_by_a_write_is_read_again(torn) -> None:
    directory, reader, writer, queued = torn
    publish_inline(writer, 1, 1, 3.0)
    whole = bytearray(position_bytes(directory, 1))
    whole[40] ^= 0xFF  # half of a write inside the description: the header's CRC fails
    queued.extend([bytes(whole)] * 2)
    reader.enter(1, writer.description)
    state = reader.peer_state(1)
    assert state.position == (1, 1) and state.description == writer.description


def test_a_newer_header_beside_an_older_slot_finds_the_message_when_read_again(torn) -> None:
    directory, reader, writer, queued = torn
    publish_inline(writer, 1, 1, 3.0)
    before = position_bytes(directory, 1)
    sent = publish_inline(writer, 2, 1, 5.0)  # step 1 of operation 2, in the next slot
    after = position_bytes(directory, 1)
    queued.extend([after[: state_record.HEADER_SIZE] + before[state_record.HEADER_SIZE :]] * 2)
    reader.enter(1, writer.description)
    reader.enter(2, writer.description)
    assert reader.peer_state(1).position == (2, 1)
    assert reader.inline_message(1, 1, confirm=False) is None  # torn: maybe a file (the caller looks)...
    assert reader.inline_message(1, 1) == sent  # ...none: read again (under the lock, or until whole)


def test_a_slot_torn_by_a_write_is_read_again(torn) -> None:
    directory, reader, writer, queued = torn
    sent = publish_inline(writer, 1, 1, 3.0)
    torn_slot = bytearray(position_bytes(directory, 1))
    torn_slot[state_record.slot_offset(1) + 40] ^= 0xFF  # inside the message of slot 1 (seq 1)
    queued.extend([bytes(torn_slot)] * 2)
    reader.enter(1, writer.description)
    reader.peer_state(1)
    assert reader.inline_message(1, 1) == sent


def test_a_record_damaged_on_disk_is_still_refused(tmp_path) -> None:
    reader, writer = _pair(tmp_path)
    publish_inline(writer, 1, 1, 3.0)
    with open(tmp_path / "state.r1", "r+b") as record:
        record.seek(40)
        record.write(b"\xff")
    reader.enter(1, writer.description)
    with pytest.raises(ProtocolError, match="checksum"):
        reader.peer_state(1)


def test_groups_that_are_not_optimistic_read_under_the_lock_only(tmp_path, torn_reads) -> None:
    _, calls = torn_reads
    reader, writer = _pair(tmp_path, optimistic=False)
    sent = publish_inline(writer, 1, 1, 3.0)
    reader.enter(1, writer.description)
    assert reader.inline_message(1, 1) == sent and reader.peer_state(1).position == (1, 1)
    assert calls == []


def _transports(tmp_path) -> tuple[GroupTransport, GroupTransport]:
    return tuple(_one_client(tmp_path, rank, 2) for rank in (0, 1))


def _area(tmp_path, sender: int, receiver: int) -> bytes:
    start = state_record.pair_offset(receiver)
    return open(tmp_path / f"state.r{sender}", "rb").read()[start : start + state_record.PAIR_AREA]


def _received(receiver: GroupTransport, src: int, index: int) -> float:
    with receiver.pairs.open(src, index) as msg:
        out = torch.empty(1)
        msg.read_into(0, out)
        return out.item()


@pytest.mark.parametrize("tear", ["counters", "slot", "older slot"])
def test_a_point_to_point_area_torn_by_a_send_is_read_again_under_the_lock(tmp_path, torn_reads, tear) -> None:
    queued, _ = torn_reads
    receiver, sender = _transports(tmp_path)
    assert receiver.progress.optimistic
    sender.pairs.send(0, [torch.tensor([1.0])], 0, "send float32[1]")
    before = _area(tmp_path, 1, 0)
    sender.pairs.send(0, [torch.tensor([2.0])], 0, "send float32[1]")
    after = bytearray(_area(tmp_path, 1, 0))
    slot = state_record.PAIR_COUNTERS_SIZE + 1 * state_record.P2P_SLOT_BYTES  # message 1's slot
    if tear == "counters":
        after[3] ^= 0xFF
    elif tear == "slot":
        after[slot + 40] ^= 0xFF
    else:  # the counters of the second send beside the slot as the first left it
        after[slot:] = before[slot:]
    queued.extend([bytes(after)] * 3)  # read again without the lock, it would be torn again
    assert receiver.pairs.sent_to_me(1) == 2
    assert _received(receiver, 1, 0) == 1.0 and _received(receiver, 1, 1) == 2.0


@pytest.mark.parametrize("tear", ["none", "torn", "more than sent"])
def test_a_sender_reads_its_receivers_count_without_the_lock_unless_it_is_torn(
    tmp_path, torn_reads, monkeypatch, tear
) -> None:
    """A sender that never receives from its receiver (a ring of 3+) reads its count anew once
    its slots are in use: without the lock, and again under it when the count is torn or says
    more was received than was sent."""
    queued, _ = torn_reads
    locked = []
    real_read = LockedRecord.read
    monkeypatch.setattr(LockedRecord, "read", lambda self, *a: locked.append(self.path) or real_read(self, *a))
    receiver, sender = _transports(tmp_path)
    slots = state_record.P2P_SLOTS
    for index in range(slots):  # every slot of the pair
        sender.pairs.send(0, [torch.tensor([float(index)])], 0, "send float32[1]")
    assert receiver.pairs.sent_to_me(1) == slots
    assert [_received(receiver, 1, index) for index in range(slots)] == [float(i) for i in range(slots)]
    receiver.pairs.acknowledge(1, slots)  # (written at once: rank 0 never sends to rank 1)
    locked.clear()
    counters = _area(tmp_path, 0, 1)[: state_record.PAIR_COUNTERS_SIZE]
    if tear == "torn":
        queued.append(counters[:3] + bytes([counters[3] ^ 0xFF]) + counters[4:])
    elif tear == "more than sent":
        queued.append(state_record.encode_pair(0, 99, 1, CRC))
    sender.pairs.send(0, [torch.tensor([7.0])], 0, "send float32[1]")  # slot 0 again: is message 0 consumed?
    reread = [path for path in locked if path.endswith("state.r0")]
    assert len(reread) == (0 if tear == "none" else 1)
    assert not any(name.startswith("p1-0") for name in os.listdir(tmp_path))  # inline: the slot was free
    assert receiver.pairs.sent_to_me(1) == slots + 1 and _received(receiver, 1, slots) == 7.0


def test_in_a_ring_of_three_the_count_for_the_previous_rank_rides_with_the_send_to_the_next(
    tmp_path, monkeypatch
) -> None:
    """No rank sends to the rank it receives from: the count it owes that rank is written with
    its next send (one locked write per round, one write range over both pair areas), and the
    sender, reading it one round late, still finds a slot free (no file)."""
    ranks = [_one_client(tmp_path, rank, 3) for rank in range(3)]
    writes: list[str] = []
    real_write = LockedRecord.write
    monkeypatch.setattr(LockedRecord, "write", lambda self, *a: writes.append(self.path) or real_write(self, *a))
    rounds = 3 * state_record.P2P_SLOTS
    for turn in range(rounds):
        for rank, transport in enumerate(ranks):
            transport.pairs.send((rank + 1) % 3, [torch.tensor([float(10 * turn + rank)])], 0, "send float32[1]")
        for rank, transport in enumerate(ranks):
            src = (rank - 1) % 3
            assert transport.pairs.sent_to_me(src) == turn + 1
            assert _received(transport, src, turn) == 10 * turn + src
            transport.pairs.acknowledge(src, turn + 1)
    assert sorted(writes) == sorted(f"{tmp_path}/state.r{rank}" for rank in range(3) for _ in range(rounds))
    assert not [name for name in os.listdir(tmp_path) if re.fullmatch(r"p\d+-\d+\.\d+", name)]
    owed = lambda rank: state_record.decode_pair(_area(tmp_path, rank, (rank - 1) % 3), (rank - 1) % 3, CRC)[1]  # noqa: E731
    assert [owed(rank) for rank in range(3)] == [rounds - 1] * 3  # the last count still held back
    for transport in ranks:
        transport.pairs.flush_acknowledgements()  # (as before a wait)
    assert [owed(rank) for rank in range(3)] == [rounds] * 3


def test_a_count_riding_past_another_peers_area_leaves_its_unread_message_whole(tmp_path) -> None:
    """Rank 3's send to rank 0 carries its count for rank 2 in one write over the areas for
    ranks 0-2: the area for rank 1 between them, holding a message rank 1 has not read yet, is
    rewritten as rank 3 wrote it."""
    ranks = [_one_client(tmp_path, rank, 4) for rank in range(4)]
    ranks[3].pairs.send(1, [torch.tensor([11.0])], 0, "send float32[1]")  # unread until the end
    ranks[2].pairs.send(3, [torch.tensor([23.0])], 0, "send float32[1]")
    assert ranks[3].pairs.sent_to_me(2) == 1 and _received(ranks[3], 2, 0) == 23.0
    ranks[3].pairs.acknowledge(2, 1)  # held back: rank 3 sends to rank 1, whose area lies next to rank 2's
    assert state_record.decode_pair(_area(tmp_path, 3, 2), 2, CRC)[1] == 0
    ranks[3].pairs.send(0, [torch.tensor([30.0])], 0, "send float32[1]")
    assert state_record.decode_pair(_area(tmp_path, 3, 2), 2, CRC)[1] == 1  # rode with the send to rank 0
    assert ranks[0].pairs.sent_to_me(3) == 1 and _received(ranks[0], 3, 0) == 30.0
    assert ranks[1].pairs.sent_to_me(3) == 1 and _received(ranks[1], 3, 0) == 11.0


def test_mid_size_collective_messages_go_through_the_ring_and_its_space_is_reused(tmp_path) -> None:
    """Between a record slot and COLLECTIVE_RING_MAX, a message goes into its rank's ring file
    (one file for all of them, space reused once readers are past) and the slot says where."""
    from fsdist.defaults import COLLECTIVE_RING_MAX, RING_BYTES

    reader, writer = _transports(tmp_path)
    if not writer.outbox.spares.enabled:
        pytest.skip("rings are for local filesystems; tmp_path is not one here")
    numel = COLLECTIVE_RING_MAX // 8 // 4 * 3  # ~3/4 of the largest: a few laps of the ring
    for seq in range(1, 3 * RING_BYTES // (numel * 8) + 2):
        payload = torch.arange(numel, dtype=torch.float64) + seq
        description = f"all_gather float64[{numel}]"
        for t in (reader, writer):
            t.enter(seq, description)
        writer.publish(1, [payload])
        reader.wait_for(1, 1)
        with reader.open_message(1, 1) as msg:
            assert msg.path.endswith(layout.collective_ring_name(1))  # not a file of its own
            out = torch.empty(numel, dtype=torch.float64)
            msg.read_into(0, out)
        assert torch.equal(out, payload), seq
        reader.advance(1)  # the reader's record shows it read: the writer may reuse the space
        writer.wait_for(0, 1)
    names = os.listdir(tmp_path)
    assert not [n for n in names if n.startswith("m")], names  # no message files, no spares
    assert os.path.getsize(tmp_path / layout.collective_ring_name(1)) == RING_BYTES


def test_where_files_are_not_reused_message_files_are_written_in_place(tmp_path, monkeypatch) -> None:
    """On network filesystems (no spares) a message file is made under its final name, never
    renamed: a rename moves its ctime and NFS clients drop its cached pages (files/io.write_new).
    Collective and point-to-point files alike read back exactly; an error while writing leaves
    no file behind and names it."""
    import fsdist.files.io as io_module

    where = Locality(one_client=False, local=False, reuse_files=False)
    reader = GroupTransport(str(tmp_path), 0, 2, AliveWatch(), 5.0, locality=where)
    writer = GroupTransport(str(tmp_path), 1, 2, AliveWatch(), 5.0, locality=where)
    renamed: list[str] = []
    real_rename = os.rename
    monkeypatch.setattr(os, "rename", lambda a, b: (renamed.append(b), real_rename(a, b))[1])
    payload = torch.arange(200_000, dtype=torch.float32)  # far past a slot: a file of its own
    for t in (reader, writer):
        t.enter(1, "all_gather float32[200000]")
    writer.publish(1, [payload])
    index = writer.pairs.send(0, [payload * 2], 0, "send float32[200000]")
    reader.wait_for(1, 1)
    out = torch.empty_like(payload)
    with reader.open_message(1, 1) as msg:
        assert os.path.basename(msg.path) == layout.message_name(1, 1, 1)
        msg.read_into(0, out)
    assert torch.equal(out, payload)
    with reader.pairs.open(1, index) as msg:
        msg.read_into(0, out)
    assert torch.equal(out, payload * 2)
    assert renamed == [] and not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]

    def disk_full(*_: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(io_module, "write_all", disk_full)
    for t in (reader, writer):
        t.enter(2, "all_gather float32[200000]")
    with pytest.raises(FsdistError, match=re.escape(layout.message_name(1, 2, 1)) + ".*No space"):
        writer.publish(1, [payload])
    assert not os.path.exists(tmp_path / layout.message_name(1, 2, 1))
    reader.close()
    writer.close()


def test_truncated_and_foreign_files_are_refused(tmp_path) -> None:
    good = publish(str(tmp_path), "good", message.encode(1, 0, "x", [torch.arange(100)], CRC))
    raw = open(good, "rb").read()
    (tmp_path / "foreign").write_bytes(b"GARBAGE" * 20)
    (tmp_path / "short").write_bytes(raw[:10])
    (tmp_path / "badcrc").write_bytes(raw[:40] + b"\xff" + raw[41:])
    (tmp_path / "cut").write_bytes(raw[:-100])
    for name in ("foreign", "short", "badcrc"):
        with pytest.raises(ProtocolError):
            FileMessage(str(tmp_path / name), CRC)
    with FileMessage(str(tmp_path / "cut"), CRC) as msg, pytest.raises(FsdistError, match="ended after"):
        msg.read_into(0, torch.empty(100, dtype=torch.int64))


def test_spares_rewrite_in_place_and_readers_see_only_the_new_message(tmp_path) -> None:
    """A message published through a spare reads back exactly, larger or smaller than the file."""
    mapped = MappedFiles(min_bytes=1024)
    pool = SparePool(str(tmp_path), rank=0, enabled=True, max_files=2, min_bytes=1024, mapped=mapped)
    big = torch.arange(100_000, dtype=torch.float32)
    first = publish(str(tmp_path), "m1", message.encode(1, 0, "big", [big], CRC))
    pool.give_back(first, os.path.getsize(first))
    assert not os.path.exists(first)  # hidden: no name a reader looks up leads to it
    small = torch.full((1000,), 7.0)
    spare = pool.take(4000 + 64)
    assert spare is not None
    spare.publish(str(tmp_path / "m2"), message.encode(2, 0, "small", [small], CRC))
    with FileMessage(str(tmp_path / "m2"), CRC) as msg:
        out = torch.empty(1000)
        msg.read_into(0, out)
        assert msg.seq == 2 and torch.equal(out, small)
        assert msg.file_size() >= big.numel() * 4  # the file kept its size; the header bounds the message
    pool.give_back(str(tmp_path / "m2"), os.path.getsize(tmp_path / "m2"), spare)
    # a message bigger than every spare grows the largest one
    bigger = torch.arange(300_000, dtype=torch.float64)
    spare = pool.take(bigger.numel() * 8)
    assert spare is not None
    spare.publish(str(tmp_path / "m3"), message.encode(3, 0, "bigger", [bigger], CRC))
    with FileMessage(str(tmp_path / "m3"), CRC) as msg:
        out64 = torch.empty(300_000, dtype=torch.float64)
        msg.read_into(0, out64)
        assert torch.equal(out64, bigger)
        with msg.mapped(0, out64[1000:2000], byte_offset=1000 * 8) as view:
            assert torch.equal(view, bigger[1000:2000])
            view.add_(1)  # a private mapping: the writer's file is untouched
    for _ in range(2):  # seen before: read through the kept mapping
        with FileMessage(str(tmp_path / "m3"), CRC, mapped=mapped) as msg:
            out64.zero_()
            msg.read_into(0, out64)
            assert torch.equal(out64, bigger)
    assert len(mapped._maps) == 1
    (kept,) = mapped._maps.values()
    with FileMessage(str(tmp_path / "m3"), CRC, mapped=mapped) as msg:
        operand = msg.mapped(0, out64[1000:2000], byte_offset=1000 * 8)
    with operand as view:  # a reduction's operand: the kept mapping itself, held for the block
        assert kept.users == 1 and torch.equal(view, bigger[1000:2000])
        fd = os.open(tmp_path / "m3", os.O_RDONLY)
        mapped.forget(fd)
        os.close(fd)
        assert mapped._maps  # not unmapped under the block
        assert torch.equal(view, bigger[1000:2000])
    assert kept.users == 0
    spare.close()
    assert not mapped._maps  # a spare deleted lets go of its mapping
    assert pool.take(10) is None  # below min_bytes: never a spare
    pool.close()
    assert os.listdir(tmp_path) == []


def test_a_message_file_shorter_than_its_part_is_a_protocol_error_when_mapped(tmp_path) -> None:
    """A part the file does not hold is refused in words, not with mmap's ValueError."""
    big = torch.arange(100_000, dtype=torch.float32)
    path = publish(str(tmp_path), "m", message.encode(1, 0, "big", [big], CRC))
    os.truncate(path, 8192)
    with FileMessage(path, CRC) as msg, pytest.raises(ProtocolError, match="ends before"):
        msg.mapped(0, big)


def test_spare_pool_is_bounded_and_off_where_disabled(tmp_path) -> None:
    pool = SparePool(str(tmp_path), rank=3, enabled=True, max_files=2, min_bytes=10, mapped=MappedFiles(1024))
    for i in range(4):
        path = publish(str(tmp_path), f"m{i}", [b"x" * 100])
        pool.give_back(path, 100)
    assert sorted(os.listdir(tmp_path)) == [".spare.r3.0", ".spare.r3.1"]  # the others were deleted
    pool.close()
    assert os.listdir(tmp_path) == []
    off = SparePool(str(tmp_path), rank=0, enabled=False, max_files=2, min_bytes=10, mapped=MappedFiles(1024))
    path = publish(str(tmp_path), "m", [b"x" * 100])
    off.give_back(path, 100)
    assert os.listdir(tmp_path) == [] and off.take(100) is None


def test_a_waiter_spins_only_while_the_run_queue_leaves_a_core_free(tmp_path) -> None:
    """Waiter.cores_to_spin's machine-wide half: runnable threads (the reader included) <= cores."""
    from fsdist.files.doorbell import RunQueue

    loadavg = tmp_path / "loadavg"
    for line, free in [("0.50 0.40 0.30 2/311 999\n", True), ("2.90 2.50 1.30 3/103 6883\n", False)]:
        loadavg.write_text(line)
        assert RunQueue(str(loadavg), cores=2).core_free() is free
    loadavg.write_text("garbage")
    assert RunQueue(str(loadavg), cores=2).core_free() is True  # unknown: decided by rank count alone
    assert RunQueue(str(tmp_path / "missing"), cores=2).core_free() is True
    # an answer serves for max_age seconds, then the file is read again
    loadavg.write_text("0.50 0.40 0.30 1/311 999\n")
    kept, fresh = RunQueue(str(loadavg), cores=2, max_age=3600), RunQueue(str(loadavg), cores=2, max_age=0)
    assert kept.core_free() is True and fresh.core_free() is True
    loadavg.write_text("2.90 2.50 1.30 3/103 6883\n")
    assert kept.core_free() is True and fresh.core_free() is False
