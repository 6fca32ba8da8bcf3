"""barrier: every rank announces it entered; each waits until all peers have.

A barrier moves no data: each rank advances its state record to step 1 (which also wakes the
peers' doorbells) and waits until every peer's record shows step 1. From DOUBLING_MIN_RANKS
ranks on, log2 N rounds of pairwise steps instead (doubling.py): fewer reads per rank.
"""

from __future__ import annotations

from ..defaults import DOUBLING_MIN_RANKS
from ..transport.interfaces import CollectiveChannel
from .doubling import barrier_doubling


def barrier(t: CollectiveChannel) -> None:
    """Return once every rank of the group has entered this barrier."""
    if t.size == 1:
        return
    if t.size >= DOUBLING_MIN_RANKS:
        barrier_doubling(t)
        return
    t.advance(1)
    for rank in range(t.size):
        if rank != t.rank:
            t.wait_for(rank, 1)
