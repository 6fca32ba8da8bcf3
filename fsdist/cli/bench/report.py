"""From per-rank iteration times to statistics, the ratio table, CSV, JSON and a plot.

Per iteration the slowest rank's time counts (an operation is done when its last rank is);
the median and p99 are over iterations. Beside them, the mean: the slowest rank's whole loop
over its iterations (nccl-tests' own figure), which a rank that finishes iterations unevenly
(ahead in one, behind in the next) does not inflate the way the per-iteration maximum does.
Bandwidths are in GB/s (10⁹ bytes per second).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .fscalls import KINDS, REMOTE_KINDS
from .ops import bus_factor
from .plan import format_size


@dataclass
class Row:
    """One (world, op, size, backend) cell, summarised over ranks and iterations."""

    world: int
    op: str
    nbytes: int
    backend: str
    iters: int
    p50_s: float
    p99_s: float
    mean_s: float  # the slowest rank's loop time over its iterations
    algbw_gbps: float
    busbw_gbps: float
    cpu_s_per_op: float  # CPU seconds per operation per rank (mean over ranks)
    #: filesystem calls per operation per rank (mean over ranks), by kind (fscalls.KINDS)
    fs_calls_by_kind: dict[str, float]
    verified: bool
    error: str | None
    #: the ranks' CPU-speed probes (rank.speed_probe) around this cell's rounds: slowest and fastest (0: none)
    probe_s: float = 0.0
    probe_fastest_s: float = 0.0
    #: p50 over the rounds with every rank's probe under SLOW_FACTOR × the run's fastest before
    #: and after them (``quiet_limit``), and how many rounds that was (0: none, or no probes)
    quiet_p50_s: float = 0.0
    quiet_rounds: int = 0


#: a cell is marked ``slow`` where a round's probe took this many times the run's fastest
SLOW_FACTOR = 1.4


def quiet_limit(per_rank_of_each_world: list[list[list[dict[str, Any]]]]) -> float:
    """The probe time under which a round counts as quiet: SLOW_FACTOR × the run's fastest probe
    (0 where nothing was probed). Takes every world's per-rank result lists."""
    probes = [
        p
        for per_rank in per_rank_of_each_world
        for cells in per_rank
        for cell in cells
        for p in (*cell.get("probes", []), *cell.get("probes_after", []))
    ]
    return SLOW_FACTOR * min(probes) if probes else 0.0


def _quiet_times(slowest: np.ndarray, cells: tuple[dict[str, Any], ...], limit: float) -> tuple[np.ndarray, int]:
    """The iterations of the rounds with every rank's probe under ``limit`` just before and after.

    The rounds of the two backends alternate, so quiet rounds compare them in the same fast phase
    of a machine whose Python speed drifts (rank.speed_probe); the count says how many there were."""
    probes = [(c.get("probes", []), c.get("probes_after", [])) for c in cells]
    rounds = len(probes[0][0])
    if not limit or not rounds or len(slowest) % rounds or any(len(b) != rounds or len(a) != rounds for b, a in probes):
        return slowest[:0], 0
    keep = [i for i in range(rounds) if all(b[i] < limit and a[i] < limit for b, a in probes)]
    return slowest.reshape(rounds, -1)[keep].ravel(), len(keep)


def summarise(world: int, per_rank: list[list[dict[str, Any]]], quiet_below_s: float = 0.0) -> list[Row]:
    """Combine the ranks' result lists (same cells in the same order on every rank); rounds with
    every rank's probes under ``quiet_below_s`` (``quiet_limit``) give the quiet p50."""
    rows = []
    for cells in zip(*per_rank, strict=True):
        first = cells[0]
        # an operation takes as long as its slowest rank: max over ranks, then statistics over iterations
        slowest = np.max(np.array([c["times"] for c in cells], dtype=np.float64), axis=0)
        p50 = float(np.median(slowest))
        p99 = float(np.percentile(slowest, 99, method="inverted_cdf"))  # nearest rank: a measured time
        algbw = first["nbytes"] / p50 / 1e9 if p50 > 0 else 0.0
        errors = [f"rank {r}: {c['error']}" for r, c in enumerate(cells) if c["error"]]
        probes = [p for c in cells for p in (*c.get("probes", []), *c.get("probes_after", []))]
        quiet, quiet_rounds = _quiet_times(slowest, cells, quiet_below_s)
        rows.append(
            Row(
                world=world,
                op=first["op"],
                nbytes=first["nbytes"],
                backend=first["backend"],
                iters=len(slowest),
                p50_s=p50,
                p99_s=p99,
                mean_s=max(float(np.mean(c["times"])) for c in cells),
                algbw_gbps=algbw,
                busbw_gbps=algbw * bus_factor(first["op"], world),
                cpu_s_per_op=float(np.mean([c["cpu"] for c in cells])) / max(1, len(slowest)),
                fs_calls_by_kind=_mean_counts([c.get("fs_calls", {}) for c in cells]),
                verified=not errors,
                error="; ".join(errors) or None,
                probe_s=max(probes, default=0.0),
                probe_fastest_s=min(probes, default=0.0),
                quiet_p50_s=float(np.median(quiet)) if quiet_rounds else 0.0,
                quiet_rounds=quiet_rounds,
            )
        )
    return rows


def _mean_counts(per_rank: list[dict[str, float]]) -> dict[str, float]:
    keys = dict.fromkeys(key for counts in per_rank for key in counts)
    return {key: sum(c.get(key, 0.0) for c in per_rank) / len(per_rank) for key in keys}


def _fs_total(row: Row, where: str = "") -> float:
    """Calls that reach the filesystem (on NFS, the server): doorbell wake-ups and waits are local.
    ``where``: ``""`` for the shared directory's, ``"local "`` for the node-local ones."""
    return sum(row.fs_calls_by_kind.get(where + kind, 0.0) for kind in REMOTE_KINDS)


def _by_cell(rows: list[Row]) -> dict[tuple[int, str, int], dict[str, Row]]:
    """Rows grouped by (world, op, size), each group by backend, in run order."""
    cells: dict[tuple[int, str, int], dict[str, Row]] = {}
    for row in rows:
        cells.setdefault((row.world, row.op, row.nbytes), {})[row.backend] = row
    return cells


def nodes_table(rows: list[Row], nodes: int) -> str:
    """``bench --nodes``: fsdist flat and in two tiers side by side, the shared directory's bytes
    and calls apart from the node-local ones (on NFS only the shared ones reach the server)."""
    cells = _by_cell(rows)
    header = (
        f"{'ranks':>5} {'op':<14} {'size':>5} | {'flat p50':>9} {'shared B':>9} {'calls/rank':>10}"
        f" | {'hier p50':>9} {'shared B':>9} {'calls/node':>10} {'local/rank':>10}"
        f" | {'bytes h/f':>9} {'calls h/f':>9} ok"
    )
    lines = [f"{nodes} simulated nodes: shared-directory bytes written per op (all ranks) and calls", header]
    lines.append("-" * len(header))
    for (world, op, nbytes), pair in cells.items():
        flat, hier = pair.get("flat"), pair.get("hier")
        if flat is None or hier is None:
            continue
        flat_bytes = flat.fs_calls_by_kind.get("bytes", 0.0) * world
        hier_bytes = hier.fs_calls_by_kind.get("bytes", 0.0) * world
        flat_calls = _fs_total(flat)
        hier_calls = _fs_total(hier) * world / nodes
        ratio_bytes = f"{hier_bytes / flat_bytes:9.2f}" if flat_bytes else f"{'-':>9}"
        ratio_calls = f"{hier_calls / flat_calls:9.2f}" if flat_calls else f"{'-':>9}"
        ok = "ok" if flat.verified and hier.verified else "FAILED"
        lines.append(
            f"{world:>5} {op:<14} {format_size(nbytes):>5} | {_time(flat.p50_s):>9} {_bytes(flat_bytes):>9}"
            f" {flat_calls:10.1f} | {_time(hier.p50_s):>9} {_bytes(hier_bytes):>9} {hier_calls:10.1f}"
            f" {_fs_total(hier, 'local '):10.1f} | {ratio_bytes} {ratio_calls} {ok}"
        )
    lines.append(
        "shared B = bytes written to the shared directory per op, all ranks together; calls/rank (flat) and "
        "calls/node (hier) = shared-directory filesystem calls per op; local/rank = node-local calls per op "
        "per rank; h/f = hier / flat (bytes: totals; calls: per node against per rank)"
    )
    return "\n".join(lines)


def mac_table(rows: list[Row]) -> str:
    """``bench --mac``: fsdist as it is beside its two authenticated forms, and what each costs."""
    cells = _by_cell(rows)
    header = (
        f"{'ranks':>5} {'op':<14} {'size':>5} | {'fsdist p50':>10} {'busbw':>6} | {'mac p50':>10} {'+ per op':>9}"
        f" {'busbw':>6} | {'+payloads':>10} {'+ per op':>9} {'busbw':>6} ok"
    )
    lines = [header, "-" * len(header)]
    for (world, op, nbytes), trio in cells.items():
        plain, mac, full = trio.get("fsdist"), trio.get("mac"), trio.get("mac+payloads")
        if plain is None or mac is None or full is None:
            continue
        parts = [f"{world:>5} {op:<14} {format_size(nbytes):>5}", f"{_time(plain.p50_s):>10} {plain.busbw_gbps:6.2f}"]
        for side in (mac, full):
            extra = side.p50_s - plain.p50_s
            sign = "-" if extra < 0 else "+"
            parts.append(f"{_time(side.p50_s):>10} {sign + _time(abs(extra)):>9} {side.busbw_gbps:6.2f}")
        ok = "ok" if all(r.verified for r in trio.values()) else "FAILED"
        lines.append(" | ".join(parts) + f" {ok}")
    lines.append(
        "mac = FSDIST_SECRET_FILE (a keyed BLAKE2b MAC on every record, counter and message header, and by"
        " default on the payloads of uint8 tensors: broadcast_bytes, the form of torch's pickles); +payloads ="
        " FSDIST_MAC_PAYLOADS=1 too (every 64 KiB of every tensor sent); + per op = p50 minus fsdist's"
        " (timings of one noisy machine: within a few µs is noise); busbw in GB/s"
    )
    return "\n".join(lines)


def _bytes(count: float) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}"
    return f"{count:.0f}"


def _time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def table(rows: list[Row]) -> str:
    """The side-by-side table: per cell fsdist and Gloo, and Gloo time / fsdist time."""
    cells = _by_cell(rows)
    fastest = min((r.probe_fastest_s for r in rows if r.probe_s > 0), default=0.0)
    header = (
        f"{'ranks':>5} {'op':<14} {'size':>5} | {'fsdist p50':>10} {'p99':>10} {'busbw':>6} {'cpu/op':>9}"
        f" {'fs/op':>6} | {'gloo p50':>10} {'p99':>10} {'busbw':>6} {'cpu/op':>9}"
        f" | {'speedup':>7} {'mean':>6} {'quiet':>6} ok"
    )
    lines = [header, "-" * len(header)]
    for (world, op, nbytes), pair in cells.items():
        fs, gl = pair.get("fsdist"), pair.get("gloo")
        parts = [f"{world:>5} {op:<14} {format_size(nbytes):>5}"]
        for side in (fs, gl):
            if side is None:
                parts.append(f"{'-':>10} {'-':>10} {'-':>6} {'-':>9}" + (f" {'-':>6}" if side is fs else ""))
            else:
                bw = f"{side.busbw_gbps:6.2f}" if side.busbw_gbps else f"{'-':>6}"
                fs_calls = f" {_fs_total(side):6.1f}" if side is fs else ""
                parts.append(
                    f"{_time(side.p50_s):>10} {_time(side.p99_s):>10} {bw} {_time(side.cpu_s_per_op):>9}{fs_calls}"
                )
        speedup = f"{gl.p50_s / fs.p50_s:6.2f}×" if fs and gl and fs.p50_s > 0 else f"{'-':>7}"
        by_mean = f"{gl.mean_s / fs.mean_s:5.2f}×" if fs and gl and fs.mean_s > 0 else f"{'-':>6}"
        both_quiet = fs and gl and fs.quiet_p50_s > 0 and gl.quiet_p50_s > 0  # (0: no quiet round)
        quiet = f"{gl.quiet_p50_s / fs.quiet_p50_s:5.2f}×" if fs and gl and both_quiet else f"{'-':>6}"
        ok = all(r.verified for r in pair.values())
        slow = " slow" if fastest and max(r.probe_s for r in pair.values()) >= SLOW_FACTOR * fastest else ""
        parts.append(f"{speedup} {by_mean} {quiet} {'ok' if ok else 'FAILED'}{slow}")
        lines.append(" | ".join(parts))
    lines.append(
        "speedup = Gloo p50 / fsdist p50 (> 1: fsdist faster); mean = the same for the loop's mean time per op"
        " (slowest rank); quiet = the speedup over the rounds timed while the machine ran at full speed"
        f" (every rank's probe under {SLOW_FACTOR}× the run's fastest before and after the round; - : none);"
        " busbw in GB/s; cpu/op per rank;"
        " fs/op = filesystem calls per op per rank, measured (doorbells and /proc aside: they stay on the machine)"
    )
    if fastest:
        lines.append(speed_summary(rows))
    return "\n".join(lines)


def speed_summary(rows: list[Row]) -> str:
    """Whether the machine was quiet: how the CPU-speed probe varied, and how many cells it marked.

    The acceptance of a benchmark wants a quiet machine; this says whether the run had one
    (a VM whose Python speed halves in phases is not, and small fsdist cells suffer most)."""
    probes = [r.probe_s for r in rows if r.probe_s > 0]
    fastest = min(r.probe_fastest_s for r in rows if r.probe_s > 0)
    cells = {(r.world, r.op, r.nbytes) for r in rows}
    slow = {(r.world, r.op, r.nbytes) for r in rows if r.probe_s >= SLOW_FACTOR * fastest}
    return (
        f"CPU speed (a fixed Python loop on every rank before and after each round): fastest {_time(fastest)}, "
        f"p50 of cells' slowest rounds {_time(float(np.median(probes)))}, slowest {_time(max(probes))}; "
        f"{len(slow)} of {len(cells)} cells had a round at ≥ {SLOW_FACTOR}× the fastest (marked slow)"
    )


def fs_calls_table(rows: list[Row]) -> str:
    """fsdist's filesystem calls per operation per rank, by kind (on NFS each is a round trip,
    except ``wait``: select on a doorbell FIFO, which stays on the machine)."""
    header = f"{'ranks':>5} {'op':<14} {'size':>5} | " + " ".join(f"{k:>6}" for k in KINDS) + f" | {'fs/op':>6}"
    lines = ["filesystem calls per op per rank (fsdist)", header, "-" * len(header)]
    for row in rows:
        if row.backend != "fsdist":
            continue
        counts = " ".join(f"{row.fs_calls_by_kind.get(k, 0.0):6.1f}" for k in KINDS)
        lines.append(f"{row.world:>5} {row.op:<14} {format_size(row.nbytes):>5} | {counts} | {_fs_total(row):6.1f}")
    return "\n".join(lines)


def _flat(row: Row) -> dict[str, Any]:
    """A CSV row: the per-kind filesystem calls as columns fs_<kind> and their total."""
    flat = asdict(row)
    by_kind = flat.pop("fs_calls_by_kind")
    flat["fs_calls_per_op"] = sum(by_kind.get(kind, 0.0) for kind in REMOTE_KINDS)
    flat.update({f"fs_{kind}": by_kind.get(kind, 0.0) for kind in KINDS})
    flat["fs_bytes_written_per_op"] = by_kind.get("bytes", 0.0)
    # bench --nodes: the node-local directory's apart (0 otherwise: everything counts as shared)
    flat["local_calls_per_op"] = sum(by_kind.get("local " + kind, 0.0) for kind in REMOTE_KINDS)
    flat["local_bytes_written_per_op"] = by_kind.get("local bytes", 0.0)
    return flat


def write_csv(rows: list[Row], path: str) -> None:
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(_flat(rows[0]).keys()) if rows else ["world"])
        writer.writeheader()
        for row in rows:
            writer.writerow(_flat(row))


def write_json(rows: list[Row], meta: dict[str, Any], path: str) -> None:
    with open(path, "w") as out:
        json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, out, indent=1)


def plot(rows: list[Row], path: str) -> None:
    """Bus bandwidth against size, one panel per op, a line per (backend, world)."""
    import matplotlib  # type: ignore[import-not-found,unused-ignore]  # the optional [plot] extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]

    ops = [op for op in dict.fromkeys(r.op for r in rows) if op != "barrier"]
    if not ops:
        return
    columns = min(3, len(ops))
    lines = math.ceil(len(ops) / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(5 * columns, 3.6 * lines), squeeze=False)
    for ax, op in zip(axes.flat, ops, strict=False):
        series: dict[tuple[str, int], list[Row]] = {}
        for row in rows:
            if row.op == op:
                series.setdefault((row.backend, row.world), []).append(row)
        for (backend, world), points in sorted(series.items()):
            style = "-" if backend == "fsdist" else "--"
            ax.plot([p.nbytes for p in points], [p.busbw_gbps for p in points], style, marker="o",
                    label=f"{backend} ×{world}")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(op)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(ops) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
