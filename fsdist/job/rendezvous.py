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

import atexit
import contextlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..defaults import DEFAULT_TIMEOUT, RENDEZVOUS_NOTE_SECONDS, SHARED_DIR_GRACE_SECONDS
from ..errors import FsdistError, RendezvousError
from ..files.io import make_private_dir, remove_tree, unlink_quietly
from ..files.locks import LockedRecord
from ..files.waiting import Deadline, poll
from ..fs import guard
from ..protocol.rendezvous_record import (
    RENDEZVOUS_FILE,
    conflict_message,
    judge,
    judge_previous,
    mark_refused,
    new_generation,
    parse,
    retire_own_stale_entries,
    staying,
)
from .liveness import Identity, is_alive, this_process

log = logging.getLogger(__name__)

__all__ = ["Generation", "claim", "clean", "confirm", "rendezvous", "withdraw"]


@dataclass
class Generation:
    """One formed job: its directory, this rank, and who every rank is."""

    root: str
    generation_id: str
    directory: str
    rank: int
    world_size: int
    members: list[Identity]
    #: The root exists for this job alone (beside a FileStore's file, or node-local): the last
    #: rank out removes it too.
    owns_root: bool = False
    #: How many groups of each name this process has created (see ProcessGroupFsdist).
    incarnations: dict[str, int] = field(default_factory=dict)
    #: Called once this rank has left (init methods release what they keep alive for torch).
    on_leave: list[Callable[[], None]] = field(default_factory=list)
    left: bool = False

    def __post_init__(self) -> None:
        # A group of another backend formed through fsdist's directory (env:// under `fsdist
        # run` serves Gloo too) is destroyed without telling fsdist: leave at exit at the latest
        atexit.register(self._leave_at_exit)

    def _leave_at_exit(self) -> None:
        try:
            self.leave()
        except (OSError, FsdistError) as exc:  # the directory may be gone already: best effort
            log.debug("fsdist: could not leave generation %s at exit: %s", self.generation_id, exc)

    def heartbeat_path(self, rank: int) -> str:
        return os.path.join(self.directory, f"heartbeat.r{rank}")

    def leave(self) -> None:
        """Mark this rank as gone; the last rank out removes the generation and empties the file.

        Leaving is recorded in the rendezvous file itself, so a rank that starts the next job
        while its peers are still shutting down sees a job that is ending, not a live one.
        Leaving twice is leaving once.
        """
        if self.left:
            return
        self.left = True
        atexit.unregister(self._leave_at_exit)
        emptied = False

        def mark(old: bytes) -> bytes | None:
            state = parse(old)
            if state.get("generation") != self.generation_id:
                return None  # already replaced (we were presumed dead): nothing of ours is left
            state["members"][str(self.rank)]["left"] = True
            if all(m.get("left") for m in state["members"].values()):
                nonlocal emptied
                emptied = True
                remove_tree(self.directory)
                return b""
            return json.dumps(state).encode()

        with LockedRecord(os.path.join(self.root, RENDEZVOUS_FILE)) as record:
            record.update(mark)
        if emptied and self.owns_root:  # closed first: on NFS an open file would stay as .nfsXXXX
            unlink_quietly(os.path.join(self.root, RENDEZVOUS_FILE))
            with contextlib.suppress(OSError):
                os.rmdir(self.root)
        for callback in self.on_leave:
            callback()
        self.on_leave.clear()


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
    record = LockedRecord(os.path.join(root, RENDEZVOUS_FILE))
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
                record = LockedRecord(os.path.join(root, RENDEZVOUS_FILE))
            try:
                record.update(join)
                if conflict:
                    raise conflict[0]
                guard.check_members(root, state.get("members", {}), warned)
            except RendezvousError as exc:
                if "refusing to start" not in str(exc) and me["fs_hazard"]:  # the file itself was corrupted
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
    members = [Identity.from_json(final["members"][str(r)]) for r in range(world_size)]
    directory = os.path.join(root, f"gen-{final['generation']}")
    log.debug("rank %d joined generation %s in %s", rank, final["generation"], root)
    return Generation(root, final["generation"], directory, rank, world_size, members)


def claim(root: str, members: list[dict[str, Any]], timeout: timedelta, owns_root: bool = False) -> Generation:
    """Record a fresh, complete generation of ``members`` (already agreed elsewhere) in ``root``.

    Rank 0 of a job that met through a torch store calls this: the store decided who the
    members are, so nobody joins here; the directory only has to hold no other live job.
    Returns rank 0's view of the generation.
    """
    root = os.path.realpath(root)
    make_private_dir(root)
    world_size = len(members)
    state: dict[str, Any] = {}
    conflict: list[RendezvousError] = []

    def take(old: bytes) -> bytes | None:
        nonlocal state
        previous = parse(old)
        try:
            verdict = judge_previous(previous, world_size) if previous else "replace"
        except RendezvousError as exc:
            if previous.get("complete"):
                raise  # never disturb a running job
            previous["conflict"] = conflict_message(previous, 0, world_size, members[0])  # fail its ranks too
            conflict.append(exc)
            return json.dumps(previous).encode()
        if verdict != "replace":
            return None  # the previous job is leaving: wait for its last member
        state = new_generation(root, world_size, previous)
        state["members"] = {str(r): m for r, m in enumerate(members)}
        state["complete"] = True
        return json.dumps(state).encode()

    def taken() -> bool | None:
        record.update(take)
        if conflict:
            raise conflict[0]
        return True if state else None

    with LockedRecord(os.path.join(root, RENDEZVOUS_FILE)) as record:
        poll(
            taken,
            Deadline(timeout.total_seconds()),
            lambda: RendezvousError(f"the previous job in {root} did not finish leaving within {timeout}"),
        )
    generation = state["generation"]
    identities = [Identity.from_json(m) for m in members]
    directory = os.path.join(root, f"gen-{generation}")
    return Generation(root, generation, directory, 0, world_size, identities, owns_root=owns_root)


def confirm(
    root: str, generation_id: str, rank: int, nonce: str, grace: float = SHARED_DIR_GRACE_SECONDS
) -> Generation:
    """Find in ``root`` the generation rank 0 claimed, with this rank (``nonce``) in slot ``rank``.

    Seeing it proves that this rank's ``root`` is rank 0's directory: a record read under the
    lock is coherent across clients, so it shows up at once; ``grace`` covers slow servers.
    """
    root = os.path.realpath(root)
    path = os.path.join(root, RENDEZVOUS_FILE)
    end = time.monotonic() + grace
    seen = "no such file"
    while True:
        try:
            with LockedRecord(path, create=False) as record:
                state = parse(record.read())
            member = state.get("members", {}).get(str(rank), {})
            if state.get("generation") == generation_id and member.get("nonce") == nonce:
                identities = [Identity.from_json(state["members"][str(r)]) for r in range(state["world_size"])]
                directory = os.path.join(root, f"gen-{generation_id}")
                return Generation(root, generation_id, directory, rank, state["world_size"], identities)
            seen = f"generation {state.get('generation')}" if state else "an empty record"
        except FileNotFoundError:
            seen = "no such file"
        if time.monotonic() >= end:
            raise RendezvousError(
                f"rank {rank}: {path} shows {seen}, not generation {generation_id} that rank 0 recorded in "
                f"its run directory {grace:.0f} s ago: this rank's directory is not the one rank 0 uses. "
                "Point every rank at one directory on a filesystem they all mount (FSDIST_DIR)"
            )
        time.sleep(0.05)


def withdraw(generation: Generation) -> None:
    """Undo ``claim`` after the job failed to form: its members never start, so they all leave."""

    def drop(old: bytes) -> bytes | None:
        if parse(old).get("generation") != generation.generation_id:
            return None
        remove_tree(generation.directory)
        return b""

    with LockedRecord(os.path.join(generation.root, RENDEZVOUS_FILE)) as record:
        record.update(drop)
    if generation.owns_root:
        unlink_quietly(os.path.join(generation.root, RENDEZVOUS_FILE))
        with contextlib.suppress(OSError):
            os.rmdir(generation.root)


def clean(root: str, force: bool = False) -> list[str]:
    """Remove every generation a dead job left in ``root``.

    Refuses while a member is alive on this host, or (unless ``force``) runs on another host,
    where this host cannot tell whether it is alive.
    """
    removed: list[str] = []
    path = os.path.join(root, RENDEZVOUS_FILE)
    if not os.path.exists(path):
        return removed
    with LockedRecord(path) as record:

        def wipe(old: bytes) -> bytes:
            state = parse(old)
            for member in state.get("members", {}).values():
                who = Identity.from_json(member)
                alive = is_alive(who)
                if member.get("left") or alive is False or (alive is None and force):
                    continue
                hint = "stop it before cleaning" if alive else "use --force if that job is dead"
                raise RendezvousError(
                    f"a job may be alive in {root} (pid {who.pid} on {who.host}, generation "
                    f"{state['generation']}): {hint}"
                )
            for name in os.listdir(root):
                if name.startswith("gen-"):
                    remove_tree(os.path.join(root, name))
                    removed.append(name)
            return b""

        record.update(wipe)
    return removed
