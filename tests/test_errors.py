"""Failures are loud and specific: timeouts, desyncs and dead peers name rank, op and sequence."""

from __future__ import annotations

import re

import pytest

from harness import RankPool
from in_rank import errors as cases


def _run(world: int, case, *args, group_timeout: float = 60, deaths_expected: bool = False):
    pool = RankPool(world, group_timeout=group_timeout)
    try:
        return pool.run_each(case, [args] * world, timeout=40, deaths_expected=deaths_expected)
    finally:
        pool.kill()


def test_timeout_names_rank_op_sequence_and_the_missing_peer() -> None:
    results = _run(2, cases.one_rank_skips_all_reduce, group_timeout=2)
    assert results[1] == "skipped"
    text = results[0]
    assert text.startswith("FsdistTimeoutError"), text
    for needle in ("rank 0", "all_reduce SUM float32[3]", "operation #1", "rank 1", "state.r1"):
        assert needle in text, f"{needle!r} missing from: {text}"


def test_shape_mismatch_is_reported_on_every_rank_with_both_sides() -> None:
    results = _run(3, cases.shapes_disagree)
    for rank, text in enumerate(results):
        assert text.startswith(("DesyncError", "PeerFailedError")), f"rank {rank}: {text}"
        assert "float32[12]" in text and "float32[10]" in text, f"rank {rank}: {text}"


def test_different_collectives_fail_on_every_rank_sync_and_async() -> None:
    for async_op in (False, True):
        results = _run(2, cases.ops_disagree, async_op)
        for rank, (first, later) in enumerate(results):
            assert re.match(r"(DesyncError|PeerFailedError)", first), f"rank {rank}: {first}"
            assert "all_gather" in first and "all_reduce" in first, f"rank {rank}: {first}"
            assert later.startswith(("GroupBrokenError", "PeerFailedError")), f"rank {rank}: {later}"


def test_dead_peer_is_named_long_before_the_timeout() -> None:
    # group timeout 60 s, case deadline 40 s: only dead-peer detection can pass this
    results = _run(2, cases.peer_dies_during_all_reduce, deaths_expected=True)
    text = results[0]
    assert text.startswith("PeerFailedError"), text
    assert "rank 1" in text and "died" in text, text


def test_a_desync_among_ranks_that_never_wait_is_still_found_on_every_rank() -> None:
    results = _run(3, cases.roots_disagree)
    for rank, text in enumerate(results):
        assert text.startswith(("DesyncError", "PeerFailedError")), f"rank {rank}: {text}"
        assert ("different operations" in text or "disagree" in text) and "root=" in text, f"rank {rank}: {text}"


def test_dtype_mismatch_is_reported_on_every_rank_with_both_sides() -> None:
    results = _run(3, cases.dtypes_disagree)
    for rank, text in enumerate(results):
        assert text.startswith(("DesyncError", "PeerFailedError")), f"rank {rank}: {text}"
        assert "float64[8]" in text and "float32[8]" in text, f"rank {rank}: {text}"


def test_run_directory_is_private(pool_factory) -> None:
    results = pool_factory(2).run(cases.modes_of_everything_in_the_run_directory)
    assert results == [[], []], results


def test_tensors_no_file_can_carry_are_refused_and_the_group_stays_usable(pool_factory) -> None:
    for texts in pool_factory(2).run(cases.tensors_no_file_can_carry):
        *refusals, after = texts
        for index in (0, 1, 2, 4, 6):  # meta: all_reduce, broadcast, send, all_to_all_single's output, all_gather's
            assert refusals[index].startswith("ValueError") and "'meta' device" in refusals[index], texts
        for index in (3, 5, 7):  # sparse: broadcast, all_to_all's input, reduce_scatter's inputs
            assert refusals[index].startswith("NotImplementedError") and "sparse" in refusals[index], texts
        assert after == "then all_reduce gave [2.0, 2.0]", texts


def test_reduce_op_mismatch_is_reported_on_every_rank_with_both_sides() -> None:
    results = _run(3, cases.reduce_ops_disagree)
    for rank, text in enumerate(results):
        assert text.startswith(("DesyncError", "PeerFailedError")), f"rank {rank}: {text}"
        assert "all_reduce MAX float32[5]" in text and "all_reduce SUM float32[5]" in text, f"rank {rank}: {text}"


@pytest.mark.parametrize("kind", ["meta", "sparse", "dtype"])
def test_a_bad_tensor_in_any_op_fails_its_caller_and_the_next_op_succeeds(pool_factory, kind: str) -> None:
    """Issue 48, 1: every op checks every tensor it takes before it is queued, so a tensor that
    cannot travel or does not fit fails the call on each rank, and the group stays usable."""
    world = 2
    for rank, said in enumerate(pool_factory(world).run(cases.a_bad_tensor_in_every_op, kind)):
        for name, text in said.items():
            refused, after = text.split(" | then all_reduce: ")
            if rank == 0 or name not in ("send", "recv"):  # (rank 0 alone sends or receives)
                assert refused != "no error", f"{kind} in {name}: not refused on rank {rank} ({text})"
            assert after == f"no error [{float(world)}, {float(world)}]", f"{kind} in {name}: the group broke ({text})"
