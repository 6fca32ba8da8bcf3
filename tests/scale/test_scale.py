"""Large worlds on 2 cores (`make test-scale`, ~2.5 min): 8 ranks on four simulated nodes through the
collective cases, and worlds of 8 and 16 ranks, flat and in two tiers, a few operations each.

Left out of `make test` (tests/conftest.py) for its time, not skipped: `make test-scale` sets
FSDIST_SCALE=1, which collects it.
"""

from __future__ import annotations

import pytest

from in_rank import collectives as cases
from in_rank import tiers as cases_tiers
from test_collectives import _check


def test_eight_ranks_on_four_nodes_run_every_collective(pool_factory) -> None:
    pool = pool_factory(8, "fsdist", (2, 2, 2, 2))
    for op, dtype in [("SUM", "float32"), ("AVG", "float32"), ("BXOR", "int64")]:
        _check(pool.run(cases.all_reduce, op, dtype), same_on_all_ranks=True)
    _check(pool.run(cases.reduce, "MAX", "int64"), same_on_all_ranks=False)
    _check(pool.run(cases.reduce_scatter, "SUM", "int64"), same_on_all_ranks=False)
    for collective in (cases.broadcast, cases.all_gather):
        _check(pool.run(collective, "float32"), same_on_all_ranks=True)
    _check(pool.run(cases.barrier_and_ordering), same_on_all_ranks=True)


@pytest.mark.parametrize(
    "world,nodes,algo",
    [
        (8, None, "flat"),
        (8, (4, 4), "hier"),
        (8, (4, 4), "flat"),
        (16, (4, 4, 4, 4), "hier"),
        (16, (4, 4, 4, 4), "flat"),
        (16, (8, 8), "hier"),
    ],
    ids=str,
)
def test_large_worlds_flat_and_in_two_tiers(pool_factory, world: int, nodes, algo: str) -> None:
    results = pool_factory(world, "fsdist", nodes).run(cases_tiers.a_few_ops, algo, timeout=600)
    failures = [f"rank {rank}: {f}" for rank, res in enumerate(results) for f in res]
    assert not failures, "\n".join(failures[:20])


def test_four_leaders_tiers_in_use_and_flat_bits_where_exact(pool_factory) -> None:
    pool = pool_factory(8, "fsdist", (2, 2, 2, 2))
    assert all(seen["node_tier"] and seen["leaders_tier"] for seen in pool.run(cases_tiers.tiers_in_use))
    results = pool.run(cases_tiers.flat_and_tiered_agree, timeout=600)
    failures = [f"rank {rank}: {f}" for rank, res in enumerate(results) for f in res]
    assert not failures, "\n".join(failures[:20])
