"""monitored_barrier: which ranks never arrived, in Gloo's words.

torch's ``dist.monitored_barrier`` refuses every backend but Gloo (it checks the name), so fsdist
offers the same call as ``fsdist.monitored_barrier`` and as the group's own ``monitored_barrier``
method (which torch's code may call directly). As in Gloo, it is built from point-to-point
messages, not from a collective: a rank that never comes must not leave the group's collectives
out of step, and rank 0 must learn exactly who came. Every other rank sends rank 0 a token and
waits for rank 0's; rank 0 waits for every token until the one deadline, then names the ranks
whose token never came (the first, or with ``wait_all_ranks`` all of them), or answers everyone.

A token carries the call's number, so one that arrives after its call gave up is passed over by
the next call instead of counting for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..defaults import BACKEND_NAME
from ..errors import FsdistError, FsdistTimeoutError
from .work import FsdistWork

__all__ = ["TAG", "monitored_barrier", "monitored_barrier_of"]

#: the point-to-point tag of the tokens (negative: torch's callers use tags from 0 up)
TAG = -0x6D62_6172

#: send(token, peer) publishes ``token`` to ``peer``; post(token, peer, seconds) posts a receive
#: of ``peer``'s token that fails after ``seconds``
Send = Callable[[torch.Tensor, int], object]
Post = Callable[[torch.Tensor, int, float], FsdistWork]


def monitored_barrier(
    rank: int, size: int, call: int, seconds: float, wait_all_ranks: bool, send: Send, post: Post
) -> None:
    """Return once every rank of the group reached its ``call``-th monitored barrier; raise on
    rank 0 naming the ranks that did not within ``seconds``, elsewhere saying rank 0 failed."""
    if size == 1:
        return
    token = torch.tensor([call], dtype=torch.int64)
    deadline = time.monotonic() + seconds
    ms = round(seconds * 1000)
    if rank != 0:
        send(token, 0)
        try:
            _token_of(0, call, deadline, post)
        except FsdistError as exc:
            raise FsdistError(
                f"Rank {rank} successfully reached monitoredBarrier, but received errors while waiting for "
                f"send/recv from rank 0. Please check rank 0 logs for faulty rank.\n Original exception: \n{exc}"
            ) from exc
        return
    arrived: list[int] = []
    missing: list[int] = []
    for peer in range(1, size):
        if not wait_all_ranks and time.monotonic() >= deadline:
            done = f"Successfully processed ranks: {_listed(arrived)}" if arrived else _NONE_PROCESSED
            raise FsdistTimeoutError(f"Rank 0 timed out in monitoredBarrier after {ms} ms.\n {done}")
        try:
            _token_of(peer, call, deadline, post)
        except FsdistError as exc:
            if not wait_all_ranks:
                raise FsdistTimeoutError(
                    f"[Rank 0]: Rank {peer} failed to pass monitoredBarrier in {ms} ms\n Original exception: \n{exc}"
                ) from exc
            missing.append(peer)
        else:
            arrived.append(peer)
    if missing:
        raise FsdistTimeoutError(f"[Rank 0]: Ranks {_listed(missing)} failed to pass monitoredBarrier in {ms} ms")
    for peer in range(1, size):
        send(token, peer)


def _token_of(peer: int, call: int, deadline: float, post: Post) -> None:
    """Receive ``peer``'s token of ``call`` by ``deadline``, passing over those of earlier calls."""
    while True:
        received = torch.zeros(1, dtype=torch.int64)
        post(received, peer, max(0.0, deadline - time.monotonic())).wait()
        if int(received) >= call:
            return


_NONE_PROCESSED = "No ranks successfully processed in monitoredBarrier."


def _listed(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def monitored_barrier_of(group: Any, timeout: timedelta | None, wait_all_ranks: bool) -> None:
    """``fsdist.monitored_barrier``: torch's call on a group of any backend (torch's own for the
    others), so one script serves Gloo and fsdist alike."""
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        return  # torch warns and returns likewise
    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise ValueError("monitored_barrier: the default process group has not been initialized")
    if dist.get_backend(pg) != BACKEND_NAME:
        dist.monitored_barrier(group, timeout, wait_all_ranks)
        return
    pg.monitored_barrier(timeout, wait_all_ranks)  # type: ignore[union-attr]  # (the stub lacks it)
