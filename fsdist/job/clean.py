"""``fsdist clean``: remove what a dead job left in a run directory, never a live job's files.

Also what its two-tier groups left on this node (``remove_node_tiers``): a generation replaced
or cleaned takes this node's tier directories with it; other nodes remove theirs when their
ranks join the generation that replaced it (the record names it: ``replaced``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..defaults import local_dir
from ..errors import RendezvousError
from ..files.io import remove_tree
from ..files.locks import LockedRecord
from ..protocol import layout, rendezvous_record
from ..protocol.rendezvous_record import parse
from .liveness import Identity, is_alive, node_id

__all__ = ["clean", "remove_node_tiers", "retire_stopped"]


def clean(root: str, force: bool = False) -> list[str]:
    """Remove every generation a dead job left in ``root``.

    Refuses while a member is alive on this host, or (unless ``force``) runs on another host,
    where this host cannot tell whether it is alive.
    """
    removed: list[str] = []
    path = os.path.join(root, layout.RENDEZVOUS_FILE)
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
                if layout.is_generation_dir(name):
                    remove_tree(os.path.join(root, name))
                    removed.append(name)
            remove_node_tiers(layout.generation_id_of(name) for name in removed)
            return b""

        record.update(wipe)
    return removed


def retire_stopped(root: str) -> None:
    """Record this machine's dead members of ``root``'s generation as gone.

    A launcher calls this after stopping its ranks: ranks of the next round on other machines
    cannot check those processes, and would take the generation for a live job. Once no member
    of this node runs, the node's tiers go. The record keeps naming the generation (every member
    gone): the next generation replaces it and removes its folder, and every launcher, however
    late, still learns which node tiers to remove.
    """
    path = os.path.join(root, layout.RENDEZVOUS_FILE)
    if not os.path.exists(path):
        return
    with LockedRecord(path) as record:

        def mark(old: bytes) -> bytes | None:
            state = parse(old)
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
            return rendezvous_record.encode(state) if False in alive else None

        record.update(mark)


def remove_node_tiers(generation_ids: Iterable[str], node: str | None = None) -> None:
    """Remove the tier directories of these generations from this machine's local directory:
    every node's (dead generations), or only ``node``'s (its ranks are gone, others may run)."""
    prefixes = tuple(layout.node_tier_prefix(g, node) for g in generation_ids if g)
    if not prefixes:
        return
    local = local_dir()
    try:
        names = os.listdir(local)
    except OSError:
        return
    for name in names:
        if name.startswith(prefixes):
            remove_tree(os.path.join(local, name))
