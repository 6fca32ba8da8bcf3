"""gather: every non-root rank publishes its input; the root reads them all.

Bytes: each non-root writes S; the root reads (N-1)·S.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..transport.interfaces import CollectiveChannel
from ._common import read_part


def gather(t: CollectiveChannel, outputs: Sequence[torch.Tensor], tensor: torch.Tensor, root: int) -> None:
    """``outputs[rank] <- tensor of rank`` on the root; ``outputs`` is ignored elsewhere."""
    if t.rank != root:
        t.publish(1, [tensor])
        return
    for rank, dest in enumerate(outputs):
        if rank == t.rank:
            dest.copy_(tensor)
        else:
            read_part(t, rank, 1, 0, dest)
