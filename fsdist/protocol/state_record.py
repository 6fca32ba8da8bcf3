"""A rank's state record ``state.r<rank>``: where the rank is, and its point-to-point counters.

Written only by its rank, under the file's fcntl lock (files/locks.py); read by its peers under
the lock, or on local filesystems first without it (a torn read fails a CRC below, or finds an
older slot beside a newer header, and is read again under the lock: transport/progress.py).
With FSDIST_IO=direct no lock is taken at all (files/direct.py): every read is read again until
its checks pass and a step the header shows has its slot::

    offset  size  field
    0       4     magic b"FSST"
    4       2     version (6), little-endian like every field
    6       2     flags: bit 0 = the rank closed the group; bit 1 = it aborted the group
    8       8     seq: the operation the rank is in (int64; 0 before the first)
    16      4     step: the last step of it the rank announced (uint32)
    20      2     length of the description in bytes (<= 208)
    22      2     zero
    24      8     history hash after operation seq (uint64)
    32      208   the operation's description, UTF-8, zero-padded (c10d/arguments.py `describe`)
    240     16    tag of bytes 0-239 (files/seal.py: a CRC-32 and zeros, or a MAC)
    256     4·2K  INLINE_SLOTS inline slots of INLINE_SLOT_BYTES each (below)
    8448    N·8K+ a pair area per peer p (PAIR_AREA bytes, at pair_offset(p)), for point to point:
                    +0   8     sent: how many messages this rank has sent to p (int64)
                    +8   8     received: how many of p's messages this rank has consumed
                    +16  16    tag of the two counters and p (all 32 bytes zero: never written)
                    +32  4·2K  P2P_SLOTS inline slots for small messages to p (index i in slot
                               i mod P2P_SLOTS; the slot header's seq is the index, step 0)

An inline slot carries one small collective message inside the record, so publishing it is one
locked write of the record the rank writes anyway, and a peer that reads the record to see the
step has the message in the same read: no file to create, rename, open or unlink. A slot is
``<q I I I>`` (seq, step, message length, CRC-32 of those three fields and the message; length
0 = empty) followed by the message in the format of protocol/message.py (with its own seq,
description and header CRC, checked by the reader). The
writer reuses a slot only after every peer's record shows it past the slot's operation; with no
free slot it publishes a file. A point-to-point slot is reused once the receiver's ``received``
counter shows the message in it consumed; a sender writes a small message, its ``sent`` counter
and the pair's ``received`` counter in one write, and the receiver reads all three (and the
slots) in one read of the pair area (locked, but for direct records).

The history hash chains every description so far: ``h(seq) = blake2b-64(h(seq-1) as 8 bytes
little-endian ‖ description of seq)``, ``h(0) = 0``, read as a little-endian uint64. Two ranks
whose hashes differ at the same seq called different operations at or before it.
A record shorter than the header has not been written yet: its rank has not started.

Every field a reader acts on is covered by a check (the header, each slot, each pair's counters),
so a bit flipped on disk, or bytes another program wrote, are refused with ProtocolError rather
than read as another position, message or count. The header's and the counters' are tags
(files/seal.py) bound to the record's identity: with FSDIST_SECRET_FILE, MACs that nobody
without the secret can forge. A slot's is a CRC-32 against torn reads only: the message in it
carries its own tag (protocol/message.py), bound to its sender, operation and step.
"""

from __future__ import annotations

import functools
import hashlib
import struct
import zlib
from dataclasses import dataclass

from ..errors import ProtocolError
from ..files.seal import TAG_BYTES, Seal

__all__ = [
    "DESCRIPTION_MAX",
    "FLAG_ABORTED",
    "FLAG_CLOSED",
    "HEADER_SIZE",
    "INLINE_MAX",
    "INLINE_SLOTS",
    "INLINE_SLOT_BYTES",
    "NOT_STARTED",
    "P2P_SLOTS",
    "P2P_SLOT_BYTES",
    "PAIR_AREA",
    "PAIR_COUNTERS_SIZE",
    "POSITION_SIZE",
    "VERSION",
    "PeerState",
    "chain",
    "decode",
    "decode_pair",
    "encode",
    "encode_pair",
    "encode_slot",
    "find_inline",
    "find_p2p",
    "fit",
    "p2p_slot_end",
    "pair_offset",
    "put_p2p",
    "slot_offset",
]

_HEADER = struct.Struct("<4sHHqIH2xQ")
_MAGIC = b"FSST"
VERSION = 6
_DESCRIPTION_OFFSET = 32
DESCRIPTION_MAX = 208
#: The header, the description and their tag: what a reader of positions (`fsdist status`) reads.
HEADER_SIZE = _DESCRIPTION_OFFSET + DESCRIPTION_MAX + TAG_BYTES
#: Inline slots: how many small messages a rank may have in its record at once, and their size.
INLINE_SLOTS = 4
INLINE_SLOT_BYTES = 2048
_INLINE = struct.Struct("<qIII")
_SLOT_FIELDS = struct.Struct("<qII")  # the slot's fields its CRC covers (with the message)
#: The largest encoded message a slot holds.
INLINE_MAX = INLINE_SLOT_BYTES - _INLINE.size
#: What a peer reads to learn a rank's position and its inline messages in one go.
POSITION_SIZE = HEADER_SIZE + INLINE_SLOTS * INLINE_SLOT_BYTES
_PAIR = struct.Struct(f"<qq{TAG_BYTES}s")
#: A pair area's counters and their tag: what a sender reads to learn what its peer consumed.
PAIR_COUNTERS_SIZE = _PAIR.size
_PAIR_VALUES = struct.Struct("<qq")  # what the counters' tag covers, with the peer's rank
#: Inline slots per pair area (messages to one peer in the record at once), and their size.
P2P_SLOTS = 4
P2P_SLOT_BYTES = INLINE_SLOT_BYTES
#: A pair area: the two counters, then the slots.
PAIR_AREA = _PAIR.size + P2P_SLOTS * P2P_SLOT_BYTES
_PEER = struct.Struct("<q")  # the pair area's peer, under its counters' tag
FLAG_CLOSED = 1
#: The rank wrote the group's ``abort`` file: a peer that reads this record learns of it without
#: reading that file (which a rank otherwise reads every GC_EVERY operations).
FLAG_ABORTED = 2


@dataclass(frozen=True)
class PeerState:
    """What a rank's state record says."""

    seq: int
    step: int
    closed: bool
    description: str
    history: int = 0
    aborted: bool = False

    @property
    def position(self) -> tuple[int, int]:
        return (self.seq, self.step)


NOT_STARTED = PeerState(seq=-1, step=0, closed=False, description="(not started)")


def chain(previous: int, description: str) -> int:
    """The history hash after an operation described by ``description``."""
    digest = hashlib.blake2b(previous.to_bytes(8, "little") + description.encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


@functools.lru_cache(maxsize=256)
def fit(description: str) -> str:
    """``description`` as the record stores it: at most DESCRIPTION_MAX bytes of UTF-8, never a
    split character, so what a rank compares is exactly what its peers read back.

    (Cached, like ``_stored``: a loop describes the same few operations on every call.)"""
    return description.encode()[:DESCRIPTION_MAX].decode(errors="ignore")


@functools.lru_cache(maxsize=256)
def _stored(description: str) -> tuple[int, bytes]:
    """The length of ``description`` as stored, and its zero-padded field."""
    text = fit(description).encode()
    return len(text), text.ljust(DESCRIPTION_MAX, b"\0")


def encode(seq: int, step: int, description: str, history: int, flags: int, check: Seal) -> bytes:
    """The record's first HEADER_SIZE bytes (the slots and pair areas after them are written apart);
    ``check``: the record's seal (files/seal.py, of layout.identity of its path)."""
    length, field = _stored(description)
    body = _HEADER.pack(_MAGIC, VERSION, flags, seq, step, length, history).ljust(_DESCRIPTION_OFFSET, b"\0") + field
    return body + check.tag(body)


def decode(raw: bytes, path: str, check: Seal) -> PeerState:
    """The position in a record's first bytes; NOT_STARTED before its rank wrote it."""
    if len(raw) < _HEADER.size:
        return NOT_STARTED
    magic, version, flags, seq, step, length, history = _HEADER.unpack_from(raw)
    if magic != _MAGIC or version != VERSION or length > DESCRIPTION_MAX:
        raise ProtocolError(f"{path} is not an fsdist v{VERSION} state record")
    if len(raw) < HEADER_SIZE:
        raise ProtocolError(f"{path}: a state record of {len(raw)} bytes is cut short (its header is {HEADER_SIZE})")
    if not check.verify_at(raw, HEADER_SIZE - TAG_BYTES):
        raise ProtocolError(check.mismatch(f"{path} (its state record's header)"))
    text = raw[_DESCRIPTION_OFFSET : _DESCRIPTION_OFFSET + length].decode(errors="replace")
    return PeerState(seq, step, bool(flags & FLAG_CLOSED), text, history, bool(flags & FLAG_ABORTED))


def pair_offset(peer: int) -> int:
    """Where the pair area for ``peer`` starts in a record."""
    return POSITION_SIZE + PAIR_AREA * peer


def p2p_slot_end(index: int) -> int:
    """Bytes from a pair area's start through the slot of message ``index``."""
    return _PAIR.size + (index % P2P_SLOTS + 1) * P2P_SLOT_BYTES


def encode_pair(sent: int, received: int, peer: int, check: Seal) -> bytes:
    """A pair area's counters with their tag (written whole: both counters share it); ``peer``:
    whose area of the record it is, ``check``: the record's seal."""
    values = _PAIR_VALUES.pack(sent, received)
    return values + check.tag(values, _PEER.pack(peer))


def put_p2p(area: bytearray, sent: int, received: int, index: int, message: bytes, peer: int, check: Seal) -> int:
    """Write the counters and message ``index`` into its slot of ``area`` (a pair area's image, for
    ``peer``); returns how many bytes from the area's start now need writing."""
    area[: _PAIR.size] = encode_pair(sent, received, peer, check)
    start = _PAIR.size + index % P2P_SLOTS * P2P_SLOT_BYTES
    slot = encode_slot(index, 0, message)
    area[start : start + len(slot)] = slot
    return start + len(slot)


def decode_pair(raw: bytes, peer: int, check: Seal, where: str = "a pair area") -> tuple[int, int]:
    """(sent, received) of ``peer``'s pair area read from its start; 0 for counters never written."""
    if len(raw) < _PAIR.size:
        raw = raw + bytes(_PAIR.size - len(raw))
    sent, received, tag = _PAIR.unpack_from(raw)
    if not check.verify(tag, memoryview(raw)[: _PAIR_VALUES.size], _PEER.pack(peer)):
        if not any(memoryview(raw)[: _PAIR.size]):
            return 0, 0  # never written (a hole in the record)
        raise ProtocolError(check.mismatch(f"{where} (point-to-point counters)"))
    if sent < 0 or received < 0:
        raise ProtocolError(f"{where}: negative point-to-point counter ({sent}, {received})")
    return int(sent), int(received)


def find_p2p(raw: bytes, index: int) -> bytes | None:
    """Message ``index`` from its slot of a pair area read from its start, or None (a file)."""
    start = _PAIR.size + index % P2P_SLOTS * P2P_SLOT_BYTES
    if len(raw) < start + _INLINE.size:
        return None
    slot_index, _, length, _ = _INLINE.unpack_from(raw, start)
    if not length or slot_index != index:
        return None
    return _slot_message(raw, start, f"point-to-point slot of message {index}")


def slot_offset(slot: int) -> int:
    return HEADER_SIZE + slot * INLINE_SLOT_BYTES


def encode_slot(seq: int, step: int, message: bytes) -> bytes:
    """An inline slot holding ``message`` (at most INLINE_MAX bytes) of (``seq``, ``step``)."""
    if len(message) > INLINE_MAX:
        raise ValueError(f"{len(message)} bytes do not fit an inline slot ({INLINE_MAX})")
    fields = _SLOT_FIELDS.pack(seq, step, len(message))
    return _INLINE.pack(seq, step, len(message), zlib.crc32(message, zlib.crc32(fields))) + message


def _slot_message(raw: bytes, start: int, what: str) -> bytes:
    """The message in the slot at ``start`` of ``raw``, its length and CRC checked."""
    seq, step, length, crc = _INLINE.unpack_from(raw, start)
    if length > INLINE_MAX or start + _INLINE.size + length > len(raw):
        raise ProtocolError(f"{what} claims {length} bytes (at most {INLINE_MAX})")
    found = raw[start + _INLINE.size : start + _INLINE.size + length]
    if zlib.crc32(found, zlib.crc32(_SLOT_FIELDS.pack(seq, step, length))) != crc:
        raise ProtocolError(f"{what}: checksum mismatch (corrupt)")
    return found


def find_inline(raw: bytes, seq: int, step: int) -> bytes | None:
    """The message of (``seq``, ``step``) among the inline slots of ``raw`` (a record's first
    POSITION_SIZE bytes), or None; the caller still checks the message's own header."""
    for slot in range(INLINE_SLOTS):
        start = slot_offset(slot)
        if len(raw) < start + _INLINE.size:
            break
        slot_seq, slot_step, length, _ = _INLINE.unpack_from(raw, start)
        if length and slot_seq == seq and slot_step == step:
            return _slot_message(raw, start, f"inline slot {slot}")
    return None
