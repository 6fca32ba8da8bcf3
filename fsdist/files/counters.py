"""Counters: a 64-bit integer in a file with its tag, changed under the lock or by its one writer.

``Counter`` (get / add / compare-and-set under the record's lock) counts ranks in and out of a
group, and serves the lock checks; ``OwnCounter``, written by one process only with direct I/O
and no lock, is a heartbeat.
"""

from __future__ import annotations

import os
import struct

from ..errors import ProtocolError
from .direct import DirectRecord
from .locks import LockedRecord
from .seal import TAG_BYTES, Seal, seal

__all__ = ["Counter", "OwnCounter", "decode_counter", "encode_counter"]

_INT64 = struct.Struct("<q")
_COUNTER = struct.Struct(f"<q{TAG_BYTES}s")  # the value, and the tag of its 8 bytes (files/seal.py)


class Counter:
    """A 64-bit integer in a file, changed only under the lock (get / add / compare-and-set).

    The file holds the value as 8 bytes, little-endian, signed, then their tag: a CRC-32, or a
    MAC with FSDIST_SECRET_FILE, bound to the file's name (a flipped bit, a foreign file or a
    forged count is a ProtocolError, never another count); empty means 0."""

    SIZE = _COUNTER.size

    def __init__(self, path: str) -> None:
        self._record = LockedRecord(path)
        self._path = path
        self._seal = seal(os.path.basename(path))

    def encode(self, value: int) -> bytes:
        return encode_counter(value, self._path, self._seal)

    def decode(self, raw: bytes) -> int:
        """The value in ``raw`` (a counter file's bytes); 0 while it is empty."""
        return decode_counter(raw, self._path, self._seal)

    def get(self) -> int:
        return self.decode(self._record.read(0, _COUNTER.size))

    def try_get(self) -> int | None:
        """The value, or None if a writer holds the lock right now (see ``LockedRecord.try_read``)."""
        raw = self._record.try_read(0, _COUNTER.size)
        return None if raw is None else self.decode(raw)

    def add(self, amount: int) -> int:
        """Add ``amount`` and return the new value."""
        new = self._record.update(lambda old: self.encode(self.decode(old) + amount))
        return self.decode(new)

    def compare_and_set(self, expected: int, desired: int) -> int:
        """Set ``desired`` if the value is ``expected``; return the value in force afterwards."""
        new = self._record.update(lambda old: self.encode(desired) if self.decode(old) == expected else None)
        return self.decode(new)

    def close(self) -> None:
        self._record.close()

    def __enter__(self) -> Counter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def encode_counter(value: int, path: str, check: Seal | None = None) -> bytes:
    """A counter file's bytes holding ``value`` (``check``: the file's seal, made from ``path``)."""
    return _COUNTER.pack(value, (check or seal(os.path.basename(path))).tag(_INT64.pack(value)))


def decode_counter(raw: bytes, path: str, check: Seal | None = None) -> int:
    """The value in a counter file's bytes ``raw`` (0 while it is empty), checked against its tag
    (``check``: the file's seal, made from ``path`` where not given)."""
    if not raw:
        return 0
    if len(raw) != _COUNTER.size:
        raise ProtocolError(f"{path}: a counter of {len(raw)} bytes (expected {_COUNTER.size} or none)")
    value, tag = _COUNTER.unpack(raw)
    check = check or seal(os.path.basename(path))
    if not check.verify(tag, raw[: _INT64.size]):
        raise ProtocolError(check.mismatch(f"{path} (a counter)"))
    return int(value)


class OwnCounter:
    """A counter file (``Counter``'s format) with one writer, read and written
    directly: a heartbeat's beat is one WRITE on NFS, not LOCK, GETATTR, READ, WRITE, UNLOCK."""

    def __init__(self, path: str) -> None:
        self._record = DirectRecord(path)
        self._path = path
        self._seal = seal(os.path.basename(path))

    def try_get(self) -> int | None:
        """The value, or None where the read met the writer's write (a beat not readable now)."""
        try:
            return decode_counter(self._record.read(0, Counter.SIZE), self._path, self._seal)
        except ProtocolError:
            return None

    def set(self, value: int) -> None:
        """Write ``value`` (this process is the counter's only writer)."""
        self._record.write(encode_counter(value, self._path, self._seal))

    def close(self) -> None:
        self._record.close()
