"""When to look at a peer on another client: each look is a round trip to the server (a READ on NFS).

A peer on this machine wakes a waiting rank through its doorbell (files/doorbell.py); one on
another client cannot, so its record is looked at, as ``Pacing`` learns when that peer tends
to arrive. ``share_of_wait`` bounds every long wait's pauses likewise (files/waiting.py).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import TypeVar

from ..defaults import (
    FIRST_SLEEP_SECONDS,
    LONG_WAIT_FRACTION,
    LONGEST_SLEEP_SECONDS,
    MAX_SLEEP_SECONDS,
    PACING_EARLIER,
    PACING_HISTORY,
    PACING_PROBE_EVERY,
    PACING_SKIP_BELOW,
    PACING_SOONER,
    PACING_WEIGHT,
)

T = TypeVar("T")

__all__ = ["REMOTE_LOOKS", "Looks", "Pacing", "share_of_wait"]


def share_of_wait(waited: float) -> float:
    """The pause a wait ``waited`` seconds long may take at most: an eighth of it, 1 s at most."""
    return min(waited * LONG_WAIT_FRACTION, LONGEST_SLEEP_SECONDS)


class Looks:
    """How many times this process looked for peers on other clients, in how many waits: each
    look is a READ on NFS (``fsdist bench`` and the NFS VM's RPC count report looks per op)."""

    def __init__(self) -> None:
        self.looks = 0
        self.waits = 0


#: this process's looks at peers on other clients (every group's waits together)
REMOTE_LOOKS = Looks()


class Pacing:
    """When to look at one peer on another client, learned from when it arrived before.

    A look is a round trip to the server, so a wait should look when the peer is likely there,
    not as often as it can. It looks at once (the peer may be there already) unless the last
    several waits never found it so; then when the peer tends to arrive (``expected``: the median
    of when the last PACING_HISTORY waits found it, so one late arrival moves it little, a look at
    that time that finds it counting as a little sooner, so the guess keeps seeking the earliest
    time it is found at; every few waits one looks at half of it first, so a peer that comes much
    sooner is seen at once);
    then with pauses doubling from one round trip (the last look's duration: never faster than
    the server answers) up to an eighth of the wait so far. A peer that keeps its pace costs a
    look or two per wait, one that is late costs a few looks per doubling of the wait, and no
    wait ends more than an eighth (plus a round trip) after its peer arrived, past the guess.
    """

    spin = 0.0
    yields = False

    def __init__(self) -> None:
        #: seconds into each recent wait at which the peer was found (0: at once)
        self._found: collections.deque[float] = collections.deque(maxlen=PACING_HISTORY)
        self.expected = 0.0
        #: how often the first look found the peer, smoothed (it is skipped when rarely)
        self.at_once = 1.0
        #: the last look's duration: no look follows another sooner
        self.round_trip = FIRST_SLEEP_SECONDS
        self._skipped = 0  # waits in a row that skipped their first look
        self._probing = False
        self._plan: list[float] = []  # this wait's looks at learned times, seconds into it
        self._step = 0.0  # its last back-off pause
        self._start = 0.0  # when this wait began, and how many of its looks missed
        self._misses = 0

    def wait(self, look: Callable[[], T | None], missed: bool = False) -> Callable[[], T | None]:
        """``look`` paced for one wait: pass it to ``poll`` with this as the schedule. ``missed``:
        the caller looked just now and did not find the peer (that was the first look)."""
        self._start = time.monotonic()
        self._misses = 1 if missed else 0
        rarely = self.at_once < PACING_SKIP_BELOW
        #: a wait that finds the peer without the guess (every few waits where the first look is
        #: skipped): a peer that now comes much sooner shows, and the guess starts again from it
        self._probing = rarely and self._skipped >= PACING_PROBE_EVERY
        skip = not missed and rarely and not self._probing
        self._skipped = self._skipped + 1 if skip else 0
        self._step = 0.0
        # the looks after the first: when the peer tends to arrive (a probe looks at half that first)
        self._plan = [self.expected / 2, self.expected] if self._probing else [self.expected]
        pending_skip = skip or missed
        REMOTE_LOOKS.waits += 1
        REMOTE_LOOKS.looks += missed

        def paced() -> T | None:
            nonlocal pending_skip
            if pending_skip:  # poll's first call: the look is made after the pause instead
                pending_skip = False
                return None
            began = time.monotonic()
            found = look()
            self.round_trip = time.monotonic() - began
            REMOTE_LOOKS.looks += 1
            if found is not None:
                self._learn(began - self._start, skip)
            else:
                self._misses += 1
            return found

        return paced

    def _learn(self, found_at: float, skipped: bool) -> None:
        if not skipped:  # the first look was made: did it find the peer?
            self.at_once += PACING_WEIGHT * ((1.0 if self._misses == 0 else 0.0) - self.at_once)
        if self._probing and found_at < PACING_SOONER * self.expected:
            self._found.clear()  # it comes much sooner now: the old guess would keep it waiting
        if self._misses == 0 and not skipped:
            self._found.append(0.0)  # there at once
        elif self._misses <= (0 if skipped else 1):  # found by the look at the guessed time: it
            self._found.append(PACING_EARLIER * found_at)  # may have come sooner (see PACING_EARLIER)
        else:  # it came after the guessed look: by this one
            self._found.append(found_at)
        self.expected = sorted(self._found)[len(self._found) // 2]

    def next_pause(self, pause: float, waited: float) -> float:
        floor = max(self.round_trip, FIRST_SLEEP_SECONDS)
        while self._plan and self._plan[0] <= waited + floor:
            self._plan.pop(0)  # (passed already)
        if self._plan:
            target = self._plan.pop(0)
            # a planned look that misses is early by up to what PACING_EARLIER took off: the
            # back-off after it starts there (or at a round trip)
            self._step = (1 - PACING_EARLIER) * target / 2
            return target - waited
        cap = max(MAX_SLEEP_SECONDS, share_of_wait(waited))
        self._step = min(max(self._step * 2, floor), max(cap, floor))
        return self._step
