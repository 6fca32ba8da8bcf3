"""Failure reports of ``fsdist run``: their formats, written and parsed without trust.

A rank's uncaught exception (``error.r<rank>.json``), the job's first failure (the launch
generation's ``abort`` record), and the restart history (``.launch/rounds``: the first failure
of each round of a job run with ``--max-restarts``), all JSON objects sealed with a checksum
line (protocol/sealed.py: a flipped bit is refused).

A rank writes its report just before it exits; its node's launcher reads it, and the launchers
agree on the first failure through the abort record, so every node reports the same cause with
its traceback. Nothing in these files is trusted: a reader caps the size, parses the JSON and
keeps only the known fields with the right types.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .sealed import bound_to_directory, seal_json, unseal_json

__all__ = ["MAX_BYTES", "MAX_ROUNDS", "add_round", "encode", "parse", "parse_rounds"]

#: a report carries a traceback, not a log: longer tracebacks keep their end (where it raised)
MAX_BYTES = 256 * 1024
#: rounds kept in the restart history (a job restarted more often keeps its first ones)
MAX_ROUNDS = 100
_ROUND_BYTES = MAX_BYTES // MAX_ROUNDS - 64  # one round's share of the history (its traceback stays in abort)
_INT_FIELDS = ("rank", "exit_code", "final")  # final: a failure no restart may follow (a signal)
_TEXT_FIELDS = ("type", "message", "traceback", "host", "reason")
#: what a report's and the history's checks are bound to (files/seal.py): their kinds
_REPORT, _HISTORY = "failure report", "restart history"


def encode(report: dict[str, Any]) -> bytes:
    """``report`` as sealed JSON within MAX_BYTES (a long traceback keeps its last part)."""
    raw = seal_json(report, _REPORT)
    if len(raw) > MAX_BYTES:
        report = {**report, "message": str(report.get("message", ""))[:8192]}
        report["traceback"] = "...\n" + str(report.get("traceback", ""))[-(MAX_BYTES // 2) :]
        raw = seal_json(report, _REPORT)
    return raw


def parse(raw: bytes) -> dict[str, Any]:
    """The report's known fields, each checked; ``ValueError`` if ``raw`` is not a report."""
    if len(raw) > MAX_BYTES:
        raise ValueError(f"failure report of {len(raw)} bytes is larger than {MAX_BYTES}")
    return _checked(_loads(unseal_json(raw, _REPORT)))


def _checked(report: Any) -> dict[str, Any]:
    """A report's known fields, each checked (``ValueError`` if it has none)."""
    if not isinstance(report, dict):
        raise ValueError("failure report is not a JSON object")
    checked: dict[str, Any] = {}
    for name in _INT_FIELDS:
        if isinstance(report.get(name), int) and not isinstance(report[name], bool):
            checked[name] = report[name]
    for name in _TEXT_FIELDS:
        if isinstance(report.get(name), str):
            checked[name] = report[name]
    when = report.get("time")
    if isinstance(when, (int, float)) and not isinstance(when, bool) and math.isfinite(when):
        checked["time"] = float(when)
    if not checked:
        raise ValueError("failure report has none of the known fields")
    return checked


def add_round(
    raw: bytes, job: str, max_restarts: int, round_index: int | None, failure: dict[str, Any],
    directory: str | None = None,
) -> bytes | None:  # fmt: skip
    """The history ``raw`` with ``failure`` as round ``round_index``'s; None: nothing changes.
    ``directory``: the run directory it lies in, which its seal is bound to (``parse_rounds``).

    Every launcher of a round offers the round's first failure; the first offer is kept, unless
    it was a consequence (``PeerFailedError``, ``GroupBrokenError``) and this one is not. A
    history of another job (an earlier run in the directory), or a damaged one, is started
    afresh; ``round_index=None`` only does that (a launcher starting a job).
    """
    identity = _history_identity(directory)
    try:
        history = parse_rounds(raw, directory)
    except ValueError:
        history = {}
    fresh = history.get("job") != job
    if fresh:
        history = {"format": 1, "job": job, "max_restarts": max_restarts, "rounds": []}
    if round_index is None:
        return seal_json(history, identity) if fresh else None
    rounds = history["rounds"]
    entry = _round_entry(failure, round_index)
    same = [i for i, e in enumerate(rounds) if e["round"] == round_index]
    if same:
        if not (_is_consequence(rounds[same[0]]) and not _is_consequence(entry)):
            return None
        rounds[same[0]] = entry
    elif len(rounds) >= MAX_ROUNDS:
        return seal_json(history, identity) if fresh else None
    else:
        rounds.append(entry)
    return seal_json(history, identity)


def _is_consequence(failure: dict[str, Any]) -> bool:
    return failure.get("type") in ("PeerFailedError", "GroupBrokenError")


def _round_entry(failure: dict[str, Any], round_index: int) -> dict[str, Any]:
    """``failure`` without its traceback, its texts cut until it fits its share of MAX_BYTES."""
    entry = {k: v for k, v in failure.items() if k != "traceback"}
    entry["round"] = round_index
    while len(json.dumps(entry)) > _ROUND_BYTES:
        texts = [k for k, v in entry.items() if isinstance(v, str) and v]
        if not texts:
            break
        longest = max(texts, key=lambda k: len(entry[k]))
        entry[longest] = entry[longest][: len(entry[longest]) // 2]
    return entry


def _history_identity(directory: str | None) -> str:
    return _HISTORY if directory is None else bound_to_directory(_HISTORY, directory)


def parse_rounds(raw: bytes, directory: str | None = None) -> dict[str, Any]:
    """The restart history's checked fields: job, max_restarts and rounds (``ValueError`` if not
    one). ``directory``: the run directory it lies in (its seal is bound to it: a history copied
    from another run directory is refused under FSDIST_SECRET_FILE); None for the bytes alone."""
    if not raw:
        raise ValueError("no restart history")
    if len(raw) > MAX_BYTES:
        raise ValueError(f"restart history of {len(raw)} bytes is larger than {MAX_BYTES}")
    history = _loads(unseal_json(raw, _history_identity(directory)))
    if not isinstance(history, dict) or history.get("format") != 1:
        raise ValueError("restart history is not a format-1 JSON object")
    job, max_restarts, rounds = history.get("job"), history.get("max_restarts"), history.get("rounds")
    if not isinstance(job, str) or not isinstance(max_restarts, int) or isinstance(max_restarts, bool):
        raise ValueError("restart history lacks its job or max_restarts")
    if not isinstance(rounds, list) or len(rounds) > MAX_ROUNDS:
        raise ValueError("restart history's rounds are not a list of at most MAX_ROUNDS")
    checked = []
    for entry in rounds:
        index = entry.get("round") if isinstance(entry, dict) else None
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise ValueError(f"restart history has a round without its number: {entry!r:.80}")
        try:
            failure = _checked({k: v for k, v in entry.items() if k != "round"})
        except ValueError:
            failure = {}
        checked.append({**failure, "round": index})
    return {"format": 1, "job": job, "max_restarts": max_restarts, "rounds": checked}


def _loads(raw: bytes) -> Any:
    """JSON, with nesting too deep for the parser reported as what it is: not a report."""
    try:
        return json.loads(raw)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc
