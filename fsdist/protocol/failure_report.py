"""Failure reports of ``fsdist run``: a rank's uncaught exception (``error.r<rank>.json``) and
the job's first failure (the launch generation's ``abort`` record), both JSON objects.

A rank writes its report just before it exits; its node's launcher reads it, and the launchers
agree on the first failure through the abort record, so every node reports the same cause with
its traceback. Nothing in these files is trusted: a reader caps the size, parses the JSON and
keeps only the known fields with the right types.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["MAX_BYTES", "encode", "parse"]

#: a report carries a traceback, not a log: longer tracebacks keep their end (where it raised)
MAX_BYTES = 256 * 1024
_INT_FIELDS = ("rank", "exit_code")
_TEXT_FIELDS = ("type", "message", "traceback", "host", "reason")


def encode(report: dict[str, Any]) -> bytes:
    """``report`` as JSON within MAX_BYTES (a long traceback keeps its last part)."""
    raw = json.dumps(report).encode()
    if len(raw) > MAX_BYTES:
        report = {**report, "message": str(report.get("message", ""))[:8192]}
        report["traceback"] = "...\n" + str(report.get("traceback", ""))[-(MAX_BYTES // 2) :]
        raw = json.dumps(report).encode()
    return raw


def parse(raw: bytes) -> dict[str, Any]:
    """The report's known fields, each checked; ``ValueError`` if ``raw`` is not a report."""
    if len(raw) > MAX_BYTES:
        raise ValueError(f"failure report of {len(raw)} bytes is larger than {MAX_BYTES}")
    report = json.loads(raw)
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
