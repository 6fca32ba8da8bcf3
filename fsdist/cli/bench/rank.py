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

from ...defaults import ENV_ALGO, ENV_BENCH_PROGRESS, ENV_LOCAL_DIR
from . import fscalls
from .ops import Case, make_case
from .plan import Plan, iterations

#: iterations run again while counting filesystem calls (after the timed ones)
COUNTED_ITERS = 100
#: turns of the CPU-speed probe's loop (~0.4 ms of one core here, ~0.8 ms in a slow phase)
PROBE_TURNS = 15_000


def speed_probe() -> float:
    """CPU seconds of a fixed pure-Python loop: this machine's speed for fsdist's own code.

    This VM runs Python at two speeds in phases of ~0.2-2 s (the same loop: 12 or 23 ms), each
    vCPU on its own (timed side by side, one core's loop took ~1.6x the other's for seconds),
    and fsdist, whose small operations are Python, slows with it where Gloo's C++ barely does.
    Thread CPU time, so a rank waiting for a core does not count as a slow one."""
    start = time.thread_time()
    total = 0
    for turn in range(PROBE_TURNS):
        total += turn * turn
    return time.thread_time() - start


def run_cells(
    op: str, nbytes: int, plan: Plan, groups: dict[str, dist.ProcessGroup], order: list[str]
) -> list[dict[str, Any]]:
    """One cell for each backend of ``order``: warm up (the first call is verified), then time
    back-to-back calls in rounds, the backends taking turns (plan.iterations says why)."""
    its = iterations(nbytes, plan.iters)
    cases: dict[str, Case] = {}
    results: dict[str, dict[str, Any]] = {}
    for backend in order:
        group = groups[backend]
        case = make_case(op, nbytes, dist.get_rank(group), dist.get_world_size(group), group)
        case.run()
        problem = case.check()
        case.reset()
        for _ in range(its.warmup - 1):
            case.run()
        cases[backend] = case
        results[backend] = {"op": op, "nbytes": case.nbytes, "requested": nbytes, "times": [], "cpu": 0.0,
                            "error": problem, "probes": [], "probes_after": []}  # fmt: skip
    for _ in range(its.rounds):
        for backend in order:
            case, result = cases[backend], results[backend]
            # every rank probes: this VM's vCPUs drift apart (one ran ~1.6x slower than the
            # other for seconds), and a call takes as long as its slowest rank
            result["probes"].append(speed_probe())
            dist.barrier(group=groups[backend])
            case.run()  # untimed: it absorbs the ranks leaving the barrier apart
            cpu0 = time.process_time()
            start = time.perf_counter()
            ends = []
            for _ in range(its.per_round):
                case.run()
                ends.append(time.perf_counter())
            result["cpu"] += time.process_time() - cpu0
            dist.barrier(group=groups[backend])  # untimed: no rank probes while a peer still times
            result["probes_after"].append(speed_probe())  # quiet rounds are fast on both sides
            # back-to-back calls: iteration i took from the end of i-1 to its own end
            result["times"] += [b - a for a, b in zip([start, *ends[:-1]], ends, strict=True)]
    for backend in order:
        # filesystem calls in a pass of their own, so counting costs the timed calls nothing
        counted = min(its.timed, COUNTED_ITERS)
        dist.barrier(group=groups[backend])
        with fscalls.counting(os.environ.get(ENV_LOCAL_DIR) if plan.nodes else None) as counts:
            for _ in range(counted):
                cases[backend].run()
        results[backend]["fs_calls"] = {kind: n / counted for kind, n in counts.items()}
        results[backend]["backend"] = backend
    return [results[backend] for backend in order]


def blocked_cpu(group: dist.ProcessGroup, seconds: float = 1.0) -> float:
    """CPU seconds a rank burns while blocked ``seconds`` in a barrier (rank 0 arrives late)."""
    dist.barrier(group=group)
    if dist.get_rank(group) == 0:
        time.sleep(seconds)
    cpu0 = time.process_time()
    dist.barrier(group=group)
    return time.process_time() - cpu0


def _group_with(**env: str) -> dist.ProcessGroup:
    """A group of every rank made with these environment variables set (FSDIST_ALGO decides how
    it runs its collectives, FSDIST_SECRET_FILE its checks: both are read when it is made)."""
    os.environ.update(env)
    try:
        return dist.new_group(backend="fsdist")
    finally:
        for name in env:
            del os.environ[name]


def _progress(line: str) -> None:
    path = os.environ.get(ENV_BENCH_PROGRESS)
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
        groups = {algo: _group_with(**{ENV_ALGO: algo}) for algo in plan.backends}
    if "mac" in plan.backends:
        secret = plan.extra["secret_file"]
        groups["mac"] = _group_with(FSDIST_SECRET_FILE=secret)
        groups["mac+payloads"] = _group_with(FSDIST_SECRET_FILE=secret, FSDIST_MAC_PAYLOADS="1")
    results: list[dict[str, Any]] = []
    cells = plan.cells()
    for index, (op, nbytes) in enumerate(cells):
        order = plan.backends if index % 2 == 0 else list(reversed(plan.backends))
        results += run_cells(op, nbytes, plan, groups, order)
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
