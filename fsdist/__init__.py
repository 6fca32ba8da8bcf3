"""fsdist: a torch.distributed backend whose ranks talk only through files in a shared directory.

Once fsdist is installed, ``import torch`` registers the ``fsdist`` backend (a ``torch.backends``
entry point); so does ``import fsdist`` after torch, or ``fsdist.register()``. Every torch init
method works with it::

    import torch.distributed as dist
    dist.init_process_group("fsdist", init_method="file:///shared/run/initfile", rank=r, world_size=n)
"""

from __future__ import annotations

import sys

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
    "register",
]


def register() -> None:
    """Register the ``fsdist`` backend, the ``fsdist://`` scheme and the port-free ``env://`` with
    torch.distributed (idempotent). Installing fsdist does it whenever torch is imported."""
    from .c10d.registration import register as register_with_torch

    register_with_torch()


# The package imports no torch of its own, so that its tools (status, doctor, clean, bench locks)
# start at once, even where torch is not installed; where torch is loaded already, register now
if "torch" in sys.modules:
    register()
