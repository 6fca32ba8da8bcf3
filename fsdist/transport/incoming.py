"""A peer's message, open for reading, wherever it travels: a record's slot, the sender's ring
file, or a file of its own (``open_incoming`` chooses by what the record's slot holds).

protocol/message.py says what the bytes are; this module reads them: where they lie, how they
reach a tensor (copied, from a kept mapping, or checked piece by piece against payload tags),
and how long they stay readable. Every form checks the header against the seal of the identity
the reader expects (files/seal.py), so a message of another sender, step or pair is refused.
"""

from __future__ import annotations

import mmap
import os
import sys
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

import torch

from ..defaults import RING_BYTES
from ..errors import ProtocolError
from ..files.io import open_file, read_exact
from ..files.mapped import Held, MappedFiles
from ..files.seal import Seal
from ..protocol.message import (
    Header,
    ShortHeaderError,
    check_payload,
    covering,
    parse_header,
    parse_ring_ref,
    tensor_bytes,
)

__all__ = ["FileMessage", "InlineMessage", "PeerRings", "RingMessage", "open_incoming"]

#: bytes a reader of a message on disk reads first (more where the header is longer)
FIRST_READ = 4096
_R = TypeVar("_R", bound="_Reader")


def open_incoming(
    slot: bytes | None, where: str, path: Callable[[], str], ring: Callable[[], tuple[int, str]], check: Seal,
    mapped: MappedFiles | None,
) -> InlineMessage | RingMessage | FileMessage:  # fmt: skip
    """The message a sender's record slot holds (``slot``), or points to in its ring file (``ring``
    gives a descriptor of it and its path), or, with no slot, the file ``path()`` names (asked
    only then). ``where`` names the slot in errors; ``check`` is the seal of the message's
    identity; ``mapped``: the rank's kept mappings, where large parts of files are read through
    them (local filesystems)."""
    if slot is None:
        return FileMessage(path(), check, mapped)
    ref = parse_ring_ref(slot, RING_BYTES, where)
    if ref is None:
        return InlineMessage(slot, where, check)
    fd, ring_path = ring()
    return RingMessage(fd, ref[0], ref[1], f"{where} in {ring_path}", check)


class PeerRings:
    """Descriptors of peers' ring files, each opened when first read from and kept until ``close``
    (a sender makes its ring before it points a slot into it)."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def open(self, path: str) -> tuple[int, str]:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = open_file(path, os.O_RDONLY)
        return fd, path

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class _Reader:
    """What every form shares: the checked header, and where a part's bytes lie."""

    def __init__(self, where: str, header: Header, check: Seal) -> None:
        self.path = where
        self.seq, self.tag, self.description, self.parts = header.seq, header.tag, header.description, header.parts
        self._check, self._tags = check, header.payload_tags

    def _range(self, index: int, byte_offset: int, want: int) -> int:
        """Where ``want`` bytes at ``byte_offset`` of part ``index`` start in the message, checked."""
        part = self.parts[index]
        if byte_offset < 0 or byte_offset + want > part.nbytes:
            raise ProtocolError(
                f"{self.path}: part {index} holds {part.nbytes} bytes, asked for {want} at {byte_offset}"
            )
        return part.offset + byte_offset

    def _bounded(self, size: int, what: str) -> None:
        """Refuse a part that lies past ``size`` bytes (the message's own extent)."""
        for index, part in enumerate(self.parts):
            if part.offset < 0 or part.nbytes < 0 or part.offset + part.nbytes > size:
                raise ProtocolError(f"{self.path}: part {index} lies outside the {size}-byte {what}")

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass


class InlineMessage(_Reader):
    """A small message already read: from a peer's record slot, or a ring message kept."""

    def __init__(self, raw: bytes, where: str, check: Seal) -> None:
        try:
            header = parse_header(raw, where, check)
        except ShortHeaderError as exc:
            raise ProtocolError(f"{where}: inline message of {len(raw)} bytes, header of {exc.header_len}") from None
        super().__init__(where, header, check)
        self._bounded(len(raw), "inline message")
        self._raw = raw

    def _bytes(self, index: int, byte_offset: int, want: int) -> memoryview:
        start = self._range(index, byte_offset, want)
        if self._tags is not None:
            part = self.parts[index]
            first, last = covering(part.nbytes, byte_offset, want)
            whole = memoryview(self._raw)[part.offset + first : part.offset + last]
            check_payload(self._check, self._tags[index], index, first, whole, self.path)
        return memoryview(self._raw)[start : start + want]

    def read_into(self, index: int, dest: torch.Tensor, byte_offset: int = 0) -> None:
        want = dest.numel() * dest.element_size()
        if want:
            tensor_bytes(dest)[:] = self._bytes(index, byte_offset, want)

    def mapped(self, index: int, like: torch.Tensor, byte_offset: int = 0) -> AbstractContextManager[torch.Tensor]:
        copy = bytearray(self._bytes(index, byte_offset, like.numel() * like.element_size()))  # small: copied
        return nullcontext(torch.frombuffer(copy, dtype=like.dtype, count=like.numel()).view(like.shape))

    def file_size(self) -> int:
        return 0  # it lives in the record: disposing of it frees no file

    def keep(self) -> InlineMessage:
        return self  # its bytes are this reader's own copy already


class _OnDisk(_Reader):
    """A message at ``base`` of a descriptor, at most ``limit`` bytes long: its header read with one
    ``pread`` (two where it is longer than FIRST_READ), parts straight into the caller's tensors."""

    def __init__(self, fd: int, base: int, limit: int, where: str, check: Seal) -> None:
        self._fd, self._base = fd, base
        head = os.pread(fd, min(limit, FIRST_READ), base)
        try:
            header = parse_header(head, where, check)
        except ShortHeaderError as short:
            if short.header_len > limit:
                raise ProtocolError(f"{where}: header of {short.header_len} bytes in a {limit}-byte message") from None
            buffer = bytearray(short.header_len)
            read_exact(fd, memoryview(buffer), base, where)
            header = parse_header(bytes(buffer), where, check)
        super().__init__(where, header, check)

    def read_into(self, index: int, dest: torch.Tensor, byte_offset: int = 0) -> None:
        """Fill contiguous CPU ``dest`` from part ``index``, starting ``byte_offset`` into the part."""
        want = dest.numel() * dest.element_size()
        start = self._base + self._range(index, byte_offset, want)
        if not want:
            return
        buffer = tensor_bytes(dest)
        if self._tags is not None:
            self._read_tagged(index, byte_offset, buffer)
        else:
            self._copy(start, buffer)

    def _copy(self, start: int, buffer: memoryview) -> None:
        read_exact(self._fd, buffer, start, self.path)

    def _read_tagged(self, index: int, byte_offset: int, buffer: memoryview) -> None:
        """Read a tagged payload's bytes into ``buffer``, checking every chunk they touch (read
        whole, into a buffer of its own where the range does not start and end on chunk edges)."""
        assert self._tags is not None
        part = self.parts[index]
        first, last = covering(part.nbytes, byte_offset, len(buffer))
        aligned = first == byte_offset and last == byte_offset + len(buffer)
        whole = buffer if aligned else memoryview(bytearray(last - first))
        read_exact(self._fd, whole, self._base + part.offset + first, self.path)
        check_payload(self._check, self._tags[index], index, first, whole, self.path)
        if not aligned:
            buffer[:] = whole[byte_offset - first : byte_offset - first + len(buffer)]

    def _copied(self, index: int, like: torch.Tensor, byte_offset: int) -> AbstractContextManager[torch.Tensor]:
        copy = torch.empty_like(like)
        self.read_into(index, copy, byte_offset)
        return nullcontext(copy)


class RingMessage(_OnDisk):
    """``length`` bytes at ``offset`` of a peer's ring file (transport/rings.py), whose descriptor it
    does not own. The bytes stay put only until this rank acknowledges the message, so it is
    never mapped, and ``keep`` copies it for a reader that leaves it for later."""

    def __init__(self, fd: int, offset: int, length: int, where: str, check: Seal) -> None:
        super().__init__(fd, offset, length, where, check)
        self._length = length
        self._bounded(length, "message")

    def mapped(self, index: int, like: torch.Tensor, byte_offset: int = 0) -> AbstractContextManager[torch.Tensor]:
        return self._copied(index, like, byte_offset)

    def file_size(self) -> int:
        return 0  # its acknowledgement frees its space: no file to dispose of

    def keep(self) -> InlineMessage:
        raw = bytearray(self._length)
        read_exact(self._fd, memoryview(raw), self._base, self.path)
        return InlineMessage(bytes(raw), self.path, self._check)


class FileMessage(_OnDisk):
    """A message in a file of its own, which it opens and closes; large parts are copied, or
    lent for a reduction, through the rank's kept mappings of files (files/mapped.py)."""

    def __init__(self, path: str, check: Seal, mapped: MappedFiles | None = None) -> None:
        fd = open_file(path, os.O_RDONLY)
        self._mapped = mapped
        try:
            # no read-ahead: a rank reads its slices of a peer's message, and on a network
            # filesystem read-ahead would fetch the others' from the server too (the reader on
            # the same client that needs them finds them cached where it reads them itself)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            super().__init__(fd, 0, sys.maxsize, path, check)
        except BaseException:
            os.close(fd)
            raise

    def _copy(self, start: int, buffer: memoryview) -> None:
        if self._mapped is None or not self._mapped.read(self._fd, start, buffer):
            read_exact(self._fd, buffer, start, self.path)

    def mapped(self, index: int, like: torch.Tensor, byte_offset: int = 0) -> AbstractContextManager[torch.Tensor]:
        """Part ``index`` from ``byte_offset`` as a read-only tensor shaped like ``like``, mapped,
        not copied, for the ``with`` block (which may outlive this message's closing).

        For reductions: ``acc += mapped`` reads the peer's bytes once, where reading them into
        a buffer first would copy them once more. The tensor must never be written. A file this
        rank has mapped before (a peer's spare, back under a new name) comes from its kept
        mapping (files/mapped.py), held for the block: a store into it would reach the file, or
        kill the process where the mapping is read-only. Any other is mapped privately
        (copy-on-write) and unmapped when the last view of it dies (``mmap.close`` would unmap
        under a live tensor: torch keeps no buffer export). A tagged payload is copied and
        checked: a mapping would show whatever the file holds when the bytes are used.
        """
        if self._tags is not None:
            return self._copied(index, like, byte_offset)
        want = like.numel() * like.element_size()
        start = self._range(index, byte_offset, want)
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
        """The file's size (a message written through a spare may be shorter than its file)."""
        return os.fstat(self._fd).st_size

    def keep(self) -> FileMessage:
        return self  # a file lives until its reader disposes of it

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1


class _HeldTensor:
    """A tensor over a kept mapping, for a ``with`` block that releases the mapping at its end."""

    def __init__(self, tensor: torch.Tensor, held: Held) -> None:
        self._tensor, self._held = tensor, held

    def __enter__(self) -> torch.Tensor:
        return self._tensor

    def __exit__(self, *exc: object) -> None:
        self._held.release()
