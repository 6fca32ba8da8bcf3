"""broadcast: the root publishes once; every other rank reads the same file.

Bytes: root writes S; each other rank reads S.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..transport.interfaces import CollectiveChannel
from ._common import read_part


def broadcast(t: CollectiveChannel, tensors: Sequence[torch.Tensor], root: int) -> None:
    """Copy the root's ``tensors`` into every rank's ``tensors`` (one message, one part each)."""
    if t.rank == root:
        t.publish(1, tensors)
        return
    for index, tensor in enumerate(tensors):
        read_part(t, root, 1, index, tensor)
