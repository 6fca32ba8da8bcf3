"""A generation agreed elsewhere (through a torch store): rank 0 claims it, the others confirm it.

When the members were agreed through a store (c10d/store_rendezvous.py), nobody joins in the
directory: rank 0 records the whole generation at once under the lock (refusing a live job
there), and every other rank must find it in its own view of the directory, which proves that
view is rank 0's directory. A generation that fails to form is withdrawn.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

from ..defaults import SHARED_DIR_GRACE_SECONDS
from ..errors import RendezvousError
from ..files.io import remove_tree
from ..files.places import adopt_run_directory
from ..files.waiting import Deadline, poll
from ..fs import guard
from ..protocol import layout, rendezvous_record
from ..protocol.rendezvous_record import CorruptRecordError, conflict_message, parse, unusable
from .clean import remove_node_tiers
from .generation import Generation
from .judge import judge_previous, new_generation
from .liveness import Identity

__all__ = ["claim", "confirm", "withdraw"]


def claim(root: str, members: list[dict[str, Any]], timeout: timedelta, owns_root: bool = False) -> Generation:
    """Record a fresh, complete generation of ``members`` (already agreed elsewhere) in ``root``.

    Rank 0 of a job that met through a torch store calls this: the store decided who the
    members are, so nobody joins here; the directory only has to hold no other live job.
    Returns rank 0's view of the generation.
    """
    root = adopt_run_directory(root)
    guard.warn_of_a_shared_secret()
    world_size = len(members)
    state: dict[str, Any] = {}
    conflict: list[RendezvousError] = []

    def take(old: bytes) -> bytes | None:
        nonlocal state
        try:
            previous = parse(old, root)
        except CorruptRecordError as exc:
            raise unusable(root, exc) from exc
        try:
            verdict = judge_previous(previous, world_size) if previous else "replace"
        except RendezvousError as exc:
            if previous.get("complete"):
                raise  # never disturb a running job
            previous["conflict"] = conflict_message(previous, 0, world_size, members[0])  # fail its ranks too
            conflict.append(exc)
            return rendezvous_record.encode(previous, root)
        if verdict != "replace":
            return None  # the previous job is leaving: wait for its last member
        state = new_generation(root, world_size, previous)
        state["members"] = {str(r): m for r, m in enumerate(members)}
        state["complete"] = True
        return rendezvous_record.encode(state, root)

    def taken() -> bool | None:
        record.update(take)
        if conflict:
            raise conflict[0]
        return True if state else None

    with rendezvous_record.locked(root) as record:
        poll(
            taken,
            Deadline(timeout.total_seconds()),
            lambda: RendezvousError(f"the previous job in {root} did not finish leaving within {timeout}"),
        )
    generation = state["generation"]
    identities = [Identity.from_json(m) for m in members]
    directory = layout.generation_dir(root, generation)
    return Generation(root, generation, directory, 0, world_size, identities, owns_root=owns_root)


def confirm(
    root: str, generation_id: str, rank: int, nonce: str, grace: float = SHARED_DIR_GRACE_SECONDS
) -> Generation:
    """Find in ``root`` the generation rank 0 claimed, with this rank (``nonce``) in slot ``rank``.

    Seeing it proves that this rank's ``root`` is rank 0's directory: a record read under the
    lock is coherent across clients, so it shows up at once; ``grace`` covers slow servers.
    """
    root = adopt_run_directory(root, create=False)
    path = os.path.join(root, layout.RENDEZVOUS_FILE)
    end = time.monotonic() + grace
    seen = "no such file"
    while True:
        try:
            with rendezvous_record.locked(root, create=False) as record:
                state = parse(record.read(), root)
            member = state.get("members", {}).get(str(rank), {})
            if state.get("generation") == generation_id and member.get("nonce") == nonce:
                remove_node_tiers(state.get("replaced", []))  # what the dead generations left on this node
                identities = [Identity.from_json(state["members"][str(r)]) for r in range(state["world_size"])]
                directory = layout.generation_dir(root, generation_id)
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
        if parse(old, generation.root).get("generation") != generation.generation_id:
            return None
        remove_tree(generation.directory)
        return b""

    with rendezvous_record.locked(generation.root) as record:
        record.update(drop)
    if generation.owns_root:
        generation.remove_root()
