"""Where a message goes: a slot of its sender's record, the sender's ring file, or a file of its own.

One policy for collective and point-to-point messages (transport/group.py, pairs.py). A message
whose encoding fits a slot (state_record.INLINE_MAX) travels inside the record write that
announces it: no file to create, rename, open or unlink. A mid-size one (local filesystems: a
ring where spares are used) is one ``pwritev`` into a ring file both sides keep open, where the
slot holds where it lies. Anything else, or where no slot or no ring room is free, is a file.
The callers differ only in where their slots and rings are and how they free them, which they
pass in; what they get back is a tagged ``Placement`` they record and later dispose of.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..defaults import INLINE
from ..files.seal import Seal
from ..protocol import message
from ..protocol.state_record import INLINE_MAX
from .spares import SpareFile

__all__ = ["InFile", "InSlot", "Placement", "place"]

Buffers = Sequence[memoryview | bytes]


@dataclass(frozen=True)
class InSlot:
    """In a record slot: the message itself, or (``ring_index`` set) where it lies in the ring file."""

    slot: int
    data: bytes
    ring_index: int | None = None


@dataclass(frozen=True)
class InFile:
    """A file of its own (written through ``spare`` where one was reused: spares.py)."""

    path: str
    size: int
    spare: SpareFile | None


Placement = InSlot | InFile


def place(
    seq: int, tag: int, description: str, tensors: Sequence[torch.Tensor], check: Seal, *,
    free_slot: Callable[[], int | None], ring: Callable[[Buffers, int], tuple[int, int] | None] | None,
    ring_max: int, write: Callable[[Buffers, int], tuple[str, SpareFile | None]],
) -> Placement:  # fmt: skip
    """Encode the message (``check``: the seal of its identity) and put it where it goes.

    ``free_slot``: a slot no reader may still read, or None; ``ring``: writes the encoded
    message into the ring file and returns (offset, its number in the ring), or None where
    there is no room (None: no ring here); ``ring_max``: the largest message it takes;
    ``write``: publishes a file, returns its path and the spare it went through.
    """
    encoded = message.encode_inline(seq, tag, description, tensors, INLINE_MAX, check) if INLINE else None
    if encoded is not None:
        slot = free_slot()
        if slot is not None:
            return InSlot(slot, encoded)
    buffers = message.encode(seq, tag, description, tensors, check)
    size = sum(len(b) for b in buffers)
    if INLINE and encoded is None and ring is not None and size <= ring_max:
        slot = free_slot()
        placed = ring(buffers, size) if slot is not None else None
        if slot is not None and placed is not None:
            offset, index = placed
            return InSlot(slot, message.encode_ring_ref(offset, size), index)
    path, spare = write(buffers, size)
    return InFile(path, size, spare)
