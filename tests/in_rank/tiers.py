"""Two-tier (hierarchical) test cases, run inside every rank of a pool on simulated nodes."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from fsdist.defaults import ENV_ALGO

from in_rank.errors import error_text


def node_tiers(local: str) -> list[str]:
    """The node tiers in ``local`` (an FSDIST_LOCAL_DIR): in this user's own folder there."""
    mine = os.path.join(local, f"fsdist-{os.geteuid()}")
    return sorted(n for n in os.listdir(mine) if n.startswith("tier-")) if os.path.isdir(mine) else []


def tiers_in_use() -> dict[str, bool]:
    """Whether this rank's world group keeps a node tier in its node-local directory, and whether
    the leaders' tier exists in the shared one."""
    local = os.environ["FSDIST_LOCAL_DIR"]
    shared = os.environ["FSDIST_TEST_DIR"]
    node_tier = bool(node_tiers(local))
    leaders = any("leaders" in dirs for _, dirs, _ in os.walk(shared))
    return {"node_tier": node_tier, "leaders_tier": leaders}


def _group(algo: str) -> dist.ProcessGroup:
    """A group of every rank whose collectives run ``algo`` (decided when it is created)."""
    before = os.environ.get(ENV_ALGO)
    os.environ[ENV_ALGO] = algo
    try:
        return dist.new_group(list(range(dist.get_world_size())))
    finally:
        if before is None:
            del os.environ[ENV_ALGO]
        else:
            os.environ[ENV_ALGO] = before


def flat_and_tiered_agree() -> list[str]:
    """Every two-tier collective gives the flat algorithm's bits where arithmetic is exact
    (integers; integer-valued floats) — and the same result on every rank (checked by the
    caller through the returned digests of both)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    flat, tiered = _group("flat"), _group("hier")
    failures: list[str] = []

    def both(label: str, run) -> None:
        a, b = run(flat), run(tiered)
        for x, y in zip(a, b, strict=True):
            if not torch.equal(x, y):
                failures.append(f"{label}: flat {x.reshape(-1)[:4].tolist()}, two tiers {y.reshape(-1)[:4].tolist()}")

    for dtype in (torch.int64, torch.float32):
        for n in (1, 7, 70_000):
            base = (torch.arange(n) % 5 + rank + 1).to(dtype)
            for op in (
                dist.ReduceOp.SUM,
                dist.ReduceOp.PRODUCT,
                dist.ReduceOp.MAX,
                dist.ReduceOp.MIN,
                dist.ReduceOp.AVG,
            ):
                if op == dist.ReduceOp.AVG and not dtype.is_floating_point:
                    continue

                def all_reduce(g, op=op, base=base):
                    x = base.clone()
                    dist.all_reduce(x, op=op, group=g)
                    return [x]

                both(f"all_reduce {op} {dtype} n={n}", all_reduce)
            if not dtype.is_floating_point:

                def bxor(g, base=base):
                    x = base.clone()
                    dist.all_reduce(x, op=dist.ReduceOp.BXOR, group=g)
                    return [x]

                both(f"all_reduce BXOR n={n}", bxor)
            for root in range(world):

                def reduce(g, root=root, base=base):
                    x = base.clone()
                    dist.reduce(x, dst=root, group=g)
                    return [x]

                def broadcast(g, root=root, base=base):
                    x = base.clone()
                    dist.broadcast(x, src=root, group=g)
                    return [x]

                both(f"reduce root={root} {dtype} n={n}", reduce)
                both(f"broadcast root={root} {dtype} n={n}", broadcast)

            def all_gather(g, base=base):
                outs = [torch.empty_like(base) for _ in range(world)]
                dist.all_gather(outs, base, group=g)
                return outs

            def reduce_scatter(g, base=base):
                out = torch.empty_like(base)
                dist.reduce_scatter(out, [base + k for k in range(world)], group=g)
                return [out]

            both(f"all_gather {dtype} n={n}", all_gather)
            both(f"reduce_scatter {dtype} n={n}", reduce_scatter)
    dist.barrier(group=tiered)
    dist.destroy_process_group(flat)
    dist.destroy_process_group(tiered)
    return failures


def a_few_ops(algo: str) -> list[str]:
    """A few collectives of each kind in a new group of every rank running ``algo``, checked
    against closed forms (large worlds: every case costs N² reads somewhere)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    group = _group(algo)
    failures: list[str] = []

    def expect(label: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if not torch.equal(got, want):
            failures.append(f"{label}: got {got.reshape(-1)[:4].tolist()}, want {want.reshape(-1)[:4].tolist()}")

    total = world * (world - 1) // 2
    for n in (1, 3000):
        x = torch.full((n,), rank, dtype=torch.int64)
        dist.all_reduce(x, group=group)
        expect(f"all_reduce n={n}", x, torch.full((n,), total))
        for root in {0, world // 2, world - 1}:
            x = torch.full((n,), rank, dtype=torch.int64)
            dist.broadcast(x, src=root, group=group)
            expect(f"broadcast root={root} n={n}", x, torch.full((n,), root))
            x = torch.full((n,), rank, dtype=torch.int64)
            dist.reduce(x, dst=root, op=dist.ReduceOp.MAX, group=group)
            expect(f"reduce root={root} n={n}", x, torch.full((n,), world - 1 if rank == root else rank))
        outs = [torch.empty(n, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(outs, torch.full((n,), rank, dtype=torch.int64), group=group)
        expect(f"all_gather n={n}", torch.stack(outs), torch.arange(world).repeat_interleave(n).view(world, n))
        out = torch.empty(n, dtype=torch.int64)
        dist.reduce_scatter(out, [torch.full((n,), rank * world + k) for k in range(world)], group=group)
        expect(f"reduce_scatter n={n}", out, torch.full((n,), sum(r * world + rank for r in range(world))))
        dist.barrier(group=group)
    dist.destroy_process_group(group)
    return failures


def nodes_disagree_on_the_shape() -> str:
    """Node 0's ranks reduce 12 elements, node 1's 10: the ranks of each node agree with each
    other, so only the leaders can see it, and every rank of every node must hear of it."""
    n = 12 if os.environ["FSDIST_NODE_ID"] == "node0" else 10
    return error_text(lambda: dist.all_reduce(torch.ones(n)))


def one_rank_disagrees_on_the_shape() -> str:
    """Rank 1 (not a leader) reduces 12 elements, every other rank 10."""
    n = 12 if dist.get_rank() == 1 else 10
    return error_text(lambda: dist.all_reduce(torch.ones(n)))


def records_chosen() -> str:
    """What the job chose for its records (FSDIST_IO=auto: job/io_choice.py), as rank 0 stored it
    for every rank: ``direct``, or why its records are locked."""
    from fsdist.c10d.store import DirectoryStore
    from fsdist.protocol import layout

    shared = os.environ["FSDIST_TEST_DIR"]
    stores = [os.path.join(root, "store") for root, dirs, _ in os.walk(shared) if "store" in dirs]
    name = layout.key_to_filename(layout.IO_PROBE_KEY + "choice")
    for store in stores:
        if os.path.exists(os.path.join(store, name)):
            return DirectoryStore(store).get(layout.IO_PROBE_KEY + "choice").decode()
    return "no choice stored"
