"""``fsdist clean``: remove what a dead job left in a run directory, never a live job's files.

Also what its two-tier groups left on this node (``remove_node_tiers``): a generation replaced
or cleaned takes this node's tier directories with it; other nodes remove theirs when their
ranks join the generation that replaced it (the record names it: ``replaced``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import RendezvousError
from ..files.io import remove_tree
from ..files.places import adopt_run_directory, existing_node_directory
from ..protocol import layout, rendezvous_record
from ..protocol.rendezvous_record import CorruptRecordError, is_generation_id, parse
from ..protocol.sealed import unseal_json
from .liveness import Identity, is_alive, node_id

__all__ = ["Cleaned", "clean", "recorded_generations", "remove_generations", "remove_node_tiers", "retire_stopped"]


@dataclass
class Cleaned:
    """What ``clean`` did: the generation folders it removed, why it emptied a record it could not
    read (None if it could), and generation-like folders no record named, left alone."""

    removed: list[str] = field(default_factory=list)
    repaired: str | None = None
    left: list[str] = field(default_factory=list)


def clean(root: str, force: bool = False) -> Cleaned:
    """Remove the generations a dead job left in ``root``: those its record names, nothing else.

    Refuses while a member is alive on this host, or (unless ``force``) runs on another host,
    where this host cannot tell whether it is alive. A record that fails validation (damaged,
    or not fsdist's) would stop every later job here, so it is emptied, and the generations a
    still-sealed copy of it names are removed: the directory is usable again.
    """
    cleaned = Cleaned()
    root = adopt_run_directory(root, create=False)
    if not os.path.isdir(root):
        missing = "does not exist" if not os.path.lexists(root) else "is not a directory"
        raise RendezvousError(f"{root} {missing}: nothing to clean")
    if not os.path.lexists(os.path.join(root, layout.RENDEZVOUS_FILE)):
        cleaned.left = _unrecorded(root, [])
        return cleaned
    with rendezvous_record.locked(root) as record:

        def wipe(old: bytes) -> bytes:
            try:
                state = parse(old, root)
                named = recorded_generations(state)
            except CorruptRecordError as exc:
                cleaned.repaired, state, named = str(exc), {}, _salvage(old, root)
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
            present = [g for g in named if os.path.lexists(layout.generation_dir(root, g))]
            remove_node_tiers(remove_generations(root, named))
            cleaned.removed = [os.path.basename(layout.generation_dir(root, g)) for g in present]
            cleaned.left = _unrecorded(root, named)
            return b""

        record.update(wipe)
    return cleaned


def recorded_generations(state: dict[str, Any]) -> list[str]:
    """The generations a parsed record names: its own, and those it replaced (whose folders and
    node tiers may still be left where a crash interrupted their removal)."""
    named = [state["generation"]] if state.get("generation") else []
    return list(dict.fromkeys([*named, *state.get("replaced", [])]))


def remove_generations(root: str, generation_ids: list[str]) -> list[str]:
    """Remove these generations' folders from ``root``, if there; the ids of those that were. An
    id that is not fsdist's form is skipped: ids come from a record, which may have been damaged."""
    removed = []
    for generation_id in generation_ids:
        path = layout.generation_dir(root, generation_id)
        if is_generation_id(generation_id) and os.path.lexists(path):
            remove_tree(path)
            removed.append(generation_id)
    return removed


def _salvage(raw: bytes, root: str) -> list[str]:
    """The generation ids a record that failed validation names, if its seal still holds (its
    bytes are as some writer wrote them); none otherwise."""
    try:
        state = json.loads(unseal_json(raw, rendezvous_record.binding(root)))
    except (ValueError, RecursionError):
        return []
    if not isinstance(state, dict):
        return []
    replaced = state.get("replaced")
    ids = [state.get("generation"), *(replaced if isinstance(replaced, list) else [])]
    return [g for g in ids if isinstance(g, str) and is_generation_id(g)]


def _unrecorded(root: str, named: list[str]) -> list[str]:
    """Folders of ``root`` named like generations that no record names: a crash between making one
    and recording it, or the user's own. Reported, never removed."""
    names = []
    for name in sorted(os.listdir(root)):
        if layout.is_generation_dir(name) and is_generation_id(layout.generation_id_of(name)):
            if layout.generation_id_of(name) not in named:
                names.append(name)
    return names


def retire_stopped(root: str) -> None:
    """Record this machine's dead members of ``root``'s generation as gone.

    A launcher calls this after stopping its ranks: ranks of the next round on other machines
    cannot check those processes, and would take the generation for a live job. Once no member
    of this node runs, the node's tiers go. The record keeps naming the generation (every member
    gone): the next generation replaces it and removes its folder, and every launcher, however
    late, still learns which node tiers to remove.
    """
    if not os.path.exists(os.path.join(root, layout.RENDEZVOUS_FILE)):
        return
    with rendezvous_record.locked(root) as record:

        def mark(old: bytes) -> bytes | None:
            state = parse(old, root)
            if not state:
                return None
            running = [m for m in state["members"].values() if not m.get("left")]
            alive = [is_alive(Identity.from_json(m)) for m in running]
            for member, status in zip(running, alive, strict=True):
                if status is False:
                    member["left"] = True
            here = node_id()
            if not any(s for m, s in zip(running, alive, strict=True) if Identity.from_json(m).placement == here):
                remove_node_tiers([state["generation"]], here)  # no rank of this node runs: its tiers are over
            return rendezvous_record.encode(state, root) if False in alive else None

        record.update(mark)


def remove_node_tiers(generation_ids: Iterable[str], node: str | None = None) -> None:
    """Remove the tier directories of these generations from this user's node-local folder:
    every node's (dead generations), or only ``node``'s (its ranks are gone, others may run).
    That folder is this user's alone (files/trust.py ``node_directory``), so what matches there
    is fsdist's; the ids are checked to be fsdist's form."""
    prefixes = tuple(layout.node_tier_prefix(g, node) for g in generation_ids if is_generation_id(g))
    if not prefixes:
        return
    local = existing_node_directory()
    if local is None:
        return
    try:
        names = os.listdir(local)
    except OSError:
        return
    for name in names:
        if name.startswith(prefixes):
            remove_tree(os.path.join(local, name))
