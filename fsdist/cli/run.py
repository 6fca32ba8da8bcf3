"""``python -m fsdist run``: a port-free torchrun. Spawns this node's ranks and watches them.

Each node's launcher starts ``--nproc-per-node`` ranks with RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE and FSDIST_DIR set, so a script written for torchrun needs nothing else: its
``init_process_group("fsdist")`` (torch's env://) meets through FSDIST_DIR (init_methods.py).
Launchers of one job find each other through the shared directory alone: they form their own
generation under ``DIR/.launch`` with fsdist's rendezvous. When a rank
fails, its launcher records the failure (rank, exit code, the rank's traceback) in that
generation's ``abort`` record, first writer wins; every launcher polls the record, stops its
own ranks, prints the *first* failure and exits non-zero. No socket is opened anywhere.

With ``--max-restarts N`` a failure ends a *round* instead of the job, as under torchrun: every
launcher stops its ranks, records them as gone in the job's rendezvous record (launchers on
other machines cannot see those processes die), leaves, and the launchers form a new generation
in the same directory and start the script again, with TORCHELASTIC_RESTART_COUNT raised (the
script resumes from its own checkpoint). Each round's first failure is kept in ``.launch/rounds``
for ``fsdist status``. A launcher whose ranks all succeeded waits, counted in the round's
``done`` record, until every launcher's did: a later failure elsewhere restarts its ranks too.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..defaults import ENV_ERROR_FILE, ENV_LAUNCHER_PID, ENV_SLURM_NNODES, ENV_SLURM_NODEID, LAUNCH_NOTE_SECONDS
from ..errors import FsdistError, RendezvousError
from ..files.counters import Counter
from ..files.io import publish, read_file
from ..files.locks import LockedRecord
from ..files.places import adopt_run_directory
from ..files.waiting import Deadline, poll
from ..job.clean import clean, retire_stopped
from ..job.generation import Generation
from ..job.liveness import is_alive
from ..job.rendezvous import rendezvous
from ..protocol import failure_report, layout, node_ranks, rendezvous_record
from . import ranks
from . import run_failures as failures

POLL_SECONDS = 0.1


@dataclass
class Rank:
    rank: int
    local_rank: int
    process: subprocess.Popen[bytes]
    error_file: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # torchrun's underscore spellings too, as torchrun takes both
    parser.add_argument(
        "--nproc-per-node", "--nproc_per_node", type=int, required=True, help="ranks to start on this node"
    )
    parser.add_argument("--nnodes", type=int, help="number of nodes (default: $SLURM_NNODES or 1)")
    parser.add_argument("--node-rank", "--node_rank", type=int, help="this node's index (default: $SLURM_NODEID or 0)")
    parser.add_argument("--dir", required=True, help="the shared run directory")
    parser.add_argument(
        "--timeout", type=float, default=1800, help="seconds to wait for the other nodes (default 1800)"
    )
    parser.add_argument(
        "--max-restarts",
        "--max_restarts",
        type=int,
        default=0,
        help="restart the whole job this many times after a failure (default 0, as torchrun)",
    )
    parser.add_argument("script", help="the training script")
    # (argparse counts a REMAINDER positional as required: "required: ..., script, script_args")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments").required = False


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
    before, after = ([a.split("=", 1)[0] for a in part] for part in (argv[:position], argv[position + 1 :]))
    given = {_REQUIRED[option] for option in before if option in _REQUIRED}
    misplaced = [_REQUIRED[option] for option in after if option in _REQUIRED and _REQUIRED[option] not in given]
    if misplaced:  # e.g. fsdist run train.py --nproc-per-node 2 --dir D
        script = argv[position] if position < len(argv) else "SCRIPT"
        parser.error(
            f"{' and '.join(dict.fromkeys(misplaced))} came after the script: fsdist run's own options come "
            f"before it (fsdist run --nproc-per-node N --dir DIR {script} [its arguments])"
        )
    args = parser.parse_args(argv)
    for option, value in (("--nproc-per-node", args.nproc_per_node), ("--nnodes", args.nnodes)):
        if value is not None and value < 1:
            parser.error(f"{option} must be 1 or more, not {value}")
    if args.node_rank is not None and args.node_rank < 0:
        parser.error(f"--node-rank must be 0 or more, not {args.node_rank}")
    if args.max_restarts < 0:
        parser.error(f"--max-restarts must be 0 or more, not {args.max_restarts}")
    if not os.path.isfile(args.script):  # before any rank starts (each would fail alike)
        parser.error(f"no script {args.script}: give the path of the Python script each rank runs")
    return args


#: the options every launch needs, by each spelling: one missing before the script but found after
#: it was meant for fsdist run
_REQUIRED = {"--nproc-per-node": "--nproc-per-node", "--nproc_per_node": "--nproc-per-node", "--dir": "--dir"}


def run(args: argparse.Namespace) -> int:
    # Ctrl-C and SIGTERM stop the job whatever this process inherited, as torchrun's agent
    # installs its own handlers: a launcher started from a script in the background gets SIGINT
    # ignored (or blocked), and would otherwise sit in the launchers' rendezvous through both
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _launch(args)
    except KeyboardInterrupt:  # Ctrl-C outside a round (waiting for the other launchers)
        print("fsdist run: interrupted (SIGINT) before this node's ranks ran", file=sys.stderr)
        return 130
    except OSError as exc:  # (fsdist's own errors, FsdistError, cli/main.py prints)
        if isinstance(exc, FsdistError):
            raise
        what = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT):
            what += f" (the run directory --dir {args.dir} must be one this user can write, with room to spare)"
        print(f"fsdist run: {what}", file=sys.stderr)
        return 1


def _launch(args: argparse.Namespace) -> int:
    nnodes = args.nnodes or int(os.environ.get(ENV_SLURM_NNODES, "1"))
    node_rank = args.node_rank if args.node_rank is not None else int(os.environ.get(ENV_SLURM_NODEID, "0"))
    if not 0 <= node_rank < nnodes:
        where = "--node-rank" if args.node_rank is not None else "$SLURM_NODEID"
        print(
            f"fsdist run: {where} {node_rank} is not a node of {nnodes} (--nnodes or $SLURM_NNODES): "
            f"each node's launcher takes its own index, 0 to {nnodes - 1}",
            file=sys.stderr,
        )
        return 2
    directory = adopt_run_directory(args.dir)
    ours = range(0)
    job = ""  # round 0's launch generation: names this job's restart history
    for restart in range(args.max_restarts + 1):
        try:
            launch = rendezvous(
                os.path.join(directory, layout.LAUNCH_DIR), node_rank, nnodes, timedelta(seconds=args.timeout),
                note=(LAUNCH_NOTE_SECONDS, lambda joined: _waiting_for(nnodes, joined, directory)),
                unit=rendezvous_record.NODES,
            )  # fmt: skip
        except RendezvousError as exc:
            if restart == 0:
                raise
            print(f"fsdist run: the launchers did not re-form the job for restart {restart}: {exc}", file=sys.stderr)
            return 1
        if not job:
            job = launch.generation_id
            _record_round(directory, job, args.max_restarts, None, {})  # a fresh history: no round failed yet
        sizes = _node_sizes(launch, node_rank, nnodes, args.nproc_per_node, args.timeout)
        first = sum(sizes[:node_rank])
        ours = range(first, first + args.nproc_per_node)  # this node's ranks: numbered node by node
        stop_signal: list[int] = []
        failure = _round(directory, launch, (node_rank, nnodes, first), sum(sizes), (job, restart), args, stop_signal)
        retire_stopped(directory)  # before leaving: the next round's ranks must see them gone
        if failure is None:
            launch.leave()
            return 0
        _record_round(directory, job, args.max_restarts, restart, failure)
        last_out = launch.leave()
        if stop_signal:  # this launcher was told to stop (Ctrl-C): one line and 128 + the signal,
            name = signal.Signals(stop_signal[0]).name  # as torchrun and shells expect
            print(f"fsdist run: interrupted ({name}): this node's ranks were stopped", file=sys.stderr)
            _clean_if_last(directory, last_out)
            return 128 + stop_signal[0]
        if failure.get("final") or restart == args.max_restarts:
            break
        failures.report(failure, f"restarting the job (restart {restart + 1} of {args.max_restarts})", ours)
    assert failure is not None  # the loop returns on success
    failures.report(
        failure,
        f"no restarts left ({args.max_restarts} used)" if args.max_restarts and not failure.get("final") else "",
        ours,
    )
    _clean_if_last(directory, last_out)
    return 1


def _node_sizes(launch: Generation, node_rank: int, nnodes: int, nproc: int, timeout: float) -> list[int]:
    """Every node's number of ranks, in node order (protocol/node_ranks.py): this launcher's
    published, the others' read. Nodes may start different numbers of ranks, as with torchrun."""
    mine = layout.node_ranks_file(launch.directory, node_rank)
    publish(launch.directory, os.path.basename(mine), [node_ranks.encode(mine, node_rank, nproc)])
    sizes = {node_rank: nproc}

    def missing() -> list[int]:
        return [node for node in range(nnodes) if node not in sizes]

    def all_read() -> list[int] | None:
        for node in missing():
            path = layout.node_ranks_file(launch.directory, node)
            try:
                sizes[node] = node_ranks.parse(read_file(path, node_ranks.MAX_BYTES, "a node's rank count"), path, node)
            except FileNotFoundError:
                continue  # not yet
            except ValueError as exc:
                raise RendezvousError(f"the launcher of node {node} published a bad rank count: {exc}") from exc
        return None if missing() else [sizes[node] for node in range(nnodes)]

    def launchers_alive(_: float) -> None:
        for node in missing():
            who = launch.members[node]
            if is_alive(who) is False:
                raise RendezvousError(
                    f"the launcher of node {node} (pid {who.pid} on {who.host}) died before it said how many "
                    "ranks it starts"
                )

    return poll(
        all_read, Deadline(timeout),
        lambda: RendezvousError(
            f"Timed out after {timeout:.0f} s waiting for the launchers of node(s) {missing()} to say how many "
            "ranks they start"
        ),
        launchers_alive,
    )  # fmt: skip


def _waiting_for(nnodes: int, joined: list[int], directory: str) -> None:
    """Say, while this launcher waits for the others, which nodes have not started theirs."""
    missing = [node for node in range(nnodes) if node not in joined]
    print(
        f"fsdist run: waiting for the launchers of node(s) {', '.join(map(str, missing))} of {nnodes} "
        f"(--node-rank; {len(joined)} joined) in {directory}",
        file=sys.stderr,
        flush=True,
    )


def _clean_if_last(directory: str, last_out: bool) -> None:
    """Where every launcher stopped its ranks (``last_out``), remove the failed job's files."""
    if last_out:
        try:
            clean(directory)
        except RendezvousError:
            pass  # a rank elsewhere outlived its launcher: the next job, or `fsdist clean`, removes them


def _round(
    directory: str,
    launch: Generation,
    node: tuple[int, int, int],
    world: int,
    job_round: tuple[str, int],
    args: argparse.Namespace,
    stop_signal: list[int],
) -> dict[str, Any] | None:
    """Run this node's ranks once: None when they succeeded, else the round's first failure.
    ``node``: this node's rank, the number of nodes, and the job rank of its first rank.

    SIGINT and SIGTERM end the job (no restart) while ranks run; between rounds they act as usual.
    """
    node_rank, nnodes, first = node
    abort = LockedRecord(os.path.join(launch.directory, layout.ABORT_FILE))
    done = Counter(os.path.join(launch.directory, layout.DONE_FILE))
    job, restart = job_round
    elastic = {  # what torchrun tells its workers: a script resumes by them
        "TORCHELASTIC_RESTART_COUNT": str(restart),
        "TORCHELASTIC_MAX_RESTARTS": str(args.max_restarts),
        "TORCHELASTIC_RUN_ID": job,
    }
    handlers = {signum: signal.signal(signum, lambda n, _: stop_signal.append(n)) for signum in _STOP_SIGNALS}
    started: list[Rank] = []
    try:
        for local in range(args.nproc_per_node):
            started.append(_start(directory, launch, (node_rank, first + local, local), args, world, elastic))
        wait_for_others = args.timeout if restart < args.max_restarts else 0.0
        failure = _watch(started, abort, done, (node_rank, nnodes), stop_signal, wait_for_others)
        if failure is None:
            return None
        ranks.stop([rank.process for rank in started])
        if stop_signal:  # a signal during the stop ends the job everywhere, whatever failed first
            failures.claim(abort, failures.signalled(stop_signal, node_rank))
        # the record as the launchers left it: a root cause may have replaced a consequence
        return failures.parsed(abort.read())
    finally:
        ranks.stop([rank.process for rank in started])
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        abort.close()
        done.close()


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _record_round(directory: str, job: str, max_restarts: int, restart: int | None, failure: dict[str, Any]) -> None:
    path = os.path.join(directory, layout.LAUNCH_DIR, layout.ROUNDS_FILE)
    with LockedRecord(path) as rounds:
        rounds.update(lambda old: failure_report.add_round(old, job, max_restarts, restart, failure, directory))


def _start(
    directory: str,
    launch: Generation,
    where: tuple[int, int, int],
    args: argparse.Namespace,
    world: int,
    elastic: dict[str, str],
) -> Rank:
    """Start one rank: ``where`` is its node, its job rank and its local rank."""
    node_rank, rank, local = where
    error_file = layout.error_file(launch.directory, rank)
    env = ranks.rank_environment(
        rank,
        local,
        world,
        args.nproc_per_node,
        node_rank,
        directory,
        **{ENV_ERROR_FILE: error_file, ENV_LAUNCHER_PID: str(os.getpid())},
        **_omp_threads(args.nproc_per_node),
        **elastic,
    )
    command = [sys.executable, "-m", "fsdist.cli.run_rank", args.script, *args.script_args]
    return Rank(rank, local, ranks.start(command, env), error_file)


def _omp_threads(nproc: int) -> dict[str, str]:
    """``OMP_NUM_THREADS=1`` for the ranks where several share the node and the user set none, as
    torchrun sets it: N ranks with a thread per core each oversubscribe the cores N times (a
    4-rank DDP step on 2 cores took 15x longer)."""
    return {"OMP_NUM_THREADS": "1"} if nproc > 1 and "OMP_NUM_THREADS" not in os.environ else {}


def _watch(
    started: list[Rank], abort: LockedRecord, done: Counter, nodes: tuple[int, int], stop_signal: list[int],
    wait: float,
) -> dict[str, Any] | None:  # fmt: skip
    """Wait until this node's ranks succeeded (None) or the round failed (its first failure).

    With restarts left (``wait`` > 0), a node whose ranks succeeded waits up to ``wait`` seconds
    for every launcher's to: a failure elsewhere meanwhile restarts its ranks too.
    """
    node_rank, nnodes = nodes
    finished = False
    deadline = float("inf")
    while True:
        if stop_signal:
            return failures.claim(abort, failures.signalled(stop_signal, node_rank))
        if not finished:  # own ranks first: a dead one here is a root cause, maybe not yet recorded
            codes = [(rank, rank.process.poll()) for rank in started]
            failed = [
                failures.rank_failure(rank.rank, rank.error_file, code) for rank, code in codes if code not in (None, 0)
            ]
            if failed:
                return failures.claim(abort, min(failed, key=failures.causal_order))
            if all(code == 0 for _, code in codes):
                if wait <= 0:
                    return None
                finished = True
                deadline = time.monotonic() + wait
                done.add(1)
        recorded = abort.read()
        if recorded:
            return failures.parsed(recorded)
        if finished:
            count = done.get()
            if count >= nnodes:
                return None
            if time.monotonic() > deadline:
                print(
                    f"fsdist run: this node's ranks succeeded; {nnodes - count} of {nnodes} launchers did not "
                    f"report within {wait:.0f} s (--timeout), so a later failure there will not restart them",
                    file=sys.stderr,
                )
                return None
        time.sleep(POLL_SECONDS)
