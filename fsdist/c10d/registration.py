"""Registering fsdist with torch.distributed: the backend, ``fsdist://``, a port-free ``env://``,
the experimental ``torch.distributed._dist2`` factory, and (opt-in) torch's default per device."""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Iterable
from datetime import timedelta

import torch
import torch.distributed as dist

from ..defaults import BACKEND_NAME, DEVICES, ENV_DEFAULT_FOR
from . import compat
from .backend import ProcessGroupFsdist, create_process_group
from .init_methods import env_handler, file_handler, fsdist_rendezvous_handler

__all__ = ["BACKEND_NAME", "make_default", "register"]

_DIST2_GROUPS = itertools.count()


def register() -> None:
    """Register the backend and the rendezvous schemes with torch.distributed (idempotent), and
    make fsdist the default for the devices ``FSDIST_DEFAULT_FOR`` names."""
    _register_backend()
    if os.environ.get(ENV_DEFAULT_FOR):
        _default_from_environment(os.environ[ENV_DEFAULT_FOR])


def _register_backend() -> None:
    if not compat.backend_registered(BACKEND_NAME):
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True, devices=list(DEVICES))
    compat.tell_flight_recorder_not_to_hook(BACKEND_NAME)
    if not compat.rendezvous_registered(BACKEND_NAME):
        compat.register_rendezvous(BACKEND_NAME, fsdist_rendezvous_handler)
    compat.wrap_rendezvous("env", env_handler)  # env:// meets through FSDIST_DIR where it is set
    compat.wrap_rendezvous("file", file_handler)  # file://: its file made the user's first, for fsdist groups
    compat.register_dist2(BACKEND_NAME, dist2_group)


def make_default(devices: Iterable[str] = ("cpu",)) -> None:
    """Make fsdist torch's default backend for ``devices`` (device types: "cpu", "cuda").

    torch picks a backend per device where none is named: ``init_process_group()`` without a
    backend (for the machine's accelerator, else cpu), ``init_device_mesh("cpu", ...)``, and
    libraries that ask torch for the CPU backend. With fsdist the default for them, they open no
    port. The environment variable ``FSDIST_DEFAULT_FOR=cpu`` does the same at ``import torch``,
    for scripts that cannot be changed.
    """
    chosen = [str(device) for device in devices]
    unknown = [device for device in chosen if device not in DEVICES]
    if unknown or not chosen:
        raise ValueError(f"fsdist can be the default for {' and '.join(DEVICES)}, not {unknown or 'no device'}")
    _register_backend()
    for device in chosen:
        dist.Backend.default_device_backend_map[device] = BACKEND_NAME


def _default_from_environment(value: str) -> None:
    """``FSDIST_DEFAULT_FOR``: a bad value warns (at ``import torch`` an error would stop torch itself)."""
    devices = [part.strip() for part in value.split(",") if part.strip()]
    try:
        make_default(devices)
    except ValueError as exc:
        warnings.warn(f"{ENV_DEFAULT_FOR}={value!r} ignored: {exc}", stacklevel=2)


def dist2_group(
    store: dist.Store, rank: int, world_size: int, timeout: timedelta, device: torch.device, **kwargs: object
) -> ProcessGroupFsdist:
    """``torch.distributed._dist2.new_group("fsdist", timeout, device)`` (torch's experimental
    object-oriented API): a group of every rank, formed over the store that ``env://`` gave (so,
    where FSDIST_DIR is set, in that directory), not registered with torch.distributed."""
    if kwargs:
        raise ValueError(f"the fsdist backend takes no options, got {sorted(kwargs)}")
    if torch.device(device).type not in DEVICES:
        raise ValueError(f"fsdist serves {' and '.join(DEVICES)} tensors, not {torch.device(device).type}")
    group_id = f"dist2_{next(_DIST2_GROUPS)}"
    return create_process_group(compat.backend_options(store, rank, world_size, timeout, group_id))
