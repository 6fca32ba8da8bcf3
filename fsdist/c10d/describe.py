"""Descriptions of operations: what every rank of a group must agree on, as readable text.

Each rank publishes the description of the operation it is in; peers compare it with their
own, and a mismatch becomes an error that shows both sides. Only what must match goes in
(op, reduce op, dtype, shapes, root): all_to_all pieces may differ between ranks, so their
shapes stay out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..collectives.reduce_ops import ReduceKind, Reduction, check_supported
from .staging import check_stageable

__all__ = ["describe", "reduction_of"]

_MAX = 200

_KINDS = {getattr(dist.ReduceOp.RedOpType, kind.name): kind for kind in ReduceKind}


def describe(
    name: str,
    tensors: Sequence[torch.Tensor],
    root: int | None = None,
    reduction: Reduction | None = None,
    tag: int | None = None,
    dtype: torch.dtype | None = None,
) -> str:
    """E.g. ``all_reduce SUM float32[1000]`` or ``broadcast root=2 int64[3, 4]``.

    Every operation describes its tensors before it is queued, so this is also where tensors
    that cannot travel are refused, the same way on every rank.
    """
    for tensor in tensors:
        check_stageable(tensor)
    words = [name]
    if reduction is not None:
        words.append(str(reduction))
    if root is not None:
        words.append(f"root={root}")
    if tag is not None:
        words.append(f"tag={tag}")
    if dtype is not None:
        words.append(str(dtype).removeprefix("torch."))
    words.extend(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in tensors)
    text = " ".join(words)
    if len(text) > _MAX:  # keep it short but still exact: a digest of the whole text
        text = text[: _MAX - 18] + " #" + hashlib.sha1(text.encode()).hexdigest()[:16]
    return text


#: the Reduction of each op without a factor (one object each, made once)
_PLAIN = {op: Reduction(kind) for op, kind in _KINDS.items() if kind is not ReduceKind.PREMUL_SUM}


def reduction_of(reduce_op: Any, tensors: Sequence[torch.Tensor]) -> Reduction:
    """The Reduction of a c10d ReduceOp, checked against every tensor's dtype."""
    reduction = _PLAIN.get(reduce_op.op)
    if reduction is None:
        kind = _KINDS[reduce_op.op]
        factor = reduce_op.factor
        if isinstance(factor, torch.Tensor):
            factor = factor.detach().to("cpu")
        reduction = Reduction(kind, factor)
    for tensor in tensors:
        check_supported(reduction, tensor.dtype)
    return reduction
