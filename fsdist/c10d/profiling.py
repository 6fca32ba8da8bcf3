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
from typing import Protocol

import torch

from . import compat

__all__ = ["PREFIX", "Event", "profile"]

PREFIX = "fsdist:"
#: how long ``wait`` waits for an event's end to be recorded (it runs on torch's inter-op pool,
#: normally within a millisecond; a pool busy with the user's own tasks must not hang the wait)
RECORD_SECONDS = 1.0


class Event:
    """One operation's profiler event: ``end`` ends it from any thread (work.FsdistWork.complete)."""

    __slots__ = ("_ended", "end")

    def __init__(self, name: str, inputs: list[torch.Tensor]) -> None:
        self.end, self._ended = compat.record_until(name, inputs)

    def wait_recorded(self) -> None:
        """Return once the ended event is in the profiler's records (so a ``wait()`` right before
        the profiler stops finds it there), or after RECORD_SECONDS."""
        deadline = time.monotonic() + RECORD_SECONDS
        while not self._ended.done() and time.monotonic() < deadline:
            time.sleep(1e-4)


class Profiled(Protocol):
    """What ``profile`` gives the event to (work.FsdistWork)."""

    event: Event | None


def profile(work: Profiled, description: str, tensors: Sequence[torch.Tensor], op: str = "") -> None:
    """Open ``work``'s event (called where a profiler records on this thread: compat.profiler_enabled).
    ``op``: the event's name after ``fsdist:`` (default: the description's first word, torch's
    name of the operation)."""
    name = PREFIX + (op or description.partition(" ")[0])
    # torch records complex tensors by their real view (as Gloo sends them)
    work.event = Event(name, [torch.view_as_real(x) if x.is_complex() else x for x in tensors])
