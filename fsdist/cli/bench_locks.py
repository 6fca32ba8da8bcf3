"""``python -m fsdist bench locks DIR``: do locks in DIR really exclude, and how fast are they?

N processes increment one lock-guarded counter for S seconds (fs/contention.py, the measurement
``doctor`` makes briefly); with ``--peer-mount DIR2`` (another mount of the same directory, e.g.
a second NFS mount with its own client cache) every other process works through DIR2. ``--kind``
measures the locks other tools take too (fs/lock_kinds.py), side by side.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..fs.contention import Contention, measure
from ..fs.lock_kinds import KINDS

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR", help="directory to test (a run directory's filesystem)")
    parser.add_argument("-n", "--procs", type=int, default=4, help="processes (default 4)")
    parser.add_argument("--seconds", type=float, default=2.0, help="how long they run (default 2)")
    parser.add_argument("--peer-mount", default=None, metavar="DIR2", help="another mount of DIR: half the processes")
    parser.add_argument(
        "--kind", default="fsdist", metavar="KIND[,KIND...]",
        help=f"the lock, or 'all': {', '.join(KINDS)} (default fsdist: its own records' lock). filelock and "
        "softfilelock are the filelock library's FileLock (flock) and SoftFileLock (a lock file)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON object (with several kinds: a list)")


def run(args: argparse.Namespace) -> int:
    kinds = list(KINDS) if args.kind == "all" else [k.strip() for k in args.kind.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        print(f"fsdist bench locks: --kind {args.kind}: each one of {', '.join(KINDS)}, or all", file=sys.stderr)
        return 2
    results = []
    for kind in kinds:
        try:
            results.append(measure(args.directory, args.procs, args.seconds, args.peer_mount, kind))
        except (ValueError, OSError, RuntimeError) as exc:
            print(f"fsdist bench locks: {kind}: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(results[0].to_json() if len(results) == 1 else [r.to_json() for r in results]))
    elif len(results) == 1:
        _print_one(results[0])
    else:
        _print_table(results)
    return 1 if any(r.lost_updates for r in results) else 0


def _print_one(result: Contention) -> None:
    where = result.directory + (f" and {result.peer_directory}" if result.peer_directory else "")
    print(f"{result.procs} processes × {result.seconds:g} s on {where}, lock: {result.kind}")
    print(f"  increments {result.increments}, counter {result.final_value}, lost updates {result.lost_updates}")
    print(f"  {result.acquisitions_per_s:,.0f} acquisitions/s; latency p50 {result.p50_us:.1f} µs, "
          f"p99 {result.p99_us:.1f} µs, max {result.max_us:.0f} µs")  # fmt: skip
    print(f"  per process {result.per_process} (fairness min/max {result.fairness:.2f})")
    if result.lost_updates:
        print(f"  {result.kind.upper()} LOCKS DO NOT EXCLUDE HERE: what relies on them is not safe on this directory")


def _print_table(results: list[Contention]) -> None:
    first = results[0]
    where = first.directory + (f" and {first.peer_directory}" if first.peer_directory else "")
    print(f"{first.procs} processes × {first.seconds:g} s per lock kind on {where}")
    print(f"  {'kind':<13} {'increments':>10} {'lost':>6} {'acq/s':>9} {'p50 µs':>9} {'p99 µs':>9}  verdict")
    for r in results:
        verdict = "safe here" if r.lost_updates == 0 else "LOSES UPDATES: not safe here"
        print(f"  {r.kind:<13} {r.increments:>10} {r.lost_updates:>6} {r.acquisitions_per_s:>9,.0f} "
              f"{r.p50_us:>9.1f} {r.p99_us:>9.1f}  {verdict}")  # fmt: skip
