"""``python -m fsdist doctor DIR [--peer-mount DIR2] [--json]``: is this filesystem safe for fsdist?

The findings come from fs/doctor.py; exit status 0: nothing unsafe found; 1: fsdist would be
unsafe here; 2: the check could not run.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading

from ..fs.doctor import DoctorStalledError, diagnose_within, render
from ..fs.hazards import classify
from ..fs.mounts import OK, UNSAFE, find_mount
from .paths import USAGE_ERROR, directory_problem

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR", help="a directory on the filesystem to check (a run directory)")
    parser.add_argument(
        "--peer-mount",
        metavar="DIR2",
        help="the same directory reached through another mount (another client), to test across clients",
    )
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument(
        "--stall-timeout", type=float, default=120.0, metavar="SECONDS",
        help="give up (UNSAFE, exit 1) when one measurement runs this long: the filesystem blocked a call "
        "(default 120)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    wanted = "give a directory on the filesystem to check (the run directory, or the folder it will be made in)"
    for path in filter(None, (args.directory, args.peer_mount)):
        problem = directory_problem("doctor", path, wanted)  # (doctor makes nothing a run would find later)
        if problem:
            print(problem, file=sys.stderr)
            return USAGE_ERROR
    try:
        report = diagnose_within(args.directory, args.peer_mount, args.stall_timeout)
    except DoctorStalledError as exc:
        print(f"fsdist doctor: {args.directory}: {exc}", file=sys.stderr)
        for line in _what_the_mounts_say([p for p in (args.directory, args.peer_mount) if p]):
            print(line, file=sys.stderr)
        return 1
    except (OSError, RuntimeError) as exc:
        print(f"fsdist doctor: could not check {args.directory}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 1 if report["verdict"] == UNSAFE else 0


#: how long the mount findings after a stall may take (they may touch the stalled filesystem)
_FINDINGS_SECONDS = 5.0


def _what_the_mounts_say(paths: list[str]) -> list[str]:
    """The mounts' own unsafe or warn findings, which may explain a stall: read from the mount
    table without resolving the paths, in a thread given up after _FINDINGS_SECONDS (a GlusterFS
    finding lists its .meta folder, which the stalled filesystem would never answer; seen on
    NFS-Ganesha: doctor printed its stall and never returned, and resolving the paths was the one
    filesystem call left)."""
    lines: list[str] = []

    def collect() -> None:
        for path in paths:
            mount = find_mount(path, resolve=False)
            for finding in classify(mount):
                if finding.verdict != OK:
                    lines.append(f"  [{finding.verdict:^6}] {finding.name} ({mount.mount_point}): {finding.detail}")

    worker = threading.Thread(target=collect, name="fsdist-doctor-findings", daemon=True)
    worker.start()
    worker.join(_FINDINGS_SECONDS)
    return list(lines) if not worker.is_alive() else [*lines, "  (the mounts' own findings did not return either)"]
