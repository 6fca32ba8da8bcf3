"""barrier: every rank announces it entered; each waits until all peers have.

A barrier moves no data: each rank advances its state record to step 1 (which also wakes the
peers' doorbells) and waits until every peer's record shows step 1. From DOUBLING_MIN_RANKS
ranks on, log2 N rounds of pairwise steps instead (doubling.py): fewer reads per rank, and
quicker where every wait is woken (one client). Across clients, from ROOTED_MIN_RANKS up to
ALLREDUCE_DOUBLING_MIN_RANKS ranks, through rank 0 (rooted.py): every look there is a round trip
to the server, and a rank other than 0 makes one write and a look or two, not log2 N of each.
"""

from __future__ import annotations

from ..defaults import ALLREDUCE_DOUBLING_MIN_RANKS, DOUBLING_MIN_RANKS, ROOTED_MIN_RANKS
from ..transport.interfaces import CollectiveChannel
from .doubling import barrier_doubling
from .rooted import barrier_rooted


def barrier(t: CollectiveChannel) -> None:
    """Return once every rank of the group has entered this barrier."""
    if t.size == 1:
        return
    if not t.locality.one_client and ROOTED_MIN_RANKS <= t.size < ALLREDUCE_DOUBLING_MIN_RANKS:
        barrier_rooted(t)
        return
    if t.size >= DOUBLING_MIN_RANKS:
        barrier_doubling(t)
        return
    t.advance(1)
    for rank in range(t.size):
        if rank != t.rank:
            t.wait_for(rank, 1)
