"""torch's Python overloads of ProcessGroup methods, turned into the one form c10d itself uses.

c10d always calls ``method(tensors, ..., opts)``. Code that calls a process group directly
(torch's own tests, some frameworks) may use pybind's other overloads: ``pg.allreduce(t)``,
``pg.allreduce([t], ReduceOp.MAX)``, ``pg.broadcast(t, root)``, ``pg.gather(outs, t, root)``...
A Python subclass replaces every overload of a name at once, so each adapter method first passes
its arguments through the function of the same name here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "allgather",
    "allreduce",
    "gather",
    "options",
    "reduce",
    "reduce_scatter",
    "rooted",
    "scatter",
    "tensor_list",
]


def tensor_list(tensors: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _is_op(value: Any) -> bool:
    return isinstance(value, (dist.ReduceOp, dist.ReduceOp.RedOpType))


def options(opts: Any, kind: type, root: int | None = None, op: Any = None) -> Any:
    """``opts`` if it is an options object; else a default ``kind()`` with ``root``/``op`` set."""
    if opts is not None and not isinstance(opts, int) and not _is_op(opts):
        return opts  # c10d's own call: an options object (all_reduce's serves all_reduce_coalesced)
    made = kind()
    if root is not None:
        made.rootRank = root
    if op is not None:
        made.reduceOp = op if isinstance(op, dist.ReduceOp) else dist.ReduceOp(op)
    return made


def allreduce(tensors: Any, opts: Any, kind: type = dist.AllreduceOptions) -> tuple[list[torch.Tensor], Any]:
    """``(tensors, opts)``, ``(tensors, op)``, ``(tensor, op)`` or ``(tensor)``."""
    return tensor_list(tensors), options(opts, kind, op=opts if _is_op(opts) else None)


def rooted(tensors: Any, opts: Any, kind: type) -> tuple[list[torch.Tensor], Any]:
    """broadcast: ``(tensors, opts)`` or ``(tensor, root)``."""
    return tensor_list(tensors), options(opts, kind, root=opts if isinstance(opts, int) else None)


def reduce(tensors: Any, opts: Any, op: Any = None) -> tuple[list[torch.Tensor], Any]:
    """``(tensors, opts)`` or ``(tensor, root, op=SUM)``."""
    root = opts if isinstance(opts, int) else None
    return tensor_list(tensors), options(opts, dist.ReduceOptions, root=root, op=op)


def allgather(outputs: Any, inputs: Any) -> tuple[list[list[torch.Tensor]], list[torch.Tensor]]:
    """``(output_lists, inputs)`` or ``(outputs, input)``: one list of outputs per input."""
    if isinstance(inputs, torch.Tensor):
        return [list(outputs)], [inputs]
    return [list(o) for o in outputs], list(inputs)


def gather(outputs: Any, inputs: Any, opts: Any) -> tuple[list[list[torch.Tensor]], list[torch.Tensor], Any]:
    """``(output_lists, inputs, opts)`` or ``(outputs, input, root)``."""
    output_lists, input_list = allgather(outputs, inputs)
    return output_lists, input_list, options(opts, dist.GatherOptions, root=opts if isinstance(opts, int) else None)


def scatter(outputs: Any, inputs: Any, opts: Any) -> tuple[list[torch.Tensor], list[list[torch.Tensor]], Any]:
    """``(outputs, input_lists, opts)`` or ``(output, inputs, root)``."""
    root = opts if isinstance(opts, int) else None
    if isinstance(outputs, torch.Tensor):
        return [outputs], [list(inputs)], options(opts, dist.ScatterOptions, root=root)
    return list(outputs), [list(i) for i in inputs], options(opts, dist.ScatterOptions, root=root)


def reduce_scatter(outputs: Any, inputs: Any, opts: Any) -> tuple[list[torch.Tensor], list[list[torch.Tensor]], Any]:
    """``(outputs, input_lists, opts)`` or ``(output, inputs, op=SUM)``."""
    op = opts if _is_op(opts) else None
    if isinstance(outputs, torch.Tensor):
        return [outputs], [list(inputs)], options(opts, dist.ReduceScatterOptions, op=op)
    return list(outputs), [list(i) for i in inputs], options(opts, dist.ReduceScatterOptions, op=op)
