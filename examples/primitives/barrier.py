"""barrier: no rank leaves it before every rank has entered it.

    python -m fsdist run --nproc-per-node 4 --dir /tmp/fsdist-run-$(id -u) examples/primitives/barrier.py

Rank 0 dawdles, then leaves a marker file before entering; every rank finds the marker after
the barrier. The marker lives in the run directory because it is the one place every rank of
a multi-node job is guaranteed to see.
"""

from __future__ import annotations

import os
import time

import torch.distributed as dist

from _common import check, main


def run(rank: int, world: int) -> None:
    marker = os.path.join(os.environ["FSDIST_DIR"], "barrier-example-marker")
    if rank == 0:
        time.sleep(0.5)  # the others reach the barrier first and must wait here
        with open(marker, "w") as out:
            out.write("rank 0 was here before the barrier")
    dist.barrier()
    check(os.path.exists(marker), "left the barrier before rank 0 entered it")
    dist.barrier()  # everyone has looked: now the marker may go
    if rank == 0:
        os.remove(marker)


if __name__ == "__main__":
    main(run)
