"""Per-operation debug records through ``logging``: rank, group, sequence number, op, bytes, time.

Switched on by ``FSDIST_DEBUG=1`` or torch's own ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, or by the
program itself with ``logging.getLogger("fsdist").setLevel(logging.DEBUG)``. The records go to
the ``fsdist.ops`` logger; each carries its fields as attributes too (``record.fsdist_rank``,
``fsdist_group``, ``fsdist_seq``, ``fsdist_op``, ``fsdist_bytes``, ``fsdist_seconds``) for
filters and structured handlers.

Off, it costs nothing per operation: a process group asks ``enabled()`` once when it is created
and, when the answer is no, never calls in here again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator

from ..defaults import ENV_DEBUG

__all__ = ["OpLog", "enabled", "log_op"]

log = logging.getLogger("fsdist.ops")
_configured = False


def _from_environment() -> bool:
    return os.environ.get(ENV_DEBUG, "") not in ("", "0") or os.environ.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL"


def enabled() -> bool:
    """Whether per-operation records are wanted (the environment is read the first time).

    When the environment asks for them, the ``fsdist`` logger is set to DEBUG and, unless the
    program configured logging itself (a handler on the root or ``fsdist`` logger), given a
    handler writing to stderr.
    """
    global _configured
    if not _configured:
        _configured = True
        if _from_environment():
            package = logging.getLogger("fsdist")
            package.setLevel(logging.DEBUG)
            if not package.handlers and not logging.getLogger().handlers:
                handler = logging.StreamHandler(sys.stderr)
                handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
                package.addHandler(handler)
    return log.isEnabledFor(logging.DEBUG)


def log_op(
    rank: int, group: str, seq: int | None, description: str, nbytes: int, seconds: float, error: str = ""
) -> None:
    """One record: ``rank 0 group 0 #12 all_reduce SUM float32[1000]: 4000 B in 0.35 ms``."""
    where = f"#{seq} " if seq is not None else ""
    outcome = f" FAILED: {error}" if error else ""
    log.debug(
        "rank %d group %s %s%s: %d B in %.3f ms%s",
        rank,
        group,
        where,
        description,
        nbytes,
        seconds * 1e3,
        outcome,
        extra={
            "fsdist_rank": rank,
            "fsdist_group": group,
            "fsdist_seq": seq,
            "fsdist_op": description,
            "fsdist_bytes": nbytes,
            "fsdist_seconds": seconds,
        },
    )


class OpLog:
    """A process group's records, or none: ``enabled()`` is asked once, when the group is made,
    so that timing and formatting cost nothing per operation when records are off."""

    def __init__(self, rank: int, group: str) -> None:
        self.on = enabled()
        self.rank, self.group = rank, group

    def record(self, seq: int | None, description: str, nbytes: int, seconds: float, error: str = "") -> None:
        log_op(self.rank, self.group, seq, description, nbytes, seconds, error)

    @contextlib.contextmanager
    def timed(self, seq: int | None, description: str, nbytes: int) -> Iterator[None]:
        """Record what runs inside, how long it took and how it failed (the error goes on).
        Callers enter it only when ``on``: off, an operation never enters this module."""
        start, error = time.perf_counter(), ""
        try:
            yield
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.record(seq, description, nbytes, time.perf_counter() - start, error)
