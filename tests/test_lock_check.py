"""The start-up lock check (job/lock_check.py): a job spanning clients measures its locks.

Each rank is a thread here and the store an in-memory one, as in test_direct.py's record
choice; the locks are real. OFD locks exclude between two descriptors of one process, so
threads standing in for two clients see what two clients with shared locks see. With the
POSIX locks fsdist falls back to (one owner per process: a second descriptor is *not*
excluded) they see what two clients of a mount with local-only locks see, for real.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest
from memory_store import every_rank_as_a_thread

import fsdist.files.locks as locks
from fsdist.errors import RendezvousError
from fsdist.files.locks import LockedRecord
from fsdist.job.lock_check import check_locks


def _check_everywhere(directory: str, clients: list[str]) -> list[Any]:
    """Every rank's outcome (None or the exception); rank r is on client ``clients[r]``."""
    return every_rank_as_a_thread(check_locks, directory, clients)


def test_locks_that_exclude_and_cohere_pass_on_every_client(tmp_path) -> None:
    assert locks.lock_kind_in_use() == "ofd"
    assert _check_everywhere(str(tmp_path), ["a", "a", "b", "c", "c"]) == [None] * 5
    assert os.listdir(tmp_path) == [], "a probe file was left behind"


def test_one_client_measures_nothing(tmp_path) -> None:
    assert _check_everywhere(str(tmp_path), ["a", "a", "a"]) == [None] * 3
    assert os.listdir(tmp_path) == []


def test_locks_that_do_not_exclude_across_clients_refuse_the_job_on_every_rank(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("FSDIST_ALLOW_UNSAFE_FS", raising=False)
    monkeypatch.setattr(locks, "_OFD_SETLK", None)  # POSIX locks: this process's descriptors never conflict
    outcomes = _check_everywhere(str(tmp_path), ["a", "b", "b"])
    assert all(isinstance(o, RendezvousError) for o in outcomes), outcomes
    text = str(outcomes[2])
    assert text == str(outcomes[0]), "every rank gives the same reason"
    assert "refusing to start" in text and "2 clients of" in text, text
    assert "did not exclude one through" in text and "locks are local to each client" in text, text
    assert "fsdist doctor" in text and "FSDIST_ALLOW_UNSAFE_FS=1 starts anyway" in text, text


def test_a_read_under_the_lock_that_shows_old_data_refuses_the_job(tmp_path, monkeypatch) -> None:
    """A client cache that a lock does not invalidate: the record rewritten through one client
    keeps reading as before through the other's open descriptor."""
    monkeypatch.delenv("FSDIST_ALLOW_UNSAFE_FS", raising=False)
    first: dict[int, bytes] = {}
    read = LockedRecord.read

    def cached(self: LockedRecord, offset: int = 0, size: int | None = None) -> bytes:
        return first.setdefault(id(self), read(self, offset, size))

    monkeypatch.setattr(LockedRecord, "read", cached)
    outcomes = _check_everywhere(str(tmp_path), ["a", "b"])
    assert all(isinstance(o, RendezvousError) for o in outcomes), outcomes
    assert "still read as its old content under the lock" in str(outcomes[1]), outcomes[1]


def test_the_override_starts_with_a_warning(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("FSDIST_ALLOW_UNSAFE_FS", "1")
    monkeypatch.setattr(locks, "_OFD_SETLK", None)
    with caplog.at_level(logging.WARNING, logger="fsdist.job.lock_check"):
        assert _check_everywhere(str(tmp_path), ["a", "b"]) == [None, None]
    assert "starting anyway: FSDIST_ALLOW_UNSAFE_FS is set" in caplog.text


def test_a_lock_check_that_does_not_finish_refuses_the_job_on_every_rank(tmp_path, monkeypatch) -> None:
    """MooseFS with mfsnoposixlocks stalled the second client's measurement past the store's
    timeout: every rank says the lock check did not finish, naming the filesystem and doctor,
    not only a store key that did not appear."""
    import memory_store

    from fsdist.errors import FsdistTimeoutError

    monkeypatch.delenv("FSDIST_ALLOW_UNSAFE_FS", raising=False)
    real_set = memory_store.MemoryStore.set

    def set_but_lose_client_1(self, key: str, value: str) -> None:
        if not key.endswith("verdict.1"):  # (client 1's measurement never finishes)
            real_set(self, key, value)

    def get_or_time_out(self, key: str) -> bytes:
        with self._changed:
            if not self._changed.wait_for(lambda: key in self.values, timeout=1):
                raise FsdistTimeoutError(f"store: key {key!r} did not appear within 1.0 s")
            return self.values[key]

    monkeypatch.setattr(memory_store.MemoryStore, "set", set_but_lose_client_1)
    monkeypatch.setattr(memory_store.MemoryStore, "get", get_or_time_out)
    outcomes = _check_everywhere(str(tmp_path), ["a", "b", "b"])
    assert all(isinstance(o, RendezvousError) for o in outcomes), outcomes
    for text in map(str, outcomes):
        assert "refusing to start" in text and "the lock check did not finish" in text, text
        assert "did not appear within" in text and "fsdist doctor" in text, text
    assert os.listdir(tmp_path) == [], "a probe file was left behind"


@pytest.mark.parametrize("where", ["tmp", "shm"])
def test_fsdist_locks_behave_as_measured_on_local_filesystems(tmp_path, where) -> None:
    """fs/probes.py lock_semantics: what doctor reports per filesystem (FUSE ones in make test-fs)."""
    from fsdist.fs.probes import lock_semantics

    directory = str(tmp_path) if where == "tmp" else "/dev/shm"
    path = os.path.join(directory, f"fsdist-test-semantics-{os.getpid()}")
    try:
        semantics = lock_semantics(path)
    finally:
        for leftover in (path, f"{path}.close", f"{path}.death"):
            os.unlink(leftover)
    assert semantics.kind == "ofd" and semantics.same_process_excludes, semantics
    assert semantics.released_at_close and semantics.released_at_death, semantics
    assert semantics.problems() == []
