"""Subgroups: sizes 1, 2, all; unsorted ranks; a rank in no subgroup; groups kept apart."""

from __future__ import annotations

from in_rank import groups as cases


def test_subgroups(pool_factory) -> None:
    results = pool_factory(4).run(cases.subgroups)
    failures = [f"rank {r}: {f}" for r, fs in enumerate(results) for f in fs]
    assert not failures, "\n".join(failures)


def test_each_group_has_its_own_directory(pool_factory) -> None:
    pool = pool_factory(2)
    results = pool.run(cases.group_files_apart, pool.directory)
    assert results[0] == results[1]
    assert len(results[0]) >= 2, results[0]  # the world group's and the new group's


def test_recreated_group_starts_fresh(pool_factory) -> None:
    results = pool_factory(3).run(cases.recreate_group)
    assert results == [[], [], []]
