"""A group's point-to-point calls: buffered sends, receives matched apart, Gloo's monitored barrier.

A send publishes its message in the caller's thread and returns a finished Work (buffered, as
Gloo's are for small messages); a receive is posted to the group's receive loop (receives.py),
made at the first receive, and matched by its waiting caller or by the loop's thread. The
channel is the group's flat transport's pairs (transport/pairs.py): point-to-point messages
never go through the tiers.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch

from ..defaults import REDUCE_THREADS
from ..errors import FsdistError
from ..files.waiting import Deadline
from ..transport.interfaces import PointToPointChannel
from ..transport.p2p import Mailbox, PendingReceive
from . import arguments as args
from .arguments import Staging, bytes_moved, describe
from .debug import OpLog
from .intraop import limited
from .monitored import TAG as MONITORED_TAG
from .monitored import monitored_barrier
from .receives import ReceiveLoop, StagedWork
from .work import FsdistWork

__all__ = ["PointToPoint"]

_UNTIMED = contextlib.nullcontext()  # a call's timing when debug records are off (debug.py)


class PointToPoint:
    """One group's sends, receives and monitored barriers."""

    def __init__(
        self, channel: PointToPointChannel, name: str, timeout: float, ops: OpLog,
        on_corrupt: Callable[[BaseException], None],
    ) -> None:  # fmt: skip
        """``name``: the receive loop's thread's; ``timeout``: a receive's, unless given;
        ``on_corrupt``: told of a message that could not be read as one (the group then aborts)."""
        self._channel = channel
        self._name = name
        self._timeout = timeout
        self._ops = ops
        self._on_corrupt = on_corrupt
        self._lock = threading.Lock()
        self._receives: ReceiveLoop | None = None
        self._closed = False
        self._monitored_calls = 0  # monitored_barrier calls so far (their tokens carry the count)

    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int) -> FsdistWork:
        """Buffered: publish the message now (in the caller's thread) and return a finished Work."""
        channel = self._channel
        args.peer(dst, "send to", channel.rank, channel.size)
        args.check_travel(tensors)
        desc = describe("send", tensors, tag=tag)
        staging = Staging()
        hosts = [staging.input(x) for x in tensors]
        work = FsdistWork(list(tensors), desc)
        work.profile(tensors)
        try:  # its copy into a file runs as the worker's would (intraop.py)
            timed = self._ops.timed(None, f"{desc} to {dst}", bytes_moved(tensors)) if self._ops.on else _UNTIMED
            with timed, limited(REDUCE_THREADS):
                channel.send(dst, hosts, tag, desc)
        except BaseException as error:  # noqa: BLE001
            work.complete(error)
        else:
            work.complete()
        return work

    def receive(
        self, tensors: Sequence[torch.Tensor], src: int | None, tag: int, seconds: float | None = None
    ) -> FsdistWork:
        """Post a receive from ``src`` (None: any rank); it fails after ``seconds`` (default: the
        group's timeout)."""
        if src is not None:
            args.peer(src, "receive from", self._channel.rank, self._channel.size)
        args.check_travel(tensors)
        with self._lock:
            if self._closed:
                raise FsdistError(f"rank {self._channel.rank}: recv called on a process group that was shut down")
            if self._receives is None:
                self._receives = ReceiveLoop(self._name, Mailbox(self._channel), self._channel, self._on_corrupt)
            receives = self._receives
        staging = Staging()
        hosts = [staging.output(x) for x in tensors]
        work = StagedWork(list(tensors), describe("recv", tensors, tag=tag), staging)
        work.profile(tensors, "recv" if src is not None else "recvAnySource")  # (Gloo's names)
        if self._ops.on:
            start, nbytes = time.perf_counter(), bytes_moved(tensors)

            def report(error: BaseException | None, source: int | None) -> None:
                what = f"{work.description} from {source if source is not None else src}"
                error_text = f"{type(error).__name__}: {error}" if error else ""
                self._ops.record(None, what, nbytes, time.perf_counter() - start, error_text)

            work.on_complete = report
        limit = self._timeout if seconds is None else seconds
        return receives.post(work, PendingReceive(src, tag, hosts, Deadline(limit)))

    def monitored_barrier(self, timeout: timedelta | float | None, wait_all_ranks: bool) -> None:
        """Gloo's monitored barrier (monitored.py): rank 0 names the ranks that did not arrive
        within ``timeout`` (seconds or a timedelta; None: the group's timeout)."""
        if timeout is None:
            seconds = self._timeout
        else:
            seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        with self._lock:
            self._monitored_calls += 1
            call = self._monitored_calls
        monitored_barrier(
            self._channel.rank, self._channel.size, call, seconds, wait_all_ranks,
            lambda token, peer: self.send([token], peer, MONITORED_TAG).wait(),
            lambda token, peer, left: self.receive([token], peer, MONITORED_TAG, left),
        )  # fmt: skip

    def close(self) -> None:
        """No more receives; those still pending fail (receives.ReceiveLoop.close)."""
        with self._lock:
            self._closed = True
            receives = self._receives
        if receives is not None:
            receives.close()
