"""all_gather: every rank publishes its inputs once; every rank reads every other rank's.

Bytes: each rank writes S and reads (N-1)·S (inherent: every rank ends with N·S).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..transport.interfaces import CollectiveChannel
from ._common import read_part


def all_gather(t: CollectiveChannel, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor]) -> None:
    """``outputs[rank][i] <- inputs[i] of rank``, for every rank (several inputs: coalesced)."""
    if t.size > 1:
        t.publish(1, inputs)
    for rank in range(t.size):
        for index, dest in enumerate(outputs[rank]):
            if rank == t.rank:
                dest.copy_(inputs[index])
            else:
                read_part(t, rank, 1, index, dest)
