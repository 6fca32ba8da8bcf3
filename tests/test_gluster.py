"""fsdist on a real shared filesystem: GlusterFS, ranks split across two mounts ("two nodes").

``scripts/gluster-up.sh`` brings glusterd and two volumes up from scratch on this host (root
only; it apt-gets the packages if they are missing): ``strict`` (client caches off, zero
timeouts, direct I/O: lock-coherent) and ``default`` (Gluster's defaults). Each volume is
mounted twice, A and B; ranks 0 and 1 reach the run directory through A, ranks 2 and 3 through
B, so every lock and every read crosses clients as it would between nodes.

On ``strict`` the core collectives, p2p and a short DDP run must be correct. On ``default`` a
read under an fcntl lock returns old data through the other mount, lock-guarded counters lose
half their updates and the rendezvous file itself is corrupted (docs/filesystems.md), so
fsdist must refuse to start, naming the volume options and mount options to change.

Skipped when not root or GlusterFS cannot be installed, unless ``FSDIST_REQUIRE_GLUSTER=1``
(CI), which makes that a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest
from two_mounts import CASES, kill_one_and_start_the_next, no_failures

from harness import RankError, RankPool
from in_rank import collectives as cases_collectives
from in_rank import tiers as cases_tiers
from in_rank import training as cases_training

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts")
REQUIRED = os.environ.get("FSDIST_REQUIRE_GLUSTER", "") not in ("", "0")


@pytest.fixture(scope="module")
def gluster() -> Iterator[str]:
    """The state folder of a running GlusterFS: ``<state>/{strict,default}/{A,B}`` are mounts."""
    if os.geteuid() != 0 and not REQUIRED:
        pytest.skip("GlusterFS tests need root (glusterd, mount)")
    # outside the suite's TMPDIR: its clean-up must never walk into a mount
    state = tempfile.mkdtemp(prefix="fsdist-gluster-", dir="/var/tmp")
    start = time.monotonic()
    up = subprocess.run([os.path.join(SCRIPTS, "gluster-up.sh"), state], capture_output=True, text=True)
    try:
        if up.returncode == 77 and not REQUIRED:
            pytest.skip(f"GlusterFS unavailable: {up.stderr.strip()}")
        assert up.returncode == 0, f"gluster-up.sh failed:\n{up.stdout}\n{up.stderr}"
        print(f"\nGlusterFS up in {time.monotonic() - start:.1f} s")
        yield state
    finally:
        subprocess.run([os.path.join(SCRIPTS, "gluster-down.sh"), state], check=False)
        shutil.rmtree(state, ignore_errors=True)


def _split_pool(state: str, mode: str, world: int = 4, **kwargs: object) -> RankPool:
    """A pool whose first half of ranks use mount A and the second half mount B."""
    job = tempfile.mkdtemp(prefix="fsdist-test-gluster-", dir=os.path.join(state, mode, "A"))
    through_b = os.path.join(state, mode, "B", os.path.basename(job))
    dirs = [job if rank < world // 2 else through_b for rank in range(world)]
    return RankPool(world, directories=dirs, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def strict_pool(gluster: str) -> Iterator[RankPool]:
    pool = _split_pool(gluster, "strict")
    yield pool
    pool.close()


@pytest.mark.parametrize(
    ("case", "args"),
    CASES,
    ids=lambda v: v.__name__ if callable(v) else "-".join(v),
)
def test_strict_gluster_two_mounts(strict_pool: RankPool, case, args) -> None:
    start = time.monotonic()
    no_failures(strict_pool.run(case, *args))
    print(f"{case.__name__}{args}: {time.monotonic() - start:.1f} s")


def test_strict_gluster_records_as_measured(strict_pool: RankPool) -> None:
    """FSDIST_IO=auto measured the two mounts: what it chose, the same on every rank."""
    choices = strict_pool.run(cases_tiers.records_chosen)
    print(f"records: {choices[0]}")
    assert choices == ["direct"] * len(choices), choices  # (measured: docs/filesystems.md, GlusterFS)


def test_strict_gluster_ddp(strict_pool: RankPool) -> None:
    assert max(strict_pool.run(cases_training.ddp_matches_reference, "plain")) <= 1e-6


def test_strict_gluster_two_nodes_in_two_tiers(gluster: str) -> None:
    """Node 0's ranks on mount A, node 1's on mount B, each node's tier on /dev/shm: the leaders
    meet across the two clients, everyone else only on their own node."""
    pool = _split_pool(gluster, "strict", nodes=(2, 2))
    try:
        assert all(seen["node_tier"] and seen["leaders_tier"] for seen in pool.run(cases_tiers.tiers_in_use))
        for case, args in [
            (cases_collectives.all_reduce, ("SUM", "float32")),
            (cases_collectives.all_reduce, ("BXOR", "int64")),
            (cases_collectives.reduce, ("MAX", "float32")),
            (cases_collectives.reduce_scatter, ("SUM", "float32")),
            (cases_collectives.broadcast, ("float32",)),
            (cases_collectives.all_gather, ("bfloat16",)),
            (cases_collectives.barrier_and_ordering, ()),
        ]:
            no_failures(pool.run(case, *args))
        assert max(pool.run(cases_training.ddp_matches_reference, "plain")) <= 1e-6
    finally:
        pool.close()


def test_strict_gluster_locks_go_with_the_descriptor_and_the_process(gluster: str) -> None:
    """The FUSE question: fsdist's OFD lock reaches glusterfs as a plain lock request. Measured
    on each mount: a second descriptor of one process is excluded, and the lock is released when
    its descriptor closes and when its process is SIGKILLed (fs/probes.py lock_semantics)."""
    from fsdist.fs.probes import lock_semantics

    for mount in ("A", "B"):
        folder = tempfile.mkdtemp(prefix="fsdist-test-locks-", dir=os.path.join(gluster, "strict", mount))
        semantics = lock_semantics(os.path.join(folder, "lock"))
        print(f"strict GlusterFS, mount {mount}: {semantics}")
        assert semantics.problems() == [], semantics
        shutil.rmtree(folder)


def test_strict_gluster_reports_a_killed_rank_and_starts_the_next_job(gluster: str) -> None:
    job = tempfile.mkdtemp(prefix="fsdist-test-gluster-", dir=os.path.join(gluster, "strict", "A"))
    through_b = os.path.join(gluster, "strict", "B", os.path.basename(job))
    print(f"strict GlusterFS: {kill_one_and_start_the_next(job, through_b)}")


def test_default_gluster_is_refused_with_the_fix(gluster: str) -> None:
    with pytest.raises(RankError) as error:
        _split_pool(gluster, "default", group_timeout=20)
    text = str(error.value)
    assert "refusing to start" in text and "FSDIST_ALLOW_UNSAFE_FS" in text, text
    assert "performance." in text and "attribute-timeout=0" in text, text
