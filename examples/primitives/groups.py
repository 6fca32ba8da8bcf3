"""Groups: collectives among a subset of the ranks (here: the even ranks, and the odd ones).

    python -m fsdist run --nproc-per-node 4 --dir /tmp/fsdist-run-$(id -u) examples/primitives/groups.py

Every rank must call ``new_group`` for every group, in the same order, even for groups it is
not a member of; a collective on a group involves only its members.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from _common import check, main, need_ranks


def run(rank: int, world: int) -> None:
    need_ranks(world, 2, "groups")
    evens, odds = list(range(0, world, 2)), list(range(1, world, 2))
    groups = {0: dist.new_group(evens), 1: dist.new_group(odds)}
    mine, members = groups[rank % 2], evens if rank % 2 == 0 else odds
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mine)
    check(t.item() == sum(members), f"got {t.item()}, expected the sum of ranks {members}")
    check(dist.get_rank(mine) == members.index(rank), "rank within the group")
    # the tutorial's example: a group of ranks 0 and 1 only (rank 2 and up do not take part)
    pair = dist.new_group([0, 1])
    if rank in (0, 1):
        ones = torch.ones(1)
        dist.all_reduce(ones, op=dist.ReduceOp.SUM, group=pair)
        check(ones.item() == 2.0, f"got {ones.item()}")
    for group in (*groups.values(), pair):
        dist.destroy_process_group(group)


if __name__ == "__main__":
    main(run)
