"""all_to_all: every rank publishes its N pieces in one message; rank i reads piece i of each.

Bytes: each rank writes its whole input and reads what it receives; uneven pieces are fine.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..transport.interfaces import CollectiveChannel
from ._common import read_part


def all_to_all(t: CollectiveChannel, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> None:
    """``outputs[rank] <- inputs[this rank]`` of ``rank``, for every rank."""
    if t.size > 1:
        t.publish(1, inputs)
    for rank, dest in enumerate(outputs):
        if rank == t.rank:
            dest.copy_(inputs[rank])
        else:
            read_part(t, rank, 1, t.rank, dest)
