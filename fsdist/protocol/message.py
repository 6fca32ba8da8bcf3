"""The on-disk message format: a fixed binary header, part descriptors, raw bytes (the codec:
encoding, parsing and checking bytes; transport/incoming.py reads messages where they lie).

A message is what one rank publishes in one step: one or more tensors ("parts"). Everything is
plain little-endian integers and raw tensor bytes, readable on any machine; nothing is ever
unpickled, because the shared directory is shared with other jobs and other users.

Layout::

    fixed header  <4s H H q q I H H>  magic "FSDM", version, part count, sequence, tag,
                                      header length, description length, flags
    description   UTF-8 text saying what the sender was doing (checked by the reader)
    parts         per part <B B 6x q q> dtype code, ndim, byte count, payload offset; ndim × <q>
    payload tags  (flag bit 0 only) per part, a 16-byte tag per CHUNK_BYTES of its payload
    tag           16 bytes over everything above (files/seal.py: a CRC-32 and zeros, or with
                  FSDIST_SECRET_FILE a MAC bound to the message's identity: its sender, its
                  operation and step, or its pair and index), so a foreign, torn, forged or
                  misplaced header is refused
    payload       each part at its offset, 64-byte aligned

The tag covers the header only: a payload of 64 MiB would cost ~40 ms to check on every read.
With a secret, payload tags are added to every message that holds a byte (uint8) tensor, the
form in which torch's ``*_object`` collectives send pickles, and with FSDIST_MAC_PAYLOADS=1 to
every message (files/seal.py); every reader checks the pieces it reads against them before the
bytes reach a tensor. Whether a message must carry them follows from its header, which the
header tag covers, so a forger can neither strip them nor add them.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch

from ..errors import ProtocolError
from ..files.seal import CHUNK_BYTES, PAYLOADS_ALL, PAYLOADS_NONE, TAG_BYTES, Seal

MAGIC = b"FSDM"
VERSION = 2
ALIGN = 64
_FIXED = struct.Struct("<4sHHqqIHH")
_PART = struct.Struct("<BB6xqq")
_DIM = struct.Struct("<q")
_CHUNK = struct.Struct("<II")  # a payload tag covers (part index, chunk index) and the chunk
#: flags: the header holds payload tags
FLAG_PAYLOAD_TAGS = 1
_MAX_HEADER = 1 << 24  # 16 MiB of part descriptors: far beyond any real message

#: Wire codes of dtypes. Append only: a code, once given, never changes meaning.
_DTYPES: list[torch.dtype] = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
    torch.complex64, torch.complex128,
]  # fmt: skip
for _name in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "complex32"):
    if hasattr(torch, _name):
        _DTYPES.append(getattr(torch, _name))
DTYPE_CODE = {dtype: code for code, dtype in enumerate(_DTYPES, start=1)}
CODE_DTYPE = {code: dtype for dtype, code in DTYPE_CODE.items()}


class Part(NamedTuple):
    """Where one tensor lies in a message file, and what it is (a tuple: made for every part read)."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    offset: int


#: dtypes numpy can view directly: their bytes come without torch's reshape and re-view (~1.4 µs
#: of a small operation's ~100)
_NUMPY_DTYPES = frozenset(
    dtype for dtype in _DTYPES if dtype not in (torch.bfloat16, torch.complex32) and "float8" not in str(dtype)
)


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, without a copy."""
    if tensor.numel() == 0:
        return memoryview(b"")
    if tensor.dtype in _NUMPY_DTYPES:
        return memoryview(tensor.numpy()).cast("B")  # type: ignore[arg-type]
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]


def _chunks(nbytes: int) -> int:
    return -(-nbytes // CHUNK_BYTES)


def _layout(
    seq: int, tag: int, description: str, tensors: Sequence[torch.Tensor], align: int, check: Seal, build: bool = True
) -> tuple[bytes, list[int], int]:
    """(header with its padding, each part's byte count, the whole message's size); ``check``:
    the message's seal. ``build=False``: the sizes only (no header made, no payload hashed)."""
    desc = description.encode()[:65535]
    ndims = [tensor.dim() for tensor in tensors]
    sizes = [tensor.numel() * tensor.element_size() for tensor in tensors]
    payload_tags = _tags_payloads(check, (tensor.dtype for tensor in tensors))  # (no list made without a secret)
    table = TAG_BYTES * sum(_chunks(n) for n in sizes) if payload_tags else 0
    header_len = _FIXED.size + len(desc) + _PART.size * len(tensors) + _DIM.size * sum(ndims) + table + TAG_BYTES
    start = offset = _align(header_len, align)
    flags = FLAG_PAYLOAD_TAGS if payload_tags else 0
    pieces = [_FIXED.pack(MAGIC, VERSION, len(tensors), seq, tag, header_len, len(desc), flags), desc]
    for tensor, ndim, nbytes in zip(tensors, ndims, sizes, strict=True):
        code = DTYPE_CODE.get(tensor.dtype)
        if code is None:
            raise TypeError(f"fsdist cannot send tensors of dtype {tensor.dtype}")
        pieces.append(_PART.pack(code, ndim, nbytes, offset))
        for size in tensor.shape:
            pieces.append(_DIM.pack(size))
        offset = _align(offset + nbytes, align)
    if not build:
        return b"", sizes, offset
    if payload_tags:
        for index, tensor in enumerate(tensors):
            data = tensor_bytes(tensor)
            for chunk in range(_chunks(sizes[index])):
                piece = data[chunk * CHUNK_BYTES : (chunk + 1) * CHUNK_BYTES]
                pieces.append(check.tag(_CHUNK.pack(index, chunk), piece))
    header = b"".join(pieces)
    return header + check.tag(header) + bytes(start - header_len), sizes, offset


def _with_payload(
    header: bytes, sizes: list[int], tensors: Sequence[torch.Tensor], align: int
) -> list[memoryview | bytes]:
    buffers: list[memoryview | bytes] = [header]
    for tensor, nbytes in zip(tensors, sizes, strict=True):
        buffers.append(tensor_bytes(tensor))
        padding = _align(nbytes, align) - nbytes
        if padding:
            buffers.append(bytes(padding))
    return buffers


def encode(
    seq: int, tag: int, description: str, tensors: Sequence[torch.Tensor], check: Seal, align: int = ALIGN
) -> list[memoryview | bytes]:
    """The buffers of a message (header, then each tensor's bytes with alignment padding);
    ``check``: the seal of the message's identity (files/seal.py).

    Files align parts to 64 bytes (mapped reads, vector loads); an inline message in a state
    record aligns them to ``INLINE_ALIGN`` to fit more into its slot. Readers only follow offsets.
    """
    header, sizes, _ = _layout(seq, tag, description, tensors, align, check)
    return _with_payload(header, sizes, tensors, align)


def encode_inline(
    seq: int, tag: int, description: str, tensors: Sequence[torch.Tensor], limit: int, check: Seal
) -> bytes | None:
    """The message as one ``bytes`` (parts aligned to INLINE_ALIGN), or None if it would take
    more than ``limit`` bytes."""
    tagged = check.payloads != PAYLOADS_NONE
    if tagged and _layout(seq, tag, description, tensors, INLINE_ALIGN, check, build=False)[2] > limit:
        return None  # (sized first where building would hash the payload)
    header, sizes, size = _layout(seq, tag, description, tensors, INLINE_ALIGN, check)
    if size > limit:
        return None
    return b"".join(_with_payload(header, sizes, tensors, INLINE_ALIGN))


def encoded_size(description: str, tensors: Sequence[torch.Tensor], check: Seal, align: int = ALIGN) -> int:
    """The bytes ``encode`` would produce (nothing is encoded: the tensors' bytes are not touched)."""
    return _layout(0, 0, description, tensors, align, check, build=False)[2]


class Header(NamedTuple):
    """A message header, checked: what it says, and the payload tags of each part (flag bit 0)."""

    seq: int
    tag: int
    description: str
    parts: tuple[Part, ...]
    length: int
    payload_tags: tuple[bytes, ...] | None


def parse_header(head: bytes, where: str, check: Seal) -> Header:
    """The header of a message starting ``head``, checked against its tag (``check``: the seal of
    the identity the reader expects the message to have).

    ``head`` must hold the whole header: a ProtocolError says how long it is when it does not.
    """
    if len(head) < _FIXED.size:
        raise ProtocolError(f"{where}: {len(head)} bytes is too short for a message header")
    magic, version, nparts, seq, tag, header_len, desc_len, flags = _FIXED.unpack_from(head)
    if magic != MAGIC:
        raise ProtocolError(f"{where} is not an fsdist message (magic {magic!r})")
    if version != VERSION:
        raise ProtocolError(f"{where} has message format version {version}; this fsdist reads {VERSION}")
    if not _FIXED.size + desc_len + TAG_BYTES <= header_len <= _MAX_HEADER:
        raise ProtocolError(f"{where}: header length {header_len} is impossible (corrupt or foreign file)")
    if header_len > len(head):
        raise ShortHeaderError(header_len)
    end = header_len - TAG_BYTES
    if not check.verify_at(head, end):
        raise ProtocolError(check.mismatch(f"{where} (a message header)"))
    key = (nparts, desc_len, flags, head[_FIXED.size : end])
    known = _PARSED.get(key)
    if known is None:
        known = _parse_body(head, nparts, desc_len, header_len, bool(flags & FLAG_PAYLOAD_TAGS), where)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[key] = known
    if bool(flags & FLAG_PAYLOAD_TAGS) != _tags_payloads(check, known[3]):
        raise ProtocolError(
            f"{where}: its payload is {'' if flags & FLAG_PAYLOAD_TAGS else 'not '}tagged and this rank's "
            "setting says otherwise: set FSDIST_SECRET_FILE and FSDIST_MAC_PAYLOADS alike on every rank"
        )
    return Header(seq, tag, known[0], known[1], header_len, known[2])


#: headers parsed before, by everything in them past the fixed part (description and parts):
#: a training loop sends the same few shapes over and over, and parsing one is ~1.5 µs
_Parsed = tuple[str, tuple[Part, ...], tuple[bytes, ...] | None, frozenset[torch.dtype]]
_PARSED: dict[tuple[int, int, int, bytes], _Parsed] = {}
_PARSED_MAX = 256


def _tags_payloads(check: Seal, dtypes: Iterable[torch.dtype]) -> bool:
    """Whether a message of parts of ``dtypes`` carries payload tags under ``check``'s setting
    (``dtypes`` is not looked at without a secret: the common case costs one comparison)."""
    if check.payloads == PAYLOADS_NONE:
        return False
    return check.payloads == PAYLOADS_ALL or torch.uint8 in dtypes


def _parse_body(head: bytes, nparts: int, desc_len: int, header_len: int, tagged: bool, where: str) -> _Parsed:
    """The description, parts and payload tags of a header whose fixed part and tag were checked."""
    pos = _FIXED.size
    description = head[pos : pos + desc_len].decode(errors="replace")
    pos += desc_len
    end = header_len - TAG_BYTES  # the descriptors (and payload tags) lie between the description and the tag
    parts: list[Part] = []
    for index in range(nparts):
        if pos + _PART.size > end:
            raise ProtocolError(f"{where}: part {index} of {nparts} lies past the header's end (corrupt header)")
        code, ndim, nbytes, offset = _PART.unpack_from(head, pos)
        pos += _PART.size
        if pos + ndim * _DIM.size > end:
            raise ProtocolError(f"{where}: part {index}'s {ndim} dimensions lie past the header's end")
        shape = tuple(_DIM.unpack_from(head, pos + i * _DIM.size)[0] for i in range(ndim))
        pos += ndim * _DIM.size
        if code not in CODE_DTYPE:
            raise ProtocolError(f"{where}: unknown dtype code {code}")
        dtype = CODE_DTYPE[code]
        if min(shape, default=0) < 0 or offset < header_len or nbytes != math.prod(shape) * dtype.itemsize:
            raise ProtocolError(
                f"{where}: part {index} ({dtype} {list(shape)}, {nbytes} bytes at {offset}) is inconsistent"
            )
        parts.append(Part(dtype, shape, nbytes, offset))
    if not tagged:
        return description, tuple(parts), None, frozenset(p.dtype for p in parts)  # shared: never changed
    tags = []
    for part in parts:
        size = TAG_BYTES * _chunks(part.nbytes)
        tags.append(bytes(head[pos : pos + size]))
        pos += size
    if pos != end:
        raise ProtocolError(f"{where}: its payload tags do not fill the header ({end - pos} bytes left)")
    return description, tuple(parts), tuple(tags), frozenset(p.dtype for p in parts)


class ShortHeaderError(ProtocolError):
    """The header is longer than the bytes read so far (a file reader reads the rest)."""

    def __init__(self, header_len: int) -> None:
        super().__init__(f"the message header is {header_len} bytes long")
        self.header_len = header_len


#: Part alignment of inline messages (enough for every dtype's element alignment).
INLINE_ALIGN = 16


def covering(nbytes: int, byte_offset: int, want: int) -> tuple[int, int]:
    """The whole payload chunks, as a byte range of a part of ``nbytes``, that hold ``want`` bytes
    from ``byte_offset``: what a reader of tagged payloads must read to check them."""
    start = byte_offset - byte_offset % CHUNK_BYTES
    return start, min(nbytes, _chunks(byte_offset + want) * CHUNK_BYTES)


def check_payload(check: Seal, tags: bytes, index: int, start: int, data: memoryview, where: str) -> None:
    """Check ``data``, part ``index``'s bytes from chunk boundary ``start``, against its tags."""
    first = start // CHUNK_BYTES
    for number in range(_chunks(len(data))):
        chunk = first + number
        piece = data[number * CHUNK_BYTES : (number + 1) * CHUNK_BYTES]
        if not check.verify(tags[chunk * TAG_BYTES : (chunk + 1) * TAG_BYTES], _CHUNK.pack(index, chunk), piece):
            raise ProtocolError(check.mismatch(f"{where} (part {index}'s payload, bytes {chunk * CHUNK_BYTES}-)"))


#: A point-to-point slot holding this instead of a message points into the sender's ring file for
#: the pair (transport/rings.py): <4s q q> magic, offset, length.
RING_MAGIC = b"FSDR"
_RING_REF = struct.Struct("<4sqq")


def encode_ring_ref(offset: int, length: int) -> bytes:
    return _RING_REF.pack(RING_MAGIC, offset, length)


def parse_ring_ref(raw: bytes, capacity: int, where: str) -> tuple[int, int] | None:
    """(offset, length) of the ring message ``raw`` points to, checked against the ring's
    ``capacity``, or None where ``raw`` is a message itself."""
    if not raw.startswith(RING_MAGIC):
        return None
    if len(raw) != _RING_REF.size:
        raise ProtocolError(f"{where}: a ring reference of {len(raw)} bytes (expected {_RING_REF.size})")
    _, offset, length = _RING_REF.unpack(raw)
    if offset < 0 or length <= _FIXED.size or offset + length > capacity:
        raise ProtocolError(
            f"{where}: ring reference to {length} bytes at {offset} lies outside the {capacity}-byte ring"
        )
    return offset, length


def _align(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align
