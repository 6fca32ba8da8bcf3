"""RPC counts of the NFS VM check (make test-nfs): read, subtract, and tabulate them.

Two sources, both the kernel's own counters (no dependency beyond the standard library):

- ``/proc/self/mountstats``: per NFS mount, the "per-op statistics" section, one line per
  operation, ``\tGETATTR: 123 123 0 ...`` whose first number is the operations issued. These are
  the NFS program's RPCs only: on NFS v3 the locks go to lockd (NLM), a separate RPC program
  that mountstats does not show.
- the ``sunrpc:rpc_request`` trace event with a histogram trigger (guest.sh sets it), keyed by
  procedure and program version: every RPC any client in the VM starts, so NLM's LOCK/UNLOCK on
  NFS v3 (lockd's version 4: "rpc v4 LOCK" in the v3 phase) and the server's callbacks to its v4
  clients, too. (The program's name is no key: two string keys overflow the histogram's key.)

rpc_count.py prints one ``RPC {json}`` line per measured window and counter; ``summary`` makes a
table of one run's lines, ``compare`` one of two runs' (before and after) with the ratio.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Mapping

MOUNTSTATS = "/proc/self/mountstats"
TRACE_HIST = "/sys/kernel/tracing/events/sunrpc/rpc_request/hist"

_DEVICE = re.compile(r"^device (\S+) mounted on (\S+) with fstype (\S+)")
_OP = re.compile(r"^\s*([A-Z_0-9]+):\s+(\d+)\b")


def parse_mountstats(text: str) -> dict[str, dict[str, int]]:
    """{mount point: {operation: operations issued}} for every NFS mount in a mountstats text."""
    mounts: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    in_ops = False
    for line in text.splitlines():
        device = _DEVICE.match(line)
        if device:
            current = mounts.setdefault(device.group(2), {}) if device.group(3) in ("nfs", "nfs4") else None
            in_ops = False
            continue
        if current is None:
            continue
        if line.strip() == "per-op statistics":
            in_ops = True
            continue
        op = _OP.match(line) if in_ops else None
        if op:
            current[op.group(1)] = int(op.group(2))
    return mounts


def mount_ops(mount_point: str, path: str = MOUNTSTATS) -> dict[str, int]:
    """Operations issued so far through one NFS mount (KeyError: no NFS mount there)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_mountstats(f.read())[mount_point]


def parse_hist(text: str) -> dict[str, int]:
    """{"rpc v3 GETATTR": hits, ...} from the rpc_request histogram ("lockd v4 LOCK" if keyed by progname)."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"^\{(.*)\}\s*hitcount:\s*(\d+)", line.strip())
        if not m:
            continue
        keys = dict(part.split(":", 1) for part in m.group(1).split(",") if ":" in part)
        keys = {k.strip(): v.strip() for k, v in keys.items()}
        name = f"{keys.get('progname', 'rpc')} v{keys.get('version', '?')} {keys.get('procname', '?')}"
        counts[name] = counts.get(name, 0) + int(m.group(2))
    return counts


def trace_counts(path: str = TRACE_HIST) -> dict[str, int] | None:
    """Every RPC started in this kernel so far, by program/version/procedure; None without the trigger."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_hist(f.read())
    except OSError:
        return None


def delta(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """The counts that grew between two readings (a counter absent before counts from 0)."""
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


# ---- tables -------------------------------------------------------------------------------------


def read_records(lines: Iterable[str]) -> list[dict[str, object]]:
    """The ``RPC {json}`` lines of a guest log or result file."""
    return [json.loads(line[4:]) for line in lines if line.startswith("RPC {")]


def per_rank(records: list[dict[str, object]], label: str, source: str, kind: str) -> dict[str, float] | None:
    """RPCs per op (per second for idle windows) per rank, by type, summed over the mounts measured.

    Each record carries its delta, the ops (or seconds) in the window and the ranks it covers
    (those on its mount for mountstats, all of them for the trace histogram).
    """
    chosen = [r for r in records if r["label"] == label and r["source"] == source and r["kind"] == kind]
    if not chosen:
        return None
    out: dict[str, float] = {}
    ranks = sum(int(str(r["ranks"])) for r in chosen)
    units = float(str(chosen[0]["units"]))
    for r in chosen:
        counts = r["delta"]
        assert isinstance(counts, dict)
        for op, n in counts.items():
            out[op] = out.get(op, 0.0) + n / (units * ranks)
    return out


def _kinds(records: list[dict[str, object]]) -> list[tuple[str, str, str]]:
    seen: dict[tuple[str, str, str], None] = {}
    for r in records:
        seen[(str(r["label"]), str(r["source"]), str(r["kind"]))] = None
    return list(seen)


def _fmt(x: float | None) -> str:
    return "–" if x is None else (f"{x:.2f}" if x < 100 else f"{x:.0f}")


def summary(records: list[dict[str, object]]) -> str:
    """One markdown table per (version, source, kind): RPCs per op per rank by type, and the total."""
    out: list[str] = []
    for label, source, kind in _kinds(records):
        rates = per_rank(records, label, source, kind) or {}
        unit = "second" if kind.startswith("idle") else "op"
        out.append(f"{label}, {source}, {kind}: RPCs per {unit} per rank")
        for op in sorted(rates, key=lambda o: -rates[o]):
            out.append(f"  {op:<28} {_fmt(rates[op])}")
        out.append(f"  {'total':<28} {_fmt(sum(rates.values()))}")
    return "\n".join(out)


def compare(before: list[dict[str, object]], after: list[dict[str, object]]) -> str:
    """Markdown: per (version, source, kind), RPCs per op per rank by type, before, after, after/before."""
    out: list[str] = []
    for label, source, kind in _kinds(before + after):
        b = per_rank(before, label, source, kind) or {}
        a = per_rank(after, label, source, kind) or {}
        unit = "second" if kind.startswith("idle") else "op"
        out += [
            f"\n{label}, {source}, {kind} (RPCs per {unit} per rank)\n",
            "| type | before | after | after/before |",
            "|---|--:|--:|--:|",
        ]
        ops = sorted(set(a) | set(b), key=lambda o: -max(a.get(o, 0.0), b.get(o, 0.0)))
        for op in [*ops, "total"]:
            vb = sum(b.values()) if op == "total" else b.get(op)
            va = sum(a.values()) if op == "total" else a.get(op)
            ratio = f"{va / vb:.2f}" if va is not None and vb else "–"
            name = "**total**" if op == "total" else op
            out.append(f"| {name} | {_fmt(vb)} | {_fmt(va)} | {ratio} |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "summary":
        with open(argv[1], encoding="utf-8") as f:
            print(summary(read_records(f)))
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        with open(argv[1], encoding="utf-8") as f, open(argv[2], encoding="utf-8") as g:
            print(compare(read_records(f), read_records(g)))
        return 0
    print("usage: mountstats.py summary RESULT | compare BEFORE_RESULT AFTER_RESULT", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
