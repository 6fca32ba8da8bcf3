"""``python -m fsdist clean DIR``: remove what a crashed run left, refusing while it lives."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import RendezvousError
from ..job.clean import clean
from ..protocol import layout
from .paths import USAGE_ERROR, directory_problem


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR", help="the run directory")
    parser.add_argument(
        "--force", action="store_true", help="also remove a job whose members run on other hosts (cannot be checked)"
    )


def run(args: argparse.Namespace) -> int:
    problem = directory_problem("clean", args.directory, "nothing to clean (give the run directory)")
    if problem:
        print(problem, file=sys.stderr)
        return USAGE_ERROR
    try:
        cleaned = clean(args.directory, force=args.force)
        # the launchers' own rendezvous (fsdist run), left behind where a launcher was killed
        launchers = os.path.join(args.directory, layout.LAUNCH_DIR)
        if os.path.isdir(launchers):
            launched = clean(launchers, force=args.force)
            cleaned.removed += [os.path.join(layout.LAUNCH_DIR, g) for g in launched.removed]
    except RendezvousError as exc:
        print(f"fsdist clean: {exc}", file=sys.stderr)
        return 1
    if cleaned.repaired:
        print(f"fsdist clean: emptied the rendezvous record, which failed validation: {cleaned.repaired}")
    names = f": {', '.join(cleaned.removed)}" if cleaned.removed else ""
    print(f"fsdist clean: removed {len(cleaned.removed)} generation(s) from {args.directory}{names}")
    if cleaned.left:
        print(
            f"fsdist clean: left {', '.join(cleaned.left)} alone: no record names it (fsdist removes only "
            "what its record names); remove it by hand if it is a leftover of yours"
        )
    return 0
