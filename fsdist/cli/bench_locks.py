"""``python -m fsdist bench locks DIR``: do fcntl locks in DIR really exclude, and how fast are they?

N processes increment one lock-guarded counter for S seconds (fs/contention.py, the measurement
``doctor`` makes briefly); with ``--peer-mount DIR2`` (another mount of the same directory, e.g.
a second NFS mount with its own client cache) every other process works through DIR2.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..fs.contention import measure

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR", help="directory to test (a run directory's filesystem)")
    parser.add_argument("-n", "--procs", type=int, default=4, help="processes (default 4)")
    parser.add_argument("--seconds", type=float, default=2.0, help="how long they run (default 2)")
    parser.add_argument("--peer-mount", default=None, metavar="DIR2", help="another mount of DIR: half the processes")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    try:
        result = measure(args.directory, args.procs, args.seconds, args.peer_mount)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"fsdist bench locks: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        where = result.directory + (f" and {result.peer_directory}" if result.peer_directory else "")
        print(f"{result.procs} processes × {result.seconds:g} s on {where}")
        print(f"  increments {result.increments}, counter {result.final_value}, lost updates {result.lost_updates}")
        print(f"  {result.acquisitions_per_s:,.0f} acquisitions/s; latency p50 {result.p50_us:.1f} µs, "
              f"p99 {result.p99_us:.1f} µs, max {result.max_us:.0f} µs")  # fmt: skip
        print(f"  per process {result.per_process} (fairness min/max {result.fairness:.2f})")
        if result.lost_updates:
            print("  LOCKS DO NOT EXCLUDE HERE: fsdist is not safe on this directory")
    return 1 if result.lost_updates else 0
