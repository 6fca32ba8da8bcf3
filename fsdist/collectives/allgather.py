"""all_gather: every rank publishes its inputs once; every rank reads every other rank's.

Bytes: each rank writes S and reads (N-1)·S (inherent: every rank ends with N·S).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..transport.interfaces import CollectiveChannel
from ._common import peers_from_next, read_part


def all_gather(t: CollectiveChannel, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor]) -> None:
    """``outputs[rank][i] <- inputs[i] of rank``, for every rank (several inputs: coalesced)."""
    if t.size > 1:
        t.publish(1, inputs)
    for index, dest in enumerate(outputs[t.rank]):  # first: the peers may still be publishing
        dest.copy_(inputs[index])
    for rank in peers_from_next(t.rank, t.size):
        for index, dest in enumerate(outputs[rank]):
            read_part(t, rank, 1, index, dest)
