"""Failure cases run inside rank processes: each returns the error it saw, as text."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def error_text(call) -> str:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the error text is what the test checks
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def one_rank_skips_all_reduce() -> str:
    """Rank 1 never calls the all_reduce; rank 0 must time out with a message that says where."""
    if dist.get_rank() == 1:
        time.sleep(5)
        return "skipped"
    return error_text(lambda: dist.all_reduce(torch.ones(3)))


def shapes_disagree() -> str:
    """Rank 0 reduces 12 elements, the others 10: every rank must say so, showing both sides."""
    n = 12 if dist.get_rank() == 0 else 10
    return error_text(lambda: dist.all_reduce(torch.ones(n)))


def ops_disagree(async_op: bool) -> list[str]:
    """Rank 0 calls all_gather where the others call all_reduce; then a later call on the broken group."""
    rank, world = dist.get_rank(), dist.get_world_size()

    def call() -> None:
        if rank == 0:
            work = dist.all_gather([torch.zeros(4) for _ in range(world)], torch.ones(4), async_op=async_op)
        else:
            work = dist.all_reduce(torch.ones(4), async_op=async_op)
        if async_op:
            try:
                work.get_future().wait()
            except Exception:  # noqa: BLE001 - the future must fail too; wait() then raises
                pass
            work.wait()

    first = error_text(call)
    later = error_text(lambda: dist.all_reduce(torch.ones(1)))
    return [first, later]


def peer_dies_during_all_reduce() -> str:
    """Rank 1 dies; rank 0, waiting in all_reduce, must name it (long before the group timeout)."""
    if dist.get_rank() == 1:
        time.sleep(0.5)
        os._exit(9)
    start = time.monotonic()
    text = error_text(lambda: dist.all_reduce(torch.ones(3)))
    return f"{text} [after {time.monotonic() - start:.2f} s]"


def roots_disagree() -> str:
    """Each rank broadcasts as if it were the root: nobody ever waits, yet all must find out."""
    rank = dist.get_rank()

    def loop() -> None:
        for _ in range(200):
            dist.broadcast(torch.ones(4), src=rank)

    return error_text(loop)


def dtypes_disagree() -> str:
    """Rank 0 reduces float64, the others float32 (same shape): every rank must say so."""
    dtype = torch.float64 if dist.get_rank() == 0 else torch.float32
    return error_text(lambda: dist.all_reduce(torch.ones(8, dtype=dtype)))


def modes_of_everything_in_the_run_directory() -> list[str]:
    """Every directory 0700 and file 0600 (unless FSDIST_GROUP_ACCESS): the directory is shared."""
    dist.all_reduce(torch.ones(4))
    dist.send(torch.ones(1), (dist.get_rank() + 1) % dist.get_world_size())
    wrong = []
    for base, dirs, files in os.walk(os.environ["FSDIST_TEST_DIR"]):
        for name in [*dirs, *files]:
            try:
                mode = os.stat(os.path.join(base, name)).st_mode & 0o777
            except FileNotFoundError:
                continue  # a peer's temporary file, renamed since the listing
            if mode & 0o077:
                wrong.append(f"{name}{'/' if name in dirs else ''} {oct(mode)}")
    dist.recv(torch.zeros(1), (dist.get_rank() - 1) % dist.get_world_size())
    return wrong


def tensors_no_file_can_carry() -> list[str]:
    """Meta tensors, and sparse ones outside all_reduce, are refused before any communication;
    the group stays usable."""
    peer, world = (dist.get_rank() + 1) % dist.get_world_size(), dist.get_world_size()
    texts = [
        error_text(lambda: dist.all_reduce(torch.ones(3, device="meta"))),
        error_text(lambda: dist.broadcast(torch.ones(3, device="meta"), src=0)),
        error_text(lambda: dist.send(torch.ones(3, device="meta"), peer)),
        error_text(lambda: dist.broadcast(torch.ones(3).to_sparse(), src=0)),  # all_reduce has sparse SUM
        # the tensors an operation does not describe (issue 48, 1): refused alike, not in the worker
        error_text(lambda: dist.all_to_all_single(torch.empty(4, device="meta"), torch.ones(4))),
        error_text(lambda: dist.all_to_all([torch.ones(2) for _ in range(world)], [torch.ones(2).to_sparse()] * world)),
        error_text(lambda: dist.all_gather([torch.empty(3, device="meta") for _ in range(world)], torch.ones(3))),
        error_text(lambda: dist.reduce_scatter(torch.ones(3), [torch.ones(3).to_sparse()] * world)),
    ]
    after = torch.ones(2)
    dist.all_reduce(after)
    texts.append(f"then all_reduce gave {after.tolist()}")
    return texts


def reduce_ops_disagree() -> str:
    """Rank 0 asks for MAX where the others ask for SUM (same tensor): every rank must say so."""
    op = dist.ReduceOp.MAX if dist.get_rank() == 0 else dist.ReduceOp.SUM
    return error_text(lambda: dist.all_reduce(torch.ones(5), op=op))


def _calls_with(bad: torch.Tensor, good: torch.Tensor) -> dict[str, object]:
    """Every op once, ``bad`` where one of its tensors goes (the rest like ``good``)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    peer = (rank + 1) % world

    def many(tensor: torch.Tensor) -> list[torch.Tensor]:
        return [tensor.clone() if not tensor.is_meta else tensor for _ in range(world)]

    def big(tensor: torch.Tensor) -> torch.Tensor:  # world × its size, of its kind
        if tensor.is_meta:
            return torch.empty(tensor.numel() * world, device="meta")
        if tensor.layout != torch.strided:
            return tensor.to_dense().repeat(world).to_sparse()
        return tensor.repeat(world)

    return {
        "broadcast": lambda: dist.broadcast(bad, src=0),
        "all_reduce": lambda: dist.all_reduce(bad, op=dist.ReduceOp.MAX),
        "reduce": lambda: dist.reduce(bad, dst=0, op=dist.ReduceOp.MAX),
        "all_gather": lambda: dist.all_gather(many(good), bad),
        "all_gather outputs": lambda: dist.all_gather(many(bad), good),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(big(bad), good),
        "gather": lambda: dist.gather(bad, many(good) if rank == 0 else None, dst=0),
        "scatter": lambda: dist.scatter(bad, many(good) if rank == 0 else None, src=0),
        "reduce_scatter": lambda: dist.reduce_scatter(good, many(bad)),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(good, big(bad)),
        "all_to_all": lambda: dist.all_to_all(many(good), many(bad)),
        "all_to_all_single": lambda: dist.all_to_all_single(big(good), big(bad)),
        "send": lambda: dist.send(bad, peer) if rank == 0 else None,  # (rank 0 alone: nothing is sent)
        "recv": lambda: dist.recv(bad, peer) if rank == 0 else None,
    }


def a_bad_tensor_in_every_op(kind: str) -> dict[str, str]:
    """Each op with one bad tensor (``kind``: a meta tensor, a sparse one, a dtype that does not
    fit the op or its partner tensors) on every rank: what the call raised, and whether the
    all_reduce right after it gave the right sum (the group still usable)."""
    good = torch.ones(4)
    bad = {
        "meta": torch.ones(4, device="meta"),
        "sparse": torch.ones(4).to_sparse(),
        "dtype": torch.ones(4, dtype=torch.complex64),  # MAX has no order on it; partners are float32
    }[kind]
    said: dict[str, str] = {}
    calls = _calls_with(bad, good)
    if kind == "dtype":  # any dtype travels where nothing else constrains it (broadcast, send,
        # recv), what only the root can judge is a desync (gather, scatter), and torch sends a
        # complex all_to_all piece as its real view: int64 pieces among float32 ones there
        ints = _calls_with(torch.ones(4, dtype=torch.int64), good)
        calls = {
            name: ints[name] if name.startswith("all_to_all") else call
            for name, call in calls.items()
            if name not in ("broadcast", "send", "recv", "gather", "scatter")
        }
    for name, call in calls.items():
        text = error_text(call)
        after = torch.ones(2)
        next_op = error_text(lambda: dist.all_reduce(after))
        said[name] = f"{text} | then all_reduce: {next_op} {after.tolist()}"
    return said
