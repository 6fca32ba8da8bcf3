"""all_to_all: every rank publishes, in one message, the pieces meant for the others; rank i
reads its piece from each.

A rank's own piece stays out of the message: nobody else reads it (2 ranks: half the bytes
written). Bytes: each rank writes what it sends and reads what it receives; uneven pieces are fine.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..transport.interfaces import CollectiveChannel
from ._common import peers_from_next, read_part


def all_to_all(t: CollectiveChannel, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> None:
    """``outputs[rank] <- inputs[this rank]`` of ``rank``, for every rank."""
    if t.size > 1:
        t.publish(1, [piece for rank, piece in enumerate(inputs) if rank != t.rank])
    outputs[t.rank].copy_(inputs[t.rank])  # first: the peers may still be publishing
    for rank in peers_from_next(t.rank, t.size):
        # the peer left its own piece out: this rank's piece is one earlier past it
        read_part(t, rank, 1, t.rank - (t.rank > rank), outputs[rank])
