"""Looks at a peer on another client (files/pacing.py ``Pacing``), on a virtual clock.

Each look is a READ on NFS, so what matters is how many looks a wait makes and how late after
the peer's arrival it ends. A virtual clock makes both exact: a look takes LOOK seconds, a
sleep takes what it asks for, the peer arrives when the test says.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fsdist.files import pacing as pacing_module
from fsdist.files import waiting
from fsdist.files.pacing import REMOTE_LOOKS, Pacing
from fsdist.files.waiting import Deadline, poll

LOOK = 1e-3  # a look's round trip


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    for module in (waiting, pacing_module):
        monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=fake.monotonic, sleep=fake.sleep))
    return fake


def _waits(clock: Clock, pacing: Pacing, arrivals: list[float]) -> list[tuple[int, float]]:
    """Each wait's (looks, lateness): how many looks it made and how long after the peer's
    arrival (``arrivals[i]`` seconds after the wait began) it ended."""
    out = []
    for arrival in arrivals:
        start, looks = clock.now, 0

        def look() -> bool | None:
            nonlocal looks
            looks += 1
            seen = clock.now >= start + arrival  # (the look sees what is there when it starts)
            clock.now += LOOK
            return True if seen else None

        poll(pacing.wait(look), Deadline(60.0), lambda: AssertionError("timed out"), sleep=clock.sleep, schedule=pacing)
        out.append((looks, clock.now - start - arrival))
    return out


def test_a_peer_that_is_always_there_costs_one_look_per_wait(clock: Clock) -> None:
    waits = _waits(clock, Pacing(), [0.0] * 50)
    assert all(looks == 1 for looks, _ in waits)


@pytest.mark.parametrize("arrival", [5e-3, 20e-3, 80e-3])
def test_a_peer_that_keeps_its_pace_costs_one_or_two_looks_and_little_lateness(clock: Clock, arrival: float) -> None:
    """Once the arrival is learned: the first look is skipped (it never found the peer), the
    look at the learned time finds it, or one more soon after; immediate re-reads would cost
    arrival / LOOK looks (5 to 80)."""
    waits = _waits(clock, Pacing(), [arrival] * 200)[50:]
    looks = [n for n, _ in waits]
    assert sum(looks) / len(looks) <= 2.2, looks
    assert max(late for _, late in waits) <= 0.1 * arrival + 5 * LOOK, waits


def test_the_paced_wait_follows_a_peer_that_comes_sooner_and_one_that_comes_later(clock: Clock) -> None:
    pacing = Pacing()
    _waits(clock, pacing, [50e-3] * 100)
    sooner = _waits(clock, pacing, [5e-3] * 100)[50:]  # (a look skipped at first: probed every few waits)
    assert max(late for _, late in sooner) <= 0.1 * 5e-3 + 5 * LOOK, sooner
    assert sum(n for n, _ in sooner) / 50 <= 2.2
    later = _waits(clock, pacing, [50e-3] * 100)[50:]
    assert sum(n for n, _ in later) / 50 <= 2.2


def test_a_long_wait_looks_at_a_bounded_rate(clock: Clock) -> None:
    """A peer 10 s late: after the first tenth of a second the pauses grow with the wait (an
    eighth of it, at most LONGEST_SLEEP_SECONDS), so the wait makes a few dozen looks, not one
    per round trip (10 000) or per 10 ms (1000), and ends at most an eighth of it late: ~35
    looks in the first tenth of a second (pauses of a round trip or two), ~30 after."""
    [(looks, late)] = _waits(clock, Pacing(), [10.0])
    assert looks <= 90, looks
    assert late <= 10.0 * pacing_module.LONG_WAIT_FRACTION + LOOK


def test_a_look_the_caller_made_counts_as_the_first(clock: Clock) -> None:
    """``missed``: the caller looked in vain just before waiting: no second look at once."""
    pacing = Pacing()
    _waits(clock, pacing, [0.0])  # (a look's round trip learned)
    start, looks = clock.now, []

    def look() -> bool | None:
        looks.append(clock.now - start)
        clock.now += LOOK
        return True if clock.now - start >= 5e-3 else None

    poll(pacing.wait(look, missed=True), Deadline(60.0), AssertionError, sleep=clock.sleep, schedule=pacing)
    assert looks and looks[0] >= LOOK, looks  # (a pause of one round trip at least came first)


def test_looks_are_counted_for_the_reports(clock: Clock) -> None:
    before = (REMOTE_LOOKS.looks, REMOTE_LOOKS.waits)
    waits = _waits(clock, Pacing(), [0.0, 3e-3, 0.0])
    assert REMOTE_LOOKS.waits - before[1] == 3
    assert REMOTE_LOOKS.looks - before[0] == sum(n for n, _ in waits)


def test_one_late_arrival_does_not_make_the_next_waits_late(clock: Clock) -> None:
    """A peer at its usual 20 ms, once 5 s late (a checkpoint, a slow first large operation),
    then at 20 ms again: the waits after it end as soon as before, not when the late one did."""
    pacing = Pacing()
    _waits(clock, pacing, [20e-3] * 50)
    [(_, late_once)] = _waits(clock, pacing, [5.0])
    after = _waits(clock, pacing, [20e-3] * 20)
    assert late_once <= 5.0 * pacing_module.LONG_WAIT_FRACTION + LOOK
    assert max(late for _, late in after) <= 0.1 * 20e-3 + 5 * LOOK, after
