"""Shared fixtures: one live pool of ranks per world size for the whole session."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterator

import pytest

from harness import Pools, RankPool


@pytest.fixture(scope="session")
def pools() -> Iterator[Pools]:
    cache = Pools()
    yield cache
    cache.close_all()
    leaked = [p for p in mp.active_children() if p.is_alive()]
    assert not leaked, f"test processes leaked: {leaked}"


@pytest.fixture
def pool_factory(pools: Pools):
    """``pool_factory(n)``: the session's live pool of n ranks."""
    return pools.get


__all__ = ["RankPool"]
