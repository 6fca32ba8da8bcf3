"""Collective test cases, run inside every rank of a pool (see harness.py).

Each case loops over every shape (0-d, empty, 1, 1000, non-contiguous, large), runs the
collective twice back to back synchronously and twice asynchronously (both issued before either
is waited on), and compares each output with a reference computed here. It returns the list of
failures (empty when all is well) and a digest of each output, so the parent can also check
that all ranks got bit-identical results.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from reference import (
    DTYPES,
    SHAPES,
    digest,
    make_input,
    mismatch,
    non_contiguous,
    reduce_op,
    reduce_reference,
    supported,
)

Result = dict[str, list[str]]
#: A trial: (seed) -> list of (label, actual, expected) after issuing ops; issue(async_op) -> works
Issue = Callable[[int, bool], tuple[list[Any], Callable[[], list[tuple[str, torch.Tensor, torch.Tensor]]]]]


def _rank_world() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


def _run_trials(label: str, issue: Issue, result: Result) -> None:
    """Twice synchronously, then two async ops issued back to back and waited afterwards.

    The large shape runs once each way: its cost is in bytes, and the small shapes already
    cover back-to-back reuse.
    """
    large = label.endswith("large")
    for seed in (1,) if large else (1, 2):
        works, check = issue(seed, False)
        _record(f"{label} sync#{seed}", check(), result)
    async_seeds = (3,) if large else (3, 4)
    pending = [issue(seed, True) for seed in async_seeds]
    for seed, (works, check) in zip(async_seeds, pending, strict=True):
        for work in works:
            if work is not None:
                work.wait()  # a Work, or a Future where torch returns one (all_reduce_coalesced)
                assert work.is_completed() if hasattr(work, "is_completed") else work.done()
        _record(f"{label} async#{seed}", check(), result)


def _record(label: str, outcomes: list[tuple[str, torch.Tensor, torch.Tensor]], result: Result) -> None:
    for what, actual, expected in outcomes:
        problem = mismatch(actual, expected)
        if problem:
            result["failures"].append(f"{label} {what}: {problem}")
        result["digests"].append(f"{label} {what} {digest(actual)}")


def _shape_input(
    seed: int, rank: int, shape: tuple[int, ...], noncontig: bool, dtype: torch.dtype, op: str = "SUM"
) -> torch.Tensor:
    tensor = make_input(seed, rank, shape, dtype, op)
    return non_contiguous(tensor) if noncontig else tensor


def _expect_unsupported(call: Callable[[], Any], result: Result) -> None:
    try:
        call()
    except ValueError as exc:
        if "support" not in str(exc):
            result["failures"].append(f"unclear error for an unsupported op: {exc}")
    else:
        result["failures"].append("an unsupported (op, dtype) did not raise ValueError")
    dist.barrier()  # the group must still work after a refused call


def _new_result() -> Result:
    return {"failures": [], "digests": []}


def all_reduce(op: str, dtype_name: str) -> Result:
    rank, world = _rank_world()
    dtype, result = DTYPES[dtype_name], _new_result()
    if not supported(op, dtype, all_reduce=True):
        _expect_unsupported(lambda: dist.all_reduce(torch.zeros(3, dtype=dtype), op=reduce_op(op)), result)
        return result
    for label, shape, noncontig in SHAPES:

        def issue(seed: int, async_op: bool, shape=shape, noncontig=noncontig) -> Any:
            inputs = [_shape_input(seed, r, shape, noncontig, dtype, op) for r in range(world)]
            tensor = inputs[rank].clone() if not noncontig else non_contiguous(inputs[rank].clone())
            work = dist.all_reduce(tensor, op=reduce_op(op), async_op=async_op)
            return [work], lambda: [("", tensor, reduce_reference(inputs, op))]

        _run_trials(label, issue, result)
    return result


def reduce(op: str, dtype_name: str) -> Result:
    rank, world = _rank_world()
    dtype, result = DTYPES[dtype_name], _new_result()
    if not supported(op, dtype):
        _expect_unsupported(lambda: dist.reduce(torch.zeros(3, dtype=dtype), dst=0, op=reduce_op(op)), result)
        return result
    for root in range(world):
        for label, shape, noncontig in _shapes_for_root(root, world):

            def issue(seed: int, async_op: bool, shape=shape, noncontig=noncontig, root=root) -> Any:
                inputs = [_shape_input(seed, r, shape, noncontig, dtype, op) for r in range(world)]
                tensor = inputs[rank].clone()
                work = dist.reduce(tensor, dst=root, op=reduce_op(op), async_op=async_op)
                expected = reduce_reference(inputs, op) if rank == root else inputs[rank]
                return [work], lambda: [("", tensor, expected)]

            _run_trials(f"root={root} {label}", issue, result)
    return result


def reduce_scatter(op: str, dtype_name: str) -> Result:
    rank, world = _rank_world()
    dtype, result = DTYPES[dtype_name], _new_result()
    if not supported(op, dtype):
        _expect_unsupported(
            lambda: dist.reduce_scatter(
                torch.zeros(3, dtype=dtype), [torch.zeros(3, dtype=dtype)] * world, op=reduce_op(op)
            ),
            result,
        )
        return result
    for label, shape, noncontig in _piece_shapes(world):
        # each rank draws only what it sends and the pieces the others send it (2N-1 inputs,
        # not N²: drawing inputs was most of this case's time at 4 ranks)
        def issue_list(seed: int, async_op: bool, shape=shape, noncontig=noncontig) -> Any:
            def piece(sender: int, k: int) -> torch.Tensor:
                return _shape_input(seed * 31 + k, sender, shape, noncontig, dtype, op)

            mine = [piece(rank, k) for k in range(world)]
            output = torch.empty(shape, dtype=dtype)
            work = dist.reduce_scatter(output, mine, op=reduce_op(op), async_op=async_op)
            expected = reduce_reference([mine[r] if r == rank else piece(r, rank) for r in range(world)], op)
            return [work], lambda: [("list", output, expected)]

        def issue_tensor(seed: int, async_op: bool, shape=shape) -> Any:
            def piece(sender: int, k: int) -> torch.Tensor:
                return make_input(seed * 31 + k, sender, shape, dtype, op)

            mine = torch.cat([piece(rank, k).reshape(-1) for k in range(world)])
            output = torch.empty(shape, dtype=dtype)  # N-d output, flat input: sizes are what must match
            work = dist.reduce_scatter_tensor(output, mine, op=reduce_op(op), async_op=async_op)
            n = output.numel()
            expected = reduce_reference(
                [mine[rank * n : (rank + 1) * n].view(shape) if r == rank else piece(r, rank) for r in range(world)],
                op,
            )
            return [work], lambda: [("tensor", output, expected)]

        _run_trials(label, issue_list, result)
        _run_trials(label, issue_tensor, result)
    return result


def _shapes_for_root(root: int, world: int, shapes: list | None = None) -> list[tuple[str, tuple[int, ...], bool]]:
    """Every shape for the last root; all but the large one for the other roots (time)."""
    shapes = SHAPES if shapes is None else shapes
    return [s for s in shapes if root == world - 1 or s[0] != "large"]


def _piece_shapes(world: int) -> list[tuple[str, tuple[int, ...], bool]]:
    """SHAPES with the large one cut so that the whole input stays a few MB."""
    return [(label, (shape[0] // world,) if label == "large" else shape, nc) for label, shape, nc in SHAPES]


def broadcast(dtype_name: str) -> Result:
    rank, world = _rank_world()
    dtype, result = DTYPES[dtype_name], _new_result()
    for root in range(world):
        for label, shape, noncontig in _shapes_for_root(root, world):

            def issue(seed: int, async_op: bool, shape=shape, noncontig=noncontig, root=root) -> Any:
                expected = _shape_input(seed, root, shape, noncontig, dtype)
                tensor = expected.clone() if rank == root else torch.zeros_like(expected)
                if noncontig:
                    tensor = non_contiguous(tensor)
                work = dist.broadcast(tensor, src=root, async_op=async_op)
                return [work], lambda: [("", tensor, expected)]

            _run_trials(f"root={root} {label}", issue, result)
    return result


def all_gather(dtype_name: str) -> Result:
    rank, world = _rank_world()
    dtype, result = DTYPES[dtype_name], _new_result()
    for label, shape, noncontig in _piece_shapes(world):

        def issue_list(seed: int, async_op: bool, shape=shape, noncontig=noncontig) -> Any:
            inputs = [_shape_input(seed, r, shape, noncontig, dtype) for r in range(world)]
            outputs = [torch.zeros(shape, dtype=dtype) for _ in range(world)]
            if noncontig:
                outputs = [non_contiguous(o) for o in outputs]
            work = dist.all_gather(outputs, inputs[rank], async_op=async_op)
            return [work], lambda: [(f"list[{r}]", outputs[r], inputs[r]) for r in range(world)]

        def issue_tensor(seed: int, async_op: bool, shape=shape) -> Any:
            inputs = [make_input(seed, r, shape, dtype) for r in range(world)]
            output = torch.zeros((world, *shape), dtype=dtype)
            work = dist.all_gather_into_tensor(output, inputs[rank], async_op=async_op)
            return [work], lambda: [("into_tensor", output, torch.stack(inputs))]

        def issue_coalesced(seed: int, async_op: bool, shape=shape) -> Any:
            inputs = [[make_input(seed * 3 + k, r, shape, dtype) for k in range(2)] for r in range(world)]
            outputs = [[torch.zeros(shape, dtype=dtype) for _ in range(2)] for _ in range(world)]
            work = dist.all_gather_coalesced(outputs, inputs[rank], async_op=async_op)
            return [work], lambda: [
                (f"coalesced[{r}][{k}]", outputs[r][k], inputs[r][k]) for r in range(world) for k in range(2)
            ]

        _run_trials(label, issue_list, result)
        _run_trials(label, issue_tensor, result)
        _run_trials(label, issue_coalesced, result)
    return result


def gather(dtype_name: str) -> Result:
    rank, world = _rank_world()
    dtype, result = DTYPES[dtype_name], _new_result()
    for root in range(world):
        for label, shape, noncontig in _shapes_for_root(root, world, _piece_shapes(world)):

            def issue(seed: int, async_op: bool, shape=shape, noncontig=noncontig, root=root) -> Any:
                inputs = [_shape_input(seed, r, shape, noncontig, dtype) for r in range(world)]
                outputs = [torch.zeros(shape, dtype=dtype) for _ in range(world)] if rank == root else None
                work = dist.gather(inputs[rank], outputs, dst=root, async_op=async_op)
                if rank != root:
                    return [work], lambda: []
                return [work], lambda: [(f"[{r}]", outputs[r], inputs[r]) for r in range(world)]

            _run_trials(f"root={root} {label}", issue, result)

            def issue_single(seed: int, async_op: bool, shape=shape, noncontig=noncontig, root=root) -> Any:
                inputs = [_shape_input(seed, r, shape, noncontig, dtype) for r in range(world)]
                output = torch.zeros((world, *shape), dtype=dtype) if rank == root else None
                work = _gather_single(inputs[rank], output, root, async_op)
                if rank != root:
                    return [work], lambda: []
                return [work], lambda: [(f"[{r}]", output[r], inputs[r]) for r in range(world)]

            _run_trials(f"gather_single root={root} {label}", issue_single, result)
    return result


def _gather_single(tensor: torch.Tensor, output: torch.Tensor | None, root: int, async_op: bool) -> Any:
    """torch >= 2.14's ``dist.gather_into_tensor``; on an older torch, which has no such call, the
    group's method that it calls, called directly."""
    if hasattr(dist, "gather_into_tensor"):
        return dist.gather_into_tensor(tensor, output, dst=root, async_op=async_op)
    opts = dist.GatherOptions()
    opts.rootRank = root
    work = dist.group.WORLD.gather_single(output if output is not None else tensor.new_empty(0), tensor, opts)
    if async_op:
        return work
    work.wait()
    return None


def scatter(dtype_name: str) -> Result:
    rank, world = _rank_world()
    dtype, result = DTYPES[dtype_name], _new_result()
    for root in range(world):
        for label, shape, noncontig in _shapes_for_root(root, world, _piece_shapes(world)):

            def issue(seed: int, async_op: bool, shape=shape, noncontig=noncontig, root=root) -> Any:
                pieces = [_shape_input(seed * 5 + k, root, shape, noncontig, dtype) for k in range(world)]
                output = torch.zeros(shape, dtype=dtype)
                if noncontig:
                    output = non_contiguous(output)
                work = dist.scatter(output, pieces if rank == root else None, src=root, async_op=async_op)
                return [work], lambda: [("", output, pieces[rank])]

            _run_trials(f"root={root} {label}", issue, result)
    return result


def all_to_all(dtype_name: str) -> Result:
    rank, world = _rank_world()
    dtype, result = DTYPES[dtype_name], _new_result()
    for label, shape, noncontig in _piece_shapes(world):

        def issue_list(seed: int, async_op: bool, shape=shape, noncontig=noncontig) -> Any:
            # piece[src][dst]
            pieces = [
                [_shape_input(seed * 11 + dst, src, shape, noncontig, dtype) for dst in range(world)]
                for src in range(world)
            ]
            outputs = [torch.zeros(shape, dtype=dtype) for _ in range(world)]
            work = dist.all_to_all(outputs, pieces[rank], async_op=async_op)
            return [work], lambda: [(f"list[{src}]", outputs[src], pieces[src][rank]) for src in range(world)]

        _run_trials(label, issue_list, result)

    def issue_uneven(seed: int, async_op: bool) -> Any:
        # rank src sends (src + dst + 1) rows of 3 to dst; some pieces are empty when seed is even
        rows = [[(src + dst + seed) % 3 for dst in range(world)] for src in range(world)]
        data = [make_input(seed, src, (sum(rows[src]), 3), dtype) for src in range(world)]
        out_rows = [rows[src][rank] for src in range(world)]
        output = torch.zeros((sum(out_rows), 3), dtype=dtype)
        work = dist.all_to_all_single(output, data[rank], out_rows, rows[rank], async_op=async_op)
        expected = torch.cat([data[src].split(rows[src])[rank] for src in range(world)])
        return [work], lambda: [("single-uneven", output, expected)]

    def issue_even(seed: int, async_op: bool) -> Any:
        data = [make_input(seed, src, (world * 4, 2), dtype) for src in range(world)]
        output = torch.zeros((world * 4, 2), dtype=dtype)
        work = dist.all_to_all_single(output, data[rank], async_op=async_op)
        expected = torch.cat([data[src].chunk(world)[rank] for src in range(world)])
        return [work], lambda: [("single-even", output, expected)]

    _run_trials("uneven", issue_uneven, result)
    _run_trials("even", issue_even, result)
    return result


def coalesced(op: str, dtype_name: str) -> Result:
    """all_reduce_coalesced and the coalescing manager (which uses the *_coalesced methods)."""
    rank, world = _rank_world()
    dtype, result = DTYPES[dtype_name], _new_result()
    if not supported(op, dtype, all_reduce=True):
        _expect_unsupported(lambda: dist.all_reduce_coalesced([torch.zeros(3, dtype=dtype)], op=reduce_op(op)), result)
        return result

    def issue(seed: int, async_op: bool) -> Any:
        shapes = [(), (0,), (7,), (3, 5), (300_000,)]
        inputs = [[make_input(seed * 13 + k, r, s, dtype, op) for k, s in enumerate(shapes)] for r in range(world)]
        tensors = [x.clone() for x in inputs[rank]]
        work = dist.all_reduce_coalesced(tensors, op=reduce_op(op), async_op=async_op)
        return [work], lambda: [
            (f"[{k}]", tensors[k], reduce_reference([inputs[r][k] for r in range(world)], op))
            for k in range(len(shapes))
        ]

    _run_trials("all_reduce_coalesced", issue, result)
    return result


def barrier_and_ordering() -> Result:
    """barrier, sync and async; then many async ops in flight at once finish in issue order."""
    rank, world = _rank_world()
    result = _new_result()
    for _ in range(3):
        dist.barrier()
    dist.barrier(async_op=True).wait()
    tensors = [torch.full((5,), float(rank + i)) for i in range(20)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    futures = [w.get_future() for w in works]
    for i, fut in enumerate(futures):
        value = fut.wait()
        expected = torch.full((5,), float(sum(range(world)) + world * i))
        _record(f"future[{i}]", [("", value[0], expected), ("", tensors[i], expected)], result)
    return result


def callback_issues_a_collective() -> Result:
    """A future callback that issues a collective and waits for it (as DDP's PowerSGD hook does)."""
    world = dist.get_world_size()
    result = _new_result()

    def callback(fut: Any) -> torch.Tensor:
        inner = torch.ones(2)
        dist.all_reduce(inner, async_op=True).get_future().wait()
        return fut.value()[0] + inner

    t = torch.ones(2)
    out = dist.all_reduce(t, async_op=True).get_future().then(callback).wait()
    _record("callback", [("", out, torch.full((2,), 2.0 * world))], result)
    return result


def run_ahead_is_bounded() -> list[int]:
    """Rank 0 broadcasts 300 times without waiting; the others start late. Rank 0's unread files
    must stay bounded (it pauses RUN_AHEAD ops ahead), and every broadcast must arrive."""
    import glob
    import os
    import time

    from fsdist.defaults import RUN_AHEAD

    rank = dist.get_rank()
    if rank != 0:
        time.sleep(1.0)
    most = 0
    for i in range(300):
        t = torch.tensor([float(i)]) if rank == 0 else torch.zeros(1)
        dist.broadcast(t, 0)
        assert t.item() == i
        if rank == 0 and i % 10 == 0:
            group_dir = glob.glob(os.path.join(os.environ["FSDIST_TEST_DIR"], "gen-*", "groups", "*"))
            most = max(most, sum(len(glob.glob(os.path.join(d, "m*.r0"))) for d in group_dir))
    dist.barrier()
    # it holds back once its oldest uncollected message is more than RUN_AHEAD operations old,
    # collecting first: at most RUN_AHEAD + 1 messages (oldest through newest) remain
    return [most, RUN_AHEAD + 1]


def large_run_ahead_is_bounded_in_bytes() -> list[int]:
    """Rank 0 broadcasts 40 × 4 MiB without waiting; the others start late. Before a file that
    would take its unread files past GC_BYTES it waits for readers (Outbox.make_room), so it
    holds at most GC_BYTES / 4 MiB + 1 of them (RUN_AHEAD alone would let all 40 pile up)."""
    import glob
    import os
    import time

    from fsdist.defaults import GC_BYTES

    rank = dist.get_rank()
    numel = (4 << 20) // 4
    if rank != 0:
        time.sleep(1.0)
    most = 0
    for i in range(40):
        t = torch.full((numel,), float(i)) if rank == 0 else torch.zeros(numel)
        dist.broadcast(t, 0)
        assert t[0].item() == i and t[-1].item() == i
        if rank == 0:
            group_dir = glob.glob(os.path.join(os.environ["FSDIST_TEST_DIR"], "gen-*", "groups", "*"))
            most = max(most, sum(len(glob.glob(os.path.join(d, "m*.r0"))) for d in group_dir))
    dist.barrier()
    return [most, GC_BYTES // (4 << 20) + 1]


def direct_process_group_calls() -> Result:
    """Calling the process group object with pybind's other overloads, as torch's own tests and
    some frameworks do: ``pg.allreduce(t)``, ``pg.broadcast(t, root)``, ``pg.gather(outs, t, root)``."""
    rank, world = _rank_world()
    pg = dist.distributed_c10d._get_default_group()
    result = _new_result()
    mine = torch.full((3,), float(rank + 1))
    every = [torch.full((3,), float(r + 1)) for r in range(world)]
    total = sum(every)

    def check(label: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
        _record(label, [(label, actual, expected)], result)

    t = mine.clone()
    check("allreduce(tensor)", pg.allreduce(t).get_future().wait()[0], total)
    t = mine.clone()
    check("allreduce([t], MAX)", pg.allreduce([t], dist.ReduceOp.MAX).get_future().wait()[0], every[-1])
    t = mine.clone()
    tripled = pg.allreduce([t]).get_future().then(lambda f: [x * 3 for x in f.wait()]).wait()[0]
    check("allreduce future then", tripled, total * 3)
    t = mine.clone()
    pg.broadcast(t, world - 1).wait()
    check("broadcast(tensor, root)", t, every[-1])
    t = mine.clone()
    pg.reduce(t, 0, dist.ReduceOp.SUM).wait()
    if rank == 0:
        check("reduce(tensor, root, op)", t, total)
    outs = [torch.zeros(3) for _ in range(world)]
    pg.allgather(outs, mine).wait()
    check("allgather(outputs, tensor)", torch.stack(outs), torch.stack(every))
    outs = [torch.zeros(3) for _ in range(world)] if rank == 0 else []
    pg.gather(outs, mine, 0).wait()
    if rank == 0:
        check("gather(outputs, tensor, root)", torch.stack(outs), torch.stack(every))
    out = torch.zeros(3)
    pg.scatter(out, every if rank == 0 else [], 0).wait()
    check("scatter(output, inputs, root)", out, every[rank])
    out = torch.zeros(3)
    pg.reduce_scatter(out, [mine.clone() for _ in range(world)], dist.ReduceOp.SUM).wait()
    check("reduce_scatter(output, inputs, op)", out, total)
    pg.barrier().wait()
    return result


def sparse_all_reduce() -> Result:
    """Sparse COO all_reduce SUM (Gloo has it; DDP uses it for sparse gradients): 1–3 sparse and
    0–3 dense dimensions with overlapping indices, as torch's own simple_sparse_reduce_tests, plus
    an empty tensor on some ranks."""

    def sparse(r: int, sparse_dims: int, dense_dims: int) -> torch.Tensor:
        indices = torch.arange(r + 1).reshape(1, r + 1)  # rank r holds rows 0..r: they overlap
        shape = [world] + [2] * dense_dims
        for _ in range(sparse_dims - 1):
            indices = torch.cat((indices, torch.zeros(1, r + 1, dtype=torch.int64)))
            shape.append(world)
        return torch.sparse_coo_tensor(indices, torch.ones([r + 1] + [2] * dense_dims), shape)

    rank, world = _rank_world()
    result = _new_result()
    for sparse_dims, dense_dims in [(1, 0), (2, 0), (3, 0), (1, 1), (1, 2), (1, 3)]:
        tensor = sparse(rank, sparse_dims, dense_dims)
        expected = sum(sparse(r, sparse_dims, dense_dims).to_dense() for r in range(world))
        dist.all_reduce(tensor)
        label = f"{sparse_dims} sparse + {dense_dims} dense dims"
        _record(label, [("sum", tensor.to_dense(), expected)], result)
        if not tensor.is_sparse:
            result["failures"].append(f"{label}: the result is no longer sparse")
    empty_on_odd = torch.sparse_coo_tensor(torch.tensor([[rank]]), torch.ones(1), (world,))
    if rank % 2:
        empty_on_odd = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0), (world,))
    dist.all_reduce(empty_on_odd)
    expected = torch.tensor([1.0 if r % 2 == 0 else 0.0 for r in range(world)])
    _record("empty on odd ranks", [("sum", empty_on_odd.to_dense(), expected)], result)
    try:
        dist.all_reduce(empty_on_odd, op=dist.ReduceOp.MAX)
        result["failures"].append("sparse MAX was accepted")
    except ValueError as exc:
        if "SUM only" not in str(exc):
            result["failures"].append(f"sparse MAX: unexpected message {exc}")
    return result


def small_messages_leave_no_files() -> list[int]:
    """50 small all_reduces, all_gathers and ring exchanges (isend/irecv): how many message files
    of theirs ever appeared in the group directories (inline slots carry them; with
    FSDIST_INLINE=0 every one is a file). Files that earlier cases left for garbage collection
    are not counted."""
    import glob
    import os

    def message_files() -> set[str]:
        group_dirs = glob.glob(os.path.join(os.environ["FSDIST_TEST_DIR"], "gen-*", "groups", "*"))
        return {
            path for d in group_dirs for pattern in ("m*", "p*-*.*") for path in glob.glob(os.path.join(d, pattern))
        }

    rank, world = _rank_world()
    dist.barrier()
    before = message_files()
    most = 0
    for i in range(50):
        t = torch.full((2,), float(rank + i))
        dist.all_reduce(t)
        assert t.tolist() == [float(sum(range(world)) + world * i)] * 2
        outs = [torch.empty(1, dtype=torch.int32) for _ in range(world)]
        dist.all_gather(outs, torch.tensor([rank * i], dtype=torch.int32))
        assert [o.item() for o in outs] == [r * i for r in range(world)]
        if world > 1:
            got = torch.zeros(3, dtype=torch.float64)
            ops = [
                dist.P2POp(
                    dist.isend, torch.full((3,), float(rank * 100 + i), dtype=torch.float64), (rank + 1) % world
                ),
                dist.P2POp(dist.irecv, got, (rank - 1) % world),
            ]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            assert got.tolist() == [float((rank - 1) % world * 100 + i)] * 3
        most = max(most, len(message_files() - before))
    dist.barrier()
    return [most]


def async_ops_progress_while_the_caller_blocks_elsewhere() -> list[str]:
    """An async collective must run without its caller waiting for it: rank 0 starts an
    all_reduce and then blocks in a receive that rank 1 only sends after the all_reduce. (A
    synchronous small op runs on its caller's thread; an async one must not wait for that.)"""

    rank, world = _rank_world()
    t = torch.ones(3)
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        got = torch.zeros(1)
        dist.recv(got, src=1)
        work.wait()
        assert got.item() == 7.0
    else:
        dist.all_reduce(t)
        if rank == 1:
            dist.send(torch.tensor([7.0]), dst=0)
    assert t.tolist() == [float(world)] * 3
    # rank 0 blocks outside fsdist (no wait() or receive to run anything): the worker must take
    # the op, also after the group was idle long enough for the worker to stop looking
    for idle in (0.0, 0.5):
        time.sleep(idle)
        u = torch.ones(2)
        if rank == 0:
            work = dist.all_reduce(u, async_op=True)
            threading.Event().wait(0.5)
            assert work.is_completed(), f"an async all_reduce did not run while its caller slept (idle {idle} s)"
            work.wait()
        else:
            dist.all_reduce(u)
        assert u.tolist() == [float(world)] * 2
    # a small op its caller waits for at once runs on the caller's thread; a large one on the worker
    pg = dist.distributed_c10d._get_default_group()
    here = threading.current_thread().name
    small = [pg.allreduce([torch.ones(2)]) for _ in range(1)]
    ran = []
    for _ in range(20):
        work = pg.allreduce([torch.ones(2)])
        work.wait()
        ran.append(work.ran_on)
    from fsdist.defaults import INLINE_RUN_BYTES

    large = pg.allreduce([torch.ones(INLINE_RUN_BYTES // 4 + 1)])  # past what a caller runs itself
    large.wait()
    small[0].wait()
    dist.barrier()
    return [f"{sum(r == here for r in ran)} of 20 on the caller", large.ran_on]


def polls_per_multi_part_operation() -> float:
    """Polling waits per operation while reading a message of 8 parts: a rank that waited for
    a peer's step once knows the step is there for the other 7 parts (each poll that finds the
    step gone quiet sleeps up to 10 ms waiting for a ring that was already taken)."""
    import fsdist.files.waiting as waiter

    polls = [0]
    real_poll = waiter.poll

    def counted(*args: Any, **kwargs: Any) -> Any:
        polls[0] += 1
        return real_poll(*args, **kwargs)

    tensors = [torch.ones(3) for _ in range(8)]
    dist.barrier()
    waiter.poll = counted
    try:
        for _ in range(20):
            dist.all_reduce_coalesced(tensors)
    finally:
        waiter.poll = real_poll
    return polls[0] / 20


def files_an_all_reduce_enters(numels: list[int]) -> list[list[str]]:
    """For each size: the package's files one all_reduce of that many float32 enters on this
    rank, in the order first entered (every thread of a fresh group profiled: its worker too)."""
    import os
    import sys

    import fsdist

    package = os.path.dirname(fsdist.__file__) + os.sep
    entered: list[str] = []
    tracing = [False]

    def profile(frame: Any, event: str, arg: Any) -> None:
        name = frame.f_code.co_filename
        if tracing[0] and event == "call" and name.startswith(package):
            if (relative := name[len(package) :]) not in entered:
                entered.append(relative)

    threading.setprofile(profile)  # before the group exists: its threads start profiled
    try:
        group = dist.new_group(list(range(dist.get_world_size())))
        found = []
        for numel in numels:
            x = torch.ones(numel)
            for _ in range(5):
                dist.all_reduce(x, group=group)
            dist.barrier(group=group)
            entered.clear()
            sys.setprofile(profile)
            tracing[0] = True
            dist.all_reduce(x, group=group)
            tracing[0] = False
            sys.setprofile(None)
            found.append(list(entered))
            dist.barrier(group=group)
        dist.destroy_process_group(group)
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        sys.setprofile(None)
    return found
