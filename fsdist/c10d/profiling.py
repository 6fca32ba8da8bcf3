"""fsdist's operations in torch.profiler traces, as torch's own backends show theirs.

Each operation is one event named ``fsdist:<op>`` (``fsdist:all_reduce``, ``fsdist:send``; Gloo's
are ``gloo:<op>``) with its tensors as inputs, so a trace taken with ``record_shapes=True`` shows
their shapes. The event opens on the calling thread when the operation is issued and ends when
it completes, on whichever thread completes it: an async operation's event spans the compute it
overlapped. Nothing happens while no profiler records on the calling thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from . import compat

if TYPE_CHECKING:
    from .work import FsdistWork

__all__ = ["PREFIX", "profile", "wait_recorded"]

PREFIX = "fsdist:"
#: how long ``wait`` waits for an event's end to be recorded (it runs on torch's inter-op pool,
#: normally within a millisecond; a pool busy with the user's own tasks must not hang the wait)
RECORD_SECONDS = 1.0


def profile(work: FsdistWork, description: str, tensors: Sequence[torch.Tensor], op: str = "") -> None:
    """Open ``work``'s event if a profiler records on this thread; ``work.complete`` ends it.
    ``op``: the event's name after ``fsdist:`` (default: the description's first word, torch's
    name of the operation)."""
    if not compat.profiler_enabled():
        return
    name = PREFIX + (op or description.partition(" ")[0])
    # torch records complex tensors by their real view (as Gloo sends them)
    inputs = [torch.view_as_real(x) if x.is_complex() else x for x in tensors]
    work.event_end, work.event_ended = compat.record_until(name, inputs)


def wait_recorded(ended: torch.futures.Future[object]) -> None:
    """Return once an ended event is in the profiler's records (so a ``wait()`` right before the
    profiler stops finds it there), or after RECORD_SECONDS."""
    deadline = time.monotonic() + RECORD_SECONDS
    while not ended.done() and time.monotonic() < deadline:
        time.sleep(1e-4)
