"""reduce: every rank publishes its input; the root reduces them in rank order.

Bytes: each rank writes S; the root reads (N-1)·S.
"""

from __future__ import annotations

import torch

from ..transport.interfaces import CollectiveChannel
from ._common import reduce_into_own
from .reduce_ops import Reduction, finish


def reduce(t: CollectiveChannel, tensor: torch.Tensor, root: int, reduction: Reduction) -> None:
    """Leave the reduction of every rank's ``tensor`` in the root's ``tensor``."""
    if t.rank != root:
        t.publish(1, [tensor])
        return
    reduce_into_own(t, 1, 0, reduction, tensor)  # the root's input is nobody else's: it takes the result
    finish(reduction, tensor, t.size)
