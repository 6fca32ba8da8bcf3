"""A setup that cannot work fails on every rank within seconds, saying what to change — never
after the group's timeout (these tests give it 120 s; a "Timed out" error would fail them).

The times are printed (pytest -s), not asserted: tests never assert on time.
"""

from __future__ import annotations

import os

from harness import RankPool, _free_port
from in_rank import init as cases

#: Short enough to matter, long enough that a slow machine never fails a correct setup.
ERROR_TYPES = {"RendezvousError", "ValueError"}


def _attempt(world: int, per_rank: list[tuple]) -> list[dict]:
    pool = RankPool(world, init=False)
    try:
        return pool.run_each(cases.init_and_report, per_rank, timeout=200)
    finally:
        pool.kill()


def _assert_every_rank_fails(results: list[dict], *needles: str) -> None:
    print("seconds to fail per rank:", [round(r["seconds"], 2) for r in results])
    for rank, result in enumerate(results):
        assert result["error"] in ERROR_TYPES, f"rank {rank}: {result}"
        assert "Timed out" not in result["message"], f"rank {rank} waited for the timeout: {result}"
        for needle in needles:
            assert needle in result["message"], f"rank {rank}: {needle!r} not in {result['message']!r}"


def test_a_tcpstore_job_across_machines_without_a_directory(tmp_path) -> None:
    port = _free_port()
    per_rank = [("tcp", r, 3, str(tmp_path), {"FSDIST_NODE_ID": f"node{r % 2}"}, port) for r in range(3)]
    _assert_every_rank_fails(_attempt(3, per_rank), "TCPStore", "2 machines", "FSDIST_DIR", "env://")


def test_a_directory_not_shared_by_every_rank(tmp_path) -> None:
    port = _free_port()  # a TCPStore job whose FSDIST_DIR is a different folder on each "node"
    per_rank = [("tcp", r, 3, str(tmp_path), {"FSDIST_DIR": str(tmp_path / f"node{r}")}, port) for r in range(3)]
    results = _attempt(3, per_rank)
    _assert_every_rank_fails(results, "not the one rank 0 uses", "FSDIST_DIR")
    assert os.listdir(tmp_path / "node0") == ["fsdist-rendezvous.json"], "rank 0 did not withdraw its generation"


def test_mismatched_world_sizes_through_a_store(tmp_path) -> None:
    worlds = [2, 3]  # rank 1 believes in a third rank that never comes
    per_rank = [("file", r, worlds[r], str(tmp_path), {}) for r in range(2)]
    _assert_every_rank_fails(_attempt(2, per_rank), "disagree on the world size")


def test_mismatched_world_sizes_through_the_directory(tmp_path) -> None:
    worlds = [2, 3]
    per_rank = [("env", r, worlds[r], str(tmp_path), {}) for r in range(2)]
    _assert_every_rank_fails(_attempt(2, per_rank), "world size")


def test_a_second_job_in_a_running_jobs_directory(pools, tmp_path) -> None:
    running = pools.get(2)  # a live fsdist:// job
    env = {"FSDIST_DIR": running.directory}
    directory_route = [("env", r, 2, running.directory, env) for r in range(2)]
    # torch's FileStore elsewhere, fsdist's files pointed at the running job's directory
    store_route = [("file", r, 2, str(tmp_path), env) for r in range(2)]
    for per_rank in (directory_route, store_route):
        _assert_every_rank_fails(_attempt(2, per_rank), "another job is running")
    assert running.run(cases.what_the_group_is)[0]["backend"] == "fsdist"  # undisturbed
