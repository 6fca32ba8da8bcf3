"""Matching a group's posted receives: on the caller's thread when it waits, else on the loop's.

A thread of its own, apart from the group's operation queue (work.py), so that a posted
``irecv`` never blocks later collectives or sends, and ``batch_isend_irecv`` with its receives
first cannot deadlock (as in Gloo). p2p.Mailbox holds the matching rules; this decides who runs
them, and when.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

import torch

from ..defaults import (
    FIRST_SLEEP_SECONDS,
    HANDOFF_SECONDS,
    HEALTH_CHECK_SECONDS,
    MAX_SLEEP_SECONDS,
    REDUCE_THREADS,
    WAKE_SPIN_SECONDS,
)
from ..errors import FsdistError, ProtocolError
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
        self, name: str, mailbox: Mailbox, health_check: Callable[[], None],
        on_corrupt: Callable[[BaseException], None], handoff: float = HANDOFF_SECONDS,
    ) -> None:  # fmt: skip
        """``on_corrupt``: told of a message that could not be read as one (damaged, foreign,
        forged): its sender's data can no longer be trusted, so the group is aborted on every rank
        (a receive that merely disagrees with its message, another size say, fails alone)."""
        self._mailbox = mailbox
        self._health_check = health_check
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
        start = time.monotonic()
        end = float("inf") if seconds is None else start + seconds
        with self._cond:
            self._callers += 1
        try:
            sleep, next_health = 0.0, start + HEALTH_CHECK_SECONDS
            if self._mailbox.sends_wake():
                # wake-ups of messages matched already: only later ones may end this caller's sleeps
                # (the passes below see every message sent before this)
                self._mailbox.sleep(0.0)
            while not work.is_completed():
                with self._matching, limited(REDUCE_THREADS):
                    progressed = self._pass()
                now = time.monotonic()
                if work.is_completed() or now >= end:
                    return
                if progressed:
                    sleep = 0.0
                    continue
                if now >= next_health:
                    next_health = now + HEALTH_CHECK_SECONDS
                    if not self._healthy():
                        return
                if now - start < WAKE_SPIN_SECONDS and self._mailbox.spin(start + WAKE_SPIN_SECONDS - now):
                    continue  # woken while spinning: match at once
                # a send wakes the receiver: sleep until it does rather than look again and again (4 ranks on 2
                # cores, 8-byte ring: ~4.7 passes per receive, each a locked read, with the
                # doubling schedule; the loop thread, not the caller, keeps that schedule)
                first = MAX_SLEEP_SECONDS if self._mailbox.sends_wake() else FIRST_SLEEP_SECONDS
                sleep = min(max(sleep * 2, first), MAX_SLEEP_SECONDS, end - now)
                self._mailbox.sleep(sleep)
        finally:
            with self._cond:
                self._callers -= 1
                if self._pending:
                    self._cond.notify()  # receives nobody waits for now: the thread takes them on

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

    def _healthy(self) -> bool:
        try:
            self._health_check()
        except BaseException as exc:  # noqa: BLE001 - every pending receive fails with it
            self._fail_all(exc)
            return False
        return True

    def _next_turn(self) -> bool:
        """Sleep until some receive has waited ``handoff`` with no caller matching; False: closing.

        Each turn first writes the counts of consumed messages held back to ride with a later
        send (pairs.acknowledge): whatever this rank does next (a collective, work of its own,
        another library's barrier), a sender at its cap waiting for one gets it within a tick
        (≤ MAX_TICK_SECONDS while receives are posted or matched), or before the thread idles.
        """
        while True:
            self._mailbox.flush_acknowledgements()  # (outside the lock: a write)
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
        while self._next_turn():
            sleep, next_health = 0.0, time.monotonic() + HEALTH_CHECK_SECONDS
            while True:
                with self._cond:
                    if self._callers or not self._pending or self._closing:
                        break  # a caller matches now, or nothing is left
                with self._matching:
                    progressed = self._pass()
                if progressed:
                    sleep = 0.0
                    continue
                now = time.monotonic()
                if now >= next_health:
                    next_health = now + HEALTH_CHECK_SECONDS
                    self._healthy()
                sleep = min(max(sleep * 2, FIRST_SLEEP_SECONDS), MAX_SLEEP_SECONDS)
                self._mailbox.sleep(sleep)

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
