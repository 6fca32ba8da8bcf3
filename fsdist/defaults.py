"""Every tunable default and environment variable name in one place."""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta

#: The name torch knows the backend by (``init_process_group("fsdist")``) and its init scheme's.
BACKEND_NAME = "fsdist"
#: The devices whose tensors fsdist moves (CUDA ones staged through host memory).
DEVICES = ("cpu", "cuda")
#: Device types (comma-separated, e.g. ``cpu`` or ``cpu,cuda``) for which fsdist becomes torch's
#: default backend at ``import torch``: ``init_process_group()`` with no backend,
#: ``init_device_mesh("cpu", ...)`` and libraries that ask torch for "the CPU backend" then get
#: fsdist, with no port (``fsdist.make_default`` does the same from code).
ENV_DEFAULT_FOR = "FSDIST_DEFAULT_FOR"
#: Environment variable naming the shared run directory (``init_method="fsdist://"``).
ENV_DIR = "FSDIST_DIR"
#: Collective algorithms of a group spread over nodes: ``hier`` (two tiers: node-local
#: directories, and one leader per node in the shared one), ``flat`` (every rank in the shared
#: directory), or ``auto`` (the default: hier where the group spans ≥ 2 nodes and some node
#: holds ≥ 2 of its ranks).
ENV_ALGO = "FSDIST_ALGO"
#: Set to ``1`` for per-operation debug logs (``TORCH_DISTRIBUTED_DEBUG=DETAIL`` works too).
ENV_DEBUG = "FSDIST_DEBUG"

#: ``env://`` (torch's default init method) meets through FSDIST_DIR when that is set; set this
#: to ``torch`` for torch's own TCPStore at MASTER_ADDR:MASTER_PORT instead.
ENV_ENV_INIT = "FSDIST_ENV_INIT"
#: Where a job whose ranks all run on one machine keeps its files when the store c10d handed
#: the backend names no shared directory (a TCPStore, a HashStore): default /dev/shm.
ENV_LOCAL_DIR = "FSDIST_LOCAL_DIR"


def local_dir() -> str:
    """This node's directory for node-local files: FSDIST_LOCAL_DIR, else /dev/shm (memory),
    else the temporary directory."""
    return os.environ.get(ENV_LOCAL_DIR) or ("/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir())


#: This rank's node (machine) identity; by default the kernel's boot id and pid namespace.
#: Tests and containers that share a kernel set it to behave as separate machines.
ENV_NODE_ID = "FSDIST_NODE_ID"
#: A rank that joins through a torch store checks that it sees the generation rank 0 created
#: in the run directory; a shared filesystem shows it at once under the lock, so after this
#: long the directory is declared not shared.
SHARED_DIR_GRACE_SECONDS = 5.0
#: A rank waiting for its peers in the directory says who it still waits for this often; a
#: launcher (fsdist run) waiting for the other nodes' launchers says so after LAUNCH_NOTE_SECONDS
#: first (its ranks have not even started: nothing else tells the user why nothing happens).
RENDEZVOUS_NOTE_SECONDS = 30.0
LAUNCH_NOTE_SECONDS = 5.0

#: torch's own default for non-NCCL process groups.
DEFAULT_TIMEOUT = timedelta(minutes=30)

#: Set to ``1`` to start even where ranks on different clients (hosts or mounts) of the run
#: directory's filesystem would not exclude each other's locks (see docs/filesystems.md).
ENV_ALLOW_UNSAFE_FS = "FSDIST_ALLOW_UNSAFE_FS"

#: Waiting: spin this long re-checking at once (not for a peer whose doorbell wakes this rank),
#: then sleep with doubling pauses up to the cap.
#: The cap bounds both the wake-up latency of a long wait and the CPU a blocked rank burns.
SPIN_SECONDS = 50e-6
#: A peer that wakes this rank, where every rank of the group on this machine has a core of its
#: own: busy-wait this long for its wake-up before sleeping. A sleeping (virtual) CPU takes 50-100
#: µs to wake, more than a small operation's whole cost, and a spinning waiter steals no CPU
#: that a peer needs when there are cores enough. The spin reads the doorbell, not the record.
WAKE_SPIN_SECONDS = 300e-6
FIRST_SLEEP_SECONDS = 20e-6
MAX_SLEEP_SECONDS = 2e-3
#: A look at a peer on another client (files/pacing.py ``Pacing``): how many recent waits the
#: guess of when the peer arrives comes from (their median: one late arrival, a slow first
#: operation, moves it little); the weight of each wait in the first-look hit rate, below which
#: the first look is skipped, and every how many such waits one looks at half the guess first
#: instead; a peer found there before PACING_SOONER of the guess starts the guess again from it.
#: On a virtual clock (tests/test_waiting.py) a peer arriving 5-80 ms into each wait is found in
#: 1.35-1.5 looks a wait, 2-7 ms after it arrived; looks as fast as the server answers cost 5-80.
PACING_HISTORY = 8
#: A peer found by the look at the guessed time is taken to have come at this fraction of it: the
#: guess keeps seeking the earliest time the peer is there. Without it two ranks waiting for each
#: other across clients can hold each other late: each one's look at its guess delays its next
#: step, which the other then learns as the time to look (the NFS VM: 2 ranks on v4.2 settled at
#: 102 ms per all_reduce, 13 ms on v3, 20 ms with the smoothed guess before).
PACING_EARLIER = 0.9
PACING_WEIGHT = 0.25
PACING_SKIP_BELOW = 0.2
PACING_PROBE_EVERY = 8
PACING_SOONER = 0.6
#: A wait that has lasted this long sleeps up to LONG_SLEEP_SECONDS between polls, and beyond
#: that up to LONG_WAIT_FRACTION of the wait so far (at most LONGEST_SLEEP_SECONDS): a peer on
#: this machine wakes the waiter anyway, so only a peer on another machine is noticed later (by
#: at most an eighth of the wait), and on NFS, where each look is a READ, a rank blocked for
#: seconds costs a few READs a second, not 100 (its health checks are spaced alike).
LONG_WAIT_SECONDS = 0.1
LONG_SLEEP_SECONDS = 10e-3
LONG_WAIT_FRACTION = 0.125
LONGEST_SLEEP_SECONDS = 1.0
#: A wait woken by its peer's doorbell looks anyway after LONG_SLEEP_SECONDS without a wake-up
#: (one lost to a full pipe, or sent before the pipe existed), then after pauses doubling up to
#: WOKEN_MAX_SLEEP_SECONDS: a safety net. Where each look is a READ of the server (direct
#: records: NFS), it starts at WOKEN_REMOTE_SLEEP_SECONDS instead: the NFS VM's barrier, whose
#: ranks wait ~0.1 s for rank 0, spent half a READ per rank per op on these looks.
WOKEN_MAX_SLEEP_SECONDS = 80e-3
WOKEN_REMOTE_SLEEP_SECONDS = 40e-3
#: A busy fcntl lock is retried at once for this long (a healthy holder keeps it for microseconds),
#: then with doubling pauses from FIRST_SLEEP_SECONDS up to LOCK_MAX_SLEEP_SECONDS, and up to
#: LONG_SLEEP_SECONDS once the wait lasted LONG_WAIT_SECONDS. `fsdist bench locks`, 8 processes
#: on 2 cores: a 2 ms cap let one waiter lose for 110 ms; 0.5 ms: 31 ms (blocking F_SETLKW: 45).
LOCK_SPIN_SECONDS = 100e-6
LOCK_MAX_SLEEP_SECONDS = 0.5e-3
#: ...and a wait with nothing to judge its holder by (no group health check) fails after this
#: long: the holder is stopped or stalled, and would otherwise keep the waiter forever.
LOCK_TIMEOUT_SECONDS = 120.0
#: How often a long wait also checks the abort marker and whether its peers are alive.
HEALTH_CHECK_SECONDS = 0.1
#: Each rank raises its heartbeat counter every fifth of the heartbeat timeout, at most this
#: often: 2 s under the default timeout, 0.4 s under a 2 s one. On NFS a beat is a round trip
#: to the server, and an idle rank costs nothing else (issue 33: at most 1 RPC a second).
HEARTBEAT_SECONDS = 2.0
HEARTBEAT_BEATS_PER_TIMEOUT = 5
#: ...and a peer on another machine whose counter stalls this long is declared dead.
HEARTBEAT_TIMEOUT_SECONDS = 10.0
ENV_HEARTBEAT_TIMEOUT = "FSDIST_HEARTBEAT_TIMEOUT"
#: ``fsdist status`` names a rank behind the others only once they have waited this long for it:
#: a healthy job's ranks stand a collective apart for a moment at every step.
STRAGGLER_AFTER_SECONDS = 1.0

#: A rank deletes its own collective files once every peer has moved past them; it checks at
#: most every this many collectives, so the directory holds a bounded number of files.
GC_EVERY = 8
#: A rank that never waits (a broadcast root, a reduce non-root) stops this many operations
#: ahead of its slowest peer until that peer catches up: its unread files stay bounded.
RUN_AHEAD = 64
#: ...and before a file that would take its uncollected files past this many bytes it waits
#: for readers to finish earlier operations' files (transport/outbox.py ``make_room``).
GC_BYTES = 32 << 20
#: Reusing retired message files (local filesystems only; FSDIST_REUSE_FILES=0 turns it off,
#: =1 forces it on): at most this many per rank and group, for messages of at least this size
#: (smaller ones travel in the records): even a small fresh file costs a create and an unlink
#: more than a rewrite (docs/benchmarks.md, "spares from 8 KiB").
ENV_REUSE_FILES = "FSDIST_REUSE_FILES"
#: How a group's state records are read and written: ``locked`` (every access under the file's
#: fcntl lock), ``direct`` (O_DIRECT on kept descriptors, no lock: one writer per record, readers
#: check), ``auto`` (the default: ``direct`` for the shared directory of a job across clients
#: where the job measures that a direct write on one client is read at once on another,
#: job/io_choice.py; else ``locked``). Set alike on every rank: a difference fails the job's start.
ENV_IO = "FSDIST_IO"
#: How long a reader of a direct record keeps reading again while what it reads is torn by the
#: writer's write (a write takes microseconds, one round trip on NFS): past it, the record is
#: damaged, not torn, and its check's error goes up.
TORN_READ_SECONDS = 1.0
REUSE_FILES = 4
REUSE_MIN_BYTES = 8192
#: On those same filesystems, a reduction reads a peer's part of at least this size straight
#: from a private mapping of its file instead of copying it into a buffer first.
MAP_MIN_BYTES = 256 << 10
#: Sends are buffered, up to this many messages per destination not yet received.
MAX_UNRECEIVED_SENDS = 256
#: On local filesystems a point-to-point message of up to RING_MESSAGE_MAX bytes that does not
#: fit a record slot goes into the sender's ring file for its receiver (transport/rings.py), of
#: RING_BYTES (sparse: pages are allocated as written, so a pair that never sends one costs none).
RING_BYTES = 2 << 20
RING_MESSAGE_MAX = 512 << 10
#: A collective message between INLINE_MAX and this goes into its rank's ring file (outbox.py)
#: with where it lies in a record slot; larger ones stay files, whose large parts reductions map.
COLLECTIVE_RING_MAX = MAP_MIN_BYTES - 1

#: Tensors of at least this many bytes, in groups of 3 or more ranks, use the slice-parallel
#: all_reduce (reduce-scatter + all-gather through files); the rest use one round where every
#: rank reads every input (with 2 ranks slicing saves nothing: each reads one input either way).
ALLREDUCE_SLICED_MIN_BYTES = 256 * 1024
#: Groups of at least this many ranks all_reduce messages of at most DOUBLING_MAX_BYTES, and
#: hold barriers, by recursive doubling (collectives/doubling.py): log2 N rounds, each one record
#: write and one read per rank, instead of one write and N − 1 reads. (At 4 ranks the two cost
#: the same calls; from 5 on doubling costs fewer, and its rounds wait for one peer each.)
DOUBLING_MIN_RANKS = 4
DOUBLING_MAX_BYTES = 1024
#: ... but all_reduces of such messages in groups of ROOTED_MIN_RANKS up to
#: ALLREDUCE_DOUBLING_MIN_RANKS − 1 ranks on one client go through rank 0 (why, and why not
#: barriers or groups across clients: collectives/rooted.py). From 32 ranks on rank 0's N − 1
#: reads in a row outgrow doubling's log2 N rounds (a judgment: 32 ranks on this 2-core machine
#: measure nothing).
ROOTED_MIN_RANKS = 4
ALLREDUCE_DOUBLING_MIN_RANKS = 32

#: torch intra-op threads of fsdist's own tensor work: a group's worker thread, and a caller's
#: thread while it runs an operation itself (c10d/intraop.py: set per thread through OpenMP, so
#: nobody else's thread count changes). Several ranks share a machine's cores, and OpenMP
#: workers that spin after each copy or reduction steal them from the peers: one thread per
#: rank, as Gloo reduces, measured 2.5× faster for a 1 MiB all_reduce on 2 cores.
ENV_REDUCE_THREADS = "FSDIST_REDUCE_THREADS"
REDUCE_THREADS = int(os.environ.get(ENV_REDUCE_THREADS, "1"))

#: Who may share a job's files: by default this user alone (directories 0700, files 0600, under
#: any umask). Ranks that run as several users name the Unix group they share (a name or a
#: number; every such user must be in it): directories are then 2770 and in that group, files
#: 0660, and what another member of that group made is adopted too (files/trust.py). A
#: primary group is often everyone's, so the group is named, never implied.
ENV_GROUP = "FSDIST_GROUP"
#: A file of 16-4096 secret bytes that every rank can read and nobody else can: every record,
#: message header, store value and rendezvous record then carries a keyed MAC instead of a bare
#: CRC-32, so an item forged or altered by anyone without the secret (root on another NFS
#: client, say) is refused (files/seal.py). Off by default.
ENV_SECRET_FILE = "FSDIST_SECRET_FILE"
#: With FSDIST_SECRET_FILE, which message payloads carry tags (each 64 KiB): unset, those of byte
#: tensors (the pickles of torch's *_object collectives); ``1`` every payload; ``0`` none (warned).
ENV_MAC_PAYLOADS = "FSDIST_MAC_PAYLOADS"
#: The switch that preceded FSDIST_GROUP (group access for the primary group): refused, naming
#: its replacement.
ENV_GROUP_ACCESS = "FSDIST_GROUP_ACCESS"

#: Collective messages whose encoding fits a state record's inline slot (state_record.INLINE_MAX,
#: ~2 KiB) travel inside the sender's record: one locked write instead of creating, renaming,
#: opening and later unlinking a file. Set to ``0`` to send every message as a file (to compare).
ENV_INLINE = "FSDIST_INLINE"
INLINE = os.environ.get(ENV_INLINE, "1") != "0"
#: A synchronous operation of at most this many bytes (inputs and outputs) runs on its caller's
#: thread when nothing is queued before it: no hand-off to the group's worker and back, whose
#: two thread wake-ups cost a 64 KiB all_reduce about half its time (docs/design.md). Larger ones
#: wake the worker at once, so an async one starts without waiting for the worker's next look
#: (an async one of this size or less, its caller not waiting, starts within 1-10 ms:
#: HANDOFF_SECONDS, the worker's look backing off to 10 ms; above 4 MiB the hand-off is noise).
INLINE_RUN_BYTES = 4 << 20
#: Such an operation that its caller has not waited for after this long (an ``async_op=True``
#: one) is taken by the worker. The worker is not woken for it, only looks this often.
HANDOFF_SECONDS = 1e-3

# ---- variables fsdist sets for the processes it starts, and those it reads of others ----------

#: Set by ``fsdist run`` for each rank: the launcher's pid (a rank whose launcher died stops) and
#: the file a failing rank writes its first error to (cli/run_rank.py).
ENV_LAUNCHER_PID = "FSDIST_LAUNCHER_PID"
ENV_ERROR_FILE = "FSDIST_ERROR_FILE"
#: Set by ``fsdist bench`` for each rank: where it reports each cell as it finishes.
ENV_BENCH_PROGRESS = "FSDIST_BENCH_PROGRESS"
#: What SLURM sets for each task (``srun``): fsdist's defaults for ``--nnodes``, ``--node-rank``,
#: and ``fsdist://``'s rank and world size.
ENV_SLURM_NNODES, ENV_SLURM_JOB_NUM_NODES, ENV_SLURM_NODEID = "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_NODEID"
ENV_SLURM_PROCID, ENV_SLURM_NTASKS = "SLURM_PROCID", "SLURM_NTASKS"
