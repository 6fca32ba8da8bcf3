"""The file layer (fsdist/files/) with real processes: counters under contention, atomic
publish, locks and their waits, kept mappings, refusing symbolic links."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time

import pytest
import torch

from fsdist.errors import FsdistError, UntrustedPathError
from fsdist.files.counters import Counter, encode_counter
from fsdist.files.io import publish
from fsdist.files.locks import LockedRecord
from fsdist.files.mapped import MappedFiles
from fsdist.files.seal import seal
from fsdist.protocol import message
from fsdist.transport.incoming import FileMessage

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
        # no torch kernel in a forked child: one that goes parallel hangs where the parent's
        # OpenMP pool was started before the fork (it is, after test_transport.py's copies)
        payload = torch.frombuffer(bytearray([i % 251]) * size, dtype=torch.uint8)
        publish(directory, "msg", message.encode(i, 0, "fill", [payload], CRC))


def test_reader_never_sees_a_partial_or_mixed_file(tmp_path) -> None:
    directory = str(tmp_path)
    size = 4 << 20
    writer = CTX.Process(target=_publisher, args=(directory, 40, size))
    writer.start()
    seen = 0
    deadline = time.monotonic() + 120
    while writer.is_alive() or seen == 0:
        if time.monotonic() > deadline:
            writer.kill()
            pytest.fail(f"Timed out: the publisher had not written its 40 messages in 120 s (a reader saw {seen})")
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


def _mountinfo_for(path: str, fstype: str, tmp_path) -> str:
    """A mount table in which ``path``'s device is a mount of ``fstype``."""
    dev = os.stat(path).st_dev
    table = tmp_path / f"mountinfo-{fstype}"
    table.write_text(f"36 1 {os.major(dev)}:{os.minor(dev)} / /mnt rw,relatime - {fstype} src rw\n")
    return str(table)


def test_only_fuse_filesystems_but_glusterfs_read_records_through_fresh_descriptors(tmp_path) -> None:
    """A FUSE daemon's cache need not honour the lock (MooseFS lost lock-guarded increments
    through held descriptors); NFS, local filesystems and lock-coherent GlusterFS keep theirs."""
    from fsdist.files import locks

    path = str(tmp_path / "record")
    with LockedRecord(path) as record:
        fd = record.fileno()
        cases = [("fuse", True), ("fuse.juicefs", True), ("fuse.ceph-fuse", False),
                 ("fuse.glusterfs", False), ("nfs4", False), ("tmpfs", False), ("fuseblk", False)]  # fmt: skip
        for fstype, fresh in cases:
            assert locks._needs_fresh_descriptors(fd, _mountinfo_for(path, fstype, tmp_path)) == fresh, fstype
        other = tmp_path / "mountinfo-other"
        other.write_text("36 1 999:999 / /mnt rw - fuse src rw\n")
        assert not locks._needs_fresh_descriptors(fd, str(other))  # no mount shows the device: as it was


def test_a_record_on_fuse_is_read_through_a_fresh_descriptor_and_synced_before_its_unlock(
    tmp_path, monkeypatch
) -> None:
    from fsdist.files import locks

    monkeypatch.setattr(locks, "_needs_fresh_descriptors", lambda fd: True)
    events: list[str] = []
    real_open, real_fsync, real_lock = locks.open_file, os.fsync, locks.lock
    monkeypatch.setattr(locks, "open_file", lambda *a, **k: (events.append("open"), real_open(*a, **k))[1])
    monkeypatch.setattr(locks.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    kinds = {0: "r", 1: "w", 2: "u"}
    monkeypatch.setattr(locks, "lock", lambda fd, kind, *a: (events.append(kinds[kind]), real_lock(fd, kind, *a))[1])
    path = str(tmp_path / "record")
    with LockedRecord(path) as record:
        events.clear()
        record.write(b"abcdef")
        assert events == ["w", "fsync", "u"]  # the write reaches the server before the next holder reads
        events.clear()
        assert record.read() == b"abcdef"
        assert events == ["r", "open", "u"]  # (a read syncs nothing)
        events.clear()
        assert record.update(lambda old: old[:2]) == b"ab"  # shorter: written, truncated, then synced
        assert events == ["w", "open", "fsync", "u"]
        assert record.read() == b"ab"
        with Counter(str(tmp_path / "counter")) as counter:
            assert [counter.add(1) for _ in range(3)] == [1, 2, 3] and counter.get() == 3
        # the name now leads to another file, or to none: the file held open is read, as on
        # every other filesystem (a finished generation's files go while a peer still looks)
        os.rename(str(tmp_path / "counter"), path)
        events.clear()
        assert record.read() == b"ab" and events == ["r", "open", "u"]
        os.unlink(path)
        assert record.read() == b"ab"
        monkeypatch.setattr(locks, "lock_kind_in_use", lambda: "posix")  # closing a descriptor would drop
        assert record.read() == b"ab"  # the lock: the held descriptor, as before


def test_lock_contention_starts_counting_once_every_process_opened_its_counter(tmp_path, monkeypatch) -> None:
    """doctor's contention row counted ~5 increments in its second on MooseFS, where the first
    open through a second mount took ~3 s: the count starts when all are ready."""
    from fsdist.fs import contention, lock_kinds

    real = lock_kinds.incrementer

    @contextlib.contextmanager
    def slow_to_open(kind: str, folder: str):
        time.sleep(1.5)  # longer than any fixed head start
        with real(kind, folder) as increment:
            yield increment

    monkeypatch.setattr(lock_kinds, "incrementer", slow_to_open)
    result = contention.contend([str(tmp_path)], 2, 0.5, max_increments=50)
    assert result.per_process == [50, 50] and result.lost_updates == 0, result

    @contextlib.contextmanager
    def slow_to_count(kind: str, folder: str):
        with real(kind, folder) as increment:
            yield lambda: (time.sleep(0.05), increment())

    monkeypatch.setattr(lock_kinds, "incrementer", slow_to_count)  # a first second that counts a few
    (tmp_path / "second").mkdir()
    result = contention.contend([str(tmp_path / "second")], 2, 0.1, max_increments=50, min_increments=6)
    assert min(result.per_process) >= 6 and result.lost_updates == 0, result  # counted on to the least
    assert 20 < result.acquisitions_per_s <= 40, result  # over the time it took: 2 processes, 50 ms each


def test_a_directory_another_client_is_making_is_looked_for_again(tmp_path, monkeypatch) -> None:
    """GlusterFS may answer one client's mkdir with EEXIST while the directory another client is
    making cannot be opened yet (ENOENT): make_private_dir tries both again, briefly, and then
    makes or adopts it; a directory that never appears is still an error."""
    from fsdist.files import trust

    real_mkdir, told = os.mkdir, []

    def mkdir_while_another_makes_it(path: str, mode: int = 0o777) -> None:
        if not told:  # the first answer: "exists" (another client's mkdir), though nothing is there yet
            told.append(path)
            raise FileExistsError(17, "File exists", path)
        real_mkdir(path, mode)

    monkeypatch.setattr(trust.os, "mkdir", mkdir_while_another_makes_it)
    made = tmp_path / "store"
    trust.make_private_dir(str(made))
    assert told == [str(made)] and made.is_dir() and made.stat().st_mode & 0o777 == 0o700

    def mkdir_always_exists(path: str, mode: int = 0o777) -> None:
        raise FileExistsError(17, "File exists", path)

    monkeypatch.setattr(trust.os, "mkdir", mkdir_always_exists)
    started = time.monotonic()
    with pytest.raises(FileNotFoundError):
        trust.make_private_dir(str(tmp_path / "never"))
    assert time.monotonic() - started < trust.GROUP_SETTLE_SECONDS + 1
