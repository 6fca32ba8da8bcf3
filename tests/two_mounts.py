"""Cases for a run directory reached through two mounts of one filesystem ("two nodes"): ranks
0-1 through mount A, 2-3 through mount B (test_gluster.py, test_filesystems.py)."""

from __future__ import annotations

import os
import signal
import time

from harness import RankPool
from in_rank import collectives as cases_collectives
from in_rank import p2p as cases_p2p
from in_rank import reliability as cases_reliability

#: the collective and p2p cases run across the two mounts
CASES = [
    (cases_collectives.all_reduce, ("SUM", "float32")),
    (cases_collectives.all_reduce, ("MAX", "int64")),
    (cases_collectives.reduce_scatter, ("SUM", "float32")),
    (cases_collectives.broadcast, ("float32",)),
    (cases_collectives.all_gather, ("bfloat16",)),
    (cases_collectives.all_to_all, ("int32",)),
    (cases_collectives.barrier_and_ordering, ()),
    (cases_p2p.tags_and_order, ()),
    (cases_p2p.any_source, ()),
    (cases_p2p.batch_exchange, ()),
]


def split_pool(a: str, b: str, **kwargs: object) -> RankPool:
    """Four ranks: 0 and 1 reach the run directory as ``a``, 2 and 3 as ``b``."""
    return RankPool(4, directories=[a, a, b, b], **kwargs)  # type: ignore[arg-type]


def no_failures(results: list) -> None:
    failures = [
        f"rank {r}: {f}" for r, res in enumerate(results) for f in (res["failures"] if isinstance(res, dict) else res)
    ]
    assert not failures, "\n".join(failures[:40])


def kill_one_and_start_the_next(a: str, b: str, victim: int = 2) -> str:
    """SIGKILL rank ``victim`` in the middle of all_reduces: every survivor must name it; then a
    new job in the same directory must start and run, so no lock of the dead rank outlived it
    (FUSE hands OFD locks to its daemon: their release at death is the filesystem's to get
    right). Returns what was measured, for the test's output."""
    pool = split_pool(a, b, group_timeout=120)
    ready = os.path.join(a, "ready")
    try:
        case = pool.start_each(cases_reliability.loop_until_killed, [("all_reduce", ready)] * 4, timeout=60)
        end = time.monotonic() + 60
        while not all(os.path.exists(f"{ready}.{r}") for r in range(4)):
            assert time.monotonic() < end, "ranks never got going"
            time.sleep(0.05)
        killed_at = time.time()
        os.kill(pool.processes[victim].pid, signal.SIGKILL)
        results = pool.results(f"{case}: kill rank {victim}", 90, deaths_expected=True)
    finally:
        pool.kill()
    survivors = {r: res for r, res in enumerate(results) if r != victim}
    for rank, (text, _) in survivors.items():
        assert text.startswith("PeerFailedError") and f"rank {victim}" in text, f"rank {rank}: {text}"
    latency = {r: round(at - killed_at, 2) for r, (_, at) in survivors.items()}
    start = time.monotonic()
    pool = split_pool(a, b, group_timeout=60)  # the next job, in the same directory
    try:
        no_failures(pool.run(cases_collectives.all_reduce, "SUM", "float32"))
    finally:
        pool.close()
    return (
        f"killed rank {victim}; each survivor noticed after {latency} s; "
        f"the next job started and ran in {time.monotonic() - start:.1f} s"
    )
