"""``python -m fsdist bench`` and ``bench locks``: they run, verify, report and clean up.

Correctness of the tools only; speed is never asserted (CI machines are shared and noisy).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from fsdist.cli.bench import report
from fsdist.cli.bench.plan import Iterations, Plan, iterations, parse_size
from fsdist.fs.contention import measure


def _bench(tmp_path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "fsdist", "bench", "--dir", str(tmp_path / "runs"), "--out",
               str(tmp_path / "result"), *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def test_bench_against_gloo_verifies_prints_the_table_writes_csv_json_and_cleans_up(tmp_path) -> None:
    ops = "all_reduce,broadcast,all_gather,reduce_scatter,all_to_all,sendrecv,barrier"
    done = _bench(tmp_path, "--ranks", "2", "--sizes", "8,1K", "--ops", ops, "--iters", "small", "--against", "gloo")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "speedup" in done.stdout and "FAILED" not in done.stdout, done.stdout
    data = json.loads((tmp_path / "result.json").read_text())
    rows = data["rows"]
    # 6 sized ops × 2 sizes + one barrier, each for both backends
    assert len(rows) == 2 * (6 * 2 + 1)
    assert {r["backend"] for r in rows} == {"fsdist", "gloo"}
    assert all(r["verified"] and r["iters"] == 3 and r["p50_s"] > 0 for r in rows), rows
    assert (tmp_path / "result.csv").read_text().count("\n") == len(rows) + 1
    assert set(data["meta"]["blocked_cpu_s"]["2"]) == {"fsdist", "gloo"}
    assert "blocked 1 s in a barrier (2 ranks)" in done.stdout
    assert "2 ranks [1/13] all_reduce 8 B done" in done.stderr and "[13/13] barrier 0 B done" in done.stderr
    assert os.listdir(tmp_path / "runs") == [], "the benchmark left its run directories behind"
    # filesystem calls are measured per op and rank: fsdist's reach the filesystem, Gloo's (C++) are not seen
    assert "filesystem calls per op per rank (fsdist)" in done.stdout
    for row in rows:
        calls = row["fs_calls_by_kind"]
        if row["backend"] == "fsdist" and row["op"] != "barrier":
            assert calls.get("lock", 0) >= 1, row
            # 8-byte messages (collective and p2p) travel inside the state records
            if row["nbytes"] == 8:
                assert calls.get("open", 0) == 0 and calls.get("rename", 0) == 0, row
    assert "fs_calls_per_op" in (tmp_path / "result.csv").read_text().splitlines()[0]


def test_fs_call_counting_sees_every_kind_and_tells_doorbells_and_proc_apart(tmp_path) -> None:
    import fcntl
    import mmap

    from fsdist.cli.bench import fscalls

    fifo = str(tmp_path / "bell")
    os.mkfifo(fifo)
    real = (os.open, os.close, fcntl.fcntl, mmap.mmap)
    with fscalls.counting() as counts:
        fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
        fcntl.lockf(fd, fcntl.LOCK_EX)
        fcntl.fcntl(fd, fcntl.F_GETFL)  # not a lock: counted as a stat-like query
        os.write(fd, b"x" * 16)
        os.pread(fd, 4, 0)
        mmap.mmap(fd, 16).close()
        os.close(fd)
        os.rename(tmp_path / "f", tmp_path / "g")
        os.unlink(tmp_path / "g")
        bell = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        os.write(bell, b"!")
        os.read(bell, 1)
        os.close(bell)
        loadavg = os.open("/proc/loadavg", os.O_RDONLY)  # a waiter's run-queue check: not a filesystem's
        os.pread(loadavg, 128, 0)
        os.close(loadavg)
    assert counts == {"open": 3, "lock": 1, "stat": 1, "write": 1, "read": 1, "mmap": 1, "close": 3,
                      "rename": 1, "unlink": 1, "wake": 2, "proc": 1, "bytes": 16}, counts  # fmt: skip
    assert (os.open, os.close, fcntl.fcntl, mmap.mmap) == real, "the real functions are back"
    with fscalls.counting() as again:
        os.stat(tmp_path)
    assert again == {"stat": 1} and counts["stat"] == 1, "counting stopped when its block ended"


def test_bench_four_ranks_fsdist_only(tmp_path) -> None:
    done = _bench(tmp_path, "--ranks", "4", "--sizes", "64", "--ops", "all_reduce,all_to_all,sendrecv",
                  "--iters", "small", "--against", "none")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((tmp_path / "result.json").read_text())["rows"]
    assert [r["backend"] for r in rows] == ["fsdist"] * 3 and all(r["verified"] for r in rows)
    assert all(r["nbytes"] == 64 for r in rows)


def test_the_first_iteration_check_catches_a_wrong_result(tmp_path) -> None:
    # a one-rank group told it is one of two: every reduction comes out wrong and must be caught
    script = textwrap.dedent(f"""
        import torch.distributed as dist, fsdist
        from fsdist.cli.bench.ops import make_case
        dist.init_process_group("fsdist", init_method="fsdist://{tmp_path}/run", rank=0, world_size=1)
        group = dist.group.WORLD
        case = make_case("all_reduce", 64, 0, 2, group)
        case.run()
        print("all_reduce", case.check())
        case = make_case("broadcast", 64, 0, 1, group)
        case.run()
        print("broadcast", case.check())
        dist.destroy_process_group()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert "16 of 16 elements wrong" in lines["all_reduce"], lines
    assert lines["broadcast"] == "None"


def test_bad_arguments_are_usage_errors(tmp_path) -> None:
    assert _bench(tmp_path, "--ops", "all_reduce,nonsense").returncode == 2
    assert _bench(tmp_path, "--sizes", "12Q").returncode == 2
    assert _bench(tmp_path, "--iters", "lots").returncode == 2


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is not None, reason="matplotlib is installed")
def test_plot_without_matplotlib_says_what_to_install(tmp_path) -> None:
    done = _bench(tmp_path, "--plot", "--ranks", "2", "--sizes", "8", "--iters", "small")
    assert done.returncode == 2 and "matplotlib" in done.stderr


def test_summary_takes_the_slowest_rank_per_iteration() -> None:
    cell = {"op": "all_reduce", "nbytes": 1 << 20, "backend": "fsdist", "cpu": 0.3, "error": None}
    ranks = [[{**cell, "times": [1.0, 3.0, 2.0]}], [{**cell, "times": [2.0, 1.0, 2.0], "cpu": 0.6}]]
    (row,) = report.summarise(2, ranks)
    assert row.p50_s == 2.0 and row.p99_s == 3.0 and row.iters == 3
    assert row.mean_s == 2.0  # the slower loop: rank 0's 6 s over 3 iterations (rank 1: 5 s)
    assert row.busbw_gbps == pytest.approx((1 << 20) / 2.0 / 1e9)  # 2(n-1)/n = 1 at n = 2
    assert row.cpu_s_per_op == pytest.approx(0.15) and row.verified
    bad = [[{**cell, "times": [1.0], "error": "1 of 4 elements wrong"}], [{**cell, "times": [1.0]}]]
    (row,) = report.summarise(2, bad)
    assert not row.verified and "rank 0" in (row.error or "")


def test_cells_timed_in_a_slow_phase_are_marked() -> None:
    def cell(op: str, backend: str, probes: list[float]) -> dict:
        return {"op": op, "nbytes": 8, "backend": backend, "cpu": 0.1, "error": None, "times": [1e-4], "probes": probes}

    ranks = [  # rank 0 probes; the other rank's lists stay empty
        [cell("all_reduce", "fsdist", [1e-3, 1.1e-3]), cell("all_reduce", "gloo", [1e-3]),
         cell("broadcast", "fsdist", [1e-3]), cell("broadcast", "gloo", [1e-3, 2e-3])],
        [cell("all_reduce", "fsdist", []), cell("all_reduce", "gloo", []),
         cell("broadcast", "fsdist", []), cell("broadcast", "gloo", [])],
    ]  # fmt: skip
    rows = report.summarise(2, ranks)
    assert [(r.probe_fastest_s, r.probe_s) for r in rows[:2]] == [(1e-3, 1.1e-3), (1e-3, 1e-3)]
    lines = report.table(rows).splitlines()
    assert lines[2].endswith(" ok") and lines[3].endswith(" ok slow")  # 2 ms: twice the fastest round
    assert "1 of 2 cells had a round at" in lines[-1] and "fastest 1.00 ms" in lines[-1]


def test_the_quiet_column_keeps_only_rounds_every_rank_probed_fast_on_both_sides() -> None:
    def cell(backend: str, times: list[float], before: list[float], after: list[float]) -> dict:
        return {"op": "all_reduce", "nbytes": 8, "backend": backend, "cpu": 0.1, "error": None, "times": times,
                "probes": before, "probes_after": after}  # fmt: skip

    # two rounds of two calls per backend. fsdist's second round: rank 0 slow after it (2 ms);
    # Gloo's second round: rank 1 slow before it (1.5 ms), rank 0 fast throughout
    rank0 = [cell("fsdist", [1e-4, 1e-4, 3e-4, 3e-4], [1e-3, 1e-3], [1e-3, 2e-3]),
             cell("gloo", [2e-4] * 4, [1e-3, 1e-3], [1e-3, 1e-3])]  # fmt: skip
    rank1 = [cell("fsdist", [1e-4] * 4, [1e-3, 1e-3], [1e-3, 1e-3]),
             cell("gloo", [1e-4, 1e-4, 4e-4, 4e-4], [1e-3, 1.5e-3], [1e-3, 1e-3])]  # fmt: skip
    limit = report.quiet_limit([[rank0, rank1]])
    assert limit == pytest.approx(1.4e-3)
    fs, gl = report.summarise(2, [rank0, rank1], limit)
    assert (fs.quiet_rounds, fs.quiet_p50_s) == (1, 1e-4) and fs.p50_s == pytest.approx(2e-4)
    assert (gl.quiet_rounds, gl.quiet_p50_s) == (1, 2e-4) and gl.p50_s == pytest.approx(3e-4)
    line = report.table([fs, gl]).splitlines()[2]
    assert line.endswith(" 1.50×  1.25×  2.00× ok slow"), line  # p50, mean, quiet
    unprobed = report.summarise(2, [rank0, rank1])  # no limit: no round counts as quiet
    assert [r.quiet_rounds for r in unprobed] == [0, 0]
    assert report.table(unprobed).splitlines()[2].endswith("     - ok slow")


def test_plan_sizes_and_iterations() -> None:
    assert [parse_size(s) for s in ("8", "1K", "64KiB", "16M", "1G")] == [8, 1024, 65536, 16 << 20, 1 << 30]
    assert iterations(8, "small") == Iterations(2, 3, 1) and iterations(8, "40") == Iterations(4, 40, 1)
    assert iterations(8, "500") == Iterations(50, 100, 5)  # a count of 100+ is split into turns
    large, small = iterations(64 << 20, "default"), iterations(8, "default")
    assert 1 <= large.warmup and 1 <= large.timed <= small.timed and small.rounds > 1
    plan = Plan(ops=["barrier", "all_reduce"], sizes=[8, 1024], backends=["fsdist"])
    assert plan.cells() == [("all_reduce", 8), ("all_reduce", 1024), ("barrier", 0)]


# ---- bench locks --------------------------------------------------------------------------


def test_lock_benchmark_loses_no_update_and_cleans_up(tmp_path) -> None:
    result = measure(str(tmp_path), procs=3, seconds=0.3)
    assert result.lost_updates == 0 and result.increments == result.final_value > 0
    assert len(result.per_process) == 3 and all(n > 0 for n in result.per_process)
    assert 0 < result.p50_us <= result.p99_us <= result.max_us
    assert os.listdir(tmp_path) == []


def test_lock_benchmark_through_a_second_path_to_the_same_directory(tmp_path) -> None:
    result = measure(str(tmp_path), procs=2, seconds=0.2, peer_directory=os.path.join(str(tmp_path), "."))
    assert result.lost_updates == 0 and result.final_value > 0


def test_lock_benchmark_cli_json_has_the_promised_keys(tmp_path) -> None:
    command = [sys.executable, "-m", "fsdist", "bench", "locks", str(tmp_path), "-n", "2", "--seconds", "0.2", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert {"lost_updates", "acquisitions_per_s", "p50_us", "p99_us", "max_us"} <= result.keys()
    assert result["lost_updates"] == 0


@pytest.mark.parametrize("kind", ["ofd", "posix", "flock", "filelock", "softfilelock"])
def test_every_lock_kind_loses_no_update_here_and_cleans_up(tmp_path, kind: str) -> None:
    """The locks other tools take (issue 35), side by side with fsdist's own: on a local
    filesystem each excludes, also through a second path to the directory."""
    result = measure(str(tmp_path), procs=3, seconds=0.3, peer_directory=os.path.join(str(tmp_path), "."), kind=kind)
    assert result.kind == kind and result.lost_updates == 0 and result.increments == result.final_value > 0
    assert os.listdir(tmp_path) == []


def test_lock_benchmark_cli_compares_the_kinds_in_one_table(tmp_path) -> None:
    command = [sys.executable, "-m", "fsdist", "bench", "locks", str(tmp_path), "-n", "2", "--seconds", "0.2",
               "--kind", "all"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines()[2:]}
    assert sorted(rows) == sorted(["fsdist", "ofd", "posix", "flock", "filelock", "softfilelock"]), done.stdout
    assert all(line.endswith("safe here") for line in rows.values()), done.stdout
    listed = subprocess.run([*command[:-1], "flock,posix", "--json"], capture_output=True, text=True, timeout=120)
    assert [r["kind"] for r in json.loads(listed.stdout)] == ["flock", "posix"], listed.stdout
    wrong = subprocess.run([*command[:-1], "fcntl"], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "--kind fcntl: each one of fsdist, ofd" in wrong.stderr, wrong.stderr
    assert os.listdir(tmp_path) == []


def test_lock_benchmark_refuses_a_peer_mount_that_is_not_the_same_directory(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    command = [sys.executable, "-m", "fsdist", "bench", "locks", str(tmp_path / "a"), "--peer-mount",
               str(tmp_path / "b"), "--seconds", "0.1"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not another mount" in done.stderr
    assert os.listdir(tmp_path / "a") == []


def test_bench_nodes_sets_flat_beside_two_tiers_with_shared_and_local_calls_apart(tmp_path) -> None:
    done = _bench(tmp_path, "--ranks", "4", "--nodes", "2", "--sizes", "8,1M", "--ops", "all_reduce,barrier",
                  "--iters", "small")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 simulated nodes" in done.stdout and "FAILED" not in done.stdout, done.stdout
    rows = json.loads((tmp_path / "result.json").read_text())["rows"]
    assert {r["backend"] for r in rows} == {"flat", "hier"} and all(r["verified"] for r in rows), rows
    by = {(r["backend"], r["op"], r["nbytes"]): r["fs_calls_by_kind"] for r in rows}
    flat, hier = by["flat", "all_reduce", 1 << 20], by["hier", "all_reduce", 1 << 20]
    # flat: every rank writes its 1 MiB to the shared directory; two tiers: a leader per node only
    assert flat["bytes"] >= 1 << 20 and not any(k.startswith("local ") for k in flat), flat
    assert hier["bytes"] * 4 <= 2 * (1 << 20) + 4096 and hier["local bytes"] > 0, hier
    assert os.listdir(tmp_path / "runs") == [], "the benchmark left its run directories behind"


def test_counting_tells_node_local_files_from_shared_ones(tmp_path) -> None:
    from fsdist.cli.bench import fscalls

    local, shared = tmp_path / "local", tmp_path / "shared"
    local.mkdir()
    shared.mkdir()
    with fscalls.counting(str(local)) as counts:
        for where in (local, shared):
            fd = os.open(where / "f", os.O_CREAT | os.O_WRONLY)
            os.write(fd, b"12345")
            os.close(fd)
    assert counts["local open"] == counts["open"] == 1, counts
    assert counts["local bytes"] == counts["bytes"] == 5, counts
    assert counts["local close"] == counts["close"] == 1, counts
