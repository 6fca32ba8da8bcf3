"""fsdist: a torch.distributed backend whose ranks talk only through files in a shared directory.

Importing fsdist (or just ``import torch`` once it is installed) registers the ``fsdist``
backend and the ``fsdist://`` rendezvous scheme; every torch init method works with it::

    import torch.distributed as dist
    dist.init_process_group("fsdist", init_method="file:///shared/run/initfile", rank=r, world_size=n)
"""

from __future__ import annotations

from ._version import __version__
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

BACKEND_NAME = "fsdist"


def register() -> None:
    """Register the backend and the rendezvous scheme with torch.distributed (idempotent)."""
    import torch.distributed as dist

    from . import _torch_compat as compat
    from .backend import create_process_group
    from .init_methods import env_handler, fsdist_rendezvous_handler

    if not compat.backend_registered(BACKEND_NAME):
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True, devices=["cpu", "cuda"])
    if not compat.rendezvous_registered(BACKEND_NAME):
        compat.register_rendezvous(BACKEND_NAME, fsdist_rendezvous_handler)
    compat.wrap_rendezvous("env", env_handler)  # env:// meets through FSDIST_DIR where it is set


register()
