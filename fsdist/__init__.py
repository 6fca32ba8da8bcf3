"""fsdist: a torch.distributed backend whose ranks talk only through files in a shared directory.

Once fsdist is installed, ``import torch`` registers the ``fsdist`` backend (a ``torch.backends``
entry point); so does ``import fsdist`` after torch, or ``fsdist.register()``. Every torch init
method works with it::

    import torch.distributed as dist
    dist.init_process_group("fsdist", init_method="file:///shared/run/initfile", rank=r, world_size=n)
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from ._version import __version__
from .defaults import BACKEND_NAME as BACKEND_NAME
from .errors import (
    DesyncError,
    FsdistError,
    FsdistTimeoutError,
    GroupBrokenError,
    PeerFailedError,
    ProtocolError,
    RendezvousError,
)

__all__ = [
    "DesyncError",
    "FsdistError",
    "FsdistTimeoutError",
    "GroupBrokenError",
    "PeerFailedError",
    "ProtocolError",
    "RendezvousError",
    "__version__",
    "make_default",
    "monitored_barrier",
    "register",
]


def register() -> None:
    """Register the ``fsdist`` backend, the ``fsdist://`` scheme and the port-free ``env://`` with
    torch.distributed (idempotent). Installing fsdist does it whenever torch is imported."""
    from .c10d.registration import register as register_with_torch

    register_with_torch()


def make_default(devices: Iterable[str] = ("cpu",)) -> None:
    """Make fsdist torch's default backend for ``devices`` ("cpu", "cuda"): then
    ``init_process_group()`` without a backend, ``init_device_mesh("cpu", ...)`` and libraries
    that ask torch for the CPU backend get fsdist and open no port. ``FSDIST_DEFAULT_FOR=cpu`` in
    the environment does the same at ``import torch``."""
    from .c10d.registration import make_default as make_default_for

    make_default_for(devices)


def monitored_barrier(group: Any = None, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
    """``torch.distributed.monitored_barrier`` for fsdist groups too: torch refuses every backend
    but Gloo by name. Rank 0 names the ranks that did not arrive within ``timeout`` (all of them
    with ``wait_all_ranks``), in Gloo's words; on a group of another backend, torch's own runs."""
    from .c10d.monitored import monitored_barrier_of

    monitored_barrier_of(group, timeout, wait_all_ranks)


# The package imports no torch of its own, so that its tools (status, doctor, clean, bench locks)
# start at once, even where torch is not installed; where torch is loaded already, register now
if "torch" in sys.modules:
    register()
