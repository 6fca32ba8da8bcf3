"""Judging a recorded generation by its members' liveness: join it, replace it, wait, or refuse.

Every procedure that reads the rendezvous record under its lock (joining, claiming, cleaning)
decides with these rules, so a second live job is refused the same way whichever door it comes
through, and a crashed job is replaced the same way too.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from ..errors import RendezvousError
from ..files.trust import make_private_dir
from ..protocol import layout
from ..protocol.rendezvous_record import (
    FORMAT,
    MAX_REPLACED,
    NODES,
    RANKS,
    member_name,
    rank_taken_message,
    size_name,
)
from .clean import recorded_generations, remove_generations, remove_node_tiers
from .liveness import Identity, is_alive

log = logging.getLogger(__name__)

__all__ = ["judge", "judge_previous", "new_generation", "staying"]


def judge(state: dict[str, Any], rank: int | None, world_size: int, me: dict[str, Any], unit: str = RANKS) -> str:
    """Decide under the lock what to do with the recorded generation: "join", "replace" or "wait".

    Raises RendezvousError for a second live job in the same directory.
    """
    if not state:
        return "replace"
    if state.get("conflict"):  # its members were told to fail: it is over once they are gone
        return judge_previous(state, world_size, unit)
    members = {int(r): m for r, m in state["members"].items()}
    holder = members.get(rank) if rank is not None else None
    if not state["complete"] and state["world_size"] == world_size:
        if holder is None or not staying(holder):
            return "join"  # a free slot, or one whose holder died while the job was forming
        if rank is not None and not any(m.get("left") for m in members.values()):
            raise RendezvousError(rank_taken_message(state, rank, me, unit))
    return judge_previous(state, world_size, unit)


def judge_previous(state: dict[str, Any], world_size: int, unit: str = RANKS) -> str:
    """A recorded generation this rank cannot join: "replace" it (over), "wait" (leaving), or
    raise RendezvousError (a live job). ``unit``: how the messages name members (RANKS, NODES)."""
    members = {int(r): m for r, m in state["members"].items()}
    remaining = {r: m for r, m in members.items() if staying(m)}
    if not remaining:
        return "replace"  # every member left or died: the generation is over
    if any(m.get("left") for m in members.values()):
        return "wait"  # a job that is shutting down: its last members are leaving
    r, m = next(iter(remaining.items()))
    holder = f"{member_name(unit, r)} is pid {m['pid']} on {m['host']}"
    if not state["complete"] and state["world_size"] != world_size:
        if unit == NODES:
            this = f"this launcher was started with --nnodes {world_size}"
        else:
            this = f"this rank was started with world size {world_size}"
        disagree = "the launchers disagree on --nnodes" if unit == NODES else "the ranks disagree on the world size"
        raise RendezvousError(
            f"a job of {size_name(unit, state['world_size'])} is forming in this directory (generation "
            f"{state['generation']}; {holder}), but {this}: {disagree}, or two jobs use this directory"
        )
    why = "is running" if state["complete"] else "is forming"
    raise RendezvousError(
        f"another job {why} in this directory (generation {state['generation']}, "
        f"{size_name(unit, state['world_size'])}; {holder}). Use another directory, or stop that job"
    )


def staying(member: dict[str, Any]) -> bool:
    """Not left, and not known to be dead. A process on another host cannot be checked from
    here, so it counts as alive: never delete what a live job elsewhere may still be using."""
    return not member.get("left") and is_alive(Identity.from_json(member)) is not False


def new_generation(root: str, world_size: int, previous: dict[str, Any]) -> dict[str, Any]:
    """Start a fresh generation, deleting the dead ones ``previous`` (the record) names.

    Only what the record names goes, never what a name pattern matches: the run directory may
    be a folder holding other things of the user's (``gen-notes/``), and a generation folder
    nobody recorded is none of fsdist's business (``fsdist clean`` reports such leftovers).
    """
    generation = secrets.token_hex(8)
    named = recorded_generations(previous)
    # the last generation, and any older one whose removal a crash interrupted
    replaced = named[:1] + [g for g in remove_generations(root, named) if g not in named[:1]]
    remove_node_tiers(replaced)  # this node's; the others' when their ranks join (``replaced``)
    if previous:
        log.warning("fsdist: replacing dead generation %s in %s", previous.get("generation"), root)
    make_private_dir(layout.generation_dir(root, generation))
    state = {"format": FORMAT, "generation": generation, "world_size": world_size, "members": {}, "complete": False}
    if replaced:
        state["replaced"] = replaced[:MAX_REPLACED]
    return state
