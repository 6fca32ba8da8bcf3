"""A ``torch.distributed.Store`` kept in a directory: one file per key.

torch needs a store for its own bookkeeping (rendezvous, ``new_group``, DDP); this one needs no
server and no port. Values are published atomically (temporary file + rename), so ``get`` never
returns a partial value, and carry a CRC-32 (protocol/sealed.py), so a damaged one is refused
(ProtocolError naming the file) rather than returned as another value. Changes that read before
they write (``add``, ``compare_set``, ``append``) run under one fcntl lock on ``.lock``. Keys are
escaped into file names that cannot leave the directory, whatever the key contains.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ..defaults import DEFAULT_TIMEOUT
from ..errors import FsdistTimeoutError, ProtocolError
from ..files.io import publish, read_file, retrying, unlink_quietly
from ..files.locks import LockedRecord
from ..files.trust import make_private_dir
from ..files.waiting import Deadline, poll
from ..protocol import layout
from ..protocol.sealed import MAX_VALUE_BYTES, SEAL_BYTES, seal_value, unseal_value

__all__ = ["DirectoryStore"]


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


class DirectoryStore(dist.Store):
    """Key-value store over a directory shared by every rank; safe across hosts with fcntl locks."""

    def __init__(self, directory: str, timeout: timedelta = DEFAULT_TIMEOUT) -> None:
        super().__init__()
        make_private_dir(directory)
        self.directory = directory
        self._timeout = timeout
        self._lock_record: LockedRecord | None = None
        self._opening = threading.Lock()
        #: Set by the rendezvous: the generation this store belongs to (the backend reads it).
        self.generation: Any = None

    def _locked(self) -> LockedRecord:
        """The store's lock record, opened on first use (again after ``release_files``)."""
        record = self._lock_record
        if record is None:
            with self._opening:
                if self._lock_record is None:
                    self._lock_record = LockedRecord(os.path.join(self.directory, layout.STORE_LOCK_FILE))
                record = self._lock_record
        return record

    def release_files(self) -> None:
        """Close the descriptor kept open on the lock file (a rank leaving the job).

        The last rank to leave deletes the generation directory; on NFS a file that another
        process of the same client still holds open is only renamed (``.nfsXXXX``), which
        leaves the directory behind. The store reopens the file if it is used again.
        """
        with self._opening:
            if self._lock_record is not None:
                self._lock_record.close()
                self._lock_record = None

    # ---- the torch.distributed.Store interface ------------------------------------------

    def set(self, key: str, value: Any) -> None:
        self._locked().update(lambda _: self._write(key, _as_bytes(value)))

    def get(self, key: str) -> bytes:
        return self._wait_value(key, Deadline(self._timeout.total_seconds()))

    def add(self, key: str, amount: int) -> int:
        result = 0

        def change(_: bytes) -> None:
            nonlocal result
            current = self._read(key)
            result = (int(current) if current else 0) + amount
            self._write(key, str(result).encode())

        self._locked().update(change)
        return result

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        """TCPStore's semantics: set ``desired`` if the value is ``expected`` (or the key is
        missing and ``expected`` is empty); return the value in force afterwards."""
        expected_b, desired_b = _as_bytes(expected), _as_bytes(desired)
        result = b""

        def change(_: bytes) -> None:
            nonlocal result
            current = self._read(key)
            if (current is None and expected_b == b"") or current == expected_b:
                self._write(key, desired_b)
                result = desired_b
            else:
                result = expected_b if current is None else current

        self._locked().update(change)
        return result

    def append(self, key: str, value: Any) -> None:
        self._locked().update(lambda _: self._write(key, (self._read(key) or b"") + _as_bytes(value)))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(key) for key in keys]

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)

    def check(self, keys: list[str]) -> bool:
        return all(self._read(key) is not None for key in keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        deadline = Deadline((timeout or self._timeout).total_seconds())
        for key in keys:
            self._wait_value(key, deadline)

    def num_keys(self) -> int:
        return sum(1 for name in os.listdir(self.directory) if layout.is_store_key_file(name))

    def delete_key(self, key: str) -> bool:
        existed = False

        def change(_: bytes) -> None:
            nonlocal existed
            existed = self._read(key) is not None
            unlink_quietly(self._path(key))

        self._locked().update(change)
        return existed

    # c10d calls these camelCase names from C++.
    getNumKeys = num_keys  # noqa: N815
    deleteKey = delete_key  # noqa: N815

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout

    @property
    def timeout(self) -> timedelta:
        return self._timeout

    def clone(self) -> DirectoryStore:
        twin = DirectoryStore(self.directory, self._timeout)
        twin.generation = self.generation
        return twin

    # ---- files --------------------------------------------------------------------------

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, layout.key_to_filename(key))

    def _read(self, key: str) -> bytes | None:
        # a value replaced by rename while it is read gives ESTALE on NFS: open it again
        return retrying(lambda: self._read_once(key))

    def _read_once(self, key: str) -> bytes | None:
        try:
            raw = read_file(self._path(key), MAX_VALUE_BYTES + SEAL_BYTES, "a store value")
        except FileNotFoundError:
            return None
        try:
            return unseal_value(raw, layout.identity(self._path(key)))
        except ValueError as exc:
            raise ProtocolError(f"store {self._path(key)} (key {key!r}): {exc}") from None

    def _write(self, key: str, value: bytes) -> None:
        name = layout.key_to_filename(key)
        publish(self.directory, name, [seal_value(value, layout.identity(os.path.join(self.directory, name)))])

    def _wait_value(self, key: str, deadline: Deadline) -> bytes:
        name = layout.key_to_filename(key)

        def attempt() -> bytes | None:
            value = self._read(key)
            if value is None and name in os.listdir(self.directory):
                # NFS caches "no such name" for up to acdirmax (~30 s) after a failed open;
                # listing the directory revalidates it, so a new key is seen in milliseconds
                value = self._read(key)
            return value

        return poll(
            attempt,
            deadline,
            lambda: FsdistTimeoutError(
                f"store {self.directory}: key {key!r} did not appear within {deadline.seconds:.1f} s"
            ),
        )
