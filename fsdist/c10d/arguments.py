"""A torch call's arguments made ready for an algorithm, the same way on every rank, before any
communication: their call form, their checks, their description, their host copies.

Call forms: c10d always calls ``method(tensors, ..., opts)``. Code that calls a process group
directly (torch's own tests, some frameworks) may use pybind's other overloads: ``pg.allreduce(t)``,
``pg.allreduce([t], ReduceOp.MAX)``, ``pg.broadcast(t, root)``, ``pg.gather(outs, t, root)``...
A Python subclass replaces every overload of a name at once, so each adapter method first passes
its arguments through the function of the same name here (``allreduce``, ``rooted``, ...).

Checks depend only on the call's own arguments and the group's shape, so every rank of a bad
call raises the same ``ValueError`` before it touches a file: the group stays usable (torch's
tests call, catch, and go on), and no rank waits for a peer that already gave up.

Descriptions are what every rank of a group must agree on, as readable text. Each rank
publishes the description of the operation it is in; peers compare it with their own, and a
mismatch becomes an error that shows both sides. Only what must match goes in (op, reduce op,
dtype, shapes, root): all_to_all pieces may differ between ranks, so their shapes stay out.

Staging gives algorithms contiguous CPU tensors: CUDA tensors go through host memory (pinned
when CUDA is available, so the copies can use DMA), non-contiguous CPU tensors through a
contiguous copy; ``Staging.finish`` copies staged outputs back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..collectives.reduce_ops import ReduceKind, Reduction, check_supported
from . import compat

__all__ = [
    "Staging",
    "allgather",
    "allreduce",
    "bytes_moved",
    "check_stageable",
    "check_travel",
    "describe",
    "exactly_one",
    "gather",
    "gather_single",
    "no_list_off_root",
    "one_dtype",
    "one_per_rank",
    "options",
    "own_piece",
    "peer",
    "reduce",
    "reduce_scatter",
    "reduction_of",
    "root",
    "rooted",
    "same",
    "same_list",
    "scaled",
    "scatter",
    "split_even",
    "splits",
    "tensor_list",
]

# ---- call forms ---------------------------------------------------------------------------


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


# ---- checks --------------------------------------------------------------------------------


def root(rank: int, size: int) -> int:
    """``rank`` if it is a rank of a group of ``size``."""
    if not 0 <= rank < size:
        raise ValueError(f"root rank {rank} is outside the group of size {size}")
    return rank


def peer(other: int, verb: str, rank: int, size: int) -> None:
    """A point-to-point partner must be another rank of the group."""
    if not 0 <= other < size:
        raise ValueError(f"cannot {verb} rank {other}: it is outside the group's ranks 0..{size - 1}")
    if other == rank:
        raise ValueError(f"rank {other} cannot {verb} itself")


def same(tensor: torch.Tensor, like: torch.Tensor, name: str) -> None:
    """``tensor`` can stand in for ``like``: stageable, same dtype and element count."""
    check_stageable(tensor)
    if tensor.numel() != like.numel() or tensor.dtype != like.dtype:
        got, expected = f"{tensor.dtype} {list(tensor.shape)}", f"{like.dtype} {list(like.shape)}"
        raise ValueError(f"{name}: tensor {got} does not match {expected}")


def same_list(tensors: Sequence[torch.Tensor], like: torch.Tensor, size: int, name: str) -> None:
    """One tensor per rank, each like ``like``."""
    if len(tensors) != size:
        raise ValueError(f"{name}: expected a list of {size} tensors, got {len(tensors)}")
    for tensor in tensors:
        same(tensor, like, name)


def exactly_one(items: Sequence[Any], name: str) -> Sequence[Any]:
    """c10d passes lists for multi-device calls; fsdist, like Gloo on CPU, takes one per rank."""
    if len(items) != 1:
        raise ValueError(f"{name}: fsdist takes exactly one tensor (list) per rank, got {len(items)}")
    return items


def one_per_rank(items: Sequence[Any], size: int, name: str, what: str) -> None:
    """all_to_all's tensors, all_gather_coalesced's output lists: one per rank."""
    if len(items) != size:
        raise ValueError(f"{name} needs {size} {what}, got {len(items)}")


def one_dtype(tensors: Sequence[torch.Tensor], name: str) -> None:
    """all_to_all's pieces, in and out, are of one dtype (as Gloo asks)."""
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in tensors})
    if len(dtypes) > 1:
        raise ValueError(f"{name}: every input and output tensor must have one dtype, got {', '.join(dtypes)}")


def scaled(smaller: Sequence[torch.Tensor], larger: Sequence[torch.Tensor], size: int, name: str) -> None:
    """The ``*_into_tensor`` forms: each of ``larger`` holds ``size`` × its partner in
    ``smaller``, in its dtype (all_gather's output, reduce_scatter's input)."""
    for small, large in zip(smaller, larger, strict=True):
        if large.numel() != small.numel() * size or large.dtype != small.dtype:
            got = f"{large.numel()} {large.dtype}"
            raise ValueError(f"{name}: {size} × {small.numel()} {small.dtype} expected, got {got}")


def no_list_off_root(lists: Sequence[Any], is_root: bool, name: str, what: str) -> None:
    """gather's outputs and scatter's inputs are the root's alone."""
    if not is_root and lists and any(lists):
        raise ValueError(f"{name}: only the root may pass {what} tensors")


def gather_single(output: torch.Tensor, tensor: torch.Tensor, size: int, is_root: bool) -> None:
    """gather_into_tensor: the root's ``output`` holds ``size`` × ``tensor``; elsewhere torch
    passes an empty placeholder."""
    if is_root:
        scaled([tensor], [output], size, "gather_single")


def own_piece(output: torch.Tensor, out_rows: list[int], tensor: torch.Tensor, in_rows: list[int], rank: int) -> None:
    """all_to_all_single: the piece a rank keeps is as large going out as coming in."""
    out_row = output[0].numel() if output.dim() and len(output) else 1
    in_row = tensor[0].numel() if tensor.dim() and len(tensor) else 1
    if out_rows[rank] * out_row != in_rows[rank] * in_row:
        raise ValueError(
            f"all_to_all_single: rank {rank} keeps {in_rows[rank] * in_row} elements of its input "
            f"but its output has room for {out_rows[rank] * out_row} there"
        )


def split_even(tensor: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """``tensor`` flattened into ``parts`` views (all empty when it is)."""
    flat = tensor.view(-1)
    return list(flat.chunk(parts)) if flat.numel() else [flat] * parts


def splits(tensor: torch.Tensor, sizes: list[int], parts: int, name: str) -> list[int]:
    """all_to_all_single's row counts per rank: as given, or even when none are."""
    rows = tensor.shape[0] if tensor.dim() else 1
    if not sizes:
        if rows % parts:
            raise ValueError(f"all_to_all_single: {name} has {rows} rows, not divisible by {parts} ranks")
        return [rows // parts] * parts
    if len(sizes) != parts or sum(sizes) != rows:
        raise ValueError(f"all_to_all_single: {name} splits {sizes} must be {parts} sizes summing to {rows}")
    return list(sizes)


# ---- descriptions --------------------------------------------------------------------------

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
    """E.g. ``all_reduce SUM float32[1000]`` or ``broadcast root=2 int64[3, 4]``: what every rank
    must agree on (the outputs a gather fills, the pieces of an all_to_all, whose shapes may
    differ from rank to rank, stay out of it)."""
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
        factor = compat.premul_sum_factor(reduce_op)
        if isinstance(factor, torch.Tensor):
            factor = factor.detach().to("cpu")
        reduction = Reduction(kind, factor)
    for tensor in tensors:
        check_supported(reduction, tensor.dtype)
    return reduction


# ---- staging -------------------------------------------------------------------------------


def check_travel(*groups: Iterable[torch.Tensor]) -> None:
    """Every tensor of an operation (its inputs and outputs) can travel: run for every operation
    before it is queued, so a bad one fails its caller and leaves the group usable."""
    for tensors in groups:
        for tensor in tensors:
            check_stageable(tensor)


def check_stageable(tensor: torch.Tensor) -> None:
    """Refuse, in the calling thread and before any communication, what no file can carry."""
    if tensor.layout != torch.strided:
        raise NotImplementedError(
            f"fsdist moves dense (strided) tensors only, not {tensor.layout}: convert with .to_dense() first"
        )
    if tensor.is_meta:
        raise ValueError("fsdist cannot communicate a tensor on the 'meta' device: it holds no data")


class Staging:
    """Collects the staged copies of one operation."""

    def __init__(self) -> None:
        self._copy_back: list[tuple[torch.Tensor, torch.Tensor]] = []

    def input(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous CPU tensor with ``tensor``'s values (``tensor`` itself when it is one)."""
        if _ready(tensor):
            return tensor
        host = _host_buffer(tensor)
        host.copy_(tensor)
        return host

    def output(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous CPU tensor whose final values ``finish`` copies into ``tensor``."""
        if _ready(tensor):
            return tensor
        host = _host_buffer(tensor)
        self._copy_back.append((tensor, host))
        return host

    def inout(self, tensor: torch.Tensor) -> torch.Tensor:
        """Both: staged with its values, copied back after."""
        if _ready(tensor):
            return tensor
        host = self.input(tensor)
        self._copy_back.append((tensor, host))
        return host

    def finish(self) -> None:
        for original, host in self._copy_back:
            original.copy_(host)
        if any(original.is_cuda for original, _ in self._copy_back):
            torch.cuda.current_stream().synchronize()
        self._copy_back.clear()


def _ready(tensor: torch.Tensor) -> bool:
    return tensor.is_cpu and tensor.is_contiguous() and not tensor.is_conj()


def _host_buffer(tensor: torch.Tensor) -> torch.Tensor:
    pin = tensor.is_cuda and torch.cuda.is_available()
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)


def bytes_moved(*groups: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct tensors involved (a tensor used as input and output counts once):
    what the worker queue weighs an operation by, and debug records report."""
    seen: dict[int, int] = {}
    for tensors in groups:
        for tensor in tensors:
            seen[id(tensor)] = tensor.numel() * tensor.element_size()
    return sum(seen.values())
