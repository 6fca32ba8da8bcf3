"""Cases for rendezvous and lifecycle, run in rank processes started without a process group."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def init_by_env_and_reduce(url: str, env: dict[str, str]) -> float:
    """Join through environment variables only, all_reduce once, leave."""
    import fsdist  # noqa: F401

    os.environ.update(env)
    dist.init_process_group("fsdist", init_method=url, timeout=timedelta(seconds=60))
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


def init_twice(directory: str, rank: int, world: int) -> list[float]:
    """Two jobs one after the other in one directory (same processes): both work."""
    import fsdist  # noqa: F401

    values = []
    for _ in range(2):
        dist.init_process_group("fsdist", init_method=f"fsdist://{directory}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))  # fmt: skip
        t = torch.ones(1)
        dist.all_reduce(t)
        values.append(t.item())
        dist.destroy_process_group()
    return values


def crash_mid_collective(directory: str, rank: int, world: int) -> None:
    """Join, publish part of a collective's traffic, and die without cleaning up."""
    import fsdist  # noqa: F401

    dist.init_process_group("fsdist", init_method=f"fsdist://{directory}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))  # fmt: skip
    dist.all_reduce(torch.ones(10))
    if dist.get_rank() == 0:
        os._exit(3)
    dist.all_reduce(torch.ones(10))  # the others wait for rank 0, then fail
    os._exit(3)


def subgroup_of_the_ends() -> list[str]:
    """A subgroup of the last and the first rank (unsorted), and a rank-order check inside it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ends = dist.new_group(sorted({world - 1, 0}, reverse=True))
    failures = []
    if rank in (0, world - 1):
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=ends)
        expected = 1.0 + (world if world > 1 else 0)
        if t.item() != expected:
            failures.append(f"ends all_reduce: got {t.item()}, expected {expected}")
        b = torch.tensor([float(rank)])
        dist.broadcast(b, group_src=dist.get_group_rank(ends, world - 1), group=ends)
        if b.item() != world - 1:
            failures.append(f"ends broadcast: got {b.item()}, expected {world - 1}")
    dist.barrier()
    dist.destroy_process_group(ends)
    return failures


def what_the_group_is() -> dict[str, object]:
    """The backend, rank and size torch reports, and where the job keeps its files."""
    pg = dist.distributed_c10d._get_default_group()
    return {
        "backend": dist.get_backend(),
        "rank": dist.get_rank(),
        "size": dist.get_world_size(),
        "root": pg._generation.root,
    }


def init_and_report(method: str, rank: int, world: int, directory: str, env: dict[str, str], port: int = 0) -> dict:
    """Try to form a group the way ``method`` does (harness.INIT_METHODS) after setting ``env``;
    report how it ended and after how long (the test prints the times; it asserts on the error)."""
    import time

    from harness import init_group

    os.environ.update(env)
    start = time.monotonic()
    try:
        init_group(method, rank, world, directory, timeout=120, port=port)
    except Exception as exc:  # noqa: BLE001 - the error is the result
        return {"error": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}
    dist.destroy_process_group()
    return {"error": None, "message": "", "seconds": time.monotonic() - start}


def fsdist_groups_under_a_gloo_world(directory: str, rank: int, world: int) -> list[float]:
    """A Gloo world group (file://) with fsdist subgroups: each forms a generation of its own."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{directory}/initfile", rank=rank, world_size=world)
    everyone = dist.new_group(backend="fsdist")
    pair = dist.new_group([0, 1], backend="fsdist")
    t = torch.ones(2) * (rank + 1)
    dist.all_reduce(t, group=everyone)
    u = torch.ones(1)
    if rank in (0, 1):
        dist.all_reduce(u, group=pair)
    assert dist.get_backend(everyone) == "fsdist" and dist.get_backend() == "gloo"
    dist.destroy_process_group()
    return [t[0].item(), u.item()]


def gloo_through_the_directory(directory: str, rank: int, world: int, rounds: int) -> list[float]:
    """Gloo with torch's default env:// under `fsdist run` (FSDIST_DIR set): the group meets
    through fsdist's directory. torch destroys it without telling fsdist, so a later init of the
    same process, and its exit, must still leave the directory clean."""
    import torch.distributed as dist

    os.environ.update(FSDIST_DIR=directory, RANK=str(rank), WORLD_SIZE=str(world))
    sums = []
    for _ in range(rounds):
        dist.init_process_group("gloo")
        t = torch.ones(1)
        dist.all_reduce(t)
        sums.append(t.item())
        dist.destroy_process_group()
    return sums
