"""``python -m fsdist`` (or ``fsdist``): command-line tools around a run directory.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
this file only lists them, so a new tool is one line in ``_COMMANDS`` and never touches another.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ._version import __version__

#: (name, module under fsdist, one-line help).
_COMMANDS: list[tuple[str, str, str]] = [
    ("run", "launcher", "start this node's ranks of a job (a port-free torchrun)"),
    ("clean", "clean_cmd", "remove what a crashed run left in DIR (refuses while a run there is alive)"),
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fsdist", description="fsdist: torch.distributed over a shared directory")
    parser.add_argument("--version", action="version", version=f"fsdist {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, module_name, help_text in _COMMANDS:
        modules[name] = importlib.import_module(f".{module_name}", __package__)
        modules[name].add_arguments(commands.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    return int(modules[args.command].run(args))


if __name__ == "__main__":
    sys.exit(main())
