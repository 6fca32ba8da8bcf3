"""`fsdist status`: it names the rank that holds a job up, and reads a crashed job's directory."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

from fsdist.inspect.status import read_status
from fsdist.protocol import failure_report, layout
from fsdist.protocol.sealed import seal_text

from harness import RankPool
from in_rank import status as cases


def _status(directory: str, *flags: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    command = [*prefix, sys.executable, "-m", "fsdist", "status", directory, *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


#: `fsdist status` run in its own pid namespace sees the ranks as another machine would: their
#: pids mean nothing there, so it can only go by their heartbeats
ANOTHER_MACHINE = ("unshare", "--pid", "--fork", "--kill-child")


def _another_machine_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run([*ANOTHER_MACHINE, "true"], capture_output=True).returncode == 0


def _while_held_up(pool: RankPool, case: Any, straggler: int, release: str, ready: Any) -> tuple[list[Any], Any]:
    """Run ``case`` in every rank of ``pool`` (in a thread); once ``ready(read_status(...))``,
    call ``fsdist status`` (JSON and text), then release the straggler. Returns the results
    and what status printed."""
    results: list[Any] = []
    errors: list[BaseException] = []

    def job() -> None:
        try:
            results.extend(pool.run(case, straggler, release, 90.0))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    runner = threading.Thread(target=job)
    runner.start()
    try:
        # wait (in-process, cheaply) until the others are inside the collective
        deadline = time.monotonic() + 60
        while not ready(read_status(pool.directory)):
            assert time.monotonic() < deadline and not errors, f"the ranks never got held up: {errors}"
            time.sleep(0.05)
        time.sleep(0.3)  # a little waiting time, so "since" is visibly positive
        shown = [_status(pool.directory, "--json"), _status(pool.directory)]
        if _another_machine_works():
            shown.append(_status(pool.directory, "--json", prefix=ANOTHER_MACHINE))
    finally:
        open(release, "w").close()
        runner.join(120)
    assert not errors, errors
    return results, shown


def test_status_names_the_straggler_and_the_op_the_others_wait_in(pool_factory, tmp_path) -> None:
    pool = pool_factory(3)
    results, (shown, text, *elsewhere) = _while_held_up(
        pool, cases.straggle_before_all_reduce, 2, str(tmp_path / "release"), lambda s: s.straggler() is not None
    )
    assert results == [6.0] * 3

    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    print(text.stdout)
    world = status["groups"][0]
    assert world["name"] == "world" and status["state"] == "running" and status["world_size"] == 3
    found = world["straggler"]
    assert found["ranks"] == [2] and found["behind"] == 1, found
    assert found["waiting_ranks"] == [0, 1]
    assert found["waiting_description"] == "all_reduce SUM float32[4]"
    assert found["waiting_seq"] == found["seq"] + 1
    assert found["waiting_s"] > 0
    assert found["description"] == "barrier"  # the straggler's last finished collective
    assert [m["liveness"] for m in status["members"]] == ["alive"] * 3
    assert [m["pid"] for m in status["members"]] == [p.pid for p in pool.processes]
    assert any(line.startswith("rank 2 is 1 collective behind") for line in status["summary"]), status["summary"]

    assert text.returncode == 0, text.stderr
    assert "rank 2 is 1 collective behind (at #" in text.stdout
    assert "the others wait in all_reduce SUM float32[4] #" in text.stdout

    for there in elsewhere:  # the same, seen from "another machine"
        assert there.returncode == 0, there.stderr
        remote = json.loads(there.stdout)
        assert [m["liveness"] for m in remote["members"]] == ["heartbeat"] * 3
        assert remote["groups"][0]["straggler"]["ranks"] == [2]


def test_status_follows_waits_through_subgroups_to_the_rank_that_holds_everyone_up(pool_factory, tmp_path) -> None:
    pool = pool_factory(4)

    def odd_group_held_up(status: Any) -> bool:
        return any(g.straggler is not None and g.ranks == [1, 3] for g in status.groups)

    results, (shown, text, *_) = _while_held_up(
        pool, cases.straggle_in_a_subgroup, 3, str(tmp_path / "release"), odd_group_held_up
    )
    assert results == [2.0] * 4
    status = json.loads(shown.stdout)
    print(text.stdout)
    odds = next(g for g in status["groups"] if g["ranks"] == [1, 3])
    assert odds["straggler"]["ranks"] == [3] and odds["straggler"]["waiting_ranks"] == [1]
    assert [p["rank"] for p in odds["positions"]] == [1, 3]
    assert status["holding_up"] == [3]
    assert "rank 3 waits for no one" in status["summary"][0]
    assert f"in group {odds['name']!r}" in text.stdout


def test_status_reads_a_crashed_job_and_watch_repeats(tmp_path) -> None:
    directory = str(tmp_path / "run")
    pool = RankPool(3, init=False)
    try:
        pool.run_each(cases.crash_after_a_broadcast, [(directory, r, 3) for r in range(3)], deaths_expected=True)
    finally:
        pool.kill()
    # what a failing rank and a launcher would have written (first writer wins in both)
    (abort,) = glob.glob(os.path.join(directory, "gen-*", "groups", "k.0.0", "abort"))
    with open(abort, "wb") as marker:
        marker.write(seal_text("rank 1: DesyncError: on purpose", layout.identity(abort)))
    os.makedirs(os.path.join(directory, ".launch", "gen-0"))
    with open(os.path.join(directory, ".launch", "gen-0", "abort"), "wb") as failure:
        failure.write(
            failure_report.encode({"rank": 1, "exit_code": 1, "type": "DesyncError", "message": "on purpose"})
        )
    shown = _status(directory, "--json", "--watch", "--interval", "0.1", "--count", "2")
    assert shown.returncode == 0, shown.stderr
    snapshots = [json.loads(line) for line in shown.stdout.splitlines()]
    assert len(snapshots) == 2
    status = snapshots[-1]
    assert status["state"] == "crashed"
    assert [m["liveness"] for m in status["members"]] == ["dead"] * 3
    assert all(isinstance(m["heartbeats"], int) for m in status["members"])
    world = status["groups"][0]
    assert [p["description"] for p in world["positions"]] == ["barrier"] * 3
    assert world["straggler"] is None
    assert any("is dead" in line for line in status["summary"])
    assert world["abort"] == "rank 1: DesyncError: on purpose"
    assert "group 'world' was aborted: rank 1: DesyncError: on purpose" in status["summary"]
    assert status["launcher_failure"]["rank"] == 1
    assert status["summary"][-1] == "the launcher recorded a failure of rank 1 (exit code 1): DesyncError: on purpose"
    subprocess.run([sys.executable, "-m", "fsdist", "clean", directory], check=True, capture_output=True)
    shutil.rmtree(os.path.join(directory, ".launch"))
    assert os.listdir(directory) == ["fsdist-rendezvous.json"]
    after = _status(directory)
    assert after.returncode == 0 and "no job in" in after.stdout


def test_status_of_a_missing_directory_is_an_error(tmp_path) -> None:
    shown = _status(str(tmp_path / "nowhere"))
    assert shown.returncode == 2 and "nowhere does not exist: give the run directory" in shown.stderr


def test_status_after_a_failed_run_says_it_failed_from_the_first_line(tmp_path) -> None:
    """Paper cut (issue 36, 8): it said "no job (none started yet, or the last one finished
    cleanly)", then that the job failed."""
    script = tmp_path / "fails.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('fsdist')\n"
        "if dist.get_rank() == 1:\n"
        "    raise SystemExit(3)\n"
        "dist.barrier()\n"
    )
    run = str(tmp_path / "run")
    launched = subprocess.run(
        [sys.executable, "-m", "fsdist", "run", "--nproc-per-node", "2", "--dir", run, str(script)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert launched.returncode == 1, launched.stderr
    lines = _status(run).stdout.splitlines()
    assert lines[1] == f"no job is running in {run}; the last one failed:", lines
    assert "finished cleanly" not in "\n".join(lines) and "then the job failed" in lines[2], lines


def test_ranks_a_moment_apart_are_no_straggler() -> None:
    """Paper cut (issue 36): a healthy job was reported "holding up" its peers for 0.0 s."""
    from fsdist.inspect.straggler import RankPosition, find_straggler

    def at(rank: int, seq: int, since: float) -> RankPosition:
        return RankPosition(rank, rank, seq, 0, f"op {seq}", False, since)

    assert find_straggler([at(0, 5, 0.0), at(1, 4, 0.0), at(2, 5, 0.02)]) is None
    late = find_straggler([at(0, 5, 1.5), at(1, 4, 0.0), at(2, 5, 0.3)])
    assert late is not None and late.ranks == [1] and late.waiting_s == 1.5
