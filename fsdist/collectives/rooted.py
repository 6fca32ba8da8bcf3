"""Small all_reduces in groups of 4 to 31 ranks (and barriers across clients): everyone to rank 0, then back.

In a group of ROOTED_MIN_RANKS up to ALLREDUCE_DOUBLING_MIN_RANKS − 1 ranks, what a small
operation costs is CPU time, wake-ups and filesystem calls, not bytes. Here a rank other than 0
writes its record once (its input, read by rank 0 only) and reads rank 0's once (the result):
2 record accesses and one sleep; rank 0 reads N − 1 records and writes one. That is 3N − 2
accesses in all, where recursive doubling makes 4 per rank per round (16 at 4 ranks, 10 here;
48 at 8, 22 here) and puts every rank to sleep once per round. Its critical path is longer (rank
0 reads its peers one after another), which is why large groups use doubling (doubling.py).
Across clients (NFS from several hosts, no two-tier split) every record access is a round trip
to the server and no doorbell wakes a waiter: the others look for rank 0's result when they
learned it tends to come (files/pacing.py ``Pacing``), so a rank other than 0 costs one WRITE
and a READ or two where doubling costs log2 N of each; barriers there go through rank 0 too
(``barrier_rooted``). On one client barriers keep doubling from DOUBLING_MIN_RANKS: with no
message to handle, its rounds were quicker there. The measurements: docs/algorithms.md.

Rank 0 reduces in rank order, as the one-round form does, and every rank takes its bits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..transport.interfaces import CollectiveChannel
from ._common import read_part, reduce_into_own
from .reduce_ops import Reduction, finish


def all_reduce_rooted(
    t: CollectiveChannel, tensors: Sequence[torch.Tensor], reduction: Reduction, first: int = 1
) -> None:
    """Reduce each of ``tensors`` over all ranks in place, using steps ``first`` and ``first + 1``."""
    if t.rank != 0:
        t.publish(first, tensors, readers=[0])
        for part, tensor in enumerate(tensors):
            read_part(t, 0, first + 1, part, tensor)
        return
    for part, tensor in enumerate(tensors):
        reduce_into_own(t, first, part, reduction, tensor)  # rank 0's input: nobody else reads it
        finish(reduction, tensor, t.size)
    t.publish(first + 1, tensors)


def barrier_rooted(t: CollectiveChannel, first: int = 1) -> None:
    """Return once every rank has entered: each tells rank 0 (step ``first``), rank 0 tells them
    all once it has heard from every one (step ``first + 1``)."""
    if t.rank != 0:
        t.advance(first, waiters=[0])
        t.wait_for(0, first + 1)
        return
    for peer in range(1, t.size):
        t.wait_for(peer, first)
    t.advance(first + 1)
