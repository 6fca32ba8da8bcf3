"""What a rank has called in one group: a running hash of every operation's description, kept
per operation for the last _HISTORY of them.

Two ranks whose hashes differ at the same operation called different operations at or before
it, even if neither waited for the other then (a rank that never waits, a broadcast root say,
is caught at the next record its peers read). The hash travels in the rank's state record
(protocol/state_record.py ``chain``); comparing it is the desync check, and the errors it
raises are worded here.
"""

from __future__ import annotations

from collections import deque

from ..errors import DesyncError
from ..protocol import state_record

__all__ = ["History", "disagree", "diverged"]

_HISTORY = 4096  # own history hashes kept, to compare with peers that lag behind


class History:
    """This rank's hash after each operation it called (the recent ones), and its descriptions."""

    def __init__(self) -> None:
        self.chain = 0
        self._at: dict[int, tuple[int, str]] = {0: (0, "")}
        self._order: deque[int] = deque([0])

    def enter(self, seq: int, description: str, stored: str) -> None:
        """Operation ``seq`` is ``description`` (``stored``: as the record holds it)."""
        self.chain = state_record.chain(self.chain, description)
        self._at[seq] = (self.chain, stored)
        self._order.append(seq)
        if len(self._order) > _HISTORY:
            self._at.pop(self._order.popleft(), None)

    def differs(self, seq: int, theirs: int) -> str | None:
        """This rank's description of operation ``seq`` where a peer's hash there, ``theirs``, is
        another (they called something else at or before it); None where they agree or ``seq``
        is too old (or too new) to tell."""
        mine = self._at.get(seq)
        return mine[1] if mine is not None and mine[0] != theirs else None


def disagree(where: str, seq: int, me: int, mine: str, peer: int, theirs: str) -> DesyncError:
    """Rank ``peer`` is in operation ``seq`` as ``theirs`` where rank ``me`` calls it ``mine``."""
    return DesyncError(
        f"{where}: ranks disagree on operation #{seq}: rank {me} called '{mine}', rank {peer} called '{theirs}'"
    )


def diverged(where: str, seq: int, ours: str, peer: int, theirs: str) -> DesyncError:
    """Rank ``peer``'s history differs from this rank's at operation ``seq``: they called
    something else there or before."""
    return DesyncError(
        f"{where}: rank {peer} called different operations from this rank at or before "
        f"operation #{seq} (this rank's #{seq} was '{ours}', rank {peer}'s is '{theirs}'; "
        "every rank of a group must call the same collectives in the same order)"
    )
