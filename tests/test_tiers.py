"""Two-tier collectives on simulated nodes: the collective matrix, and agreement with flat.

Each layout is a pool whose ranks carry a node id and a node-local directory of their own
(harness.py ``nodes``): (2, 2) and (2, 3) are even and odd nodes, (3, 1) a node with one rank
(its leader alone, no node tier). Four leaders and more (their tier by doubling) run in
milliseconds in tests/test_algorithms.py over memory channels, and on 8 and 16 processes in
tests/scale (`make test-scale`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from harness import RankPool, left_in
from in_rank import collectives as cases
from in_rank import errors as cases_errors
from in_rank import groups as cases_groups
from in_rank import status as cases_status
from in_rank import tiers as cases_tiers
from test_collectives import _check
from test_status import _while_held_up

LAYOUTS = [(2, 2), (2, 3), (3, 1)]
#: every reduce op once, on a float and an integer dtype between them
REDUCTIONS = [
    ("SUM", "float32"), ("AVG", "float32"), ("PREMUL_SUM", "float32"), ("MIN", "float32"),
    ("PRODUCT", "int64"), ("MAX", "int64"), ("BAND", "int64"), ("BOR", "int64"), ("BXOR", "int64"),
    ("SUM", "int64"), ("SUM", "bfloat16"),
]  # fmt: skip
SMALL_LAYOUTS = LAYOUTS
#: each reduction on one layout, in turn: every op and every layout is covered, not their product
#: (the flat suite has the full matrix; what the tiers add is the same on every op)
SPREAD = [(SMALL_LAYOUTS[i % len(SMALL_LAYOUTS)], op, dtype) for i, (op, dtype) in enumerate(REDUCTIONS)]


def _pool(pool_factory, layout: tuple[int, ...]):
    return pool_factory(sum(layout), "fsdist", layout)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_the_world_group_runs_in_two_tiers(pool_factory, layout) -> None:
    results = _pool(pool_factory, layout).run(cases_tiers.tiers_in_use)
    singles = {sum(layout[:i]) for i, count in enumerate(layout) if count == 1}
    for rank, seen in enumerate(results):
        assert seen["node_tier"] == (rank not in singles), f"rank {rank}: {seen}"
        assert seen["leaders_tier"], f"rank {rank}: {seen}"


@pytest.mark.parametrize("layout,op,dtype", SPREAD, ids=str)
def test_all_reduce(pool_factory, layout, op: str, dtype: str) -> None:
    _check(_pool(pool_factory, layout).run(cases.all_reduce, op, dtype), same_on_all_ranks=True)


#: reduce and reduce_scatter visit every root and shape: six reductions, two per layout
ROOTED = [
    (layout, op, dtype) for layout, op, dtype in SPREAD if op in ("SUM", "AVG", "PREMUL_SUM", "PRODUCT", "MAX", "BXOR")
]


@pytest.mark.parametrize("layout,op,dtype", [c for c in ROOTED if c[2] != "bfloat16"], ids=str)
def test_reduce_and_reduce_scatter(pool_factory, layout, op: str, dtype: str) -> None:
    pool = _pool(pool_factory, layout)
    _check(pool.run(cases.reduce, op, dtype), same_on_all_ranks=False)
    _check(pool.run(cases.reduce_scatter, op, dtype), same_on_all_ranks=False)


@pytest.mark.parametrize(
    "layout,collective,dtype",
    [
        (layout, c, dtype)
        for layout, dtype in zip(SMALL_LAYOUTS, ["float32", "int64", "float16"], strict=True)
        for c in (cases.broadcast, cases.all_gather)
    ]
    + [((3, 1), c, "float32") for c in (cases.gather, cases.scatter, cases.all_to_all)],  # flat beside tiers
    ids=lambda v: v.__name__ if callable(v) else str(v),
)
def test_data_movement(pool_factory, layout, collective, dtype: str) -> None:
    _check(
        _pool(pool_factory, layout).run(collective, dtype),
        same_on_all_ranks=collective in (cases.broadcast, cases.all_gather),
    )


@pytest.mark.parametrize("layout", SMALL_LAYOUTS, ids=str)
def test_coalesced_barrier_and_subgroups(pool_factory, layout) -> None:
    pool = _pool(pool_factory, layout)
    _check(pool.run(cases.coalesced, "SUM", "float32"), same_on_all_ranks=True)
    _check(pool.run(cases.barrier_and_ordering), same_on_all_ranks=True)
    if sum(layout) == 4:  # its subgroups span the nodes unevenly
        assert pool.run(cases_groups.subgroups) == [[]] * sum(layout)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_two_tiers_give_the_flat_bits_where_arithmetic_is_exact(pool_factory, layout) -> None:
    results = _pool(pool_factory, layout).run(cases_tiers.flat_and_tiered_agree)
    failures = [f"rank {rank}: {f}" for rank, res in enumerate(results) for f in res]
    assert not failures, "\n".join(failures[:20])


def _run_fresh(layout: tuple[int, ...], case, deaths_expected: bool = False) -> list:
    pool = RankPool(sum(layout), group_timeout=60, nodes=layout)
    try:
        return pool.run_each(case, [()] * sum(layout), timeout=40, deaths_expected=deaths_expected)
    finally:
        pool.kill()


@pytest.mark.parametrize(
    "case",
    [cases_tiers.nodes_disagree_on_the_shape, cases_tiers.one_rank_disagrees_on_the_shape],
    ids=lambda f: f.__name__,
)
def test_a_desync_on_one_node_is_reported_on_every_rank_of_every_node(case) -> None:
    for rank, text in enumerate(_run_fresh((2, 2), case)):
        assert text.startswith(("DesyncError", "PeerFailedError")), f"rank {rank}: {text}"
        assert "float32[12]" in text and "float32[10]" in text, f"rank {rank}: {text}"


def test_a_rank_dying_on_one_node_is_named_on_the_other() -> None:
    # group timeout 60 s, case deadline 40 s: only dead-peer detection, crossing the tiers, passes
    results = _run_fresh((2, 2), cases_errors.peer_dies_during_all_reduce, deaths_expected=True)
    for rank in (0, 2, 3):
        assert results[rank].startswith("PeerFailedError"), f"rank {rank}: {results[rank]}"
        assert "rank 1" in results[rank] and "died" in results[rank], f"rank {rank}: {results[rank]}"


def test_status_shows_both_tiers_and_the_rank_that_holds_them_up(pool_factory, tmp_path, monkeypatch) -> None:
    pool = _pool(pool_factory, (2, 2))
    # `fsdist status` run as on node 1: it sees the leaders' tier and node 1's own
    monkeypatch.setenv("FSDIST_NODE_ID", "node1")
    monkeypatch.setenv("FSDIST_LOCAL_DIR", pool.node_dirs[1])

    def held_up(status: Any) -> bool:
        return any(g.straggler is not None and g.straggler.ranks == [3] for g in status.groups)

    results, (shown, text, *_) = _while_held_up(
        pool, cases_status.straggle_before_all_reduce, 3, str(tmp_path / "release"), held_up
    )
    assert results == [10.0] * 4
    status = json.loads(shown.stdout)
    print(text.stdout)
    names = [g["name"] for g in status["groups"]]
    assert names[:3] == ["world", "world · leaders' tier", "world · node node1's tier"], names
    leaders, node = status["groups"][1], status["groups"][2]
    assert leaders["ranks"] == [0, 2] and node["ranks"] == [2, 3]
    assert node["straggler"]["ranks"] == [3] and node["straggler"]["waiting_ranks"] == [2]
    assert status["groups"][0]["straggler"]["ranks"] == [3]  # the world group's ranks, where the tiers see them
    assert status["holding_up"] == [3], status["summary"]
    assert "node node1's tier" in text.stdout
    assert "rank 3 holding the job up runs on node node1" in status["summary"], status["summary"]


TIERS_SCRIPT = """
import os, torch, torch.distributed as dist
dist.init_process_group("fsdist")
x = torch.full((5,), float(dist.get_rank()))
dist.all_reduce(x)
mine = os.path.join(os.environ["FSDIST_LOCAL_DIR"], f"fsdist-{os.geteuid()}")
tier = os.path.isdir(mine) and any(name.startswith("tier-") for name in os.listdir(mine))
print(f"rank {dist.get_rank()} node {os.environ['FSDIST_NODE_ID']} sum {x[0].item():.0f} node tier {tier}")
dist.destroy_process_group()
"""


@pytest.mark.parametrize("shared_local_dir", [False, True], ids=["own-local-dirs", "one-local-dir"])
def test_two_launchers_with_their_own_node_ids_run_as_two_machines(tmp_path, shared_local_dir: bool) -> None:
    """Also when both nodes keep their tiers in one directory (containers sharing /dev/shm):
    each node's tier has a name of its own."""
    script = tmp_path / "tiers.py"
    script.write_text(TIERS_SCRIPT)
    launchers = []
    for node in (0, 1):
        local = tmp_path / ("node0" if shared_local_dir else f"node{node}")
        local.mkdir(mode=0o700, exist_ok=True)
        env = {**os.environ, "FSDIST_NODE_ID": f"node{node}", "FSDIST_LOCAL_DIR": str(local)}
        command = [sys.executable, "-m", "fsdist", "run", "--dir", str(tmp_path / "run"), "--nnodes", "2",
                   "--node-rank", str(node), "--nproc-per-node", "2", str(script)]  # fmt: skip
        launchers.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outputs = [launcher.communicate(timeout=300) for launcher in launchers]
    for node, (launcher, (out, err)) in enumerate(zip(launchers, outputs, strict=True)):
        assert launcher.returncode == 0, f"node {node}: {out + err}"
        for local_rank in range(2):
            line = f"rank {2 * node + local_rank} node node{node} sum 6 node tier True"
            assert line in out, f"node {node}: {out + err}"
        assert left_in(str(tmp_path / ("node0" if shared_local_dir else f"node{node}"))) == [], "a node tier was left"


def test_forced_two_tiers_on_one_node_and_forced_flat_across_nodes(pool_factory) -> None:
    """FSDIST_ALGO=hier on one machine: a node tier only (no leaders' tier); =flat across nodes."""
    for pool, algo in [(pool_factory(3), "hier"), (_pool(pool_factory, (2, 2)), "flat")]:
        results = pool.run(cases_tiers.a_few_ops, algo)
        failures = [f"rank {rank}: {f}" for rank, res in enumerate(results) for f in res]
        assert not failures, "\n".join(failures[:20])


CRASH_SCRIPT = """
import os, sys, torch, torch.distributed as dist
rank, mode, run = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("fsdist", init_method=f"fsdist://{run}", rank=rank, world_size=4)
x = torch.ones(3)
dist.all_reduce(x)
mine = os.path.join(os.environ["FSDIST_LOCAL_DIR"], f"fsdist-{os.geteuid()}")
print(sorted(os.listdir(mine)), flush=True)
dist.barrier()
if mode == "crash":
    os._exit(3)  # no shutdown: the generation and its node tiers stay behind
dist.destroy_process_group()
"""


def test_a_crashed_jobs_node_tiers_go_when_the_next_job_starts(tmp_path) -> None:
    script = tmp_path / "job.py"
    script.write_text(CRASH_SCRIPT)
    locals_ = [tmp_path / "node0", tmp_path / "node1"]
    for local in locals_:
        local.mkdir(mode=0o700)

    def job(mode: str) -> list[str]:
        procs = []
        for rank in range(4):
            env = {**os.environ, "FSDIST_NODE_ID": f"node{rank // 2}", "FSDIST_LOCAL_DIR": str(locals_[rank // 2])}
            command = [sys.executable, str(script), str(rank), mode, str(tmp_path / "run")]
            procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        outs = [proc.communicate(timeout=120) for proc in procs]
        for rank, (proc, (out, err)) in enumerate(zip(procs, outs, strict=True)):
            assert proc.returncode == (3 if mode == "crash" else 0), f"rank {rank}: {out + err}"
        return [out for out, _ in outs]

    job("crash")
    left = [cases_tiers.node_tiers(str(local)) for local in locals_]
    assert all(len(names) == 1 and names[0].startswith("tier-") for names in left), left
    for out in job("ok"):  # each rank sees only its new generation's tier: the crashed one's is gone
        assert len(eval(out.strip())) == 1 and eval(out.strip()) != left[0] and eval(out.strip()) != left[1], out
    assert [left_in(str(local)) for local in locals_] == [[], []]


def test_one_node_id_on_two_machines_is_refused_on_every_rank(monkeypatch) -> None:
    """Two machines given one FSDIST_NODE_ID would wait forever in a node tier that each keeps in
    its own /dev/shm: every rank of the group refuses, naming the ranks and what to set."""
    from types import SimpleNamespace

    from fsdist.c10d.placement import two_tiers
    from fsdist.job.liveness import Identity

    monkeypatch.delenv("FSDIST_LOCAL_DIR", raising=False)
    monkeypatch.delenv("FSDIST_ALGO", raising=False)
    monkeypatch.delenv("FSDIST_IO", raising=False)
    members = [Identity("h", 1, 1, machine=f"boot{r // 2 if r < 2 else r}", node="n0" if r < 2 else f"n{r}")
               for r in range(4)]  # fmt: skip
    members[1] = Identity("h2", 1, 1, machine="another-boot", node="n0")
    generation = SimpleNamespace(members=members, generation_id="0" * 16, heartbeat_path=lambda r: "")

    class Store:
        def set(self, key: str, value: str) -> None: ...

        def get(self, key: str) -> bytes:
            return b"hier"

    for rank in range(4):
        with pytest.raises(ValueError, match=r"ranks 0, 1 of this group count as one node .* FSDIST_NODE_ID"):
            two_tiers(Store(), generation, range(4), rank, SimpleNamespace(directory="/nonexistent/k.0.0"), 10.0)  # type: ignore[arg-type]
    # FSDIST_ALGO set unlike rank 0's: refused at creation, naming both (FSDIST_IO is checked
    # once for the job: test_direct.py's test_forced_records_are_not_measured_and_must_be_set_alike)
    monkeypatch.setenv("FSDIST_ALGO", "flat")
    with pytest.raises(ValueError, match=r"as 'flat' \(FSDIST_ALGO=flat\), rank 0 as 'hier'.*FSDIST_ALGO alike"):
        two_tiers(Store(), generation, range(4), 2, SimpleNamespace(directory="/nonexistent/k.0.0"), 10.0)  # type: ignore[arg-type]
