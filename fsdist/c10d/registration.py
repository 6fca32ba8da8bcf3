"""Registering fsdist with torch.distributed: the backend, ``fsdist://`` and a port-free ``env://``."""

from __future__ import annotations

import torch.distributed as dist

from ..defaults import BACKEND_NAME
from . import compat
from .backend import create_process_group
from .init_methods import env_handler, fsdist_rendezvous_handler

__all__ = ["BACKEND_NAME", "register"]


def register() -> None:
    """Register the backend and the rendezvous schemes with torch.distributed (idempotent)."""
    if not compat.backend_registered(BACKEND_NAME):
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True, devices=["cpu", "cuda"])
    if not compat.rendezvous_registered(BACKEND_NAME):
        compat.register_rendezvous(BACKEND_NAME, fsdist_rendezvous_handler)
    compat.wrap_rendezvous("env", env_handler)  # env:// meets through FSDIST_DIR where it is set
