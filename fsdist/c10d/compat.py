"""Every private torch name fsdist touches, in one place: a torch upgrade changes this file only."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

# ``torch.distributed.rendezvous`` the attribute is a function; the module must be fetched by name.
_rendezvous = importlib.import_module("torch.distributed.rendezvous")


#: turning autograd off and on for one thread, as ``torch.no_grad`` does, without its three
#: Python-level calls per operation (``torch._C._set_grad_enabled``)
set_grad_enabled: Callable[[bool], None] = torch._C._set_grad_enabled


def backend_registered(name: str) -> bool:
    return name.upper() in dist.Backend._plugins


def rendezvous_registered(scheme: str) -> bool:
    return scheme in _rendezvous._rendezvous_handlers


def register_rendezvous(scheme: str, handler: Callable[..., Any]) -> None:
    dist.register_rendezvous_handler(scheme, handler)


def wrap_rendezvous(scheme: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace torch's handler for ``scheme`` by ``wrap(handler)``, once (torch has no public way:
    ``register_rendezvous_handler`` refuses a scheme that exists)."""
    handlers = _rendezvous._rendezvous_handlers
    current = handlers[scheme]
    if not getattr(current, "fsdist_wrapped", False):
        wrapped = wrap(current)
        wrapped.fsdist_wrapped = True  # type: ignore[attr-defined]
        handlers[scheme] = wrapped


def unwrap_store(store: dist.Store) -> dist.Store:
    """The innermost store under c10d's PrefixStore chain (it hands back our Python object)."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store
