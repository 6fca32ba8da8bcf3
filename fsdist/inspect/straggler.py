"""Who holds whom up, from where each rank of a group is: the analysis behind ``fsdist status``.

Input is each rank's position in a group (its state record: sequence number, step,
description). A rank behind the others in a group's collectives is a straggler; across groups,
waits can form chains (a rank late in the world group may itself wait for a rank in a
subgroup), and the chain ends at a rank that waits for nobody.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..defaults import STRAGGLER_AFTER_SECONDS

__all__ = ["RankPosition", "Straggler", "find_straggler", "holding_up", "in_step_line", "list_ranks"]


@dataclass
class RankPosition:
    """One rank's state record in one group: the operation it is in or last finished."""

    group_rank: int
    rank: int | None  # the global rank, when the group's membership is known
    seq: int  # -1: no record yet; 0: the group exists but ran no collective
    step: int
    description: str
    closed: bool
    since_s: float | None  # seconds since the record last changed (entering, publishing, p2p)


@dataclass
class Straggler:
    """Ranks of a group that are behind while others wait in a later collective."""

    ranks: list[int]  # global ranks (group ranks when membership is unknown)
    seq: int  # the stragglers' position
    description: str
    behind: int  # how many collectives
    waiting_ranks: list[int]
    waiting_seq: int  # the operation the others wait in
    waiting_description: str
    waiting_s: float | None  # how long the longest waiter has waited
    summary: str


def find_straggler(positions: list[RankPosition], after: float = STRAGGLER_AFTER_SECONDS) -> Straggler | None:
    """The ranks at the lowest sequence number, when others entered a later collective and have
    waited there ``after`` seconds or more (or for a time nobody can tell).

    Only sequence numbers are compared: within one collective the steps a rank publishes depend
    on its role (a broadcast's root publishes, the others only read), so equal sequence numbers
    with different steps are normal.
    """
    live = [p for p in positions if p.seq >= 0 and not p.closed]
    if len(live) < 2:
        return None
    low, high = min(p.seq for p in live), max(p.seq for p in live)
    if low == high:
        return None
    late = [p for p in live if p.seq == low]
    waiting = [p for p in live if p.seq == high]
    wait_s = max((p.since_s for p in waiting if p.since_s is not None), default=None)
    if wait_s is not None and wait_s < after:
        return None  # a moment apart, as at every step of a healthy job
    ids = [p.rank if p.rank is not None else p.group_rank for p in late]
    word = "collective" if high - low == 1 else "collectives"
    who = "rank" if len(late) == 1 else "ranks"
    others = "the others wait" if len(late) + len(waiting) == len(live) else f"ranks {list_ranks(_ids(waiting))} wait"
    since = f" since {wait_s:.1f} s" if wait_s is not None else ""
    at = (
        f"at #{low} {late[0].description}"
        if low > 0
        else f"before {'its' if len(late) == 1 else 'their'} first collective"
    )
    summary = (
        f"{who} {list_ranks(ids)} {'is' if len(late) == 1 else 'are'} {high - low} {word} behind "
        f"({at}): {others} in {waiting[0].description} #{high}{since}"
    )
    return Straggler(
        ids, low, late[0].description, high - low, _ids(waiting), high, waiting[0].description, wait_s, summary
    )


def holding_up(stragglers: list[Straggler | None]) -> list[int]:
    """Ranks behind in some group's collective that wait in no group themselves.

    A rank late in the world group may only be waiting for another rank in a subgroup; the
    chain of waits ends at a rank that waits for nobody (computing, or blocked outside fsdist's
    collectives). Pass only groups whose membership is known: their ranks are the job's ranks.
    """
    late: set[int] = set()
    waiting: set[int] = set()
    for straggler in stragglers:
        if straggler is not None:
            late.update(straggler.ranks)
            waiting.update(straggler.waiting_ranks)
    return sorted(late - waiting)


def in_step_line(positions: list[RankPosition]) -> str:
    """Where the ranks are when nobody is behind (the world group's positions)."""
    if not positions:
        return "no process group has been created yet"
    seqs = {p.seq for p in positions}
    ages = [p.since_s for p in positions if p.since_s is not None]
    last = f" (last change {min(ages):.1f} s ago)" if ages else ""
    if len(seqs) == 1:
        p = positions[0]
        return f"all ranks are at #{p.seq} {p.description}{last}: computing, or in or past that collective"
    return f"ranks are at operations {sorted(seqs)}{last}"


def _ids(positions: list[RankPosition]) -> list[int]:
    return [p.rank if p.rank is not None else p.group_rank for p in positions]


def list_ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)
