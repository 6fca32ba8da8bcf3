"""Direct records (FSDIST_IO=direct): state records read and written with O_DIRECT and no lock.

Nothing excludes a reader from the writer's write, so every read torn by a write must be found
by the record's checks and read again, never acted on: these tests hand the reader torn
point-to-point counters (a torn header or slot: test_transport.py, for both kinds of record),
race a real writer process against a reader on tmpfs for each region type and cut a writer off
mid-record (scripts/nfs-vm/torn_ranks.py, which the NFS VM runs across two clients), and run
collectives and point to point in direct groups. Where the filesystem wants direct I/O aligned
(ext4, xfs) direct records are refused. FSDIST_IO=auto's measurement across clients runs here
with threads as ranks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import torch
from memory_store import MemoryStore, every_rank_as_a_thread

import fsdist.files.direct as direct
import fsdist.files.locks as locks
from fsdist.errors import FsdistError, ProtocolError
from fsdist.files.counters import OwnCounter
from fsdist.files.direct import DirectRecord, io_setting
from fsdist.files.locks import LockedRecord, OptimisticRecord
from fsdist.fs.mounts import find_mount
from fsdist.job.io_choice import Choice
from fsdist.protocol import state_record
from fsdist.transport.group import GroupTransport
from fsdist.transport.locality import Locality
from fsdist.transport.progress import Progress

from harness import RankPool
from in_rank import collectives as cases
from in_rank import p2p as p2p_cases
from record_support import AliveWatch, direct_io_folder, position_bytes, publish_inline, queue_reads

#: filesystems that take direct I/O of any size at any offset
UNALIGNED_OK = ("tmpfs", "nfs", "nfs4")


@pytest.fixture
def shm():
    """A private folder on /dev/shm (tmpfs: unaligned direct I/O works there)."""
    path = direct_io_folder()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _pair(directory: str) -> tuple[Progress, Progress]:
    make = lambda rank: Progress(directory, rank, 2, AliveWatch(), 5.0, record_kind=DirectRecord)  # noqa: E731
    return make(0), make(1)


@pytest.fixture
def torn_reads(monkeypatch):
    """Make the next direct reads return the given bytes (then the file's own again)."""
    return queue_reads(monkeypatch, DirectRecord, "read")


def test_direct_records_need_a_filesystem_that_takes_unaligned_direct_io(tmp_path, shm, monkeypatch) -> None:
    assert DirectRecord.refusal(shm) is None
    here = str(tmp_path)
    why = DirectRecord.refusal(here)
    assert (why is None) == (find_mount(here).fstype in UNALIGNED_OK), why
    monkeypatch.setenv("FSDIST_IO", "direct")
    assert Locality.of(shm, one_client=True).direct
    if why is not None:  # the suite's own folder is on ext4 here: refused for a shared group, naming it...
        with pytest.raises(FsdistError, match=f"FSDIST_IO=direct: {here}: .*refuses unaligned direct I/O"):
            Locality.of(here, one_client=False)
        # ...and locked for one machine's own (a node tier: every rank there finds the same)
        assert not Locality.of(here, one_client=True).direct
    assert not [n for n in os.listdir(shm) if n.startswith(".tmp")], "the probe file was left behind"
    monkeypatch.setenv("FSDIST_IO", "sometimes")
    with pytest.raises(ValueError, match="expected auto, direct or locked"):
        io_setting()
    monkeypatch.setenv("FSDIST_IO", "auto")  # auto: direct only where the job chose it (job/io_choice.py)
    assert not Locality.of(shm, one_client=True).direct
    chosen, not_chosen = Choice(True, "measured"), Choice(False, "FSDIST_IO=locked")
    assert Locality.of(shm, one_client=False, records=chosen).record_kind is DirectRecord
    assert Locality.of(shm, one_client=False, records=not_chosen).record_kind is LockedRecord
    assert Locality.of(shm, one_client=True).record_kind is OptimisticRecord  # (one machine: tmpfs)
    monkeypatch.setenv("FSDIST_IO", "direct")  # a node's own tier (no job choice): the setting alone
    assert Locality.of(shm, one_client=True).record_kind is DirectRecord


def test_a_direct_record_takes_no_lock_and_refuses_a_compare_and_set(shm) -> None:
    path = os.path.join(shm, "state.r0")
    writer, reader = DirectRecord(path), DirectRecord(path)
    with LockedRecord(path) as other, other.held():  # someone holds the lock: no access waits for it
        start = time.monotonic()
        writer.write(b"hello", 3)
        assert reader.read(3, 5) == b"hello"
        assert time.monotonic() - start < 1.0
    with pytest.raises(FsdistError, match="compare-and-set needs the lock"):
        writer.update(lambda old: b"x")
    writer.close()
    reader.close()


def test_point_to_point_counters_torn_by_a_send_are_read_again(shm, torn_reads) -> None:
    queued, _ = torn_reads
    reader, writer = _pair(shm)
    check = writer.seals[1]
    area = bytearray(state_record.PAIR_AREA)
    end = state_record.put_p2p(area, 1, 0, 0, b"payload", 0, check)
    writer.write_own(bytes(area[:end]), state_record.pair_offset(0))
    torn = bytearray(area)
    torn[3] ^= 0xFF  # the counters' tag fails
    queued.extend([bytes(torn)] * 2)
    raw, (sent, received), _ = reader.read_peer(
        1, state_record.pair_offset(0), state_record.PAIR_AREA,
        lambda raw: state_record.decode_pair(raw, 0, check),
    )  # fmt: skip
    assert (sent, received) == (1, 0) and state_record.find_p2p(raw, 0) == b"payload"


def test_a_record_damaged_for_good_is_refused_after_the_torn_read_bound(shm, monkeypatch) -> None:
    monkeypatch.setattr(locks, "TORN_READ_SECONDS", 0.05)
    reader, writer = _pair(shm)
    publish_inline(writer, 1, 1, 3.0)
    with open(os.path.join(shm, "state.r1"), "r+b") as record:
        record.seek(40)
        record.write(b"\xff")
    reader.enter(1, writer.description)
    start = time.monotonic()
    with pytest.raises(ProtocolError, match="state record's header"):
        reader.peer_state(1)
    assert time.monotonic() - start < 2.0


DIRECT_WORLDS = [2, 3]


@pytest.fixture(scope="module", params=DIRECT_WORLDS)
def direct_pool(request):
    directory = direct_io_folder()
    pool = RankPool(request.param, env={"FSDIST_IO": "direct"}, directories=[directory] * request.param)
    yield pool
    pool.close()


def _failures(results: list[dict[str, list[str]]]) -> list[str]:
    return [f"rank {rank}: {f}" for rank, res in enumerate(results) for f in res["failures"]]


@pytest.mark.parametrize(
    "case, args",
    [
        (cases.all_reduce, ("SUM", "float32")),
        (cases.all_reduce, ("MAX", "int64")),
        (cases.reduce_scatter, ("SUM", "float32")),
        (cases.broadcast, ("float32",)),
        (cases.all_gather, ("bfloat16",)),
        (cases.all_to_all, ("float32",)),
        (cases.coalesced, ("SUM", "float32")),
        (cases.barrier_and_ordering, ()),
    ],
    ids=lambda v: getattr(v, "__name__", "-".join(map(str, v)) if isinstance(v, tuple) else str(v)),
)
def test_collectives_in_a_direct_group_match_their_references(direct_pool, case, args) -> None:
    failures = _failures(direct_pool.run(case, *args))
    assert not failures, "\n".join(failures[:40])


def test_small_messages_in_a_direct_group_travel_in_the_records(direct_pool) -> None:
    results = direct_pool.run(cases.small_messages_leave_no_files)
    assert [r[0] for r in results] == [0] * direct_pool.world_size, results


@pytest.mark.parametrize(
    "case",
    [p2p_cases.ring_every_dtype_and_shape, p2p_cases.tags_and_order, p2p_cases.any_source,
     p2p_cases.mid_size_messages_out_of_order_every_byte_checked,
     p2p_cases.large_messages_come_back_through_kept_mappings, p2p_cases.held_back_counts_never_block_a_capped_sender],
    ids=lambda f: f.__name__,
)  # fmt: skip
def test_point_to_point_in_a_direct_group(direct_pool, case) -> None:
    failures = [f"rank {rank}: {f}" for rank, res in enumerate(direct_pool.run(case)) for f in res]
    assert not failures, "\n".join(failures[:40])


def test_a_direct_heartbeat_beats_without_the_lock_and_its_watcher_reads_it(shm, monkeypatch) -> None:
    """With direct records a beat is one direct write: it goes on while another process would
    hold the file's lock (a locked beat would wait), and a watcher reading directly sees it move."""
    import fsdist.job.liveness as liveness

    monkeypatch.setattr(liveness, "HEARTBEAT_SECONDS", 0.01)
    path = os.path.join(shm, "heartbeat.r0")
    with LockedRecord(path) as other, other.held():
        beat = liveness.Heartbeat(path, direct=True)
        watcher = OwnCounter(path)
        try:
            seen = {watcher.try_get()}
            deadline = time.monotonic() + 10
            while len(seen) < 4 and time.monotonic() < deadline:
                seen.add(watcher.try_get())
                time.sleep(0.005)
        finally:
            beat.stop()
            watcher.close()
    assert len(seen - {None}) >= 3, f"the beat did not move while the lock was held: {seen}"
    assert direct.takes_direct_io(shm)


def test_a_slot_that_arrives_after_its_header_is_waited_for_not_taken_for_a_desync(shm) -> None:
    """On NFS a record write larger than wsize is several WRITEs: the header can be seen well
    before the slot it announces (here 1.5 s, past TORN_READ_SECONDS). The reader waits for the
    slot, as for a step, instead of concluding the peer moved on without publishing."""
    where = Locality(one_client=False, local=False, reuse_files=False, direct=True)
    reader = GroupTransport(shm, 0, 2, AliveWatch(), 10.0, locality=where)
    writer = GroupTransport(shm, 1, 2, AliveWatch(), 10.0, locality=where)
    before = position_bytes(shm, 1)
    writer.enter(1, "all_reduce SUM float32[1]")
    writer.publish(1, [torch.tensor([3.0])])
    after = position_bytes(shm, 1)
    assert after[state_record.HEADER_SIZE :] != before[state_record.HEADER_SIZE :], "the message is not inline"
    fd = os.open(os.path.join(shm, "state.r1"), os.O_WRONLY)
    try:
        os.pwrite(fd, after[: state_record.HEADER_SIZE] + before[state_record.HEADER_SIZE :], 0)  # first part
        late = threading.Timer(1.5, lambda: os.pwrite(fd, after, 0))  # the rest, 1.5 s later
        late.start()
        reader.enter(1, "all_reduce SUM float32[1]")
        start = time.monotonic()
        reader.wait_for(1, 1)
        with reader.open_message(1, 1) as msg:
            value = torch.empty(1)
            msg.read_into(0, value)
        late.join()
    finally:
        os.close(fd)
    assert value.item() == 3.0 and time.monotonic() - start >= 1.4
    reader.close()
    writer.close()


# ---- FSDIST_IO=auto: the job measures whether direct records hold across its clients -------------


def _choose_everywhere(directory: str, clients: list[str]) -> list[Any]:
    """Every rank's Choice (or exception), each rank a thread; rank r reaches the directory
    through client ``clients[r]``."""
    from fsdist.job.io_choice import choose_records

    return every_rank_as_a_thread(choose_records, directory, clients)


def test_auto_chooses_direct_records_where_a_direct_write_is_read_at_once_on_another_client(shm, monkeypatch):
    monkeypatch.delenv("FSDIST_IO", raising=False)
    choices = _choose_everywhere(shm, ["a", "a", "b", "b", "c"])
    assert all(c.direct for c in choices), choices
    assert "3 clients" in choices[0].why
    assert not [n for n in os.listdir(shm) if n.startswith("io-probe")], "a probe file was left behind"


def test_auto_keeps_locked_records_where_a_direct_read_shows_an_older_write(shm, monkeypatch):
    """A filesystem caching behind O_DIRECT (here: reads that keep showing the first nonce) shows
    in the second round: every rank gets locked records, with the reason."""
    monkeypatch.delenv("FSDIST_IO", raising=False)
    first: dict[str, bytes] = {}
    read = DirectRecord.read

    def cached(self: DirectRecord, offset: int = 0, size: int | None = None) -> bytes:
        return first.setdefault(self.path, read(self, offset, size))

    monkeypatch.setattr(DirectRecord, "read", cached)
    choices = _choose_everywhere(shm, ["a", "b"])
    assert all(not c.direct for c in choices), choices
    assert all("caches behind O_DIRECT" in c.why and "round 2" in c.why for c in choices)


def test_auto_keeps_locked_records_on_one_client_or_where_direct_io_is_refused(shm, tmp_path, monkeypatch):
    monkeypatch.delenv("FSDIST_IO", raising=False)
    assert all(not c.direct and "one client" in c.why for c in _choose_everywhere(shm, ["a"] * 3))
    why = DirectRecord.refusal(str(tmp_path))
    if why is not None:  # (ext4 and xfs want direct I/O aligned)
        choices = _choose_everywhere(str(tmp_path), ["a", "b"])
        assert all(not c.direct and "refuses unaligned direct I/O" in c.why for c in choices), choices


def test_forced_records_are_not_measured_and_must_be_set_alike(shm, monkeypatch):
    monkeypatch.setenv("FSDIST_IO", "locked")
    assert all(not c.direct and c.why == "FSDIST_IO=locked" for c in _choose_everywhere(shm, ["a", "b"]))
    monkeypatch.setenv("FSDIST_IO", "direct")
    assert all(c.direct for c in _choose_everywhere(shm, ["a", "b"]))
    from fsdist.job.io_choice import choose_records
    from fsdist.job.liveness import Identity

    store = MemoryStore()
    store.set("fsdist/io-probe/setting", "auto")  # rank 0's
    with pytest.raises(ValueError, match="FSDIST_IO=direct here, auto on rank 0: set FSDIST_IO alike"):
        choose_records(store, shm, [Identity("h", 1, 1, client="a"), Identity("h", 2, 1, client="b")], 1)


def test_torn_reads_of_every_region_type_and_a_writer_cut_off_on_tmpfs(shm) -> None:
    """The NFS VM's torn-read check (scripts/nfs-vm/torn_ranks.py: a reader racing its writer for
    a record's position, a pair area and a counter; a writer cut off mid-record), here on tmpfs."""
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "nfs-vm", "torn_ranks.py")
    done = subprocess.run(
        [sys.executable, script, shm, shm, "1.0", "tmpfs"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" PASS (tmpfs)") == 5, done.stdout
