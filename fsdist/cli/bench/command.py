"""``python -m fsdist bench``: spawn each world, collect its timings, print and write the results.

Each world size gets a fresh private directory under ``--dir`` (default ``/dev/shm``), holding
the fsdist run directory, the plan and the ranks' outputs; it is removed afterwards, whatever
happened.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from ...defaults import ENV_BENCH_PROGRESS
from ...files.trust import make_private_dir
from .. import ranks
from . import report
from .plan import (
    BACKENDS,
    DEFAULT_OPS,
    DEFAULT_RANKS,
    DEFAULT_SIZES,
    MAC_BACKENDS,
    NODE_BACKENDS,
    OPS,
    Plan,
    parse_size,
)  # fmt: skip

#: A world whose ranks take longer than this is killed (a hang must not outlive the benchmark).
WORLD_TIMEOUT_SECONDS = 900.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", default=DEFAULT_RANKS, help=f"world sizes to run (default {DEFAULT_RANKS})")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"message sizes S (default {DEFAULT_SIZES})")
    parser.add_argument(
        "--ops", default="",
        help=f"operations, of {', '.join(OPS)} (default: all but broadcast_bytes, which --mac adds)",
    )  # fmt: skip
    parser.add_argument("--dir", default=None, help="where the runs' files go (default /dev/shm, else TMPDIR)")
    parser.add_argument("--against", default="gloo", choices=["gloo", "none"], help="compare with Gloo (default)")
    parser.add_argument("--iters", default="default", help="'default' (by size), 'small' (smoke test) or a count")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per rank (default: torch's choice)")
    parser.add_argument("--out", default="fsdist-bench", help="write OUT.csv and OUT.json ('' to skip)")
    parser.add_argument("--plot", action="store_true", help="also draw OUT.png (needs the [plot] extra: matplotlib)")
    parser.add_argument(
        "--nodes", type=int, default=0,
        help="simulate K nodes per world (ranks split evenly, each node its own FSDIST_NODE_ID and "
        "FSDIST_LOCAL_DIR) and compare fsdist flat with two tiers, shared and node-local calls and "
        "bytes apart (instead of Gloo)",
    )  # fmt: skip
    parser.add_argument(
        "--mac", action="store_true",
        help="compare fsdist as it is with FSDIST_SECRET_FILE (a keyed MAC on every record and header, and "
        "on the payloads of byte tensors, which carry torch's pickles) and with FSDIST_MAC_PAYLOADS=1 too "
        "(every payload) (instead of Gloo): what authentication costs per op and per GB",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
        worlds = [int(w) for w in args.ranks.split(",") if w.strip()]
        if not worlds or min(worlds) < 1:
            raise ValueError("--ranks needs world sizes of at least 1")
        if plan.nodes and any(w % plan.nodes for w in worlds):
            raise ValueError(f"--nodes {plan.nodes} must divide every world size ({args.ranks})")
    except ValueError as exc:
        print(f"fsdist bench: {exc}", file=sys.stderr)
        return 2
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("fsdist bench: --plot needs matplotlib: pip install 'fsdist[plot]' (or matplotlib)", file=sys.stderr)
        return 2
    base = args.dir or ("/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir())
    started = time.monotonic()
    results: dict[int, list[list[dict[str, Any]]]] = {}
    blocked: dict[str, dict[str, float]] = {}
    for world in worlds:
        print(f"fsdist bench: {world} ranks in {base} ...", file=sys.stderr, flush=True)
        try:
            outputs = _run_world(plan, world, base)
        except RuntimeError as exc:
            print(f"fsdist bench: {exc}", file=sys.stderr)
            return 2
        results[world] = [out["results"] for out in outputs]
        if world > 1:  # the ranks that waited for rank 0: the worst of them
            blocked[str(world)] = {b: max(out["blocked_cpu"][b] for out in outputs[1:]) for b in plan.backends}
    quiet_below = report.quiet_limit(list(results.values()))  # the whole run's fastest probe sets it
    rows = [row for world, per_rank in results.items() for row in report.summarise(world, per_rank, quiet_below)]
    elapsed = time.monotonic() - started
    if plan.nodes:
        print(report.nodes_table(rows, plan.nodes))
    elif args.mac:
        print(report.mac_table(rows))
    else:
        print(report.table(rows))
        print(report.fs_calls_table(rows))
    for label, cpu in blocked.items():
        burnt = ", ".join(f"{backend} {seconds:.3f}" for backend, seconds in cpu.items())
        print(f"blocked 1 s in a barrier ({label} ranks), CPU seconds: {burnt}")
    print(f"({len(rows)} cells in {elapsed:.0f} s, directory {base})")
    if args.out:
        meta = {"command": sys.argv, "plan": plan.to_json(), "worlds": worlds, "dir": base, "seconds": elapsed,
                "machine": platform.platform(), "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                time.gmtime()), "blocked_cpu_s": blocked}  # fmt: skip
        report.write_csv(rows, f"{args.out}.csv")
        report.write_json(rows, meta, f"{args.out}.json")
        written = [f"{args.out}.csv", f"{args.out}.json"]
        if args.plot:
            report.plot(rows, f"{args.out}.png")
            written.append(f"{args.out}.png")
        print("wrote " + ", ".join(written))
    failed = [r for r in rows if not r.verified]
    for row in failed:
        print(f"VERIFICATION FAILED: {row.backend} {row.op} {row.nbytes} B ×{row.world}: {row.error}", file=sys.stderr)
    return 1 if failed else 0


def _plan(args: argparse.Namespace) -> Plan:
    default = ",".join(OPS if args.mac else DEFAULT_OPS)
    ops = [op.strip() for op in (args.ops or default).split(",") if op.strip()]
    unknown = [op for op in ops if op not in OPS]
    if unknown or not ops:
        raise ValueError(f"unknown ops {unknown}; choose from {', '.join(OPS)}")
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if args.iters not in ("default", "small") and not (args.iters.isdigit() and int(args.iters) > 0):
        raise ValueError(f"--iters must be 'default', 'small' or a positive count, not {args.iters!r}")
    if args.nodes < 0:
        raise ValueError("--nodes must be at least 1 (or 0: one machine)")
    if args.nodes and args.mac:
        raise ValueError("--nodes and --mac each compare fsdist with itself: choose one")
    backends = (
        list(NODE_BACKENDS) if args.nodes else list(MAC_BACKENDS) if args.mac
        else list(BACKENDS) if args.against == "gloo" else ["fsdist"]
    )  # fmt: skip
    return Plan(ops=ops, sizes=sizes, backends=backends, iters=args.iters, threads=args.threads, nodes=args.nodes)


def _run_world(plan: Plan, world: int, base: str) -> list[dict[str, Any]]:
    """Run one world's ranks to completion; return each rank's output (results, blocked CPU)."""
    if not os.path.isdir(base):  # (an existing one, /dev/shm say, is only where the private folder goes)
        make_private_dir(base)
    work = tempfile.mkdtemp(prefix=f"fsdist-bench-w{world}-", dir=base)  # 0700, made exclusively
    procs: list[subprocess.Popen[bytes]] = []
    try:
        plan_path = os.path.join(work, "plan.json")
        if "mac" in plan.backends:  # a secret for the MAC groups: the run's own, 0600
            secret = os.path.join(work, "secret")
            with open(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
                out.write(os.urandom(32))
            plan.extra["secret_file"] = secret
        with open(plan_path, "w") as out:
            json.dump(plan.to_json(), out)
        extra = {"GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
                 ENV_BENCH_PROGRESS: os.path.join(work, "progress")}  # fmt: skip
        per_node = world // plan.nodes if plan.nodes else world
        for rank in range(world):  # one node's ranks, as `fsdist run` starts them (or K nodes')
            node = rank // per_node
            if plan.nodes:
                local = os.path.join(work, f"node{node}")
                make_private_dir(local)
                extra.update(FSDIST_NODE_ID=f"bench-node{node}", FSDIST_LOCAL_DIR=local)
            env = ranks.rank_environment(
                rank, rank % per_node, world, per_node, node, os.path.join(work, "run"), **extra
            )
            command = [sys.executable, "-m", "fsdist.cli.bench.rank", plan_path, os.path.join(work, f"out.r{rank}")]
            procs.append(ranks.start(command, env, log_path=os.path.join(work, f"log.r{rank}")))
        _wait_all(procs, work)
        results = []
        for rank in range(world):
            with open(os.path.join(work, f"out.r{rank}")) as source:
                results.append(json.load(source))
        return results
    finally:
        ranks.stop(procs, grace=0.0)  # a world that failed or ended: nothing to wait for
        shutil.rmtree(work, ignore_errors=True)


def _show_progress(path: str, shown: int, world: int) -> int:
    """Print the lines rank 0 added to its progress file since ``shown``; return the new count."""
    try:
        with open(path) as source:
            lines = source.read().splitlines()
    except FileNotFoundError:
        return shown
    for line in lines[shown:]:
        print(f"fsdist bench: {world} ranks {line}", file=sys.stderr, flush=True)
    return len(lines)


def _wait_all(procs: list[subprocess.Popen[bytes]], work: str) -> None:
    """Wait for every rank; the first to fail ends the world and its log is raised."""
    deadline = time.monotonic() + WORLD_TIMEOUT_SECONDS
    shown = 0
    while any(p.poll() is None for p in procs):
        shown = _show_progress(os.path.join(work, "progress"), shown, len(procs))
        failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
        if failed or time.monotonic() > deadline:
            rank = failed[0] if failed else 0
            with open(os.path.join(work, f"log.r{rank}"), errors="replace") as log:
                tail = log.read()[-4000:]
            what = f"exited with {procs[rank].returncode}" if failed else "timed out"
            raise RuntimeError(f"rank {rank} of {len(procs)} {what}:\n{tail}")
        time.sleep(0.05)
    _show_progress(os.path.join(work, "progress"), shown, len(procs))
    failed = [r for r, p in enumerate(procs) if p.returncode != 0]
    if failed:
        with open(os.path.join(work, f"log.r{failed[0]}"), errors="replace") as log:
            raise RuntimeError(f"rank {failed[0]} of {len(procs)} exited with {procs[failed[0]].returncode}:\n"
                               + log.read()[-4000:])  # fmt: skip
