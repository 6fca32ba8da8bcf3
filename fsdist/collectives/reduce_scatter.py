"""reduce_scatter: every rank publishes its N pieces once; rank i reduces piece i of all ranks.

Bytes: each rank writes N·S (its whole input) and reads (N-1)·S, S being one output piece.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..transport.interfaces import CollectiveChannel
from ._common import reduce_into_own
from .reduce_ops import Reduction, finish


def reduce_scatter(
    t: CollectiveChannel,
    outputs: Sequence[torch.Tensor],
    inputs: Sequence[Sequence[torch.Tensor]],
    reduction: Reduction,
) -> None:
    """For each k: ``outputs[k] <- reduction over ranks of inputs[k][rank]`` (k > 0: coalesced).

    ``inputs[k]`` holds N pieces; the message lays them out k-major, piece ``rank`` of input
    ``k`` being part ``k * N + rank``.
    """
    if t.size > 1:
        t.publish(1, [piece for pieces in inputs for piece in pieces])
    for k, output in enumerate(outputs):
        output.copy_(inputs[k][t.rank])  # the own piece is published: the output takes the result
        reduce_into_own(t, 1, k * t.size + t.rank, reduction, output)
        finish(reduction, output, t.size)
