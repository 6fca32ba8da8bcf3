"""barrier: every rank announces it entered; each waits until all peers have.

Entering an operation already writes the rank's state record, so a barrier moves no data.
"""

from __future__ import annotations

from ..transport import GroupTransport


def barrier(t: GroupTransport) -> None:
    """Return once every rank of the group has entered this barrier."""
    for rank in range(t.size):
        if rank != t.rank:
            t.wait_for(rank, 0)
