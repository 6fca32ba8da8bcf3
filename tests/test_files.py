"""The file layer with real processes: counters under contention, atomic publish, messages."""

from __future__ import annotations

import multiprocessing as mp
import os
import struct

import pytest
import torch

from fsdist.errors import FsdistError, ProtocolError, UntrustedPathError
from fsdist.files.io import publish
from fsdist.files.locks import Counter, LockedRecord, encode_counter
from fsdist.files.mapped import MappedFiles
from fsdist.files.seal import seal
from fsdist.protocol import message, state_record
from fsdist.transport.incoming import FileMessage, InlineMessage
from fsdist.transport.spares import SparePool

from harness import run_forked

CRC = seal("test")  # the check without FSDIST_SECRET_FILE: a CRC-32 (tests/test_mac.py tries the MAC)

CTX = mp.get_context("fork")  # the parent has imported everything; fork starts in milliseconds


def _increment(path: str, times: int) -> None:
    counter = Counter(path)
    for _ in range(times):
        counter.add(1)


def test_counter_8_processes_x_2000_increments(tmp_path) -> None:
    path = str(tmp_path / "counter")
    assert run_forked(_increment, [(path, 2000)] * 8) == [0] * 8
    assert Counter(path).get() == 16000


def test_counter_compare_and_set(tmp_path) -> None:
    counter = Counter(str(tmp_path / "c"))
    assert counter.compare_and_set(0, 5) == 5
    assert counter.compare_and_set(0, 9) == 5  # expected did not match: unchanged
    assert counter.add(-2) == 3
    assert counter.get() == 3


def _publisher(directory: str, rounds: int, size: int) -> None:
    for i in range(rounds):
        payload = torch.full((size,), i % 251, dtype=torch.uint8)
        publish(directory, "msg", message.encode(i, 0, "fill", [payload], CRC))


def test_reader_never_sees_a_partial_or_mixed_file(tmp_path) -> None:
    directory = str(tmp_path)
    size = 4 << 20
    writer = CTX.Process(target=_publisher, args=(directory, 40, size))
    writer.start()
    seen = 0
    while writer.is_alive() or seen == 0:
        try:
            msg = FileMessage(os.path.join(directory, "msg"), CRC)
        except FileNotFoundError:
            continue
        with msg:
            assert msg.parts[0].nbytes == size
            out = torch.empty(size, dtype=torch.uint8)
            msg.read_into(0, out)
            assert bool((out == out[0]).all()), "a reader saw bytes of two different messages"
            assert out[0].item() == msg.seq % 251
            seen += 1
    writer.join()
    assert writer.exitcode == 0
    assert not [n for n in os.listdir(directory) if n.startswith(".tmp")], "temporary files left behind"


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


def test_inline_messages_round_trip_and_damaged_slots_are_refused() -> None:
    """Small messages in a state record's slots: found by (seq, step), parsed and bounded."""
    tensors = [torch.arange(5, dtype=torch.int16), torch.tensor(2.5, dtype=torch.float64), torch.empty(0)]
    raw = b"".join(message.encode(9, 0, "all_gather float64[]", tensors, CRC, message.INLINE_ALIGN))
    assert len(raw) == message.encoded_size("all_gather float64[]", tensors, CRC, message.INLINE_ALIGN)
    assert len(raw) <= state_record.INLINE_MAX
    record = bytearray(state_record.POSITION_SIZE)
    slot = state_record.encode_slot(9, 2, raw)
    record[state_record.slot_offset(3) : state_record.slot_offset(3) + len(slot)] = slot
    assert state_record.find_inline(bytes(record), 9, 1) is None  # other step
    assert state_record.find_inline(bytes(record), 8, 2) is None  # a stale slot of another operation
    found = state_record.find_inline(bytes(record), 9, 2)
    assert found == raw
    msg = InlineMessage(found, "record", CRC)
    assert (msg.seq, msg.description, [p.shape for p in msg.parts]) == (9, "all_gather float64[]", [(5,), (), (0,)])
    out = torch.empty(5, dtype=torch.int16)
    msg.read_into(0, out)
    assert out.equal(tensors[0])
    with msg.mapped(1, torch.empty((), dtype=torch.float64)) as value:
        assert value.item() == 2.5
    with pytest.raises(ValueError):
        state_record.encode_slot(1, 1, bytes(state_record.INLINE_MAX + 1))
    lying = bytearray(record)
    struct.pack_into("<qII", lying, state_record.slot_offset(3), 9, 2, state_record.INLINE_SLOT_BYTES * 4)
    with pytest.raises(ProtocolError, match="claims"):
        state_record.find_inline(bytes(lying), 9, 2)
    with pytest.raises(ProtocolError):
        InlineMessage(raw[:-8], "record", CRC)  # a part now ends outside the message
    with pytest.raises(ProtocolError):
        InlineMessage(raw[:40], "record", CRC)  # the header itself is cut


def test_pair_areas_carry_both_counters_and_small_point_to_point_messages() -> None:
    """A pair area: (sent, received), then message i in slot i mod P2P_SLOTS, found by index."""
    first = b"".join(message.encode(4, 7, "send tag=7", [torch.arange(3)], CRC, message.INLINE_ALIGN))
    second = b"".join(message.encode(5, 7, "send tag=7", [torch.ones(2)], CRC, message.INLINE_ALIGN))
    area = bytearray(state_record.PAIR_AREA)
    end = state_record.put_p2p(area, 5, 2, 4, first, 1, CRC)
    assert end == state_record.p2p_slot_end(4) - state_record.P2P_SLOT_BYTES + 20 + len(first)
    state_record.put_p2p(area, 6, 3, 5, second, 1, CRC)
    assert state_record.decode_pair(bytes(area), 1, CRC) == (6, 3)
    assert state_record.find_p2p(bytes(area), 4) == first and state_record.find_p2p(bytes(area), 5) == second
    assert state_record.find_p2p(bytes(area), 6) is None  # slot 0 holds message 4: 6 is a file
    assert state_record.decode_pair(b"", 1, CRC) == (0, 0)  # never written: nothing sent, nothing received
    assert state_record.find_p2p(b"", 0) is None
    counters = state_record.PAIR_COUNTERS_SIZE
    lying = bytearray(area)
    struct.pack_into("<qII", lying, counters, 4, 0, state_record.P2P_SLOT_BYTES * 2)
    with pytest.raises(ProtocolError, match="claims"):
        state_record.find_p2p(bytes(lying), 4)
    with pytest.raises(ProtocolError, match="negative"):
        state_record.decode_pair(state_record.encode_pair(-1, 0, 1, CRC), 1, CRC)
    # every field a reader acts on is checksummed: one flipped bit is refused, never another value
    for flipped_at, read in [
        (3, lambda raw: state_record.decode_pair(raw, 1, CRC)),
        (counters + 20 + 40, lambda raw: state_record.find_p2p(raw, 4)),
    ]:
        flipped = bytearray(area)
        flipped[flipped_at] ^= 0x10
        with pytest.raises(ProtocolError, match="checksum"):
            read(bytes(flipped))


def test_a_records_flags_say_closed_and_aborted() -> None:
    for flags, closed, aborted in [(0, False, False), (1, True, False), (2, False, True), (3, True, True)]:
        state = state_record.decode(state_record.encode(3, 1, "barrier", 0, flags, CRC), "record", CRC)
        assert (state.closed, state.aborted) == (closed, aborted)


def test_symlinks_are_not_followed(tmp_path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"secret")
    os.symlink(target, tmp_path / "link")
    with pytest.raises(UntrustedPathError, match="symbolic link"):
        FileMessage(str(tmp_path / "link"), CRC)
    with pytest.raises(UntrustedPathError, match="symbolic link"):
        LockedRecord(str(tmp_path / "link"))


def test_publish_reports_the_path_and_leaves_no_temp_file(tmp_path) -> None:
    missing = str(tmp_path / "no-such-dir")
    with pytest.raises(FsdistError, match="no-such-dir"):
        publish(missing, "x", [b"data"])


def test_every_dtype_round_trips(tmp_path) -> None:
    for dtype in message.DTYPE_CODE:
        if dtype.is_floating_point or dtype.is_complex:
            tensor = (
                torch.randn(3, 4, dtype=torch.float64).to(dtype)
                if not dtype.is_complex
                else torch.randn(3, 4, dtype=dtype)
            )
        elif dtype == torch.bool:
            tensor = torch.tensor([[True, False], [False, True]])
        else:
            tensor = torch.arange(12).to(dtype).reshape(3, 4)
        path = publish(str(tmp_path), "m", message.encode(7, -3, "d", [tensor], CRC))
        with FileMessage(path, CRC) as msg:
            assert (msg.seq, msg.tag, msg.parts[0].dtype, msg.parts[0].shape) == (7, -3, dtype, tuple(tensor.shape))
            out = torch.empty_like(tensor)
            msg.read_into(0, out)
            assert out.view(torch.uint8).equal(tensor.view(torch.uint8))


def test_header_layout_is_little_endian_and_fixed(tmp_path) -> None:
    path = publish(str(tmp_path), "m", message.encode(5, 9, "ab", [torch.zeros(2, dtype=torch.int32)], CRC))
    raw = open(path, "rb").read()
    magic, version, nparts, seq, tag = struct.unpack_from("<4sHHqq", raw)
    assert (magic, version, nparts, seq, tag) == (b"FSDM", 2, 1, 5, 9)


def _cross_lock(me: str, other: str, directory: str, seconds: float) -> None:
    """One thread writes this process's record while another reads the peer's (like a rank's
    worker and receive threads): with process-wide POSIX locks the kernel sees false deadlocks."""
    import threading
    import time

    mine, theirs = LockedRecord(os.path.join(directory, me)), LockedRecord(os.path.join(directory, other))
    stop = time.monotonic() + seconds
    errors: list[BaseException] = []

    def loop(step) -> None:
        while time.monotonic() < stop:
            try:
                step()
            except OSError as exc:
                errors.append(exc)
                return

    threads = [
        threading.Thread(target=loop, args=(lambda: mine.write(b"x" * 64),)),
        threading.Thread(target=loop, args=(lambda: theirs.read(0, 64),)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def test_threads_of_two_processes_never_see_false_deadlocks(tmp_path) -> None:
    assert run_forked(_cross_lock, [("a", "b", str(tmp_path), 1.5), ("b", "a", str(tmp_path), 1.5)]) == [0, 0]


def test_two_records_on_one_file_in_one_process_exclude_each_other(tmp_path) -> None:
    import threading

    path = str(tmp_path / "c")
    counters = [Counter(path), Counter(path)]  # two open file descriptions of one file

    def bump(counter: Counter) -> None:
        for _ in range(500):
            counter.add(1)

    threads = [threading.Thread(target=bump, args=(c,)) for c in counters]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counters[0].get() == 1000


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


def test_kept_mappings_read_what_was_written_last_and_let_go_of_deleted_files(tmp_path) -> None:
    """files/mapped.py: a file is mapped the second time its inode is read; a copy out of the kept
    mapping sees every later write, through the mapping or not; a short file and small reads are
    left to pread; deleted files and the oldest beyond capacity are unmapped."""
    mapped = MappedFiles(min_bytes=4096, capacity=2)
    paths = [str(tmp_path / f"f{i}") for i in range(3)]
    fds = []
    for index, path in enumerate(paths):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(fd, bytes([index + 1]) * 65536, 0)
        fds.append(fd)
    out = bytearray(8192)
    assert not mapped.read(fds[0], 100, memoryview(out))  # first sight: pread
    assert mapped.read(fds[0], 100, memoryview(out)) and out == bytes([1]) * 8192
    assert not mapped.read(fds[0], 0, memoryview(bytearray(100)))  # small: pread
    assert not mapped.read(fds[0], 65536 - 100, memoryview(out))  # past the end: pread says so
    os.pwrite(fds[0], b"\x07" * 8192, 100)  # rewritten by another path (a peer's spare)
    assert mapped.read(fds[0], 100, memoryview(out)) and out == b"\x07" * 8192
    assert not mapped.write(fds[0], [b"\x09" * 5000, memoryview(bytearray(b"\x0a" * 70000))])  # too short
    assert os.fstat(fds[0]).st_size == 65536
    os.ftruncate(fds[0], 75000)  # grown (SpareFile: fallocate): mapped again, longer
    assert mapped.write(fds[0], [b"\x09" * 5000, memoryview(bytearray(b"\x0a" * 70000))])
    assert os.pread(fds[0], 2, 4999) == b"\x09\x0a"
    assert mapped.read(fds[0], 5000, memoryview(out)) and out == b"\x0a" * 8192
    for fd in fds[1:]:
        assert mapped.write(fd, [b"\x05" * 8192])
    assert len(mapped._maps) == 2  # capacity: the oldest went
    os.unlink(paths[1])
    mapped.read(fds[0], 0, memoryview(out))  # a miss sweeps deleted files
    assert all(os.fstat(m.fd).st_nlink for m in mapped._maps.values())
    mapped.close()
    assert not mapped._maps
    for fd in fds:
        os.close(fd)


def test_a_held_operand_is_the_shared_file_and_outlives_forget_sweeps_and_close(tmp_path) -> None:
    """files/mapped.py ``hold``: a reader's kept mapping (read-only, shared with the writer) is
    lent for a reduction and is unmapped by nothing until released, not even ``close``."""
    mapped = MappedFiles(min_bytes=4096, capacity=1)
    path, other = str(tmp_path / "f"), str(tmp_path / "g")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.pwrite(fd, b"\x01" * 65536, 0)
    assert mapped.hold(fd, 100, 8192) is None  # first sight: the caller maps it privately
    assert mapped.hold(fd, 100, 100) is None  # small: the caller copies
    held = mapped.hold(fd, 100, 8192)
    assert held is not None
    (kept,) = mapped._maps.values()
    assert not kept.writable and kept.users == 1
    with held:
        assert held.view == b"\x01" * 8192
        os.pwrite(fd, b"\x02" * 8192, 100)  # the writer's next message: the view is the file
        assert held.view == b"\x02" * 8192
        mapped.forget(fd)
        os.unlink(path)
        other_fd = os.open(other, os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(other_fd, b"\x03" * 65536, 0)
        assert mapped.write(other_fd, [b"\x04" * 8192])  # a miss: sweeps deleted files, evicts
        assert kept in mapped._maps.values()  # ... but not one in use
        mapped.close()
        assert kept in mapped._maps.values() and held.view == b"\x02" * 8192
    assert kept.users == 0 and not mapped._maps  # closed: unmapped when the hold ended
    os.close(fd)
    os.close(other_fd)


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


def _hold_lock(path: str, ready, release) -> None:
    with LockedRecord(path) as record, record.held():
        ready.set()
        release.wait(30)


def test_a_busy_lock_is_judged_while_waited_for_and_never_waits_past_its_limit(tmp_path, monkeypatch) -> None:
    """Another process holds the lock and does not let go (stopped, stalled): the wait is judged
    by ``on_wait`` (a group's health check) or fails after LOCK_TIMEOUT_SECONDS, naming the file;
    ``try_read`` does not wait at all. Released, the lock is taken again at once."""
    import time

    from fsdist.errors import FsdistTimeoutError
    from fsdist.files import locks

    path = str(tmp_path / "record")
    LockedRecord(path).write(encode_counter(12345678, path))
    ready, release = CTX.Event(), CTX.Event()
    holder = CTX.Process(target=_hold_lock, args=(path, ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        waits: list[float] = []

        def judge(waited: float) -> None:
            waits.append(waited)
            if waited > 0.3:
                raise RuntimeError("the holder is stopped")

        with LockedRecord(path, on_wait=judge) as record, pytest.raises(RuntimeError, match="stopped"):
            record.read()
        assert len(waits) >= 2 and waits == sorted(waits), waits
        monkeypatch.setattr(locks, "LOCK_TIMEOUT_SECONDS", 0.3)
        started = time.monotonic()
        with LockedRecord(path) as record, pytest.raises(FsdistTimeoutError, match=f"Timed out .* lock on {path}"):
            record.write(b"x")
        assert time.monotonic() - started < 5
        with Counter(path) as counter:
            assert counter.try_get() is None
    finally:
        release.set()
        holder.join(30)
    with Counter(path) as counter:
        assert counter.try_get() == counter.get() == 12345678
