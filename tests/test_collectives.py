"""Every collective × reduce op × dtype × world size (1–4) × shape, against references.

Each pytest case runs in a live pool of real rank processes (harness.py); the shapes, roots,
repeats and sync/async variants of one case run inside it and are reported by label.
"""

from __future__ import annotations

import pytest

from harness import RankPool
from in_rank import collectives as cases
from reference import DTYPES, OPS

WORLDS = [1, 2, 3, 4]


def _check(results: list[dict[str, list[str]]], same_on_all_ranks: bool) -> None:
    failures = [f"rank {rank}: {f}" for rank, res in enumerate(results) for f in res["failures"]]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:40])
    if same_on_all_ranks:
        for rank, res in enumerate(results[1:], start=1):
            assert res["digests"] == results[0]["digests"], f"rank {rank}'s results differ from rank 0's"


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("world", WORLDS)
def test_all_reduce(pool_factory, world: int, op: str, dtype: str) -> None:
    _check(pool_factory(world).run(cases.all_reduce, op, dtype), same_on_all_ranks=True)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("world", WORLDS)
def test_reduce(pool_factory, world: int, op: str, dtype: str) -> None:
    _check(pool_factory(world).run(cases.reduce, op, dtype), same_on_all_ranks=False)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("world", WORLDS)
def test_reduce_scatter(pool_factory, world: int, op: str, dtype: str) -> None:
    _check(pool_factory(world).run(cases.reduce_scatter, op, dtype), same_on_all_ranks=False)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize(
    "collective",
    [cases.broadcast, cases.all_gather, cases.gather, cases.scatter, cases.all_to_all],
    ids=lambda f: f.__name__,
)
def test_data_movement(pool_factory, collective, world: int, dtype: str) -> None:
    _check(
        pool_factory(world).run(collective, dtype), same_on_all_ranks=collective in (cases.broadcast, cases.all_gather)
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "bool", "complex64"])
@pytest.mark.parametrize("op", ["SUM", "MAX", "PRODUCT"])
@pytest.mark.parametrize("world", WORLDS)
def test_all_reduce_coalesced(pool_factory, world: int, op: str, dtype: str) -> None:
    _check(pool_factory(world).run(cases.coalesced, op, dtype), same_on_all_ranks=True)


@pytest.mark.parametrize("world", WORLDS)
def test_barrier_and_async_order(pool_factory, world: int) -> None:
    _check(pool_factory(world).run(cases.barrier_and_ordering), same_on_all_ranks=True)


@pytest.mark.parametrize("world", [2, 3])
def test_callback_may_issue_a_collective(pool_factory, world: int) -> None:
    _check(pool_factory(world).run(cases.callback_issues_a_collective), same_on_all_ranks=True)


def test_a_rank_that_never_waits_runs_only_a_bounded_way_ahead(pool_factory) -> None:
    pool = pool_factory(3)
    results = pool.run_each(cases.run_ahead_is_bounded, [()] * 3)
    most, bound = results[0]
    print(f"rank 0 kept at most {most} unread broadcast files (bound {bound})")
    assert 0 < most <= bound, f"rank 0 kept {most} unread broadcast files (bound {bound})"


def test_a_root_publishing_large_messages_ahead_of_its_readers_holds_few_files(pool_factory) -> None:
    pool = pool_factory(2)
    results = pool.run_each(cases.large_run_ahead_is_bounded_in_bytes, [()] * 2)
    most, bound = results[0]
    print(f"rank 0 kept at most {most} unread 4 MiB broadcast files (bound {bound})")
    assert 0 < most <= bound, f"rank 0 kept {most} unread 4 MiB broadcast files (bound {bound})"


@pytest.mark.parametrize("world", [2, 3])
def test_async_ops_progress_while_the_caller_blocks_elsewhere(pool_factory, world: int) -> None:
    for on_caller, large in pool_factory(world).run(cases.async_ops_progress_while_the_caller_blocks_elsewhere):
        assert int(on_caller.split()[0]) >= 15, on_caller  # the caller claims it before it lets go of the GIL
        assert large.startswith("fsdist-"), large  # past INLINE_RUN_BYTES: the worker, woken at once


@pytest.mark.parametrize("world", [2, 3])
def test_small_messages_travel_inside_the_state_records(pool_factory, world: int) -> None:
    results = pool_factory(world).run(cases.small_messages_leave_no_files)
    assert [r[0] for r in results] == [0] * world, f"message files appeared: {results}"


def test_without_inline_messages_small_ones_are_files_and_still_right() -> None:
    pool = RankPool(2, env={"FSDIST_INLINE": "0"})
    try:
        results = pool.run(cases.small_messages_leave_no_files)
    finally:
        pool.close()
    assert all(r[0] > 0 for r in results), results


@pytest.mark.parametrize("world", [1, 2, 3])
def test_direct_process_group_calls_in_every_pybind_form(pool_factory, world: int) -> None:
    _check(pool_factory(world).run(cases.direct_process_group_calls), same_on_all_ranks=False)


@pytest.mark.parametrize("world", WORLDS)
def test_sparse_all_reduce_sum(pool_factory, world: int) -> None:
    _check(pool_factory(world).run(cases.sparse_all_reduce), same_on_all_ranks=True)


def test_a_message_of_many_parts_is_waited_for_once(pool_factory) -> None:
    for rank, polls in enumerate(pool_factory(2).run(cases.polls_per_multi_part_operation)):
        assert polls <= 1.0, f"rank {rank}: {polls} polling waits per operation of 8 parts"
