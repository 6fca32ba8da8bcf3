"""FSDIST_IO=auto: direct records where a direct write on one client is read at once on another.

Direct records (files/direct.py) are safe only where a direct write is at the server when it
returns and a direct read asks the server: the Linux NFS client's O_DIRECT (fs/nfs/direct.c).
A filesystem that caches behind O_DIRECT, or takes no unaligned direct I/O, keeps the locked
records. So it is measured, once per job, by the ranks themselves: the first rank on each
client writes a nonce into its own probe file with O_DIRECT and says so through the store (a
locked, coherent channel); the first rank on the next client reads it with O_DIRECT, which must
show that nonce at once; then both again with a second nonce, so a reader that cached the first
would fail. Rank 0 gathers every client's verdict and publishes the choice, which every rank
reads: the same on all of them. One client (one machine, or one mount) keeps locked records,
whose reads there cost no round trip to look at a peer (a doorbell wakes it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Sequence
from typing import Protocol

from ..defaults import ENV_IO
from ..errors import FsdistError
from ..files.direct import DirectRecord, io_setting, takes_direct_io
from ..files.io import unlink_quietly
from ..protocol import layout
from .liveness import Identity

__all__ = ["Choice", "choose_records"]

_NONCE_BYTES = 16
_ROUNDS = 2
_DIRECT = "direct"


class KeyValue(Protocol):
    """What the choice needs of the job's store (c10d/store.py DirectoryStore): ``get`` waits."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> bytes: ...


class Choice:
    """How this job's records are read and written, and why (``fsdist status`` and errors say it)."""

    def __init__(self, direct: bool, why: str) -> None:
        self.direct, self.why = direct, why

    def __repr__(self) -> str:
        return f"Choice({'direct' if self.direct else 'locked'}: {self.why})"


def choose_records(store: KeyValue, directory: str, members: Sequence[Identity], rank: int) -> Choice:
    """The records of the job in ``directory`` (its generation folder), decided alike on every
    rank: ``members`` are every rank's identity from the rendezvous record. FSDIST_IO=direct or
    locked decides without measuring (direct: where the filesystem takes it at all)."""
    setting = io_setting()
    if rank == 0:  # (a rank measuring while another does not would wait for it until the timeout)
        store.set(f"{layout.IO_PROBE_KEY}setting", setting)
    elif (theirs := store.get(f"{layout.IO_PROBE_KEY}setting").decode()) != setting:
        raise ValueError(f"rank {rank}: {ENV_IO}={setting} here, {theirs} on rank 0: set {ENV_IO} alike on every rank")
    if setting != "auto":
        direct = setting == "direct" and takes_direct_io(directory)
        return Choice(direct, f"{ENV_IO}={setting}" + ("" if direct or setting == "locked" else ", not taken here"))
    clients = sorted({member.client for member in members})
    if len(clients) < 2:
        return Choice(False, "every rank reaches the directory through one client: locked records")
    mine = clients.index(members[rank].client)
    first = min(r for r, member in enumerate(members) if member.client == members[rank].client)
    key = layout.IO_PROBE_KEY
    if rank == first:
        verdict = _probe(store, directory, mine, len(clients))
        store.set(f"{key}verdict.{mine}", verdict)
    if rank == 0:
        verdicts = [store.get(f"{key}verdict.{c}").decode() for c in range(len(clients))]
        failed = [v for v in verdicts if v != _DIRECT]
        store.set(f"{key}choice", _DIRECT if not failed else failed[0])
    if rank == first:
        unlink_quietly(layout.io_probe_file(directory, mine))
    choice = store.get(f"{key}choice").decode()
    if choice == _DIRECT:
        return Choice(
            True, f"a direct write was read at once by a direct read on another client ({len(clients)} clients)"
        )
    return Choice(False, choice)


def _probe(store: KeyValue, directory: str, client: int, clients: int) -> str:
    """This client's part: write its probe, read the previous client's. "direct", or why not."""
    key, previous = layout.IO_PROBE_KEY, (client - 1) % clients
    why = DirectRecord.refusal(directory)
    own = None if why else DirectRecord(layout.io_probe_file(directory, client))
    try:
        for round_ in range(_ROUNDS):
            nonce = secrets.token_hex(_NONCE_BYTES)
            if own is not None:
                own.write(nonce.encode())
            store.set(f"{key}wrote.{client}.{round_}", nonce if own is not None else "-")
            theirs = store.get(f"{key}wrote.{previous}.{round_}").decode()
            if why is None and theirs != "-":
                why = _read_back(directory, previous, theirs, round_)
            store.set(f"{key}read.{previous}.{round_}", "")
            store.get(f"{key}read.{client}.{round_}")  # (our reader is done: the next nonce may go)
    finally:
        if own is not None:
            own.close()
    if why is None:
        return _DIRECT
    return f"locked records: client {client} of {clients}: {why}"


def _read_back(directory: str, client: int, nonce: str, round_: int) -> str | None:
    """None if client ``client``'s probe shows ``nonce`` to a direct read, else what it showed."""
    path = layout.io_probe_file(directory, client)
    try:
        record = DirectRecord(path, create=False)
    except (OSError, FsdistError) as exc:
        return f"its probe {path} could not be opened for a direct read ({exc})"
    with contextlib.closing(record):
        seen = record.read(0, 2 * _NONCE_BYTES)
    if seen != nonce.encode():
        return (
            f"a direct read of {os.path.basename(path)} showed {seen[:8]!r}..., not what another client had "
            f"written there directly (round {round_ + 1}): this filesystem caches behind O_DIRECT"
        )
    return None
