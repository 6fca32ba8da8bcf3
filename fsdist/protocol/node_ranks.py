"""How many ranks each node's launcher starts (``fsdist run``): nodes may start different numbers,
as with torchrun (``--nproc-per-node`` 2 on one node, 1 on another).

Once the launchers of a round have met, each publishes ``nproc.n<node>.json`` in the round's
launch generation (layout.node_ranks_file): the JSON object ``{"node": <node>, "nproc": <ranks>}``
sealed with a check line (protocol/sealed.py; with FSDIST_SECRET_FILE a MAC of the file's
identity, its round and name, too). A record copied to another node's name is refused by its
``node``. Every launcher reads every node's, and numbers the job's ranks node by node from them.
Nothing in it is trusted: a reader caps the size, checks the seal, and takes the two integers
only within their ranges.
"""

from __future__ import annotations

import json
import os
from typing import Any

from . import layout
from .sealed import seal_json, unseal_json

__all__ = ["MAX_BYTES", "MAX_RANKS_PER_NODE", "encode", "parse"]

#: a record is a few dozen bytes; more is not one
MAX_BYTES = 1024
#: more ranks than any node runs (a typo's 20000 is refused by the launcher before it publishes)
MAX_RANKS_PER_NODE = 4096


def encode(path: str, node: int, nproc: int) -> bytes:
    """The record of ``path`` (layout.node_ranks_file) saying node ``node`` starts ``nproc`` ranks."""
    return seal_json({"node": node, "nproc": nproc}, layout.identity(path))


def parse(raw: bytes, path: str, node: int) -> int:
    """Node ``node``'s number of ranks from its record at ``path``; ``ValueError`` naming what is
    wrong otherwise."""
    name = os.path.basename(path)
    if len(raw) > MAX_BYTES:
        raise ValueError(f"{name} holds {len(raw)} bytes, more than {MAX_BYTES}")
    record: Any = json.loads(unseal_json(raw, layout.identity(path)))
    if not isinstance(record, dict) or type(record.get("node")) is not int or record["node"] != node:
        raise ValueError(f"{name} is not node {node}'s record")
    nproc = record.get("nproc")
    if type(nproc) is not int or not 1 <= nproc <= MAX_RANKS_PER_NODE:
        raise ValueError(f"{name}: {nproc!r} ranks is not 1 to {MAX_RANKS_PER_NODE}")
    return nproc
