"""``python -m fsdist clean DIR``: remove what a crashed run left, refusing while it lives."""

from __future__ import annotations

import argparse
import sys

from ..errors import RendezvousError
from ..job.clean import clean


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR", help="the run directory")
    parser.add_argument(
        "--force", action="store_true", help="also remove a job whose members run on other hosts (cannot be checked)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        removed = clean(args.directory, force=args.force)
    except RendezvousError as exc:
        print(f"fsdist clean: {exc}", file=sys.stderr)
        return 1
    print(f"fsdist clean: removed {len(removed)} generation(s) from {args.directory}")
    return 0
