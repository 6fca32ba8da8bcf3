"""How ``fsdist run``'s launchers agree on a round's first failure and print it.

Every launcher may see a failure at once (its own rank's exit, a consequence on another node),
so the first is claimed in the launch generation's ``abort`` record: a rank's root cause
replaces a consequence recorded first, and a signal makes the record final. The record is read
back as a checked failure report (protocol/failure_report.py), never trusted as written.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

from ..errors import FsdistError
from ..files.io import read_file
from ..files.locks import LockedRecord
from ..job.liveness import hostname
from ..protocol import failure_report


def signalled(stop_signal: list[int], node_rank: int) -> dict[str, Any]:
    """The failure of a launcher stopped by a signal (Ctrl-C, a scheduler's SIGTERM): the other
    nodes' launchers print it, so it names the node and its host."""
    name = signal.Signals(stop_signal[0]).name
    reason = f"the launcher of node {node_rank} (on {hostname()}), stopped by {name}"
    return {"rank": -1, "reason": reason, "final": 1}


def rank_failure(rank: int, error_file: str, code: int) -> dict[str, Any]:
    """A dead rank's failure: the report it wrote to ``error_file`` (checked: the file sits in
    the shared directory), else what its exit code says."""
    report: dict[str, Any] = {"rank": rank, "exit_code": code, "host": hostname()}
    try:
        report.update(failure_report.parse(read_file(error_file, failure_report.MAX_BYTES, "a rank's failure report")))
    except (OSError, ValueError, FsdistError):  # none written, or not one to trust
        why = f"killed by signal {-code}" if code < 0 else "exited without a Python exception"
        report["message"] = f"rank {rank} {why} (exit code {code})"
    return report


CONSEQUENCES = {"PeerFailedError", "GroupBrokenError"}


def causal_order(failure: dict[str, Any]) -> tuple[bool, float]:
    """Ranks that failed *because* a peer failed come after the peer; then by time."""
    return (failure.get("type") in CONSEQUENCES, float(failure.get("time", 0.0)))


def claim(abort: LockedRecord, failure: dict[str, Any]) -> dict[str, Any]:
    """Record ``failure`` unless another launcher recorded one first; return what is recorded.

    A rank's root cause replaces a consequence recorded first (a rank that failed *because* a
    peer died often exits before the peer's own launcher polls the dead process), and a final
    failure (a signal) makes the recorded one final: every launcher then stops for good.
    """

    def first(old: bytes) -> bytes | None:
        if not old:
            return failure_report.encode(failure)
        recorded = parsed(old)
        final = {"final": 1} if failure.get("final") or recorded.get("final") else {}
        if causal_order(recorded)[0] and not causal_order(failure)[0] and failure.get("rank", -1) >= 0:
            return failure_report.encode({**failure, **final})
        if final and not recorded.get("final"):
            return failure_report.encode({**recorded, **final})
        return None

    return parsed(abort.update(first))


def parsed(recorded: bytes) -> dict[str, Any]:
    try:
        return failure_report.parse(recorded)
    except ValueError as exc:  # another launcher's record, damaged: the job still failed
        return {"rank": -1, "reason": f"the job's failure record is unreadable ({exc})"}


def report(failure: dict[str, Any], then: str, ours: range) -> None:
    """Print the round's first failure. A traceback is printed only for a rank of another node:
    this node's ranks printed theirs to this launcher's output already."""
    launcher = failure.get("rank", -1) < 0
    who = failure.get("reason", "a launcher") if launcher else f"rank {failure['rank']}"
    what = "this round" if then.startswith("restarting") else "the job"
    lines = [f"fsdist run: {what} failed; the first failure was {who}"]
    if "exit_code" in failure:
        lines[0] += f" (exit code {failure['exit_code']} on {failure.get('host', '?')})"
    if failure.get("type") in CONSEQUENCES:  # the root cause was never recorded: a node lost, say
        lines[0] = lines[0].replace("the first failure was", "the first failure recorded was")
        lines[0] += (
            ", which only stopped because another rank failed; no launcher recorded that rank's own "
            "failure (its node, or its launcher, may have been killed)"
        )
    if then:
        lines[0] += f"; {then}"
    if failure.get("type"):
        lines.append(f"{failure['type']}: {failure.get('message', '')}")
    elif failure.get("message") or (failure.get("reason") and not launcher):
        lines.append(str(failure.get("message") or failure.get("reason")))
    if failure.get("traceback") and failure.get("rank", -1) not in ours:
        lines.append(failure["traceback"].rstrip())
    print("\n".join(lines), file=sys.stderr, flush=True)
