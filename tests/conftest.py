"""Shared fixtures, and the suite's own hygiene checks.

Every temporary file of the suite (rank pools' run directories, pytest's tmp_path, the
children's temporary files) lives under one fresh directory. At the end of the session a
leaked child process, or a run directory left behind, fails the run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from harness import Pools, RankPool, torchs_import_folder

# tests/frameworks needs Lightning, accelerate and transformers (the `frameworks` extra): only
# `make test-frameworks` runs it, setting FSDIST_FRAMEWORKS=1 (its conftest then fails the session
# if a framework is missing). Left out here, it is never collected, so never silently skipped.
collect_ignore = [] if os.environ.get("FSDIST_FRAMEWORKS") == "1" else ["frameworks"]
# tests/scale runs worlds of 8 and 16 ranks (minutes on 2 cores): only `make test-scale`, which
# sets FSDIST_SCALE=1, collects it.
if os.environ.get("FSDIST_SCALE") != "1":
    collect_ignore.append("scale")

#: FSDIST_TEST_WORLDS=2,3 keeps, of the cases parametrized by world size, those of these sizes only
#: (make test-torch-versions runs every collective at worlds 2 and 3 on each torch release); the
#: others are reported as deselected
WORLDS = {int(w) for w in os.environ.get("FSDIST_TEST_WORLDS", "").split(",") if w.strip()}

SUITE_TMP = tempfile.mkdtemp(prefix="fsdist-suite-")
os.environ["TMPDIR"] = SUITE_TMP  # spawned ranks inherit it
tempfile.tempdir = SUITE_TMP


@pytest.fixture(scope="session")
def pools() -> Iterator[Pools]:
    cache = Pools()
    yield cache
    cache.close_all()


@pytest.fixture
def pool_factory(pools: Pools):
    """``pool_factory(n)``: the session's live pool of n ranks."""
    return pools.get


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not WORLDS:
        return
    kept, dropped = [], []
    for item in items:
        world = getattr(item, "callspec", None) and item.callspec.params.get("world")
        (dropped if world is not None and world not in WORLDS else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    problems = []
    leaked = [p for p in mp.active_children() if p.is_alive()]
    if leaked:
        problems.append(f"test processes leaked: {leaked}")
        for proc in leaked:
            proc.kill()
    # pytest's own tmp_path tree, and torch's compile cache (torch writes it to TMPDIR)
    ours = ("pytest-of-", "torchinductor_")
    held = torchs_import_folder()  # torch's, removed at this interpreter's exit
    torchs = {os.path.basename(held.name)} if held is not None else set()
    leftovers = sorted(n for n in os.listdir(SUITE_TMP) if not n.startswith(ours) and n not in torchs)
    if leftovers:
        problems.append(f"run directories or files left in {SUITE_TMP}: {leftovers}")
    shutil.rmtree(SUITE_TMP, ignore_errors=True)
    if problems:
        print("\nHYGIENE FAILURE:\n" + "\n".join(problems))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


__all__ = ["RankPool"]
