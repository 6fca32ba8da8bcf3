"""Recursive doubling: small all_reduces and barriers in log2 N rounds of pairwise exchange.

The one-round forms make each rank read every peer's record: N − 1 locked reads per operation,
each a round trip on NFS. Here rank r exchanges with r xor 1, then r xor 2, r xor 4, ...: after
log2 N rounds every rank holds the reduction of all inputs, having written log2 N messages and
read log2 N. A world that is not a power of two, N = P + E with P the largest power of two
below it, first folds: rank P + i hands its input to rank i (step ``first``), and gets the
result back from it at the end (step ``first + 1 + log2 P``).

Every message has one reader (``publish(..., readers=[partner])``), so a rank's record space
is reused as soon as that partner moves on, without learning where the other ranks are.
Each pair combines in rank order (the lower block's value first), so both sides compute the
same bits and every rank ends with an identical result, as with the one-round form.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..transport.interfaces import CollectiveChannel
from ._common import peer_part, read_part
from .reduce_ops import Reduction, combine_into, combine_to, finish


def _shape(size: int) -> tuple[int, int, int]:
    """(P, E, rounds): the largest power of two P ≤ size, the E = size − P extra ranks, log2 P."""
    power = 1 << (size.bit_length() - 1)
    return power, size - power, power.bit_length() - 1


def all_reduce_doubling(
    t: CollectiveChannel, tensors: Sequence[torch.Tensor], reduction: Reduction, first: int = 1
) -> None:
    """Reduce each of ``tensors`` over all ranks in place, using steps ``first`` to ``first + 1 + log2 P``."""
    power, extra, rounds = _shape(t.size)
    rank, last = t.rank, first + 1 + rounds
    if rank >= power:  # an extra rank: hand the input over, take the result back
        t.publish(first, tensors, readers=[rank - power])
        for part, tensor in enumerate(tensors):
            read_part(t, rank - power, last, part, tensor)
        return
    if rank < extra:
        for part, tensor in enumerate(tensors):
            with peer_part(t, rank + power, first, part, tensor) as other:
                combine_into(reduction, tensor, other)
    for round_ in range(rounds):
        partner, step = rank ^ (1 << round_), first + 1 + round_
        t.publish(step, tensors, readers=[partner])
        for part, tensor in enumerate(tensors):
            with peer_part(t, partner, step, part, tensor) as other:
                if rank < partner:
                    combine_into(reduction, tensor, other)
                else:
                    combine_to(reduction, other, tensor, tensor)
    for tensor in tensors:
        finish(reduction, tensor, t.size)
    if rank < extra:
        t.publish(last, tensors, readers=[rank + power])


def barrier_doubling(t: CollectiveChannel, first: int = 1) -> None:
    """Return once every rank has entered: the same rounds with steps instead of messages."""
    power, extra, rounds = _shape(t.size)
    rank, last = t.rank, first + 1 + rounds
    if rank >= power:
        t.advance(first, waiters=[rank - power])
        t.wait_for(rank - power, last)
        return
    if rank < extra:
        t.wait_for(rank + power, first)
    for round_ in range(rounds):
        partner, step = rank ^ (1 << round_), first + 1 + round_
        t.advance(step, waiters=[partner])
        t.wait_for(partner, step)
    if rank < extra:
        t.advance(last, waiters=[rank + power])
