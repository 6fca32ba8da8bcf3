"""What one benchmark run measures: operations, sizes, world sizes, iteration counts.

Iteration counts depend only on the size, never on timings measured on the way, so every rank
of a world runs the same loop without having to agree on anything.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

OPS = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "sendrecv",
    "barrier",
    "broadcast_bytes",
)
#: what runs when ``--ops`` names none; ``--mac`` adds broadcast_bytes, a uint8 broadcast, which
#: is what torch's *_object collectives send (their payloads are tagged under a secret by default)
DEFAULT_OPS = OPS[:-1]
DEFAULT_SIZES = "8,1K,64K,1M,16M,64M"
DEFAULT_RANKS = "2,4"
BACKENDS = ("fsdist", "gloo")
#: ``--nodes``: fsdist's two forms side by side (groups of every rank, FSDIST_ALGO at creation)
NODE_BACKENDS = ("flat", "hier")
#: ``--mac``: fsdist as it is, with FSDIST_SECRET_FILE (payload tags on byte tensors only), and with
#: FSDIST_MAC_PAYLOADS=1 too (on every payload)
#: (groups of every rank, each made with its settings: files/seal.py Sealer)
MAC_BACKENDS = ("fsdist", "mac", "mac+payloads")

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``8``, ``1K``, ``64KiB``, ``16M`` -> bytes (binary units, as nccl-tests)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:I?B)?\s*", text.upper())
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 8, 1K, 64K, 16M)")
    return int(match.group(1)) * _UNITS[match.group(2)]


def format_size(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


@dataclass(frozen=True)
class Iterations:
    """How one cell runs: ``warmup`` untimed calls per backend, then ``rounds`` rounds of
    ``per_round`` timed calls, the backends taking turns within each round."""

    warmup: int
    per_round: int
    rounds: int = 1

    @property
    def timed(self) -> int:
        return self.per_round * self.rounds


def iterations(nbytes: int, mode: str) -> Iterations:
    """The iterations of one cell: many for small messages, few for 64 MiB.

    ``mode`` is ``default``, ``small`` (a smoke test: a handful each) or a fixed count.
    Small cells take turns in rounds: this VM's speed drifts in phases of ~0.1-1 s (a 4-rank
    8-byte all_reduce, back to back, 330-630 µs per op from one 250-op window to the next), and
    one block of fsdist followed by one of Gloo, each ~0.1 s, let the ratio swing with the
    phase either block fell in (4 ranks: 0.71-1.42× in six runs). Taking turns spreads both
    backends over the same phases.
    """
    if mode == "small":
        return Iterations(2, 3)
    if mode != "default":
        count = int(mode)
        rounds = 5 if count >= 100 and count % 5 == 0 else 1
        return Iterations(max(1, count // 10), count // rounds, rounds)
    if nbytes <= 64 << 10:
        return Iterations(20, 100, 5)
    if nbytes <= 1 << 20:
        # 50 iterations of a 1 MiB op (~25 ms) let one scheduler hiccup on a small VM set the
        # p50: all_to_all 1M measured 0.24-1.33x Gloo in four such runs, 0.84-1.43x at 300
        return Iterations(10, 50, 4)
    if nbytes <= 16 << 20:
        return Iterations(2, 12)
    return Iterations(2, 6)


@dataclass
class Plan:
    """Everything a rank needs to run its share of the benchmark (travels as JSON)."""

    ops: list[str]
    sizes: list[int]
    backends: list[str]
    iters: str = "default"
    threads: int = 0  # torch intra-op threads per rank; 0 keeps torch's default
    nodes: int = 0  # simulated nodes per world (0: one machine, as it is)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(**data)

    def cells(self) -> list[tuple[str, int]]:
        """(op, size) in run order; a barrier moves no data, so it runs once, at size 0."""
        cells: list[tuple[str, int]] = []
        for size in self.sizes:
            cells += [(op, size) for op in self.ops if op != "barrier"]
        if "barrier" in self.ops:
            cells.append(("barrier", 0))
        return cells
