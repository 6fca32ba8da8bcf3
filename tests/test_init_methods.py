"""Every way torch forms a group works with fsdist: file://, default env:// under `fsdist run`,
env:// with torch's TCPStore, and a user's store= — at world sizes 1–4, with the collective
matrix's representative ops and subgroups. (fsdist:// itself is what every other test uses.)
"""

from __future__ import annotations

import os

import pytest

from harness import INIT_METHODS, RankPool
from in_rank import collectives as collectives
from in_rank import groups as groups
from in_rank import init as cases_init
from in_rank import p2p as p2p

ROUTES = [m for m in INIT_METHODS if m != "fsdist"]
WORLDS = [1, 2, 3, 4]
CASES = {
    "all_reduce SUM float32": (collectives.all_reduce, "SUM", "float32"),
    "all_reduce MAX int64": (collectives.all_reduce, "MAX", "int64"),
    "reduce_scatter AVG float64": (collectives.reduce_scatter, "AVG", "float64"),
    "broadcast bfloat16": (collectives.broadcast, "bfloat16"),
    "all_gather int32": (collectives.all_gather, "int32"),
    "all_to_all float32": (collectives.all_to_all, "float32"),
    "barrier and async order": (collectives.barrier_and_ordering,),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("route", ROUTES)
def test_collectives(pools, route: str, world: int, case: str) -> None:
    function, *args = CASES[case]
    results = pools.get(world, route).run(function, *args)
    failures = [f"rank {rank}: {f}" for rank, res in enumerate(results) for f in res["failures"]]
    assert not failures, "\n".join(failures[:40])


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("route", ROUTES)
def test_p2p_and_subgroups(pools, route: str, world: int) -> None:
    pool = pools.get(world, route)
    failures = pool.run(cases_init.subgroup_of_the_ends)
    if world > 1:
        failures += pool.run(p2p.ring_every_dtype_and_shape)
    if world == 4:
        failures += pool.run(groups.subgroups)
    assert not [f for f in failures if f], failures


@pytest.mark.parametrize("route", ROUTES)
def test_the_group_is_fsdist_and_says_where_its_files_are(pools, route: str) -> None:
    pool = pools.get(2, route)
    seen = pool.run(cases_init.what_the_group_is)
    assert [s["backend"] for s in seen] == ["fsdist"] * 2
    assert [(s["rank"], s["size"]) for s in seen] == [(0, 2), (1, 2)]
    roots = {s["root"] for s in seen}
    assert len(roots) == 1
    root = roots.pop()
    expected = {
        "file": os.path.realpath(f"{pool.directory}/initfile") + ".fsdist",  # beside torch's file
        "env": os.path.realpath(pool.directory),  # FSDIST_DIR itself
        "store": os.path.realpath(f"{pool.directory}/storefile") + ".fsdist",
    }
    if route == "tcp":  # node-local: a fresh folder in FSDIST_LOCAL_DIR (the test points it here)
        assert os.path.dirname(root) == os.path.join(os.path.realpath(pool.directory), f"fsdist-{os.getuid()}")
        assert os.path.basename(root).startswith("run-"), root
    else:
        assert root == expected[route]


@pytest.mark.parametrize("route", ROUTES)
def test_destroy_leaves_only_what_each_route_documents(route: str) -> None:
    pool = RankPool(3, init_method=route)
    directory = pool.directory
    pool.run(collectives.barrier_and_ordering)
    remaining = pool.close()  # raises if anything but the rendezvous file is left
    # fsdist's own rendezvous file stays in a run directory users name (FSDIST_DIR, fsdist://:
    # deleting a lock file others may be about to lock is unsafe); a directory fsdist made for
    # the job alone (beside torch's file, or node-local) goes entirely, and torch's FileStore
    # removes its own file when its last user closes it
    assert remaining == (["fsdist-rendezvous.json"] if route == "env" else []), remaining
    assert not os.path.exists(directory)


def test_fsdist_subgroups_under_a_gloo_world(tmp_path) -> None:
    pool = RankPool(3, init=False)
    try:
        results = pool.run_each(cases_init.fsdist_groups_under_a_gloo_world, [(str(tmp_path), r, 3) for r in range(3)])
    finally:
        pool.kill()
    assert results == [[6.0, 2.0], [6.0, 2.0], [6.0, 1.0]]
    leftovers = [n for n in os.listdir(tmp_path) if n != "initfile"]  # torch's FileStore file is Gloo's
    assert not leftovers, leftovers


def test_a_gloo_group_formed_through_the_directory_leaves_nothing_behind(tmp_path) -> None:
    pool = RankPool(2, init=False)
    try:
        results = pool.run_each(cases_init.gloo_through_the_directory, [(str(tmp_path), r, 2, 2) for r in range(2)])
    finally:
        pool.close()  # the ranks exit normally: fsdist leaves the last generation at exit
    assert results == [[2.0, 2.0]] * 2
    assert os.listdir(tmp_path) == ["fsdist-rendezvous.json"], os.listdir(tmp_path)
