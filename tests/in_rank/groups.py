"""Subgroup cases (world of 4): groups of size 1, 2 and all, unsorted ranks, a rank in none."""

from __future__ import annotations

import torch
import torch.distributed as dist


def subgroups() -> list[str]:
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4
    failures: list[str] = []
    # every rank must call new_group, members or not
    solo = dist.new_group([0])
    pair = dist.new_group([2, 1])  # unsorted: torch sorts, group ranks follow global order
    everyone = dist.new_group(list(range(world)))
    trio = dist.new_group([0, 1, 3])
    # rank 3 is in neither `solo` nor `pair`; rank 2 is not in `trio`

    def expect(label: str, tensor: torch.Tensor, values: list[float]) -> None:
        if tensor.tolist() != values:
            failures.append(f"{label}: got {tensor.tolist()}, expected {values}")

    for repeat in range(2):
        # interleave groups: each group's sequence numbers and files are its own
        if rank in (1, 2):
            t = torch.tensor([float(rank)])
            dist.all_reduce(t, group=pair)
            expect(f"pair all_reduce #{repeat}", t, [3.0])
            b = torch.tensor([float(rank * 100)])
            dist.broadcast(b, group_src=0, group=pair)  # group rank 0 is global rank 1
            expect(f"pair broadcast #{repeat}", b, [100.0])
        if rank == 0:
            t = torch.tensor([5.0])
            dist.all_reduce(t, group=solo)
            expect("solo all_reduce", t, [5.0])
        w = torch.tensor([1.0])
        dist.all_reduce(w)
        expect("world all_reduce", w, [4.0])
        e = torch.tensor([float(rank)])
        dist.all_reduce(e, group=everyone, op=dist.ReduceOp.MAX)
        expect("everyone MAX", e, [3.0])
        if rank != 2:
            outs = [torch.zeros(1) for _ in range(3)]
            dist.all_gather(outs, torch.tensor([float(rank)]), group=trio)
            expect("trio all_gather", torch.cat(outs), [0.0, 1.0, 3.0])
            if rank == 0:
                dist.send(torch.tensor([42.0]), group_dst=2, group=trio)  # group rank 2 = global 3
            if rank == 3:
                got = torch.zeros(1)
                dist.recv(got, group_src=0, group=trio)
                expect("trio recv", got, [42.0])
        dist.barrier()
    for group in (solo, pair, everyone, trio):
        if group != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(group)
    return failures


def group_files_apart(root: str) -> list[str]:
    """Each group keeps its files in its own directory under the generation."""
    import glob
    import os

    g = dist.new_group([0, 1])
    if dist.get_rank() in (0, 1):
        dist.all_reduce(torch.ones(1), group=g)
    dist.barrier()
    dirs = sorted(os.path.basename(p) for p in glob.glob(os.path.join(root, "gen-*", "groups", "*")))
    dist.barrier()
    if dist.get_rank() in (0, 1):
        dist.destroy_process_group(g)
    return dirs


def recreate_group() -> list[str]:
    """Destroy a subgroup and make it again with the same ranks: torch may reuse its name."""
    failures = []
    for i in range(3):
        g = dist.new_group([0, 1], use_local_synchronization=True) if dist.get_rank() in (0, 1) else None
        if g is not None:
            t = torch.tensor([float(i)])
            dist.all_reduce(t, group=g)
            if t.item() != 2.0 * i:
                failures.append(f"round {i}: {t.item()}")
            dist.destroy_process_group(g)
    dist.barrier()
    return failures
