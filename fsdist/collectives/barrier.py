"""barrier: every rank announces it entered; each waits until all peers have.

A barrier moves no data: each rank advances its state record to step 1 (which also rings the
peers' doorbells) and waits until every peer's record shows step 1.
"""

from __future__ import annotations

from ..transport.interfaces import CollectiveChannel


def barrier(t: CollectiveChannel) -> None:
    """Return once every rank of the group has entered this barrier."""
    if t.size == 1:
        return
    t.advance(1)
    for rank in range(t.size):
        if rank != t.rank:
            t.wait_for(rank, 1)
