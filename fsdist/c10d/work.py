"""Work objects, and the queue that runs a group's operations in issue order.

Collectives of a group run one at a time on one FIFO worker thread, in the order the caller
issued them (sequence numbers are assigned in the calling thread), or on the caller's thread
when it waits for one nobody has started. Receives are matched apart (receives.py), so that a
posted ``irecv`` never blocks later collectives or sends (as in Gloo).

``dist.Work`` is subclassed rather than built from a future: an error set on a Python future is
not seen by C++ (see TORCH_API.md), so ``wait()`` raises the stored error itself and
``get_future()`` unwraps it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..defaults import HANDOFF_SECONDS, INLINE_RUN_BYTES, REDUCE_THREADS
from ..errors import FsdistTimeoutError, GroupBrokenError
from . import compat, profiling
from .intraop import SERIAL_BYTES, limit_this_thread, limited

log = logging.getLogger(__name__)

__all__ = ["FsdistWork", "OpQueue", "Turns"]


class _Failed:
    """The future's value when the operation failed (the error travels beside it)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Latch:
    """A one-shot event on a bare lock, held until ``set``: every operation makes one, and
    ``threading.Event`` builds a Condition for it."""

    __slots__ = ("_held", "_set")

    def __init__(self) -> None:
        self._held = threading.Lock()
        self._held.acquire()
        self._set = False

    def set(self) -> None:  # (once: FsdistWork completes once)
        self._set = True
        self._held.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        if self._held.acquire(timeout=-1 if timeout is None else timeout):
            self._held.release()  # let every other waiter through too
            return True
        return self._set


class FsdistWork(dist.Work):
    """The handle of one operation: ``wait()`` raises its real error; the future holds outputs."""

    def __init__(self, outputs: list[torch.Tensor], description: str) -> None:
        super().__init__()
        self.description = description
        self._outputs = outputs
        #: made by the first ``get_future`` (most works are only waited for: ~2 µs saved)
        self._future: torch.futures.Future[Any] | None = None
        self._done = _Latch()
        self._error: BaseException | None = None
        self._source: int = -1
        self._lock = threading.Lock()
        self._completed = False
        self._future_handed_out = False
        #: set by the queue whose caller may run the operation in ``wait`` (OpQueue,
        #: receives.ReceiveLoop): runs it here, or waits until another thread has taken it
        #: (called with wait's timeout in seconds, or None)
        self.run_here: Callable[[float | None], None] | None = None
        #: the name of the thread that ran the operation (the caller's or the group worker's)
        self.ran_on = ""
        #: its torch.profiler event, when one records it (profiling.py)
        self.event: profiling.Event | None = None

    def profile(self, tensors: Sequence[torch.Tensor], op: str = "") -> None:
        """Open its torch.profiler event where a profiler records on this thread (profiling.py)."""
        if compat.profiler_enabled():
            profiling.profile(self, self.description, tensors, op)

    def complete(self, error: BaseException | None = None, source: int | None = None) -> None:
        """Record the outcome (the first call wins) and complete the future.

        Callbacks attached through ``get_future().then`` run when the future completes. They
        must not run on the group's worker thread: a callback that issues a collective and
        waits for it (DDP's PowerSGD hook does) would wait for the very thread it blocks. So a
        future that was handed out completes on a completion thread; one that was not (no
        callback can be attached yet) completes at once, with no thread hop.
        """
        with self._lock:
            if self._completed:
                return
            self._completed = True
            # nothing is left to run in the caller: and the hook (its queue's entry, which holds
            # this Work) would keep both alive in a cycle until the cyclic GC runs, whose
            # passes cost every small operation dearly
            self.run_here = None
            self._error = error
            if source is not None:
                self._source = source
            if self.event is not None:
                self.event.end()
            if not self._future_handed_out:
                self._finish()
                return
        _completions().submit(self._finish)

    def _finish(self) -> None:
        try:
            if self._future is not None:
                self._future.set_result(_Failed(self._error) if self._error else self._outputs)
        finally:
            self._done.set()

    def wait(self, timeout: timedelta | None = None) -> bool:
        seconds = timeout.total_seconds() if timeout is not None and timeout.total_seconds() > 0 else None
        run_here = self.run_here  # (once: completing on another thread clears it)
        if run_here is not None and not self._done.is_set():
            start = time.monotonic()
            run_here(seconds)
            left = None if seconds is None else max(0.0, seconds - (time.monotonic() - start))
        else:
            left = seconds
        if not self._done.wait(left):
            raise FsdistTimeoutError(f"'{self.description}' did not finish within {seconds:.1f} s of wait()")
        if self.event is not None:
            self.event.wait_recorded()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._outputs

    def source_rank(self) -> int:
        return self._source

    _source_rank = source_rank  # (c10d's older name)

    def get_future(self) -> torch.futures.Future[Any]:
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                if self._completed:  # completed before anyone asked: the outcome is known
                    self._future.set_result(_Failed(self._error) if self._error else self._outputs)
            self._future_handed_out = True
        return self._future.then(_unwrap)

    def synchronize(self) -> None:
        self.wait()


_COMPLETIONS: list[ThreadPoolExecutor] = []  # made at first use
_COMPLETIONS_LOCK = threading.Lock()


def _completions() -> ThreadPoolExecutor:
    """Threads that complete futures: several, so a callback may wait on a later operation."""
    with _COMPLETIONS_LOCK:
        if not _COMPLETIONS:
            _COMPLETIONS.append(ThreadPoolExecutor(max_workers=8, thread_name_prefix="fsdist-complete"))
        return _COMPLETIONS[0]


def _unwrap(future: torch.futures.Future[Any]) -> Any:
    value = future.value()
    if isinstance(value, _Failed):
        raise value.error
    return value


IDLE_AFTER_SECONDS = 0.1  # the helper stops looking for what nobody took after this long without a submission
#: While its looks find nothing to do, the helper looks half as often, down to this: an async
#: small operation its caller never waits for then starts within 10 ms (within 1 ms again once
#: the helper found one).
MAX_TICK_SECONDS = 10e-3


class Turns:
    """When a helper thread (OpQueue's worker, receives.ReceiveLoop's) takes what callers did
    not run themselves: a caller runs its own small operation or receive (a hand-off costs two
    wake-ups: docs/design.md), so a submission does not wake the helper; while things keep
    coming it looks every ``handoff`` seconds (backing off to MAX_TICK_SECONDS while callers
    took everything) for one nobody took within ``handoff``, and sleeps once idle. The queues
    keep their own entries: a Work keeps only its outcome. Every method but ``__init__`` runs
    with ``cond``'s lock held."""

    def __init__(self, cond: threading.Condition, handoff: float) -> None:
        self.handoff = handoff
        self._cond = cond
        self._tick = handoff
        self._idle = False  # asleep without a timeout: a submission must wake it
        self._last_submit = 0.0

    def submitted(self, now: float, urgent: bool = False) -> None:
        """Something was queued at ``now``; ``urgent``: the helper takes it at once, not after ``handoff``."""
        self._last_submit = now
        if urgent or self._idle:
            self._cond.notify()

    def look(self, oldest: Callable[[], float | None], busy: bool) -> bool:
        """True when something the helper may take is due (``oldest()``: when the oldest such
        thing may be taken, None: nothing); else sleep until it may be, or for a tick while
        things are coming or ``busy`` (a caller runs one now), or until woken, and return False
        (the caller looks again, after whatever else it must check)."""
        now = time.monotonic()
        due = oldest()
        timeout: float | None
        if due is not None:
            if due <= now:
                self._tick = self.handoff  # its caller did not take it: look often again
                return True
            timeout = due - now
        elif busy or now - self._last_submit < IDLE_AFTER_SECONDS:
            # look again for a submission nobody takes, less often while every look finds the
            # callers took theirs themselves
            timeout, self._tick = self._tick, min(self._tick * 2, MAX_TICK_SECONDS)
        else:
            timeout = None
        self._idle = timeout is None
        self._cond.wait(timeout)
        self._idle = False
        return False


class _Op:
    """A queued operation: what runs it, its tensors' bytes, and when the worker may take it."""

    __slots__ = ("caller_may_run", "claim_after", "claimed", "nbytes", "run", "work")

    def __init__(self, work: FsdistWork, run: Callable[[], None], nbytes: int, claim_after: float, small: bool) -> None:
        self.run: Callable[[], None] | None = run
        self.work, self.nbytes, self.claim_after = work, nbytes, claim_after
        self.caller_may_run, self.claimed = small, False


class OpQueue:
    """A group's operations, run one at a time in issue order.

    A worker thread runs them, so an operation progresses whether or not its caller waits
    (``async_op=True``, or a rank that blocks elsewhere first). But a caller that waits for an
    operation nobody has started yet, with nothing before it, runs it itself (small operations
    only, see ``INLINE_RUN_BYTES``): a synchronous ``dist.all_reduce`` then costs no hand-off to
    the worker and back. Whoever claims an operation first runs it; the other passes over it.
    The worker takes what callers leave as ``Turns`` says; a large operation wakes it at once.

    After an operation fails the group is broken: the error is reported on every later
    operation instead of letting ranks run on out of step.
    """

    def __init__(self, name: str, on_error: Callable[[BaseException], None], handoff: float = HANDOFF_SECONDS) -> None:
        self._on_error = on_error
        self.broken: BaseException | None = None
        #: the queue's state; both conditions share it (taken as itself: a Condition's ``with``
        #: is a Python-level call, two per small operation)
        self._lock = threading.Lock()
        self._worker_cv = threading.Condition(self._lock)  # the worker sleeps here
        self._caller_cv = threading.Condition(self._lock)  # callers wait here for an operation to end
        self._callers_waiting = 0  # (on ``_caller_cv``)
        self._turns = Turns(self._worker_cv, handoff)
        self._unstarted: deque[_Op] = deque()
        self._running = False
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"fsdist-{name}", daemon=True)
        self._thread.start()

    def submit(self, work: FsdistWork, run: Callable[[], None], nbytes: int = 0) -> FsdistWork:
        """Queue ``run`` as ``work``; its caller may run it in ``work.wait()`` if ``nbytes`` (its
        inputs' and outputs' bytes) is small."""
        now = time.monotonic()
        urgent = nbytes > INLINE_RUN_BYTES
        op = _Op(work, run, nbytes, now if urgent else now + self._turns.handoff, not urgent)
        if not urgent:
            work.run_here = functools.partial(self._run_in_caller, op)
        with self._lock:
            self._unstarted.append(op)
            self._turns.submitted(now, urgent)
        return work

    def _run_in_caller(self, op: _Op, seconds: float | None = None) -> None:
        """``op.work.wait()``: run ``op`` (and the small operations queued before it) here, unless
        the worker has them; returns once ``op`` is claimed by either side. (``seconds`` is
        not a limit here: a started operation runs to its own deadline.)"""
        while True:
            with self._lock:
                while True:
                    if op.claimed:
                        return  # (the worker's, or run here already)
                    head = self._unstarted[0]
                    if not self._running and head.caller_may_run:
                        self._start(head)
                        break
                    self._callers_waiting += 1
                    try:
                        self._caller_cv.wait()  # the worker runs something (``_execute`` notifies)
                    finally:
                        self._callers_waiting -= 1
            if head.nbytes < SERIAL_BYTES:
                self._execute(head)  # (no tensor work of its own would use a second thread)
            else:
                with limited(REDUCE_THREADS):  # as on the worker (intraop.py)
                    self._execute(head)

    def _start(self, op: _Op) -> None:
        """Claim the queue's head (the lock is held)."""
        self._unstarted.popleft()
        op.claimed = True
        self._running = True

    def _oldest(self) -> float | None:
        """When the worker may take the head (at once while closing), None: it may not now."""
        if self._running or not self._unstarted:
            return None
        return float("-inf") if self._closing else self._unstarted[0].claim_after

    def _next_for_worker(self) -> _Op | None:
        """The operation the worker should run now, waiting for one (None: closing and done)."""
        with self._lock:
            while True:
                if self._closing and not self._running and not self._unstarted:
                    return None
                if self._turns.look(self._oldest, busy=self._running):
                    head = self._unstarted[0]
                    self._start(head)
                    return head

    def _execute(self, op: _Op) -> None:
        run, op.run = op.run, None
        work = op.work
        work.ran_on = threading.current_thread().name
        try:
            if self.broken is not None:
                work.complete(GroupBrokenError(f"'{work.description}' not run: the group broke earlier: {self.broken}"))
                return
            try:
                if run is None:
                    raise RuntimeError(f"'{work.description}' was claimed twice")  # a bug, not a race
                run()
            except BaseException as error:  # noqa: BLE001 - every error goes to the waiter
                self.broken = error
                work.complete(error)  # first: the waiter must hear of it even if reporting fails
                try:
                    self._on_error(error)
                except BaseException:  # e.g. ENOSPC while writing the abort marker
                    log.exception("fsdist: could not report the failure of '%s' to peers", work.description)
            else:
                work.complete()
        finally:
            with self._lock:
                self._running = False
                if self._callers_waiting:  # (a Condition's notify is Python: skipped when nobody waits)
                    self._caller_cv.notify_all()  # a caller waiting for its turn
                if self._unstarted or self._closing:
                    self._worker_cv.notify()  # only then can the worker have anything to do

    def _run(self) -> None:
        limit_this_thread(REDUCE_THREADS)  # this thread only (intraop.py)
        while True:
            op = self._next_for_worker()
            if op is None:
                return
            self._execute(op)
            del op  # not held while the worker waits for the next: its tensors go with its Work

    def close(self) -> None:
        """Finish queued operations, then stop the thread."""
        with self._lock:
            self._closing = True
            self._worker_cv.notify()
        self._thread.join()
