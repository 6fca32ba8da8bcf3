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

import logging
import secrets
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..defaults import DEFAULT_TIMEOUT, ENV_ALLOW_UNSAFE_FS, RENDEZVOUS_NOTE_SECONDS
from ..errors import RendezvousError
from ..files.places import adopt_run_directory
from ..files.waiting import Deadline, poll
from ..fs import guard
from ..fs.mounts import describe_filesystem, is_local
from ..protocol import layout, rendezvous_record
from ..protocol.rendezvous_record import (
    MAX_WAITING,
    CorruptRecordError,
    conflict_message,
    mark_refused,
    parse,
    retire_own_stale_entries,
    unusable,
)
from .clean import remove_node_tiers
from .generation import Generation, in_use_here
from .judge import judge, new_generation, staying
from .liveness import Identity, this_process

log = logging.getLogger(__name__)

__all__ = ["Generation", "membership_changes", "rendezvous"]


def rendezvous(
    root: str,
    rank: int | None,
    world_size: int,
    timeout: timedelta = DEFAULT_TIMEOUT,
    *,
    min_size: int | None = None,
    last_call: float = 0.0,
    note: tuple[float, Callable[[list[int]], None]] | None = None,
    unit: str = rendezvous_record.RANKS,
) -> Generation:
    """Join (or start) the generation of a ``world_size``-rank job in ``root``; wait until full.

    ``rank=None`` takes the lowest free slot (torchrun's agents get their node rank this way).
    With ``min_size`` (elastic: torchrun's ``--nnodes=MIN:MAX``, ``rank=None`` only) a forming
    generation also closes with ``min_size`` or more members once no one joined for
    ``last_call`` seconds, and a rank finding one running with room left waits in its record's
    ``waiting`` list (its members' ``membership_changes``) until the members re-form it.
    ``note``: (after how many seconds, what to call with the ranks joined so far) while it waits,
    then every RENDEZVOUS_NOTE_SECONDS, in place of the log's warning. ``unit``: how errors name
    the members (``rendezvous_record.NODES`` where they are nodes' launchers).
    """
    if world_size < 1 or (rank is not None and not 0 <= rank < world_size):
        raise RendezvousError(f"rank {rank} is outside a world of size {world_size}")
    elastic = min_size is not None and min_size < world_size
    if elastic and (rank is not None or min_size is None or min_size < 1):
        raise RendezvousError(f"an elastic rendezvous takes slots in arrival order and 1 <= min_size: {min_size}")
    root = adopt_run_directory(root)  # (it may sit behind a link: /scratch -> ...)
    guard.warn_of_a_shared_secret()
    me = {**this_process().to_json(), "nonce": secrets.token_hex(8), **guard.describe_client(root)}
    guard.refuse_known_multinode(root, me, world_size)
    in_use = {generation.generation_id for generation in in_use_here(root)}
    record = rendezvous_record.locked(root)
    warned: set[str] = set()
    try:
        state: dict[str, Any] = {}

        def my_slot() -> int | None:
            slots = [int(r) for r, m in state.get("members", {}).items() if m.get("nonce") == me["nonce"]]
            return slots[0] if slots else None

        def join(old: bytes) -> bytes | None:
            nonlocal state
            state = parse(old, root)
            if joined and my_slot() is None:
                raise lost_entry(joined[0])
            retired = retire_own_stale_entries(state, me, in_use)
            if state.get("generation") in in_use:
                raise RendezvousError(
                    f"this process already runs an fsdist group in {root} (generation {state['generation']}): "
                    "a second job through the same directory waits until that group is destroyed "
                    "(dist.destroy_process_group); or use another directory"
                )
            members = state.get("members", {}).values()
            if any(m.get("refused") for m in members) and any(staying(m) for m in members):
                return None  # a member refused this filesystem: fail like it did (fs_guard)
            if my_slot() is not None:
                if state.get("conflict"):
                    raise RendezvousError(state["conflict"])
                if elastic and not state["complete"] and last_call_over(state):
                    close(state)
                    return rendezvous_record.encode(state, root)
                return None  # already a member: just watching the generation fill up
            waiting = wait_for_next_round(state) if elastic else None
            if waiting is not None:  # on the running generation's waiting list
                return rendezvous_record.encode(state, root) if waiting else None
            try:
                verdict = judge(state, rank, world_size, me, unit)
            except RendezvousError as exc:
                if state.get("complete"):
                    raise  # never disturb a running job
                # two jobs, or ranks of one job that disagree, are forming here: the ranks
                # already waiting would otherwise wait for the whole timeout; fail them too
                state["conflict"] = conflict_message(state, rank, world_size, me, unit)
                conflict.append(exc)
                return rendezvous_record.encode(state, root)
            if verdict == "wait":  # the previous job is shutting down: let it finish
                return rendezvous_record.encode(state, root) if retired else None
            if verdict == "replace":
                state = new_generation(root, world_size, previous=state)
                if elastic:
                    state.update(min_size=min_size, max_size=world_size)
            # members known dead can never take part: free their slots rather than count them
            state["members"] = {r: m for r, m in state["members"].items() if staying(m)}
            slot = rank if rank is not None else min(set(range(world_size)) - {int(r) for r in state["members"]})
            state["members"][str(slot)] = me
            state["complete"] = len(state["members"]) == world_size
            joined[:] = [state["generation"]]
            return rendezvous_record.encode(state, root)

        joined: list[str] = []  # the generation this rank wrote itself into (while it waits)

        def lost_entry(generation: str) -> RendezvousError:
            """A live rank's entry is only ever removed by that rank: gone from the record, a
            write under the lock replaced it without having seen it."""
            now = state.get("generation")
            where = "no longer names" if now == generation else f"names generation {now} in place of"
            if me["fs_hazard"]:  # the mount is known to do this across clients: say which, and the fix
                return guard.damaged(
                    root, me["fs_hazard"], f"rank {rank}: the rendezvous file {record.path} {where} this rank's entry "
                    f"in generation {generation}: another rank rewrote it without seeing that write"
                )  # fmt: skip
            return RendezvousError(
                f"rank {rank}: the rendezvous file {record.path} {where} this rank's entry in generation "
                f"{generation}, written under its lock: another rank rewrote it without seeing that write. On "
                f"{describe_filesystem(root)} the locks do not exclude, or reads under them do not show the last "
                f"writer's data, across the clients (nodes or mounts) the ranks use: `python -m fsdist doctor "
                f"{root} --peer-mount DIR2` measures it; docs/filesystems.md lists settings that are safe"
            )

        def formed() -> dict[str, Any] | None:
            nonlocal record
            if me["fs_hazard"]:  # a held descriptor may never see other clients' writes here
                record.close()
                record = rendezvous_record.locked(root)
            try:
                record.update(join)
                if conflict:
                    raise conflict[0]
                guard.check_members(root, state.get("members", {}), warned)
            except RendezvousError as exc:
                if isinstance(exc, CorruptRecordError) and me["fs_hazard"]:  # this mount loses locked writes
                    raise guard.corrupted(root, me["fs_hazard"], record.path, exc) from exc
                if isinstance(exc, CorruptRecordError):
                    raise guard.suspect(root, unusable(root, exc)) from exc
                reason = str(exc)
                record.update(lambda old: mark_refused(old, me["nonce"], reason, root))
                raise
            if my_slot() is not None and state["complete"]:
                return state
            if time.monotonic() >= next_note[0]:  # a rank that never shows up may use another directory
                next_note[0] = time.monotonic() + RENDEZVOUS_NOTE_SECONDS
                joined = sorted(int(r) for r in state.get("members", {}))
                if note is not None:
                    note[1](joined)
                else:
                    log.warning(
                        "fsdist: rank %s waits in %s for %d of %d ranks (joined so far: %s); a rank that "
                        "is running but never joins uses another directory (or another world size)",
                        rank, root, world_size - len(joined), world_size, joined,
                    )  # fmt: skip
            return None

        seen = [0, time.monotonic()]  # members counted, and since when (this rank's own clock)

        def last_call_over(state: dict[str, Any]) -> bool:
            count = len(state["members"])
            if count != seen[0]:
                seen[:] = [count, time.monotonic()]
            return count >= (min_size or world_size) and time.monotonic() - seen[1] >= last_call

        def close(state: dict[str, Any]) -> None:
            """Form the elastic generation with the members it has, numbered in slot order."""
            members = [state["members"][r] for r in sorted(state["members"], key=int)]
            state.update(members={str(i): m for i, m in enumerate(members)}, world_size=len(members), complete=True)

        def wait_for_next_round(state: dict[str, Any]) -> bool | None:
            """In a running elastic generation with room: be on its waiting list (True: the list
            changed). None where that does not apply."""
            members = state.get("members", {}).values()
            if not (state.get("complete") and state.get("max_size") == world_size):
                return None
            if any(m.get("left") for m in members) or len(members) >= world_size:
                return None  # re-forming now (join the next one), or full (a second job: refused)
            before = state.get("waiting", [])
            waiting = [w for w in before if w["nonce"] != me["nonce"] and staying(w)]
            if len(waiting) >= MAX_WAITING:
                raise RendezvousError(f"{MAX_WAITING} ranks already wait to join the job in {root}")
            state["waiting"] = [*waiting, me]
            return [w["nonce"] for w in before] != [w["nonce"] for w in state["waiting"]]

        next_note = [time.monotonic() + (RENDEZVOUS_NOTE_SECONDS if note is None else note[0])]
        conflict: list[RendezvousError] = []
        deadline = Deadline(timeout.total_seconds())
        final = poll(
            formed,
            deadline,
            lambda: RendezvousError(
                f"rank {rank}: rendezvous in {root} timed out after {deadline.seconds:.0f} s; "
                f"{len(state.get('members', {}))} of {world_size} ranks joined "
                f"(ranks {sorted(int(r) for r in state.get('members', {}))})"
                + (
                    f"; and this rank's mount is unsafe across clients: {me['fs_hazard']} (ranks reaching {root} "
                    f"through several mounts or nodes lose each other's entries here; such a job is refused unless "
                    f"{ENV_ALLOW_UNSAFE_FS}=1)"
                    if me["fs_hazard"]
                    else ""
                )
                + (
                    ""
                    if me["fs_hazard"] or is_local(root)
                    else f"; {guard.lock_hint(root, 'ranks can miss each other')}"
                )
            ),
        )
        slot = my_slot()
        assert slot is not None
    finally:
        record.close()
    rank = slot
    remove_node_tiers(final.get("replaced", []))  # what the dead generations left on this node
    world_size = final["world_size"]  # an elastic generation formed with the members it had
    members = [Identity.from_json(final["members"][str(r)]) for r in range(world_size)]
    directory = layout.generation_dir(root, final["generation"])
    log.debug("rank %d joined generation %s in %s", rank, final["generation"], root)
    return Generation(root, final["generation"], directory, rank, world_size, members)


def membership_changes(generation: Generation) -> int:
    """How many members left ``generation`` (to re-form it, or for good) and how many live ranks
    wait to join it (elastic): what its other members must re-form for. A generation no longer
    recorded counts as one change."""
    with rendezvous_record.locked(generation.root) as record:
        state = parse(record.read(), generation.root)
    if state.get("generation") != generation.generation_id:
        return 1
    left = sum(1 for r, m in state["members"].items() if m.get("left") and int(r) != generation.rank)
    return left + sum(1 for w in state.get("waiting", []) if staying(w))
