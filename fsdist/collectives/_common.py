"""Helpers every collective algorithm shares: reading a peer's part, reducing over ranks.

Scratch buffers are kept per thread (each group runs its collectives on one worker thread) and
reused: a fresh 64 MiB tensor costs its page faults again on every call (~2–3 GB/s here),
which is as slow as writing a fresh file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

from ..defaults import MAP_MIN_BYTES
from ..errors import DesyncError
from ..transport.interfaces import CollectiveChannel, Incoming
from .reduce_ops import Reduction, combine_into, combine_to

_SCRATCH = threading.local()


def scratch(like: torch.Tensor, slot: int = 0) -> torch.Tensor:
    """A reusable tensor shaped like ``like`` (contents undefined); ``slot`` 0 and 1 are distinct.

    The last view handed out of each slot is kept and handed out again for the same dtype and
    shape: making it (slice, two views) costs ~3 µs, a small operation's whole reduction less.
    """
    views: list[tuple[torch.dtype, torch.Size, torch.Tensor] | None] | None = getattr(_SCRATCH, "views", None)
    if views is None:
        _SCRATCH.buffers = [torch.empty(0, dtype=torch.uint8)] * 2
        views = _SCRATCH.views = [None, None]
    last = views[slot]
    if last is not None and last[0] == like.dtype and last[1] == like.shape:
        return last[2]
    nbytes = like.numel() * like.element_size()
    buffers: list[torch.Tensor] = _SCRATCH.buffers
    if buffers[slot].numel() < nbytes:
        buffers[slot] = torch.empty(nbytes, dtype=torch.uint8)
    view = buffers[slot][:nbytes].view(like.dtype).view(like.shape)
    views[slot] = (like.dtype, like.shape, view)
    return view


def peers_from_next(rank: int, size: int) -> list[int]:
    """Every other rank, from ``rank + 1`` round to ``rank − 1``: where every rank reads every
    peer's message, each starts at a different one (not all at rank 0's file at once)."""
    return [(rank + offset) % size for offset in range(1, size)]


def read_part(
    t: CollectiveChannel, peer: int, step: int, part: int, dest: torch.Tensor, byte_offset: int | None = None
) -> None:
    """Wait for ``peer``'s message of ``step`` and copy part ``part`` into ``dest``.

    With ``byte_offset`` None the part must match ``dest`` exactly (dtype and size), else only
    the dtype and the range are checked (a slice of a larger part).
    """
    t.wait_for(peer, step)
    with t.open_message(peer, step) as msg:
        _check_part(t, peer, msg, part, dest, byte_offset)
        msg.read_into(part, dest, byte_offset or 0)


def peer_part(
    t: CollectiveChannel, peer: int, step: int, part: int, like: torch.Tensor, byte_offset: int | None = None
) -> AbstractContextManager[torch.Tensor]:
    """``peer``'s part as a tensor shaped like ``like``, to be read once inside the ``with``
    block (an operand of a reduction) and never written.

    Large parts on local filesystems come mapped straight from the peer's file (one pass over
    the bytes instead of a copy and a pass), from the ``with`` on; others are copied into
    scratch slot 1 at once, valid until the next call that uses that slot.
    """
    nbytes = like.numel() * like.element_size()
    if not (t.locality.maps_messages and nbytes >= MAP_MIN_BYTES):
        other = scratch(like, 1)
        read_part(t, peer, step, part, other, byte_offset)
        return nullcontext(other)
    return _mapped_part(t, peer, step, part, like, byte_offset)


@contextmanager
def _mapped_part(
    t: CollectiveChannel, peer: int, step: int, part: int, like: torch.Tensor, byte_offset: int | None
) -> Iterator[torch.Tensor]:
    """A large part, mapped for the ``with`` block (a mapping taken and released within it)."""
    t.wait_for(peer, step)
    with t.open_message(peer, step) as msg:
        _check_part(t, peer, msg, part, like, byte_offset)
        with msg.mapped(part, like, byte_offset or 0) as operand:
            yield operand


def _check_part(
    t: CollectiveChannel, peer: int, msg: Incoming, part: int, dest: torch.Tensor, byte_offset: int | None
) -> None:
    sent = msg.parts[part]
    nbytes = dest.numel() * dest.element_size()
    if sent.dtype != dest.dtype or (byte_offset is None and sent.nbytes != nbytes):
        error = DesyncError(
            f"rank {t.rank}: rank {peer} sent {sent.dtype} {list(sent.shape)} ({sent.nbytes} bytes) "
            f"where this rank expects {dest.dtype} {list(dest.shape)} ({nbytes} bytes) "
            f"in '{msg.description}' (#{msg.seq})"
        )
        t.abort(str(error))
        raise error


def reduce_into_own(
    t: CollectiveChannel, step: int, part: int, reduction: Reduction, own: torch.Tensor, byte_offset: int | None = None,
    locate: Callable[[int], tuple[int, int | None]] | None = None,
) -> None:  # fmt: skip
    """``own <- x_0 (op) x_1 (op) ... (op) x_{N-1}`` in rank order, where x_{rank} is ``own`` itself.

    ``own`` must be free to overwrite once it has been combined (already published, or not
    needed by anyone else): the result lands in it with no final copy. Rank 0 accumulates in it
    from the start; rank r > 0 combines the ranks before it in scratch slot 0 (rank 1: just
    x_0, read from its mapping), writes ``prefix (op) own`` into ``own`` (the same operand
    order as ``acc op= own``) and accumulates the ranks after it there. Each peer's operand is
    its part ``part`` from ``byte_offset``, or where ``locate(peer)`` says: (part, byte offset).
    """

    def operand(peer: int) -> AbstractContextManager[torch.Tensor]:
        peer_part_index, offset = locate(peer) if locate is not None else (part, byte_offset)
        return peer_part(t, peer, step, peer_part_index, own, offset)

    if t.rank == 1:
        with operand(0) as first:
            combine_to(reduction, first, own, own)
    elif t.rank > 1:
        prefix = scratch(own, 0)
        first_part, first_offset = locate(0) if locate is not None else (part, byte_offset)
        read_part(t, 0, step, first_part, prefix, first_offset)
        for rank in range(1, t.rank):
            with operand(rank) as other:
                combine_into(reduction, prefix, other)
        combine_to(reduction, prefix, own, own)
    for rank in range(t.rank + 1, t.size):
        with operand(rank) as other:
            combine_into(reduction, own, other)
