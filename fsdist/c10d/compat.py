"""Every private torch name fsdist touches, in one place: a torch upgrade changes this file only."""

from __future__ import annotations

import importlib
import itertools
import logging
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

# ``torch.distributed.rendezvous`` the attribute is a function; the module must be fetched by name.
log = logging.getLogger(__name__)

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


# ---- profiler events that end on another thread (profiling.py) ------------------------------
#
# A torch.profiler event is a RecordFunction. Its end is recorded only on a thread that carries
# the profiler's thread-local state, and Python has no way to carry that state to another thread
# but one: a task TorchScript forks on torch's inter-op pool resumes after a ``wait`` with the
# state of the thread that forked it (Gloo's Work ends its events through
# ``at::wrapPropagateTLSState`` likewise). The task holds no thread while it waits.

#: whether a profiler records on this thread (thread-local, ~0.1 µs)
profiler_enabled: Callable[[], bool] = torch.autograd._profiler_enabled

_KEYS = itertools.count()
#: continuation.py once imported (None: this torch cannot script it); [] until first needed
_CONTINUATION: list[Any] = []


def _continuation() -> Any:
    """continuation.py (scripted at its import), or None where this torch cannot script it."""
    if not _CONTINUATION:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.jit.script is deprecated; nothing else carries the state
                from . import continuation
        except Exception:
            log.warning("fsdist: profiler events show no input shapes here (TorchScript unavailable)", exc_info=True)
            continuation = None  # type: ignore[assignment]
        _CONTINUATION.append(continuation)
    return _CONTINUATION[0]


def record_until(name: str, inputs: list[torch.Tensor]) -> tuple[Callable[[], None], torch.futures.Future[Any]]:
    """Open profiler event ``name`` on this thread, with ``inputs`` (their shapes show where the
    profiler records shapes). Returns ``end``, which ends it from any thread, and a future that
    completes once the end is recorded."""
    trigger: torch.futures.Future[int] = torch.futures.Future()
    pool = _continuation()
    if pool is None:  # torch's own route for a future's end: the end lands right, the shapes are lost
        handle = torch.ops.profiler._record_function_enter_new(name, None)
        return lambda: trigger.set_result(0), torch.ops.profiler._call_end_callbacks_on_jit_fut(handle, trigger)
    record = torch._C._profiler._RecordFunctionFast(name, inputs)
    record.__enter__()
    key = next(_KEYS)
    pool.REGISTERED[key] = lambda: record.__exit__(None, None, None)
    return lambda: trigger.set_result(key), pool.fsdist_event_end(trigger)


def prepare_records() -> None:
    """Script continuation.py now (~30 ms, once per process), not inside the first profiled step."""
    _continuation()


def disable_shaped_records() -> None:
    """Take the shape-less route from now on (what a torch without TorchScript gets; for its test)."""
    _CONTINUATION[:] = [None]


# ---- torch.distributed._dist2 (experimental in torch) ---------------------------------------


def register_dist2(name: str, factory: Callable[..., Any]) -> None:
    """Register ``factory`` with ``torch.distributed._dist2`` once (a torch without it: nothing)."""
    try:
        dist2 = importlib.import_module("torch.distributed._dist2")
    except ImportError:
        return
    if name not in dist2._BACKENDS:
        dist2.register_backend(name, factory)


def backend_options(store: dist.Store, rank: int, size: int, timeout: Any, group_id: str) -> Any:
    """The options c10d hands a backend's creator, for a group made outside c10d (``_dist2``)."""
    opts = dist.distributed_c10d._DistributedBackendOptions()
    opts.store, opts.group_rank, opts.group_size = store, rank, size
    opts.timeout, opts.group_id, opts.global_ranks_in_group = timeout, group_id, []
    return opts
