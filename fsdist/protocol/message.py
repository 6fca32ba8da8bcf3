"""The on-disk message format: a fixed binary header, part descriptors, raw bytes.

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
FSDIST_MAC_PAYLOADS=1 (with a secret) adds the payload tags, and every reader checks the pieces
it reads against them before the bytes reach a tensor.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import warnings
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import NamedTuple

import torch

from ..errors import ProtocolError
from ..files.io import open_file, read_exact
from ..files.mapped import Held, MappedFiles
from ..files.seal import CHUNK_BYTES, TAG_BYTES, Seal

MAGIC = b"FSDM"
VERSION = 2
ALIGN = 64
_FIXED = struct.Struct("<4sHHqqIHH")
_PART = struct.Struct("<BB6xqq")
_DIM = struct.Struct("<q")
_CHUNK = struct.Struct("<II")  # a payload tag covers (part index, chunk index) and the chunk
#: flags: the header holds payload tags
FLAG_PAYLOAD_TAGS = 1
_FIRST_READ = 4096
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
    payload_tags = check.payloads
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
    if check.payloads and _layout(seq, tag, description, tensors, INLINE_ALIGN, check, build=False)[2] > limit:
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
        raise _ShortHeaderError(header_len)
    end = header_len - TAG_BYTES
    if not check.verify_at(head, end):
        raise ProtocolError(check.mismatch(f"{where} (a message header)"))
    if bool(flags & FLAG_PAYLOAD_TAGS) != check.payloads:
        raise ProtocolError(
            f"{where}: its payload is {'' if flags & FLAG_PAYLOAD_TAGS else 'not '}tagged and this rank's "
            "setting says otherwise: set FSDIST_MAC_PAYLOADS alike on every rank"
        )
    key = (nparts, desc_len, flags, head[_FIXED.size : end])
    known = _PARSED.get(key)
    if known is None:
        known = _parse_body(head, nparts, desc_len, header_len, bool(flags & FLAG_PAYLOAD_TAGS), where)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[key] = known
    return Header(seq, tag, known[0], known[1], header_len, known[2])


#: headers parsed before, by everything in them past the fixed part (description and parts):
#: a training loop sends the same few shapes over and over, and parsing one is ~1.5 µs
_PARSED: dict[tuple[int, int, int, bytes], tuple[str, tuple[Part, ...], tuple[bytes, ...] | None]] = {}
_PARSED_MAX = 256


def _parse_body(
    head: bytes, nparts: int, desc_len: int, header_len: int, tagged: bool, where: str
) -> tuple[str, tuple[Part, ...], tuple[bytes, ...] | None]:
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
        return description, tuple(parts), None  # shared by every message with this header: never changed
    tags = []
    for part in parts:
        size = TAG_BYTES * _chunks(part.nbytes)
        tags.append(bytes(head[pos : pos + size]))
        pos += size
    if pos != end:
        raise ProtocolError(f"{where}: its payload tags do not fill the header ({end - pos} bytes left)")
    return description, tuple(parts), tuple(tags)


class _ShortHeaderError(ProtocolError):
    """The header is longer than the bytes read so far (a file reader reads the rest)."""

    def __init__(self, header_len: int) -> None:
        super().__init__(f"the message header is {header_len} bytes long")
        self.header_len = header_len


#: Part alignment of inline messages (enough for every dtype's element alignment).
INLINE_ALIGN = 16


def _covering(nbytes: int, byte_offset: int, want: int) -> tuple[int, int]:
    """The whole payload chunks, as a byte range of a part of ``nbytes``, that hold ``want`` bytes
    from ``byte_offset``: what a reader of tagged payloads must read to check them."""
    start = byte_offset - byte_offset % CHUNK_BYTES
    return start, min(nbytes, _chunks(byte_offset + want) * CHUNK_BYTES)


def _check_payload(check: Seal, tags: bytes, index: int, start: int, data: memoryview, where: str) -> None:
    """Check ``data``, part ``index``'s bytes from chunk boundary ``start``, against its tags."""
    first = start // CHUNK_BYTES
    for number in range(_chunks(len(data))):
        chunk = first + number
        piece = data[number * CHUNK_BYTES : (number + 1) * CHUNK_BYTES]
        if not check.verify(tags[chunk * TAG_BYTES : (chunk + 1) * TAG_BYTES], _CHUNK.pack(index, chunk), piece):
            raise ProtocolError(check.mismatch(f"{where} (part {index}'s payload, bytes {chunk * CHUNK_BYTES}-)"))


class InlineMessage:
    """A small message carried in a peer's state record (protocol/state_record.py), already read."""

    def __init__(self, raw: bytes, where: str, check: Seal) -> None:
        """``check``: the seal of the identity the reader expects the message to have."""
        self.path = where
        try:
            header = parse_header(raw, where, check)
        except _ShortHeaderError as exc:
            raise ProtocolError(f"{where}: inline message of {len(raw)} bytes, header of {exc.header_len}") from None
        self.seq, self.tag, self.description, self.parts = header.seq, header.tag, header.description, header.parts
        for index, part in enumerate(self.parts):
            if part.offset < 0 or part.nbytes < 0 or part.offset + part.nbytes > len(raw):
                raise ProtocolError(f"{where}: part {index} lies outside the {len(raw)}-byte inline message")
        self._raw = raw
        self._check, self._tags = check, header.payload_tags

    def _bytes(self, index: int, byte_offset: int, want: int) -> memoryview:
        part = self.parts[index]
        if byte_offset < 0 or byte_offset + want > part.nbytes:
            raise ProtocolError(
                f"{self.path}: part {index} holds {part.nbytes} bytes, asked for {want} at {byte_offset}"
            )
        if self._tags is not None:
            first, last = _covering(part.nbytes, byte_offset, want)
            whole = memoryview(self._raw)[part.offset + first : part.offset + last]
            _check_payload(self._check, self._tags[index], index, first, whole, self.path)
        start = part.offset + byte_offset
        return memoryview(self._raw)[start : start + want]

    def read_into(self, index: int, dest: torch.Tensor, byte_offset: int = 0) -> None:
        want = dest.numel() * dest.element_size()
        if want:
            tensor_bytes(dest)[:] = self._bytes(index, byte_offset, want)

    def mapped(self, index: int, like: torch.Tensor, byte_offset: int = 0) -> AbstractContextManager[torch.Tensor]:
        want = like.numel() * like.element_size()
        copy = bytearray(self._bytes(index, byte_offset, want))  # small: a copy is the cheap way
        return nullcontext(torch.frombuffer(copy, dtype=like.dtype, count=like.numel()).view(like.shape))

    def file_size(self) -> int:
        return 0  # it lives in the record: disposing of it frees no file

    def keep(self) -> InlineMessage:
        return self  # its bytes are this reader's own copy already

    def close(self) -> None:
        pass

    def __enter__(self) -> InlineMessage:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class Message:
    """A validated message in a file; parts are read straight into caller buffers.

    Either a message file of its own (``Message(path)``, which it opens and closes) or a stretch
    of a peer's ring file (``Message.in_ring``: ``length`` bytes at ``base`` of a descriptor it
    does not own). A ring message's bytes stay put only until the reader acknowledges it, so it
    is never mapped, and ``keep`` copies it for a reader that leaves it for later.
    """

    def __init__(
        self, path: str, check: Seal, fd: int | None = None, base: int = 0, length: int | None = None,
        mapped: MappedFiles | None = None,
    ) -> None:  # fmt: skip
        """``check``: the seal of the identity the reader expects the message to have;
        ``mapped``: the rank's kept mappings, to copy large parts of a file message through
        (local filesystems; files/mapped.py)."""
        self.path = path
        self._check = check
        self._mapped = mapped
        self._owns_fd = fd is None
        self._fd = open_file(path, os.O_RDONLY) if fd is None else fd
        self._base, self._length = base, length
        try:
            self._parse_header()
        except BaseException:
            self.close()
            raise

    @classmethod
    def in_ring(cls, fd: int, offset: int, length: int, where: str, check: Seal) -> Message:
        """The message of ``length`` bytes at ``offset`` of ring file ``fd`` (see parse_ring_ref)."""
        return cls(where, check, fd, offset, length)

    def _parse_header(self) -> None:
        first = _FIRST_READ if self._length is None else min(self._length, _FIRST_READ)
        head = os.pread(self._fd, first, self._base)
        try:
            parsed = parse_header(head, self.path, self._check)
        except _ShortHeaderError as short:
            if self._length is not None and short.header_len > self._length:
                raise ProtocolError(
                    f"{self.path}: header of {short.header_len} bytes in a {self._length}-byte message"
                ) from None
            buffer = bytearray(short.header_len)
            read_exact(self._fd, memoryview(buffer), self._base, self.path)
            parsed = parse_header(bytes(buffer), self.path, self._check)
        self.seq, self.tag, self.description, self.parts = parsed.seq, parsed.tag, parsed.description, parsed.parts
        self._tags = parsed.payload_tags
        if self._length is not None:
            for index, part in enumerate(self.parts):
                if part.offset + part.nbytes > self._length:
                    raise ProtocolError(f"{self.path}: part {index} lies outside the {self._length}-byte message")

    def _check_range(self, index: int, byte_offset: int, want: int) -> int:
        """The file offset of ``want`` bytes at ``byte_offset`` of part ``index``, checked."""
        part = self.parts[index]
        if byte_offset < 0 or byte_offset + want > part.nbytes:
            raise ProtocolError(
                f"{self.path}: part {index} holds {part.nbytes} bytes, asked for {want} at {byte_offset}"
            )
        return self._base + part.offset + byte_offset

    def read_into(self, index: int, dest: torch.Tensor, byte_offset: int = 0) -> None:
        """Fill contiguous CPU ``dest`` from part ``index``, starting ``byte_offset`` into the part."""
        want = dest.numel() * dest.element_size()
        start = self._check_range(index, byte_offset, want)
        if not want:
            return
        buffer = tensor_bytes(dest)
        if self._tags is not None:
            self._read_tagged(index, byte_offset, buffer)
        elif self._mapped is None or self._length is not None or not self._mapped.read(self._fd, start, buffer):
            read_exact(self._fd, buffer, start, self.path)

    def _read_tagged(self, index: int, byte_offset: int, buffer: memoryview) -> None:
        """Read a tagged payload's bytes into ``buffer``, checking every chunk they touch (read
        whole, into a buffer of its own where the range does not start and end on chunk edges)."""
        assert self._tags is not None
        part = self.parts[index]
        first, last = _covering(part.nbytes, byte_offset, len(buffer))
        aligned = first == byte_offset and last == byte_offset + len(buffer)
        whole = buffer if aligned else memoryview(bytearray(last - first))
        read_exact(self._fd, whole, self._base + part.offset + first, self.path)
        _check_payload(self._check, self._tags[index], index, first, whole, self.path)
        if not aligned:
            buffer[:] = whole[byte_offset - first : byte_offset - first + len(buffer)]

    def mapped(self, index: int, like: torch.Tensor, byte_offset: int = 0) -> AbstractContextManager[torch.Tensor]:
        """Part ``index`` from ``byte_offset`` as a read-only tensor shaped like ``like``, mapped,
        not copied, for the ``with`` block (which may outlive this message's closing).

        For reductions: ``acc += mapped`` reads the peer's bytes once, where reading them into
        a buffer first would copy them once more. The tensor must never be written. A file this
        rank has mapped before (a peer's spare, back under a new name) comes from its kept
        mapping (files/mapped.py), held for the block: a store into it would reach the file, or
        kill the process where the mapping is read-only. Any other is mapped privately
        (copy-on-write) and unmapped when the last view of it dies (``mmap.close`` would unmap
        under a live tensor: torch keeps no buffer export). A ring message is copied instead:
        the sender reuses its bytes once it is acknowledged.
        """
        if self._length is not None or self._tags is not None:  # (tagged: checked bytes only, never the file's)
            copy = torch.empty_like(like)
            self.read_into(index, copy, byte_offset)
            return nullcontext(copy)
        want = like.numel() * like.element_size()
        start = self._check_range(index, byte_offset, want)
        if want == 0:
            raise ProtocolError(f"{self.path}: asked to map no bytes of part {index}")
        held = self._mapped.hold(self._fd, start, want) if self._mapped is not None else None
        if held is None:
            return nullcontext(self._private(start, like))
        try:
            with warnings.catch_warnings():  # read-only: torch warns once that it cannot enforce it
                warnings.simplefilter("ignore", UserWarning)
                tensor = torch.frombuffer(held.view, dtype=like.dtype, count=like.numel()).view(like.shape)
        except BaseException:
            held.release()
            raise
        return _HeldTensor(tensor, held)

    def _private(self, start: int, like: torch.Tensor) -> torch.Tensor:
        want = like.numel() * like.element_size()
        base = start - start % mmap.ALLOCATIONGRANULARITY
        try:
            mapping = mmap.mmap(self._fd, start - base + want, access=mmap.ACCESS_COPY, offset=base)
        except ValueError:  # (mmap's word for a file shorter than the range)
            raise ProtocolError(
                f"{self.path}: the file ends before byte {start + want} of its part (size {self.file_size()})"
            ) from None
        view = torch.frombuffer(mapping, dtype=like.dtype, count=like.numel(), offset=start - base)
        return view.view(like.shape)

    def file_size(self) -> int:
        """The file's size (a message written through a spare may be shorter than its file); 0 for a
        ring message, whose acknowledgement frees its space with no file to dispose of."""
        return os.fstat(self._fd).st_size if self._length is None else 0

    def keep(self) -> Message | InlineMessage:
        """This message, readable after its acknowledgement: a file lives until its reader
        disposes of it; a ring message is copied out."""
        if self._length is None:
            return self
        raw = bytearray(self._length)
        read_exact(self._fd, memoryview(raw), self._base, self.path)
        return InlineMessage(bytes(raw), self.path, self._check)

    def close(self) -> None:
        if self._owns_fd and self._fd >= 0:
            os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> Message:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _HeldTensor:
    """A tensor over a kept mapping, for a ``with`` block that releases the mapping at its end."""

    def __init__(self, tensor: torch.Tensor, held: Held) -> None:
        self._tensor, self._held = tensor, held

    def __enter__(self) -> torch.Tensor:
        return self._tensor

    def __exit__(self, *exc: object) -> None:
        self._held.release()


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
