"""Refuse a job whose locks do not hold across its clients: measured by its own ranks at start.

fsdist's records are only as safe as their fcntl locks: a lock must exclude every other client's,
and a read under it must show what the last holder wrote, through a descriptor held open all
along (files/locks.py ``LockedRecord``). Some mounts break either promise and show nothing in
the mount table (MooseFS ``mfsnoposixlocks``, SeaweedFS without ``-dlm``, a FUSE daemon that
caches), so a job spanning clients measures it before its first collective. Like
FSDIST_IO=auto's probe (job/io_choice.py), in a ring over the job's clients: the first rank
on each client holds a lock on its own probe record and rewrites it; the first rank on the next
client checks that the lock excluded it, reads the record, and after the rewrite reads it
again through the same descriptor: it must show the rewrite. Rank 0 gathers the verdicts and
publishes one; every rank raises the same error. Twelve store operations per client, once per
job; a job on one client skips it.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence

from ..defaults import ENV_ALLOW_UNSAFE_FS
from ..errors import FsdistTimeoutError, RendezvousError
from ..files.io import unlink_quietly
from ..files.locks import LockedRecord
from ..fs import guard
from ..fs.mounts import describe_filesystem
from ..protocol import layout
from .io_choice import KeyValue
from .liveness import Identity

log = logging.getLogger(__name__)

__all__ = ["check_locks"]

#: how long a rewrite may take to show under the lock through another client (doctor's bound)
COHERENT_SECONDS = 0.1
_OK = "ok"


def check_locks(store: KeyValue, directory: str, members: Sequence[Identity], rank: int) -> None:
    """Raise RendezvousError on every rank of the job in ``directory`` (its generation folder)
    when its clients' locks do not exclude or cohere; FSDIST_ALLOW_UNSAFE_FS=1 logs instead."""
    clients = sorted({member.client for member in members})
    if len(clients) < 2:
        return
    mine = clients.index(members[rank].client)
    firsts = [min(r for r, m in enumerate(members) if m.client == client) for client in clients]
    key = layout.LOCK_PROBE_KEY
    try:
        if rank == firsts[mine]:
            store.set(f"{key}verdict.{mine}", _probe(store, directory, mine, firsts))
        if rank == 0:
            verdicts = [store.get(f"{key}verdict.{c}").decode() for c in range(len(clients))]
            store.set(f"{key}result", next((v for v in verdicts if v != _OK), _OK))
        result = store.get(f"{key}result").decode()
    except FsdistTimeoutError as exc:
        # a dozen store operations that took the whole timeout: measured on MooseFS with
        # mfsnoposixlocks, where two clients rewriting one file without a shared lock stall
        # each write for ~30 s; every rank says so, not only the one whose measurement stalled
        result = f"the lock check did not finish ({exc}), which locks local to each client can cause"
    finally:
        if rank == firsts[mine]:
            unlink_quietly(layout.lock_probe_file(directory, mine))
    if result == _OK:
        return
    error = RendezvousError(
        f"refusing to start: the ranks reach {directory} through {len(clients)} clients of "
        f"{describe_filesystem(directory)}, and at start {result}: ranks on different clients would "
        f"corrupt each other's files. python -m fsdist doctor DIR --peer-mount DIR2 shows what the mount does "
        f"(docs/filesystems.md: a setting that is safe); {ENV_ALLOW_UNSAFE_FS}=1 starts anyway"
    )
    if not guard.allowed():
        raise error
    log.warning("fsdist: rank %d: %s (starting anyway: %s is set)", rank, error, ENV_ALLOW_UNSAFE_FS)


def _probe(store: KeyValue, directory: str, client: int, firsts: Sequence[int]) -> str:
    """This client's part: hold and rewrite its own record, test the previous client's."""
    key, previous = layout.LOCK_PROBE_KEY, (client - 1) % len(firsts)
    ours = f"client {client} (rank {firsts[client]})"
    theirs = f"client {previous} (rank {firsts[previous]})"
    own = LockedRecord(layout.lock_probe_file(directory, client))
    other: LockedRecord | None = None
    try:
        first, second = secrets.token_hex(8).encode(), secrets.token_hex(8).encode()
        own.write(first)
        with own.held():
            store.set(f"{key}held.{client}", "")
            store.get(f"{key}held.{previous}")
            other = LockedRecord(layout.lock_probe_file(directory, previous), create=False)
            excluded = other.try_read() is None  # a shared lock, refused while they hold theirs
            store.set(f"{key}tried.{previous}", "")
            store.get(f"{key}tried.{client}")  # (our tester is done: let go)
        before = other.read()  # their first write, which a client cache now holds
        store.set(f"{key}read.{previous}", "")
        store.get(f"{key}read.{client}")
        own.write(second)
        store.set(f"{key}rewrote.{client}", second.decode())
        expected = store.get(f"{key}rewrote.{previous}")
        if not excluded:
            return f"a lock held through {theirs} did not exclude one through {ours}: locks are local to each client"
        if not before:
            return f"what {theirs} wrote under the lock read as nothing under the lock through {ours}"
        seen, end = other.read(), time.monotonic() + COHERENT_SECONDS
        while seen[: len(expected)] != expected and time.monotonic() < end:
            time.sleep(0.005)
            seen = other.read()
        if seen[: len(expected)] != expected:
            return (
                f"a record rewritten under the lock through {theirs} still read as its old content under the lock "
                f"through {ours}'s record after {COHERENT_SECONDS:g} s: the locks are no coherence point"
            )
        return _OK
    finally:
        own.close()
        if other is not None:
            other.close()
