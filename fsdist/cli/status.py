"""``python -m fsdist status DIR``: show a job's ranks, where each one is, and who holds the others up.

Reads the run directory only (``fsdist.status``), so it works from any machine that sees the
directory, while the job runs or after it crashed. ``--json`` prints the same as one JSON
object (one per line with ``--watch``) for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..inspect.status import GroupStatus, RunStatus, read_status
from .paths import USAGE_ERROR, directory_problem

_CLEAR = "\033[H\033[2J"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR", help="the run directory (--dir of `fsdist run`, or fsdist://DIR)")
    parser.add_argument("--json", action="store_true", help="print JSON (one object per refresh) instead of a table")
    parser.add_argument("--watch", action="store_true", help="refresh until interrupted (Ctrl-C)")
    parser.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="seconds between refreshes with --watch (default 1)"
    )
    parser.add_argument(
        "--count", type=int, default=0, metavar="N", help="with --watch: stop after N refreshes (default: never)"
    )


def run(args: argparse.Namespace) -> int:
    """Print the status once, or every ``--interval`` seconds with ``--watch``. Exit 0 when the
    directory could be read (whatever the job's state), 1 when it could not, 2 when it is none."""
    problem = directory_problem("status", args.directory, "give the run directory (--dir of `fsdist run`)")
    if problem:
        print(problem, file=sys.stderr)
        return USAGE_ERROR
    shown = 0
    try:
        while True:
            try:
                status = read_status(args.directory)
            except (OSError, ValueError, KeyError) as exc:
                print(f"fsdist status: cannot read {args.directory}: {exc}", file=sys.stderr)
                return 1
            if args.json:
                print(json.dumps(status.to_json()), flush=True)
            else:
                print((_CLEAR if args.watch and sys.stdout.isatty() else "") + render(status), flush=True)
            shown += 1
            if not args.watch or (args.count and shown >= args.count):
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def render(status: RunStatus) -> str:
    """The human-readable form: a header, one line per rank, one table per subgroup, the summary."""
    lines = [f"fsdist status {status.directory}"]
    if status.generation is None:
        return "\n".join([*lines, *status.summary])
    lines.append(f"generation {status.generation}, world size {status.world_size}, {status.state}")
    world = status.groups[0] if status.groups and status.groups[0].name == "world" else None
    positions = {p.group_rank: p for p in world.positions} if world else {}
    rows = [["rank", "host", "pid", "liveness", "heartbeat", "seq", "step", "op (world group)", "since"]]
    for m in status.members:
        p = positions.get(m.rank)
        rows.append(
            [
                str(m.rank),
                m.host,
                str(m.pid),
                m.liveness,
                _age(m.heartbeat_age_s),
                str(p.seq) if p else "-",
                str(p.step) if p else "-",
                (p.description + (" (closed)" if p.closed else "")) if p else "-",
                _age(p.since_s) if p else "-",
            ]
        )
    lines += _table(rows)
    for group in status.groups:
        if group is not world:
            lines += ["", *_group_table(group)]
    return "\n".join([*lines, "", *status.summary])


def _group_table(group: GroupStatus) -> list[str]:
    members = "unknown ranks" if group.ranks is None else f"ranks {', '.join(map(str, group.ranks))}"
    rows = [["group rank", "rank", "seq", "step", "op", "since"]]
    for p in group.positions:
        rank = str(p.rank) if p.rank is not None else "?"
        rows.append([str(p.group_rank), rank, str(p.seq), str(p.step), p.description, _age(p.since_s)])
    return [f"group {group.name!r} ({members})", *_table(rows)]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"
