"""``python -m fsdist.cli.bench.rank PLAN OUT``: one rank of a benchmark world.

The rank joins an fsdist job (``FSDIST_DIR``, ``RANK``, ``WORLD_SIZE`` from the parent) and,
when Gloo is compared, a Gloo group of the same processes (``new_group(backend="gloo")``: its
rendezvous goes through fsdist's store, its data over loopback TCP). Both backends are driven
through the same ``torch.distributed`` calls, cell by cell, alternating which goes first, so
machine noise hits both alike. It writes every iteration's end time to OUT for the parent,
which takes the slowest rank per iteration (nccl-tests style).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from ...defaults import ENV_ALGO
from . import fscalls
from .ops import make_case
from .plan import Plan, iterations

#: iterations run again while counting filesystem calls (after the timed ones)
COUNTED_ITERS = 100


def run_cell(op: str, nbytes: int, plan: Plan, group: dist.ProcessGroup) -> dict[str, Any]:
    """Warm up (the first call is verified), then time ``iters`` back-to-back calls."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    case = make_case(op, nbytes, rank, world, group)
    warmup, iters = iterations(nbytes, plan.iters)
    case.run()
    problem = case.check()
    case.reset()
    for _ in range(warmup - 1):
        case.run()
    dist.barrier(group=group)
    cpu0 = time.process_time()
    start = time.perf_counter()
    ends = []
    for _ in range(iters):
        case.run()
        ends.append(time.perf_counter())
    cpu = time.process_time() - cpu0
    # back-to-back calls: iteration i took from the end of i-1 to its own end
    times = [b - a for a, b in zip([start, *ends[:-1]], ends, strict=True)]
    # filesystem calls in a pass of their own, so counting costs the timed calls nothing
    counted = min(iters, COUNTED_ITERS)
    dist.barrier(group=group)
    with fscalls.counting(os.environ.get("FSDIST_LOCAL_DIR") if plan.nodes else None) as counts:
        for _ in range(counted):
            case.run()
    fs_calls = {kind: n / counted for kind, n in counts.items()}
    return {"op": op, "nbytes": case.nbytes, "requested": nbytes, "times": times, "cpu": cpu, "error": problem,
            "fs_calls": fs_calls}  # fmt: skip


def blocked_cpu(group: dist.ProcessGroup, seconds: float = 1.0) -> float:
    """CPU seconds a rank burns while blocked ``seconds`` in a barrier (rank 0 arrives late)."""
    dist.barrier(group=group)
    if dist.get_rank(group) == 0:
        time.sleep(seconds)
    cpu0 = time.process_time()
    dist.barrier(group=group)
    return time.process_time() - cpu0


def _group_running(algo: str) -> dist.ProcessGroup:
    """A group of every rank whose collectives run ``algo`` (``flat`` or ``hier``)."""
    os.environ[ENV_ALGO] = algo
    try:
        return dist.new_group(backend="fsdist")
    finally:
        del os.environ[ENV_ALGO]


def _progress(line: str) -> None:
    path = os.environ.get("FSDIST_BENCH_PROGRESS")
    if path:
        with open(path, "a") as out:
            out.write(line + "\n")


def main(plan_path: str, out_path: str) -> int:
    with open(plan_path) as source:
        plan = Plan.from_json(json.load(source))
    if plan.threads:
        torch.set_num_threads(plan.threads)
    import fsdist  # noqa: F401  registers the backend (the entry point does too, when installed)

    dist.init_process_group("fsdist", init_method="fsdist://")
    groups: dict[str, dist.ProcessGroup] = {"fsdist": dist.group.WORLD}  # type: ignore[dict-item]
    if "gloo" in plan.backends:
        groups["gloo"] = dist.new_group(backend="gloo")
    if plan.nodes:  # the two forms as groups of every rank (the form is decided at creation)
        groups = {algo: _group_running(algo) for algo in plan.backends}
    results: list[dict[str, Any]] = []
    cells = plan.cells()
    for index, (op, nbytes) in enumerate(cells):
        order = plan.backends if index % 2 == 0 else list(reversed(plan.backends))
        for backend in order:
            cell = run_cell(op, nbytes, plan, groups[backend])
            cell["backend"] = backend
            results.append(cell)
        if dist.get_rank() == 0:  # the parent echoes these lines while it waits: the sweep's progress
            _progress(f"[{index + 1}/{len(cells)}] {op} {nbytes} B done")
    blocked = {backend: blocked_cpu(group) for backend, group in groups.items()}
    dist.barrier()
    for name, group in groups.items():
        if name != "fsdist":
            dist.destroy_process_group(group)
    dist.destroy_process_group()
    temp = f"{out_path}.tmp"
    with open(temp, "w") as out:
        json.dump({"rank": int(os.environ["RANK"]), "results": results, "blocked_cpu": blocked}, out)
    os.replace(temp, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
