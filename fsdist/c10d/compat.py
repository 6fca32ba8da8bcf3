"""Every private torch name fsdist calls, and every difference between the torch releases it
supports (docs/torch-versions.md), in one place: a torch upgrade changes this file.

Each difference is decided by a feature test of the torch that is running (does the attribute
exist), never by a try/except that could hide a failure. Two kinds of private name live
elsewhere, where they must: the c10d method names fsdist *answers* (``_device_types``,
``_get_backend`` and every collective's name) are the table of ProcessGroupFsdist in backend.py,
which takes the older names from ``OLDER_METHOD_NAMES`` here; ``torch.jit._fork``/``_wait`` sit
in continuation.py, which TorchScript compiles.
"""

from __future__ import annotations

import importlib
import importlib.util
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


# ---- what differs between torch releases ----------------------------------------------------

#: c10d's older names for entry points that backend.py implements under today's names
#: (older -> today's). torch <= 2.12 calls the older ones from Python (``all_gather_into_tensor``
#: calls ``_allgather_base``, the coalescing manager ``allgather_into_tensor_coalesced``); every
#: release's C++ callers (functional collectives) still use some. Every tested release binds all
#: five; each is answered even where one is not, since the C++ side may still look it up by name.
OLDER_METHOD_NAMES = {
    "_allgather_base": "all_gather_single",
    "_reduce_scatter_base": "reduce_scatter_single",
    "allgather_into_tensor_coalesced": "all_gather_single_coalesced",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_single_coalesced",
    "alltoall_base": "all_to_all_single",
}


def answer_older_method_names(cls: type) -> type:
    """Class decorator: ``cls`` answers each of ``OLDER_METHOD_NAMES`` with the method of today's
    name. (Unanswered, c10d's own C++ method runs and fails with the misleading "No backend type
    associated with device type cpu".)"""
    for older, current in OLDER_METHOD_NAMES.items():
        setattr(cls, older, getattr(cls, current))
    return cls


def premul_sum_factor(reduce_op: dist.ReduceOp) -> float | torch.Tensor:
    """The factor of a ``PREMUL_SUM`` ReduceOp (``dist._make_nccl_premul_sum(f)``).

    Newer torch binds it as ``ReduceOp.factor``; 2.10 and older keep it only in the op's pickled
    state, ``(op, factor)``, which is how c10d itself copies a ReduceOp."""
    if hasattr(reduce_op, "factor"):
        return reduce_op.factor
    _op, factor = reduce_op.__getstate__()  # type: ignore[attr-defined, unused-ignore]
    return factor


def tell_flight_recorder_not_to_hook(name: str) -> None:
    """Have torch (>= 2.15) attach no flight-recorder hook to groups of backend ``name``.

    torch's flight recorder records a backend that does not record itself through pre/post hooks
    that run inside c10d's C++ ProcessGroup methods, around the C++ Backend they dispatch to. A
    Python backend cannot be a C++ Backend (it must subclass ProcessGroup, TORCH_API.md), and it
    overrides those very methods, so a hook on its group would never run; worse, attaching one
    fails ("Could not find the default backend type 0"), and with it every group. torch offers no
    Python call that adds an entry to a recorder, so fsdist keeps its own record of each rank's
    operations (FSDIST_DEBUG, docs/debugging.md) and names itself among the backends torch leaves
    alone: those that record themselves, and those with nothing for a hook to record."""
    recording = vars(dist.distributed_c10d).get("_FR_SELF_RECORDING_BACKENDS")
    if recording is not None:
        recording.add(name)


def register_dist2(name: str, factory: Callable[..., Any]) -> None:
    """Register ``factory`` with ``torch.distributed._dist2`` once: torch's experimental group
    API, in torch 2.10 to 2.13 of the releases tested (2.7 and 2.8 have none, 2.14 removed it; there,
    nothing to register with)."""
    if not has_dist2():
        return
    dist2 = importlib.import_module("torch.distributed._dist2")
    if name not in dist2._BACKENDS:
        dist2.register_backend(name, factory)


def has_dist2() -> bool:
    """Whether this torch has ``torch.distributed._dist2`` (2.10 to 2.13)."""
    return importlib.util.find_spec("torch.distributed._dist2") is not None


def backend_options(store: dist.Store, rank: int, size: int, timeout: Any, group_id: str) -> Any:
    """The options c10d hands a backend's creator, for a group made outside c10d (``_dist2``)."""
    opts = dist.distributed_c10d._DistributedBackendOptions()
    opts.store, opts.group_rank, opts.group_size = store, rank, size
    opts.timeout, opts.group_id, opts.global_ranks_in_group = timeout, group_id, []
    return opts
