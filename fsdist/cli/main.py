"""``python -m fsdist`` (or ``fsdist``): command-line tools around a run directory.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
this file only lists them, so a new tool is one line in ``_COMMANDS`` and never touches another.
A name of two words (``"bench locks"``) is a command of its own, chosen when both words lead argv.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .._version import __version__
from ..errors import FsdistError

#: (name, module under fsdist, one-line help).
_COMMANDS: list[tuple[str, str, str]] = [
    ("run", "run", "start this node's ranks of a job (a port-free torchrun)"),
    ("status", "status", "show a job's ranks, the operation each is in, and which rank holds the others up"),
    ("clean", "clean", "remove what a crashed run left in DIR (refuses while a run there is alive)"),
    (
        "bench",
        "bench.command",
        "time every collective against Gloo in the same run (nccl-tests style; locks: `fsdist bench locks`)",
    ),
    ("bench locks", "bench_locks", "N processes increment lock-guarded counters: lost updates, rate, latency"),
    ("doctor", "doctor", "check that the filesystem of DIR is safe for fsdist (locks, rename, visibility)"),
]


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # the longest command name that leads argv wins: "bench locks DIR" before "bench"
    for name, module_name, help_text in sorted(_COMMANDS, key=lambda c: -len(c[0].split())):
        words = name.split()
        if argv[: len(words)] == words:
            module = importlib.import_module(f".{module_name}", __package__)
            parser = argparse.ArgumentParser(prog=f"fsdist {name}", description=help_text)
            module.add_arguments(parser)
            parse = getattr(
                module, "parse_args", lambda parser, argv: parser.parse_args(argv)
            )  # a command may check more
            try:
                return int(module.run(parse(parser, argv[len(words) :])))
            except FsdistError as exc:  # fsdist's own refusal says what and why: one line, no traceback
                print(f"fsdist {name}: {exc}", file=sys.stderr)
                return 1
            except BrokenPipeError:  # its reader went away (`fsdist status DIR | head`): as other tools
                sys.stdout = None  # (nothing left to print, or to flush at exit)
                return 141
    parser = argparse.ArgumentParser(prog="fsdist", description="fsdist: torch.distributed over a shared directory")
    parser.add_argument("--version", action="version", version=f"fsdist {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, _, help_text in _COMMANDS:
        commands.add_parser(name, help=help_text)
    parser.parse_args(argv)  # no command led argv: prints the help, the version or a usage error
    return 2


if __name__ == "__main__":
    sys.exit(main())
