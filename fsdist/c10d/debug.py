"""Per-operation debug records through ``logging``: rank, group, sequence number, op, bytes, time.

Switched on by ``FSDIST_DEBUG=1`` or torch's own ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, or by the
program itself with ``logging.getLogger("fsdist").setLevel(logging.DEBUG)``. The records go to
the ``fsdist.ops`` logger; each carries its fields as attributes too (``record.fsdist_rank``,
``fsdist_group``, ``fsdist_seq``, ``fsdist_op``, ``fsdist_bytes``, ``fsdist_seconds``) for
filters and structured handlers.

Off, it costs nothing per operation: a process group asks ``enabled()`` once when it is created
and skips timing and formatting entirely when the answer is no.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable

import torch

from ..defaults import ENV_DEBUG

__all__ = ["enabled", "log_op", "tensor_bytes"]

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


def tensor_bytes(*groups: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct tensors involved (a tensor used as input and output counts once)."""
    seen: dict[int, int] = {}
    for tensors in groups:
        for tensor in tensors:
            seen[id(tensor)] = tensor.numel() * tensor.element_size()
    return sum(seen.values())


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
