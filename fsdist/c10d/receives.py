"""Matching a group's posted receives: on the caller's thread when it waits, else on the loop's.

A thread of its own, apart from the group's operation queue (work.py), so that a posted
``irecv`` never blocks later collectives or sends, and ``batch_isend_irecv`` with its receives
first cannot deadlock (as in Gloo). p2p.Mailbox holds the matching rules; this decides who runs
them, and when; how a matcher waits for the next message is the channel's waiter's
(files/waiting.py ``Waiter.for_sends``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

import torch

from ..defaults import HANDOFF_SECONDS, REDUCE_THREADS
from ..errors import FsdistError, ProtocolError
from ..transport.interfaces import PointToPointChannel
from ..transport.p2p import Mailbox, PendingReceive
from .arguments import Staging
from .intraop import limit_this_thread, limited
from .work import FsdistWork, Turns

__all__ = ["ReceiveLoop", "StagedWork"]


class _Posted:
    """A posted receive, its Work, and when the loop's thread may take it."""

    __slots__ = ("claim_after", "receive", "work")

    def __init__(self, work: FsdistWork, receive: PendingReceive, claim_after: float) -> None:
        self.work, self.receive, self.claim_after = work, receive, claim_after


class ReceiveLoop:
    """Matches posted receives against arrived messages, in posting order.

    As with OpQueue's small operations, a caller that waits for its receive matches in its own
    thread (the message has usually arrived), and the loop's thread takes those nobody waits
    for (an ``irecv`` tested with ``is_completed()``, a future's callback) as work.Turns says.
    One matcher at a time, so a pass sees one snapshot of arrived messages
    (Mailbox.begin_pass); the thread stays away while a caller matches.
    """

    def __init__(
        self, name: str, mailbox: Mailbox, channel: PointToPointChannel,
        on_corrupt: Callable[[BaseException], None], handoff: float = HANDOFF_SECONDS,
    ) -> None:  # fmt: skip
        """``channel``: the mailbox's, whose ``wait_for_sends`` paces every wait for a message
        here and whose health check fails every pending receive. ``on_corrupt``: told of a
        message that could not be read as one (damaged, foreign, forged): its sender's data can
        no longer be trusted, so the group is aborted on every rank (a receive that merely
        disagrees with its message, another size say, fails alone)."""
        self._mailbox = mailbox
        self._channel = channel
        self._on_corrupt = on_corrupt
        self._pending: list[_Posted] = []
        self._cond = threading.Condition()
        self._turns = Turns(self._cond, handoff)
        self._matching = threading.Lock()
        self._callers = 0  # callers matching in their own thread now
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"fsdist-recv-{name}", daemon=True)
        self._thread.start()

    def post(self, work: FsdistWork, receive: PendingReceive) -> FsdistWork:
        now = time.monotonic()
        work.run_here = functools.partial(self._run_in_caller, work)
        with self._cond:
            self._pending.append(_Posted(work, receive, now + self._turns.handoff))
            self._turns.submitted(now)
        return work

    def _run_in_caller(self, work: FsdistWork, seconds: float | None = None) -> None:
        """Called by ``work.wait()``: match receives here until ``work`` completes (or ``seconds`` pass)."""
        end = float("inf") if seconds is None else time.monotonic() + seconds

        def matched() -> bool | None:
            if work.is_completed():
                return True
            with self._matching, limited(REDUCE_THREADS):
                progressed = self._pass()
            return True if work.is_completed() else (False if progressed else None)

        with self._cond:
            self._callers += 1
        try:
            self._wait(matched, end, spin=True)
        finally:
            with self._cond:
                self._callers -= 1
                if self._pending:
                    self._cond.notify()  # receives nobody waits for now: the thread takes them on

    def _wait(self, attempt: Callable[[], bool | None], end: float, spin: bool) -> None:
        """``attempt`` until it returns True or ``end`` passes, paced by the channel's waiter; a
        failed health check (an abort, a dead peer) fails every pending receive with its error."""
        try:
            self._channel.wait_for_sends(attempt, end, self._channel.check_health, spin)
        except BaseException as exc:  # noqa: BLE001 - every pending receive fails with it
            self._fail_all(exc)

    def _pass(self) -> bool:
        """Try every pending receive once, in posting order; True if any completed (lock held)."""
        with self._cond:
            pending = list(self._pending)
        if not pending:
            return False
        self._mailbox.begin_pass()
        progressed = False
        for posted in pending:
            try:
                if not self._mailbox.try_receive(posted.receive):
                    continue
                error = None
            except BaseException as exc:  # noqa: BLE001 - reported to the waiter
                error = exc
            with self._cond:
                self._pending = [item for item in self._pending if item is not posted]
            posted.work.complete(error, posted.receive.matched_source)
            if isinstance(error, ProtocolError):
                self._on_corrupt(error)
            progressed = True
        return progressed

    def _next_turn(self) -> bool:
        """Sleep until some receive has waited ``handoff`` with no caller matching; False: closing.

        Each turn first writes the counts of consumed messages held back to ride with a later
        send (pairs.acknowledge): whatever this rank does next (a collective, work of its own,
        another library's barrier), a sender at its cap waiting for one gets it within a tick
        (≤ MAX_TICK_SECONDS while receives are posted or matched), or before the thread idles.
        """
        while True:
            self._channel.flush_acknowledgements()  # (outside the lock: a write)
            with self._cond:
                if self._closing:
                    return False
                if self._turns.look(self._oldest, busy=self._callers > 0):
                    return True

    def _oldest(self) -> float | None:
        """When the thread may take the oldest receive; None while a caller matches, or none is posted."""
        return self._pending[0].claim_after if self._pending and not self._callers else None

    def _run(self) -> None:
        limit_this_thread(REDUCE_THREADS)

        def matched() -> bool | None:
            with self._cond:
                if self._callers or not self._pending or self._closing:
                    return True  # a caller matches now, or nothing is left
            with self._matching:
                return False if self._pass() else None

        while self._next_turn():
            self._wait(matched, float("inf"), spin=False)

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            pending, self._pending = self._pending, []
        for posted in pending:
            posted.work.complete(error)

    def close(self) -> None:
        """Stop matching: receives still pending now can never complete, so they fail."""
        with self._cond:
            self._closing = True
            pending, self._pending = self._pending, []
            self._cond.notify()
        for posted in pending:
            source, tag = posted.receive.source, posted.receive.tag
            where = "any rank" if source is None else f"rank {source}"
            posted.work.complete(FsdistError(f"recv from {where} (tag {tag}) never matched: the group was shut down"))
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._mailbox.close()


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
