"""The end of a profiler event, recorded on another thread with the state of the thread that
opened it.

compat.record_until ends each fsdist profiler event through this (see there why TorchScript).
This module is scripted when first imported, and holds no ``from __future__ import annotations``:
TorchScript reads its annotations as types, not strings.
"""

from collections.abc import Callable

import torch

#: each open event's closing callback, by key (the trigger's result)
REGISTERED: dict[int, Callable[[], None]] = {}


@torch.jit.ignore  # type: ignore[untyped-decorator]
def _close(key: int) -> None:
    REGISTERED.pop(key)()


@torch.jit.script
def _after(trigger: torch.jit.Future[int]) -> None:
    _close(torch.jit._wait(trigger))


@torch.jit.script
def fsdist_event_end(trigger: torch.jit.Future[int]) -> torch.jit.Future[None]:
    """Run ``REGISTERED[k]`` once ``trigger`` completes with ``k``, on torch's inter-op pool with
    this thread's state. The forked task holds no thread while it waits. (A profiler records
    this call as a tiny event beside the fsdist event, and the task as ``<forked function>`` on
    an inter-op thread.)"""
    return torch.jit._fork(_after, trigger)


def _warm() -> None:
    """Start the inter-op pool now: its first task takes ~25 ms, which would land in an event."""
    trigger: torch.futures.Future[int] = torch.futures.Future()
    REGISTERED[-1] = lambda: None
    done = fsdist_event_end(trigger)
    trigger.set_result(-1)
    done.wait()


_warm()
