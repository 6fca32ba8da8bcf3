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
_BYTES = re.compile(r"^\s*bytes:\s+(\d+(?:\s+\d+){5,})")
#: the "bytes:" line's fields kept (nfs_iostat's order: normal read, normal write, direct read,
#: direct write, server read, server write, ...): what crossed the wire, whichever way it was read
BYTES_READ, BYTES_WRITTEN = "bytes read from server", "bytes written to server"


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
        counted = _BYTES.match(line)
        if counted:
            fields = [int(x) for x in counted.group(1).split()]
            current[BYTES_READ], current[BYTES_WRITTEN] = fields[4], fields[5]
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


def is_bytes(name: str) -> bool:
    """A byte count (mountstats' "bytes:" line), not an RPC: reported in MiB, not in totals."""
    return name.startswith("bytes ")


def _fmt(x: float | None) -> str:
    return "–" if x is None else (f"{x:.2f}" if x < 100 else f"{x:.0f}")


def summary(records: list[dict[str, object]]) -> str:
    """One markdown table per (version, source, kind): RPCs per op per rank by type, and the total."""
    out: list[str] = []
    for label, source, kind in _kinds(records):
        rates = per_rank(records, label, source, kind) or {}
        unit = "second" if kind.startswith("idle") else "op"
        out.append(f"{label}, {source}, {kind}: RPCs per {unit} per rank")
        calls = {op: v for op, v in rates.items() if not is_bytes(op)}
        for op in sorted(calls, key=lambda o: -calls[o]):
            out.append(f"  {op:<28} {_fmt(calls[op])}")
        out.append(f"  {'total':<28} {_fmt(sum(calls.values()))}")
        for op in sorted(set(rates) - set(calls)):
            out.append(f"  {op:<28} {rates[op] / 2**20:.2f} MiB")
    return "\n".join(out)


def _trace_only(label: str, key: str, nfs_ops: set[str]) -> str | None:
    """The row name of a histogram key the mounts' counters do not show, None for an NFS op they do.

    Keys are "rpc vN NAME" (or "PROG vN NAME"): within the NFS v3 phase version 4 is NLM (lockd)
    and NAMEs of NFS's own version that mountstats lacks are NFSACL's; within the v4 phase
    version 1 is the server's callbacks to its clients.
    """
    _, version, name = key.split(" ", 2)
    nfs_version = "v4" if label.startswith("NFS v4") else "v3"
    if version == nfs_version and name in nfs_ops:
        return None
    if nfs_version == "v3" and version == "v4":
        return f"NLM {name} (lockd)"
    if nfs_version == "v4" and version == "v1":
        return f"{name} (server→client callback)"
    return f"{key} (not in mountstats)"


def merged(records: list[dict[str, object]], label: str, kind: str) -> dict[str, float]:
    """Per op per rank: the NFS ops from mountstats, plus the RPCs only the histogram saw (NLM, callbacks)."""
    out = dict(per_rank(records, label, "mountstats", kind) or {})
    for key, value in (per_rank(records, label, "trace", kind) or {}).items():
        name = _trace_only(label, key, set(out))
        if name is not None:
            out[name] = out.get(name, 0.0) + value
    return out


def compare(before: list[dict[str, object]], after: list[dict[str, object]]) -> str:
    """Markdown, a table per NFS version: RPCs per op per rank by type, before, after, after/before.

    Each kind of op gets its columns (idle: RPCs per second per rank); rows are the NFS ops the
    mounts counted, then the RPCs only the trace histogram saw (marked), then the totals.
    """
    out: list[str] = []
    labels = list(dict.fromkeys(str(r["label"]) for r in before + after))
    kinds = list(dict.fromkeys(str(r["kind"]) for r in before + after))
    for label in labels:
        b = {k: merged(before, label, k) for k in kinds}
        a = {k: merged(after, label, k) for k in kinds}
        head, rule = "| RPC type |", "|---|"
        for k in kinds:
            unit = "per s" if k.startswith("idle") else "per op"
            head += f" {k} {unit}: before | after | after/before |"
            rule += "--:|--:|--:|"
        out += [f"\n{label}: RPCs per rank\n", head, rule]
        names: dict[str, float] = {}
        for k in kinds:
            for side in (a[k], b[k]):
                for name, v in side.items():
                    if not is_bytes(name):  # (RPCs only: byte counts are in the summary)
                        names[name] = max(names.get(name, 0.0), v)
        ordered = sorted(names, key=lambda n: ("(" in n, -names[n]))
        nfs_rows = [n for n in ordered if "(" not in n]
        extra_rows = [n for n in ordered if "(" in n]
        rows: list[tuple[str, list[str] | None]] = [(n, None) for n in nfs_rows + extra_rows]
        rows += [("**total NFS ops (mountstats)**", nfs_rows), ("**total, every RPC**", nfs_rows + extra_rows)]
        for title, members in rows:
            row = f"| {title} |"
            for k in kinds:
                if members is None:
                    vb, va = b[k].get(title), a[k].get(title)
                else:
                    vb = sum(b[k].get(m, 0.0) for m in members) if b[k] else None
                    va = sum(a[k].get(m, 0.0) for m in members) if a[k] else None
                ratio = f"{va / vb:.2f}" if va is not None and vb else "–"
                row += f" {_fmt(vb)} | {_fmt(va)} | {ratio} |"
            out.append(row)
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
