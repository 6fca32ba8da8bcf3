"""scatter: the root publishes all N pieces in one message; rank i reads piece i.

Bytes: the root writes N·S (one file); every other rank reads S.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..transport.interfaces import CollectiveChannel
from ._common import read_part


def scatter(t: CollectiveChannel, output: torch.Tensor, inputs: Sequence[torch.Tensor], root: int) -> None:
    """``output <- inputs[rank]`` of the root; ``inputs`` is ignored off the root."""
    if t.rank == root:
        if t.size > 1:
            t.publish(1, inputs)
        output.copy_(inputs[t.rank])
        return
    read_part(t, root, 1, t.rank, output)
