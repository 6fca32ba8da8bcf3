"""Each benchmarked operation: its buffers, one call, the check of its first result, its bus factor.

Sizes follow nccl-tests: S is the largest buffer a rank holds (all_gather: the output,
reduce_scatter: the input), and bus bandwidth = S / t × a factor that makes it comparable
with the hardware's bandwidth (all_reduce 2(n−1)/n, all_gather / reduce_scatter / all_to_all
(n−1)/n, broadcast and sendrecv 1). Inputs hold small integers in float32, so every correct
result is exact and is compared bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

Group = dist.ProcessGroup


@dataclass
class Case:
    """One operation at one size on one rank, ready to be called repeatedly."""

    nbytes: int  # S as reported (after rounding the element count to the world size)
    run: Callable[[], None]
    check: Callable[[], str | None]  # after the first call: None, or what is wrong
    reset: Callable[[], None]  # after checking: keep later iterations' values bounded


def bus_factor(op: str, world: int) -> float:
    if op == "all_reduce":
        return 2 * (world - 1) / world
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (world - 1) / world
    if op == "barrier":
        return 0.0
    return 1.0


def _zero(tensor: torch.Tensor) -> None:
    tensor.zero_()


def _pattern(count: int) -> torch.Tensor:
    return (torch.arange(count, dtype=torch.int64) % 13 + 1).to(torch.float32)


def _differs(got: torch.Tensor, want: torch.Tensor, what: str) -> str | None:
    if torch.equal(got, want):
        return None
    bad = int((got != want).sum())
    return f"{what}: {bad} of {want.numel()} elements wrong"


def make_case(op: str, nbytes: int, rank: int, world: int, group: Group) -> Case:
    """Build ``op``'s buffers for S = ``nbytes`` (at least one element per rank)."""
    count = max(1, nbytes // 4)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count = max(world, count // world * world)
    builder = _BUILDERS[op]
    return builder(count, rank, world, group)


def _all_reduce(count: int, rank: int, world: int, group: Group) -> Case:
    base = _pattern(count)
    tensor = base * (rank + 1)
    want = base * (world * (world + 1) // 2)
    return Case(
        count * 4,
        lambda: dist.all_reduce(tensor, group=group),
        lambda: _differs(tensor, want, "all_reduce SUM"),
        lambda: _zero(tensor),  # repeated sums of zeros stay zeros (no overflow, no denormals)
    )


def _broadcast(count: int, rank: int, world: int, group: Group) -> Case:
    want = _pattern(count)
    tensor = want.clone() if rank == 0 else torch.zeros(count)
    return Case(
        count * 4,
        lambda: dist.broadcast(tensor, src=dist.get_global_rank(group, 0), group=group),
        lambda: _differs(tensor, want, "broadcast from rank 0"),
        lambda: None,
    )


def _broadcast_bytes(count: int, rank: int, world: int, group: Group) -> Case:
    """A uint8 broadcast of S bytes: what broadcast_object_list sends (a pickle, as bytes)."""
    want = (torch.arange(count * 4, dtype=torch.int64) % 251).to(torch.uint8)
    tensor = want.clone() if rank == 0 else torch.zeros(count * 4, dtype=torch.uint8)
    return Case(
        count * 4,
        lambda: dist.broadcast(tensor, src=dist.get_global_rank(group, 0), group=group),
        lambda: _differs(tensor, want, "broadcast of bytes from rank 0"),
        lambda: None,
    )


def _all_gather(count: int, rank: int, world: int, group: Group) -> Case:
    piece = count // world
    base = _pattern(piece)
    source = base * (rank + 1)
    output = torch.zeros(count)
    want = torch.cat([base * (r + 1) for r in range(world)])
    return Case(
        count * 4,
        lambda: dist.all_gather_into_tensor(output, source, group=group),
        lambda: _differs(output, want, "all_gather_into_tensor"),
        lambda: None,
    )


def _reduce_scatter(count: int, rank: int, world: int, group: Group) -> Case:
    piece = count // world
    base = _pattern(count)
    source = base * (rank + 1)
    output = torch.zeros(piece)
    want = base[rank * piece : (rank + 1) * piece] * (world * (world + 1) // 2)
    return Case(
        count * 4,
        lambda: dist.reduce_scatter_tensor(output, source, group=group),
        lambda: _differs(output, want, "reduce_scatter_tensor SUM"),
        lambda: None,
    )


def _all_to_all(count: int, rank: int, world: int, group: Group) -> Case:
    piece = count // world
    base = _pattern(piece)
    # piece j of rank r holds base × (r·world + j + 1): every (sender, receiver) pair distinct
    source = torch.cat([base * (rank * world + j + 1) for j in range(world)])
    output = torch.zeros(count)
    want = torch.cat([base * (src * world + rank + 1) for src in range(world)])
    return Case(
        count * 4,
        lambda: dist.all_to_all_single(output, source, group=group),
        lambda: _differs(output, want, "all_to_all_single"),
        lambda: None,
    )


def _sendrecv(count: int, rank: int, world: int, group: Group) -> Case:
    """A ring, as nccl-tests' sendrecv: each rank sends S to the next and receives S from the previous."""
    base = _pattern(count)
    source = base * (rank + 1)
    output = torch.zeros(count)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    want = base * (prev + 1)

    def run() -> None:
        ops = [
            dist.P2POp(dist.isend, source, dist.get_global_rank(group, nxt), group),
            dist.P2POp(dist.irecv, output, dist.get_global_rank(group, prev), group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return Case(count * 4, run, lambda: _differs(output, want, "sendrecv ring"), lambda: None)


def _barrier(count: int, rank: int, world: int, group: Group) -> Case:
    return Case(0, lambda: dist.barrier(group=group), lambda: None, lambda: None)


_BUILDERS: dict[str, Callable[[int, int, int, Group], Case]] = {
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "all_to_all": _all_to_all,
    "sendrecv": _sendrecv,
    "barrier": _barrier,
    "broadcast_bytes": _broadcast_bytes,
}
