"""Port-free rendezvous: ranks form a *generation* of a job through one lock-guarded file.

``DIR/fsdist-rendezvous.json`` (JSON, read and written only under an fcntl lock) names the
generation being formed or running and the identity of each member. A new generation, with
its own fresh ``gen-<id>/`` subdirectory, is started when there is none, when the recorded one
is dead (its same-host members' processes are gone), or when a rank finds its own slot taken
by a dead process. Files of a crashed earlier run are therefore never read: they live in a
directory no live rank names, and the rank that replaces a generation deletes it.

A rank waiting for a generation to fill up re-joins if someone replaced it meanwhile, so all
live ranks converge on the newest generation. A generation whose members are alive on this
host is never replaced: a second job pointed at the same directory gets a clear error.

The file holds JSON, never pickle: the directory is shared with other users.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from datetime import timedelta
from typing import Any

from ..defaults import DEFAULT_TIMEOUT, RENDEZVOUS_NOTE_SECONDS
from ..errors import RendezvousError
from ..files.io import make_private_dir
from ..files.locks import LockedRecord
from ..files.waiting import Deadline, poll
from ..fs import guard
from ..protocol import layout
from ..protocol.rendezvous_record import (
    CorruptRecordError,
    conflict_message,
    mark_refused,
    parse,
    retire_own_stale_entries,
)
from .clean import remove_node_tiers
from .generation import Generation
from .judge import judge, new_generation, staying
from .liveness import Identity, this_process

log = logging.getLogger(__name__)

__all__ = ["Generation", "rendezvous"]


def rendezvous(root: str, rank: int | None, world_size: int, timeout: timedelta = DEFAULT_TIMEOUT) -> Generation:
    """Join (or start) the generation of a ``world_size``-rank job in ``root``; wait until full.

    ``rank=None`` takes the lowest free slot (torchrun's agents get their node rank this way).
    """
    if world_size < 1 or (rank is not None and not 0 <= rank < world_size):
        raise RendezvousError(f"rank {rank} is outside a world of size {world_size}")
    root = os.path.realpath(root)  # the run directory itself may sit behind a link (/scratch -> ...)
    make_private_dir(root)
    me = {**this_process().to_json(), "nonce": secrets.token_hex(8), **guard.describe_client(root)}
    guard.refuse_known_multinode(root, me, world_size)
    record = LockedRecord(os.path.join(root, layout.RENDEZVOUS_FILE))
    warned: set[str] = set()
    try:
        state: dict[str, Any] = {}

        def my_slot() -> int | None:
            slots = [int(r) for r, m in state.get("members", {}).items() if m.get("nonce") == me["nonce"]]
            return slots[0] if slots else None

        def join(old: bytes) -> bytes | None:
            nonlocal state
            state = parse(old)
            retired = retire_own_stale_entries(state, me)
            members = state.get("members", {}).values()
            if any(m.get("refused") for m in members) and any(staying(m) for m in members):
                return None  # a member refused this filesystem: fail like it did (fs_guard)
            if my_slot() is not None:
                if state.get("conflict"):
                    raise RendezvousError(state["conflict"])
                return None  # already a member: just watching the generation fill up
            try:
                verdict = judge(state, rank, world_size, me)
            except RendezvousError as exc:
                if state.get("complete"):
                    raise  # never disturb a running job
                # two jobs, or ranks of one job that disagree, are forming here: the ranks
                # already waiting would otherwise wait for the whole timeout; fail them too
                state["conflict"] = conflict_message(state, rank, world_size, me)
                conflict.append(exc)
                return json.dumps(state).encode()
            if verdict == "wait":  # the previous job is shutting down: let it finish
                return json.dumps(state).encode() if retired else None
            if verdict == "replace":
                state = new_generation(root, world_size, previous=state)
            # members known dead can never take part: free their slots rather than count them
            state["members"] = {r: m for r, m in state["members"].items() if staying(m)}
            slot = rank if rank is not None else min(set(range(world_size)) - {int(r) for r in state["members"]})
            state["members"][str(slot)] = me
            state["complete"] = len(state["members"]) == world_size
            return json.dumps(state).encode()

        def formed() -> dict[str, Any] | None:
            nonlocal record
            if me["fs_hazard"]:  # a held descriptor may never see other clients' writes here
                record.close()
                record = LockedRecord(os.path.join(root, layout.RENDEZVOUS_FILE))
            try:
                record.update(join)
                if conflict:
                    raise conflict[0]
                guard.check_members(root, state.get("members", {}), warned)
            except RendezvousError as exc:
                if isinstance(exc, CorruptRecordError) and me["fs_hazard"]:  # this mount loses locked writes
                    raise guard.corrupted(root, me["fs_hazard"], record.path, exc) from exc
                reason = str(exc)
                record.update(lambda old: mark_refused(old, me["nonce"], reason))
                raise
            if my_slot() is not None and state["complete"]:
                return state
            if time.monotonic() >= next_note[0]:  # a rank that never shows up may use another directory
                next_note[0] = time.monotonic() + RENDEZVOUS_NOTE_SECONDS
                joined = sorted(int(r) for r in state.get("members", {}))
                log.warning(
                    "fsdist: rank %s waits in %s for %d of %d ranks (joined so far: %s); a rank that "
                    "is running but never joins uses another directory (or another world size)",
                    rank, root, world_size - len(joined), world_size, joined,
                )  # fmt: skip
            return None

        next_note = [time.monotonic() + RENDEZVOUS_NOTE_SECONDS]
        conflict: list[RendezvousError] = []
        deadline = Deadline(timeout.total_seconds())
        final = poll(
            formed,
            deadline,
            lambda: RendezvousError(
                f"rank {rank}: rendezvous in {root} timed out after {deadline.seconds:.0f} s; "
                f"{len(state.get('members', {}))} of {world_size} ranks joined "
                f"(ranks {sorted(int(r) for r in state.get('members', {}))})"
                + (f"; and this rank's mount is unsafe across clients: {me['fs_hazard']}" if me["fs_hazard"] else "")
            ),
        )
        slot = my_slot()
        assert slot is not None
    finally:
        record.close()
    rank = slot
    remove_node_tiers(final.get("replaced", []))  # what the dead generations left on this node
    members = [Identity.from_json(final["members"][str(r)]) for r in range(world_size)]
    directory = layout.generation_dir(root, final["generation"])
    log.debug("rank %d joined generation %s in %s", rank, final["generation"], root)
    return Generation(root, final["generation"], directory, rank, world_size, members)
