"""``python -m fsdist run``: a port-free torchrun. Spawns this node's ranks and watches them.

Each node's launcher starts ``--nproc-per-node`` ranks with RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE and FSDIST_DIR set, so a script written for torchrun needs nothing else: its
``init_process_group("fsdist")`` (torch's env://) meets through FSDIST_DIR (init_methods.py).
Launchers of one job find each other through the shared directory alone: they form their own
generation under ``DIR/.launch`` with fsdist's rendezvous. When a rank
fails, its launcher records the failure (rank, exit code, the rank's traceback) in that
generation's ``abort`` record, first writer wins; every launcher polls the record, stops its
own ranks, prints the *first* failure and exits non-zero. No socket is opened anywhere.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import RendezvousError
from ..files.io import open_file
from ..files.locks import LockedRecord
from ..job.clean import clean
from ..job.generation import Generation
from ..job.rendezvous import rendezvous
from ..protocol import failure_report, layout
from . import ranks

POLL_SECONDS = 0.1


@dataclass
class Rank:
    rank: int
    local_rank: int
    process: subprocess.Popen[bytes]
    error_file: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc-per-node", type=int, required=True, help="ranks to start on this node")
    parser.add_argument("--nnodes", type=int, help="number of nodes (default: $SLURM_NNODES or 1)")
    parser.add_argument("--node-rank", type=int, help="this node's index (default: $SLURM_NODEID or 0)")
    parser.add_argument("--dir", required=True, help="the shared run directory")
    parser.add_argument(
        "--timeout", type=float, default=1800, help="seconds to wait for the other nodes (default 1800)"
    )
    parser.add_argument("script", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``fsdist run``'s arguments, naming an unknown option before the script as unknown.

    argparse alone would take the unknown option's value as the script and every option after
    it as the script's arguments, then complain that the real options are missing.
    """
    takes_value = {
        option: action.nargs != 0
        for action in parser._actions  # argparse's only list of its options
        for option in action.option_strings
    }
    position = 0
    while position < len(argv) and argv[position].startswith("-"):
        option = argv[position].split("=", 1)[0]
        if option not in takes_value:
            parser.error(f"unknown option {option} (fsdist run's own options come before the script)")
        position += 2 if takes_value[option] and "=" not in argv[position] else 1
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    nnodes = args.nnodes or int(os.environ.get("SLURM_NNODES", "1"))
    node_rank = args.node_rank if args.node_rank is not None else int(os.environ.get("SLURM_NODEID", "0"))
    directory = os.path.realpath(args.dir)
    world = nnodes * args.nproc_per_node
    launch = rendezvous(os.path.join(directory, layout.LAUNCH_DIR), node_rank, nnodes, timedelta(seconds=args.timeout))
    abort = LockedRecord(os.path.join(launch.directory, layout.ABORT_FILE))
    started = [_start(directory, launch, node_rank, local, args, world) for local in range(args.nproc_per_node)]
    stop_signal: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, _frame: stop_signal.append(signum))
    try:
        failure = _watch(started, abort, stop_signal)
    finally:
        ranks.stop([rank.process for rank in started])
        abort.close()
    if failure is None:
        launch.leave()
        return 0
    _report(failure)
    launch.leave()
    try:  # best effort: remove the failed job's files once no member of it is alive
        clean(directory)
    except RendezvousError:
        pass  # ranks elsewhere still stopping: the next job, or `fsdist clean`, removes them
    return 1


def _start(
    directory: str, launch: Generation, node_rank: int, local: int, args: argparse.Namespace, world: int
) -> Rank:
    rank = node_rank * args.nproc_per_node + local
    error_file = layout.error_file(launch.directory, rank)
    env = ranks.rank_environment(
        rank, local, world, args.nproc_per_node, node_rank, directory, FSDIST_ERROR_FILE=error_file
    )
    command = [sys.executable, "-m", "fsdist.cli.run_rank", args.script, *args.script_args]
    return Rank(rank, local, ranks.start(command, env), error_file)


def _watch(started: list[Rank], abort: LockedRecord, stop_signal: list[int]) -> dict[str, Any] | None:
    """Wait until every rank succeeded (None) or the job failed (the first failure)."""
    while True:
        if stop_signal:
            _claim(abort, {"rank": -1, "reason": f"launcher got signal {stop_signal[0]}"})
        recorded = abort.read()
        if recorded:
            return _parsed(recorded)
        codes = [(rank, rank.process.poll()) for rank in started]
        failed = [_failure(rank, code) for rank, code in codes if code not in (None, 0)]
        if failed:
            return _claim(abort, min(failed, key=_causal_order))
        if all(code == 0 for _, code in codes):
            return None
        time.sleep(POLL_SECONDS)


def _failure(rank: Rank, code: int) -> dict[str, Any]:
    report: dict[str, Any] = {"rank": rank.rank, "exit_code": code, "host": os.uname().nodename}
    try:
        fd = open_file(rank.error_file, os.O_RDONLY)
        try:
            report.update(failure_report.parse(os.read(fd, failure_report.MAX_BYTES + 1)))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        why = f"killed by signal {-code}" if code < 0 else "exited without a Python exception"
        report["message"] = f"rank {rank.rank} {why} (exit code {code})"
    return report


_CONSEQUENCES = {"PeerFailedError", "GroupBrokenError"}


def _causal_order(failure: dict[str, Any]) -> tuple[bool, float]:
    """Ranks that failed *because* a peer failed come after the peer; then by time."""
    return (failure.get("type") in _CONSEQUENCES, float(failure.get("time", 0.0)))


def _claim(abort: LockedRecord, failure: dict[str, Any]) -> dict[str, Any]:
    """Record ``failure`` unless another launcher recorded one first; return the first."""
    final = abort.update(lambda old: None if old else failure_report.encode(failure))
    return _parsed(final)


def _parsed(recorded: bytes) -> dict[str, Any]:
    try:
        return failure_report.parse(recorded)
    except ValueError as exc:  # another launcher's record, damaged: the job still failed
        return {"rank": -1, "reason": f"the job's failure record is unreadable ({exc})"}


def _report(failure: dict[str, Any]) -> None:
    who = "the launcher" if failure.get("rank", -1) < 0 else f"rank {failure['rank']}"
    lines = [f"fsdist run: the job failed; the first failure was {who}"]
    if "exit_code" in failure:
        lines[0] += f" (exit code {failure['exit_code']} on {failure.get('host', '?')})"
    if failure.get("type"):
        lines.append(f"{failure['type']}: {failure.get('message', '')}")
    elif failure.get("message") or failure.get("reason"):
        lines.append(str(failure.get("message") or failure.get("reason")))
    if failure.get("traceback"):
        lines.append(failure["traceback"].rstrip())
    print("\n".join(lines), file=sys.stderr, flush=True)
