"""One rank of the NFS-in-VM check: collectives, p2p and a short DDP run, results checked."""

from __future__ import annotations

import faulthandler
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import fsdist  # noqa: F401


def _phase(rank: int, start: float, what: str) -> None:
    """A progress line per phase: a rank stopped by the time limit shows how far it got."""
    print(f"rank {rank} +{time.monotonic() - start:.1f} s {what}", flush=True)


def main() -> None:
    directory, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    label = sys.argv[4] if len(sys.argv) > 4 else "NFS"
    # guest.sh's `timeout -s USR1` makes a stuck rank print every thread's stack before it is killed
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    start = time.monotonic()
    _phase(rank, start, "imported torch; joining")
    dist.init_process_group("fsdist", init_method=f"fsdist://{directory}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))  # fmt: skip
    t0 = time.monotonic()
    _phase(rank, start, "joined")
    for n in (1, 1000, 300_000):
        t = torch.full((n,), float(rank + 1))
        dist.all_reduce(t)
        assert torch.all(t == world * (world + 1) / 2), "all_reduce"
        b = torch.full((n,), float(rank))
        dist.broadcast(b, src=world - 1)
        assert torch.all(b == world - 1), "broadcast"
        out = [torch.empty(n) for _ in range(world)]
        dist.all_gather(out, torch.full((n,), float(rank)))
        assert all(torch.all(o == r) for r, o in enumerate(out)), "all_gather"
    _phase(rank, start, "collectives done")
    send = torch.full((10,), float(rank))
    recv = torch.empty(10)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert torch.all(recv == (rank - 1) % world), "p2p ring"
    _phase(rank, start, "p2p done")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    _phase(rank, start, "DDP built")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        torch.manual_seed(100 * step + rank)
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(g, flat) for g in gathered), "DDP replicas differ"
    ops_s = time.monotonic() - t0
    _phase(rank, start, "DDP trained 5 steps")
    dist.destroy_process_group()
    print(f"rank {rank} PASS ({label}) init {t0 - start:.1f} s, work {ops_s:.1f} s, destroy {time.monotonic() - t0 - ops_s:.1f} s", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # noqa: BLE001 - reported to the result file
        print(f"rank {sys.argv[2]} FAIL {type(exc).__name__}: {exc}", flush=True)
        raise
