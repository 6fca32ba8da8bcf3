"""Work objects and the queue that runs a group's operations in issue order.

Collectives of a group run one at a time on one FIFO worker thread, in the order the caller
issued them (sequence numbers are assigned in the calling thread), or on the caller's thread
when it waits for one nobody has started. Receives are matched apart (receives.py), so that a
posted ``irecv`` never blocks later collectives or sends (as in Gloo).

``dist.Work`` is subclassed rather than built from a future: an error set on a Python future is
not seen by C++ (see TORCH_API.md), so ``wait()`` raises the stored error itself and
``get_future()`` unwraps it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from ..defaults import HANDOFF_SECONDS, INLINE_RUN_BYTES, REDUCE_THREADS
from ..errors import FsdistTimeoutError, GroupBrokenError
from . import profiling
from .arguments import Staging
from .intraop import SERIAL_BYTES, limit_this_thread, limited

log = logging.getLogger(__name__)

__all__ = ["IDLE_AFTER_SECONDS", "MAX_TICK_SECONDS", "FsdistWork", "OpQueue", "StagedWork"]

IDLE_AFTER_SECONDS = 0.1  # the worker stops looking for unclaimed operations after this long without one
#: While its looks find nothing to do, the worker looks half as often, down to this: an async
#: small operation its caller never waits for then starts within 10 ms (within 1 ms again once
#: the worker found one).
MAX_TICK_SECONDS = 10e-3


class _Runner(Protocol):
    """Whoever else may run an operation (OpQueue, receives.ReceiveLoop): its caller's ``wait``
    runs it in place through this."""

    def run_in_caller(self, work: FsdistWork, seconds: float | None = None) -> None: ...


class _Failed:
    """The future's value when the operation failed (the error travels beside it)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Latch:
    """A one-shot event on a bare lock, held until ``set``: every operation makes one, and
    ``threading.Event`` builds a Condition for it (~3 µs, a few % of a small all_reduce)."""

    __slots__ = ("_held", "_set")

    def __init__(self) -> None:
        self._held = threading.Lock()
        self._held.acquire()
        self._set = False

    def set(self) -> None:
        """Called once (FsdistWork completes once)."""
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
        #: set by OpQueue.submit: the operation to run, and the queue whose caller may run it
        self._run: Callable[[], None] | None = None
        self._runner: _Runner | None = None  # set when its caller may run it
        self._claim_after = 0.0  # when the worker may take it (monotonic seconds)
        self._claimed = False
        self._nbytes = 0  # its inputs' and outputs' bytes (OpQueue.submit)
        #: the name of the thread that ran the operation (the caller's or the group worker's)
        self.ran_on = ""
        #: its torch.profiler event, when one records it (profiling.py): ends it / has ended it
        self.event_end: Callable[[], None] | None = None
        self.event_ended: torch.futures.Future[Any] | None = None

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
            self._error = error
            if source is not None:
                self._source = source
            if self.event_end is not None:
                self.event_end()
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
        if self._runner is not None and not self._done.is_set():
            start = time.monotonic()
            self._runner.run_in_caller(self, seconds)
            left = None if seconds is None else max(0.0, seconds - (time.monotonic() - start))
        else:
            left = seconds
        if not self._done.wait(left):
            raise FsdistTimeoutError(f"'{self.description}' did not finish within {seconds:.1f} s of wait()")
        if self.event_ended is not None:
            profiling.wait_recorded(self.event_ended)
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

    def _source_rank(self) -> int:
        return self._source

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


_COMPLETIONS: ThreadPoolExecutor | None = None
_COMPLETIONS_LOCK = threading.Lock()


def _completions() -> ThreadPoolExecutor:
    """Threads that complete futures: several, so a callback may wait on a later operation."""
    global _COMPLETIONS
    with _COMPLETIONS_LOCK:
        if _COMPLETIONS is None:
            _COMPLETIONS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fsdist-complete")
        return _COMPLETIONS


def _unwrap(future: torch.futures.Future[Any]) -> Any:
    value = future.value()
    if isinstance(value, _Failed):
        raise value.error
    return value


class OpQueue:
    """A group's operations, run one at a time in issue order.

    A worker thread runs them, so an operation progresses whether or not its caller waits
    (``async_op=True``, or a rank that blocks elsewhere first). But a caller that waits for an
    operation nobody has started yet, with nothing before it, runs it itself (small operations
    only, see ``INLINE_RUN_BYTES``): a synchronous ``dist.all_reduce`` then costs no hand-off to
    the worker and back. Whoever claims an operation first runs it; the other passes over it.

    Nor is the worker woken for such an operation: waking a thread costs the caller a context
    switch and a GIL hand-off, about 40% of a small all_reduce (docs/design.md).
    While operations keep coming the worker instead looks now and then (every ``HANDOFF_SECONDS``,
    backing off to ``MAX_TICK_SECONDS`` while it finds nothing) for one that nobody claimed for
    ``HANDOFF_SECONDS`` (an async operation its caller has not waited for) and runs it; after
    ``IDLE_AFTER_SECONDS`` without a submission it sleeps until woken. A large operation wakes
    it at once.

    After an operation fails the group is broken: the error is reported on every later
    operation instead of letting ranks run on out of step.
    """

    def __init__(self, name: str, on_error: Callable[[BaseException], None], handoff: float = HANDOFF_SECONDS) -> None:
        self._on_error = on_error
        self._handoff = handoff
        self.broken: BaseException | None = None
        #: the queue's state; both conditions share it (taken as itself: a Condition's ``with``
        #: is a Python-level call, two per small operation)
        self._lock = threading.Lock()
        self._worker_cv = threading.Condition(self._lock)  # the worker sleeps here
        self._caller_cv = threading.Condition(self._lock)  # callers wait here for an operation to end
        self._callers_waiting = 0  # (on ``_caller_cv``)
        self._unstarted: deque[FsdistWork] = deque()
        self._running = False
        self._closing = False
        self._worker_idle = False  # asleep without a timeout: a submission must wake it
        self._last_submit = 0.0
        self._tick = handoff
        self._thread = threading.Thread(target=self._run, name=f"fsdist-{name}", daemon=True)
        self._thread.start()

    def submit(self, work: FsdistWork, run: Callable[[], None], nbytes: int = 0) -> FsdistWork:
        """Queue ``run`` as ``work``; its caller may run it in ``work.wait()`` if ``nbytes`` is small."""
        work._run = run
        work._nbytes = nbytes
        now = time.monotonic()
        urgent = nbytes > INLINE_RUN_BYTES
        if not urgent:
            work._runner = self
        work._claim_after = now if urgent else now + self._handoff
        with self._lock:
            self._unstarted.append(work)
            self._last_submit = now
            if urgent or self._worker_idle:
                self._worker_cv.notify()
        return work

    def run_in_caller(self, work: FsdistWork, seconds: float | None = None) -> None:
        """Called by ``work.wait()``: run ``work`` (and the small operations queued before it) here,
        unless the worker has them; returns once ``work`` is claimed by either side. (``seconds``
        is not a limit here: a started operation runs to its own deadline.)"""
        while True:
            with self._lock:
                while True:
                    if work._claimed:
                        return  # (the worker's, or run here already)
                    head = self._unstarted[0]
                    if not self._running and head._runner is self:
                        self._start(head)
                        break
                    self._callers_waiting += 1
                    try:
                        self._caller_cv.wait()  # the worker runs something (``_execute`` notifies)
                    finally:
                        self._callers_waiting -= 1
            if head._nbytes < SERIAL_BYTES:
                self._execute(head)  # (no tensor work of its own would use a second thread)
            else:
                with limited(REDUCE_THREADS):  # as on the worker (intraop.py)
                    self._execute(head)

    def _start(self, work: FsdistWork) -> None:
        """Claim the queue's head (the lock is held)."""
        self._unstarted.popleft()
        work._claimed = True
        self._running = True

    def _next_for_worker(self) -> FsdistWork | None:
        """The operation the worker should run now, waiting for one (None: closing and done)."""
        with self._lock:
            while True:
                now = time.monotonic()
                timeout: float | None
                if self._unstarted and not self._running:
                    head = self._unstarted[0]
                    if head._claim_after <= now or self._closing:
                        self._start(head)
                        self._tick = self._handoff  # its caller did not wait: look often again
                        return head
                    timeout = head._claim_after - now
                elif self._closing and not self._running:
                    return None
                elif self._running or now - self._last_submit < IDLE_AFTER_SECONDS:
                    # look again for a submission nobody waits for, less often while every
                    # look finds the callers ran their operations themselves
                    timeout, self._tick = self._tick, min(self._tick * 2, MAX_TICK_SECONDS)
                else:
                    timeout = None
                self._worker_idle = timeout is None
                self._worker_cv.wait(timeout)
                self._worker_idle = False

    def _execute(self, work: FsdistWork) -> None:
        run, work._run = work._run, None
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
        while (work := self._next_for_worker()) is not None:
            self._execute(work)

    def close(self) -> None:
        """Finish queued operations, then stop the thread."""
        with self._lock:
            self._closing = True
            self._worker_cv.notify()
        self._thread.join()


class StagedWork(FsdistWork):
    """A receive's Work: copies the staged host buffers back before it reports completion."""

    def __init__(self, outputs: list[torch.Tensor], description: str, staging: Staging) -> None:
        super().__init__(outputs, description)
        self._staging = staging
        #: called with (error, source) when the receive ends; debug records use it
        self.on_complete: Callable[[BaseException | None, int | None], None] | None = None

    def complete(self, error: BaseException | None = None, source: int | None = None) -> None:
        if error is None:
            try:
                self._staging.finish()
            except BaseException as exc:  # noqa: BLE001
                error = exc
        report, self.on_complete = self.on_complete, None  # the first outcome only, like complete()
        if report is not None:
            report(error, source)
        super().complete(error, source)
