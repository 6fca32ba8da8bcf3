"""A rank's state record ``state.r<rank>``: where the rank is, and its point-to-point counters.

Written only by its rank, read by its peers, always under the file's fcntl lock (files/locks.py)::

    offset  size  field
    0       4     magic b"FSST"
    4       2     version (1), little-endian like every field
    6       2     flags: bit 0 = the rank closed the group
    8       8     seq: the operation the rank is in (int64; 0 before the first)
    16      4     step: the last step of it the rank announced (uint32)
    20      2     length of the description in bytes (<= 224)
    22      2     zero
    24      8     history hash after operation seq (uint64)
    32      224   the operation's description, UTF-8, zero-padded (describe.py's text)
    256     8·N   sent[dst]: how many messages this rank has sent to rank dst (int64 each)
    256+8N  8·N   received[src]: how many of src's messages this rank has consumed

The history hash chains every description so far: ``h(seq) = blake2b-64(h(seq-1) as 8 bytes
little-endian ‖ description of seq)``, ``h(0) = 0``, read as a little-endian uint64. Two ranks
whose hashes differ at the same seq called different operations at or before it.
A record shorter than the header has not been written yet: its rank has not started.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from ..errors import ProtocolError

__all__ = [
    "COUNTER_SIZE",
    "DESCRIPTION_MAX",
    "FLAG_CLOSED",
    "HEADER_SIZE",
    "NOT_STARTED",
    "VERSION",
    "PeerState",
    "chain",
    "decode",
    "decode_counter",
    "encode",
    "encode_counter",
    "fit",
    "received_offset",
    "sent_offset",
]

_HEADER = struct.Struct("<4sHHqIH2xQ")
_MAGIC = b"FSST"
VERSION = 1
_DESCRIPTION_OFFSET = 32
DESCRIPTION_MAX = 224
#: The header and the description: what a reader of positions (a peer, `fsdist status`) reads.
HEADER_SIZE = _DESCRIPTION_OFFSET + DESCRIPTION_MAX
_SLOT = struct.Struct("<q")
COUNTER_SIZE = _SLOT.size
FLAG_CLOSED = 1


@dataclass(frozen=True)
class PeerState:
    """What a rank's state record says."""

    seq: int
    step: int
    closed: bool
    description: str
    history: int = 0

    @property
    def position(self) -> tuple[int, int]:
        return (self.seq, self.step)


NOT_STARTED = PeerState(seq=-1, step=0, closed=False, description="(not started)")


def chain(previous: int, description: str) -> int:
    """The history hash after an operation described by ``description``."""
    digest = hashlib.blake2b(previous.to_bytes(8, "little") + description.encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


def fit(description: str) -> str:
    """``description`` as the record stores it: at most DESCRIPTION_MAX bytes of UTF-8, never a
    split character, so what a rank compares is exactly what its peers read back."""
    return description.encode()[:DESCRIPTION_MAX].decode(errors="ignore")


def encode(seq: int, step: int, description: str, history: int, flags: int = 0) -> bytes:
    """The record's first HEADER_SIZE bytes (the counters after them are written one by one)."""
    text = fit(description).encode()
    header = _HEADER.pack(_MAGIC, VERSION, flags, seq, step, len(text), history)
    return header.ljust(_DESCRIPTION_OFFSET, b"\0") + text.ljust(DESCRIPTION_MAX, b"\0")


def decode(raw: bytes, path: str) -> PeerState:
    """The position in a record's first bytes; NOT_STARTED before its rank wrote it."""
    if len(raw) < _HEADER.size:
        return NOT_STARTED
    magic, version, flags, seq, step, length, history = _HEADER.unpack_from(raw)
    if magic != _MAGIC or version != VERSION or length > DESCRIPTION_MAX:
        raise ProtocolError(f"{path} is not an fsdist v{VERSION} state record")
    text = raw[_DESCRIPTION_OFFSET : _DESCRIPTION_OFFSET + length].decode(errors="replace")
    return PeerState(seq, step, bool(flags & FLAG_CLOSED), text, history)


def sent_offset(dst: int) -> int:
    return HEADER_SIZE + _SLOT.size * dst


def received_offset(src: int, size: int) -> int:
    return HEADER_SIZE + _SLOT.size * (size + src)


def encode_counter(value: int) -> bytes:
    return _SLOT.pack(value)


def decode_counter(raw: bytes) -> int:
    """A counter's value; 0 while it has not been written."""
    return int(_SLOT.unpack(raw)[0]) if len(raw) == _SLOT.size else 0
