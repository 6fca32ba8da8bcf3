"""``python -m fsdist`` (or ``fsdist``): command-line tools around a run directory."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import launcher
from ._version import __version__
from .errors import RendezvousError
from .rendezvous import clean


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fsdist", description="fsdist: torch.distributed over a shared directory")
    parser.add_argument("--version", action="version", version=f"fsdist {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    clean_cmd = commands.add_parser(
        "clean", help="remove what a crashed run left in DIR (refuses while a run there is alive)"
    )
    run_cmd = commands.add_parser("run", help="start this node's ranks of a job (a port-free torchrun)")
    launcher.add_arguments(run_cmd)
    clean_cmd.add_argument("directory", metavar="DIR")
    clean_cmd.add_argument(
        "--force", action="store_true", help="also remove a job whose members run on other hosts (cannot be checked)"
    )
    args = parser.parse_args(argv)
    if args.command == "run":
        return launcher.run(args)
    if args.command == "clean":
        try:
            removed = clean(args.directory, force=args.force)
        except RendezvousError as exc:
            print(f"fsdist clean: {exc}", file=sys.stderr)
            return 1
        print(f"fsdist clean: removed {len(removed)} generation(s) from {args.directory}")
        return 0
    return 2  # pragma: no cover - argparse rejects unknown commands first


if __name__ == "__main__":
    sys.exit(main())
