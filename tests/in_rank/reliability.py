"""Reliability cases run inside rank processes: long loops, full disks, kills at random points."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def _run_dir_files() -> int:
    return sum(len(files) for _, _, files in os.walk(os.environ["FSDIST_TEST_DIR"]))


def many_small_all_reduces(steps: int) -> list[int]:
    """`steps` small all_reduces; returns the most files the run directory ever held (sampled)."""
    most = 0
    t = torch.ones(4)
    for step in range(steps):
        t.fill_(1.0)
        dist.all_reduce(t)
        if step % 250 == 0:
            most = max(most, _run_dir_files())
    assert t[0].item() == dist.get_world_size()
    return [most]


def fill_the_disk(nbytes: int) -> str:
    """Every rank all_reduces a tensor bigger than the filesystem's free space."""
    try:
        dist.all_reduce(torch.ones(nbytes // 4))
    except Exception as exc:  # noqa: BLE001 - the error text is what the test checks
        text = f"{type(exc).__name__}: {exc}"
    else:
        text = "no error"
    return text


def loop_until_killed(op: str, ready_file: str) -> tuple[str, float]:
    """Run `op` in a loop; when a peer is killed, return (error text, time it was raised)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    step = 0
    try:
        while True:
            if op == "all_reduce":
                t = torch.full((1000,), float(rank))
                dist.all_reduce(t)
                assert t[0].item() == sum(range(world)), "wrong result"
            elif op == "broadcast":
                t = torch.full((1000,), float(step)) if rank == 0 else torch.zeros(1000)
                dist.broadcast(t, 0)
                assert t[0].item() == step, "wrong result"
            elif op == "all_gather":
                outs = [torch.zeros(100) for _ in range(world)]
                dist.all_gather(outs, torch.full((100,), float(rank)))
                assert [o[0].item() for o in outs] == list(range(world)), "wrong result"
            elif op == "sendrecv":
                dist.send(torch.full((100,), float(step)), (rank + 1) % world)
                got = torch.zeros(100)
                dist.recv(got, (rank - 1) % world)
                assert got[0].item() == step, "wrong result"
            elif op == "barrier":
                dist.barrier()
            step += 1
            if step == 20:
                open(f"{ready_file}.{rank}", "w").close()  # the parent kills only once all ran a while
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}", time.time()
