"""A rank's state record ``state.r<rank>``: where the rank is, and its point-to-point counters.

Written only by its rank, read by its peers, always under the file's fcntl lock (files/locks.py)::

    offset  size  field
    0       4     magic b"FSST"
    4       2     version (2), little-endian like every field
    6       2     flags: bit 0 = the rank closed the group
    8       8     seq: the operation the rank is in (int64; 0 before the first)
    16      4     step: the last step of it the rank announced (uint32)
    20      2     length of the description in bytes (<= 224)
    22      2     zero
    24      8     history hash after operation seq (uint64)
    32      224   the operation's description, UTF-8, zero-padded (describe.py's text)
    256     4·2K  INLINE_SLOTS inline slots of INLINE_SLOT_BYTES each (below)
    8448    8·N   sent[dst]: how many messages this rank has sent to rank dst (int64 each)
    8448+8N 8·N   received[src]: how many of src's messages this rank has consumed

An inline slot carries one small collective message inside the record, so publishing it is one
locked write of the record the rank writes anyway, and a peer that reads the record to see the
step has the message in the same read: no file to create, rename, open or unlink. A slot is
``<q I I>`` (seq, step, message length; length 0 = empty) followed by the message in the format
of protocol/message.py (with its own seq, description and CRC, checked by the reader). The
writer reuses a slot only after every peer's record shows it past the slot's operation; with no
free slot it publishes a file.

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
    "INLINE_MAX",
    "INLINE_SLOTS",
    "INLINE_SLOT_BYTES",
    "NOT_STARTED",
    "POSITION_SIZE",
    "VERSION",
    "PeerState",
    "chain",
    "decode",
    "decode_counter",
    "encode",
    "encode_counter",
    "encode_slot",
    "find_inline",
    "fit",
    "received_offset",
    "sent_offset",
    "slot_offset",
]

_HEADER = struct.Struct("<4sHHqIH2xQ")
_MAGIC = b"FSST"
VERSION = 2
_DESCRIPTION_OFFSET = 32
DESCRIPTION_MAX = 224
#: The header and the description: what a reader of positions (`fsdist status`) reads.
HEADER_SIZE = _DESCRIPTION_OFFSET + DESCRIPTION_MAX
#: Inline slots: how many small messages a rank may have in its record at once, and their size.
INLINE_SLOTS = 4
INLINE_SLOT_BYTES = 2048
_INLINE = struct.Struct("<qII")
#: The largest encoded message a slot holds.
INLINE_MAX = INLINE_SLOT_BYTES - _INLINE.size
#: What a peer reads to learn a rank's position and its inline messages in one go.
POSITION_SIZE = HEADER_SIZE + INLINE_SLOTS * INLINE_SLOT_BYTES
_COUNTER = struct.Struct("<q")
COUNTER_SIZE = _COUNTER.size
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
    return POSITION_SIZE + _COUNTER.size * dst


def received_offset(src: int, size: int) -> int:
    return POSITION_SIZE + _COUNTER.size * (size + src)


def slot_offset(slot: int) -> int:
    return HEADER_SIZE + slot * INLINE_SLOT_BYTES


def encode_slot(seq: int, step: int, message: bytes) -> bytes:
    """An inline slot holding ``message`` (at most INLINE_MAX bytes) of (``seq``, ``step``)."""
    if len(message) > INLINE_MAX:
        raise ValueError(f"{len(message)} bytes do not fit an inline slot ({INLINE_MAX})")
    return _INLINE.pack(seq, step, len(message)) + message


def find_inline(raw: bytes, seq: int, step: int) -> bytes | None:
    """The message of (``seq``, ``step``) among the inline slots of ``raw`` (a record's first
    POSITION_SIZE bytes), or None; the caller still checks the message's own header."""
    for slot in range(INLINE_SLOTS):
        start = slot_offset(slot)
        if len(raw) < start + _INLINE.size:
            break
        slot_seq, slot_step, length = _INLINE.unpack_from(raw, start)
        if length and slot_seq == seq and slot_step == step:
            if length > INLINE_MAX or start + _INLINE.size + length > len(raw):
                raise ProtocolError(f"inline slot {slot} claims {length} bytes (at most {INLINE_MAX})")
            return raw[start + _INLINE.size : start + _INLINE.size + length]
    return None


def encode_counter(value: int) -> bytes:
    return _COUNTER.pack(value)


def decode_counter(raw: bytes) -> int:
    """A counter's value; 0 while it has not been written."""
    return int(_COUNTER.unpack(raw)[0]) if len(raw) == _COUNTER.size else 0
