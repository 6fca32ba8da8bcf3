"""Every tunable default and environment variable name in one place."""

from __future__ import annotations

import os
from datetime import timedelta

#: Environment variable naming the shared run directory (``init_method="fsdist://"``).
ENV_DIR = "FSDIST_DIR"
#: Set to ``1`` for per-operation debug logs (``TORCH_DISTRIBUTED_DEBUG=DETAIL`` works too).
ENV_DEBUG = "FSDIST_DEBUG"

#: torch's own default for non-NCCL process groups.
DEFAULT_TIMEOUT = timedelta(minutes=30)

#: Set to ``1`` to start even where ranks on different clients (hosts or mounts) of the run
#: directory's filesystem would not exclude each other's locks (see docs/filesystems.md).
ENV_ALLOW_UNSAFE_FS = "FSDIST_ALLOW_UNSAFE_FS"

#: Waiting: spin this long re-checking at once, then sleep with doubling pauses up to the cap.
#: The cap bounds both the wake-up latency of a long wait and the CPU a blocked rank burns.
SPIN_SECONDS = 50e-6
FIRST_SLEEP_SECONDS = 20e-6
MAX_SLEEP_SECONDS = 2e-3
#: How often a long wait also checks the abort marker and whether its peers are alive.
HEALTH_CHECK_SECONDS = 0.1
#: Each rank raises its heartbeat counter this often...
HEARTBEAT_SECONDS = 1.0
#: ...and a peer on another machine whose counter stalls this long is declared dead.
HEARTBEAT_TIMEOUT_SECONDS = 10.0
ENV_HEARTBEAT_TIMEOUT = "FSDIST_HEARTBEAT_TIMEOUT"

#: A rank deletes its own collective files once every peer has moved past them; it checks at
#: most every this many collectives, so the directory holds a bounded number of files.
GC_EVERY = 8
#: A rank that never waits (a broadcast root, a reduce non-root) stops this many operations
#: ahead of its slowest peer until that peer catches up: its unread files stay bounded.
RUN_AHEAD = 64
#: Sends are buffered, up to this many messages per destination not yet received.
MAX_UNRECEIVED_SENDS = 256

#: Messages bigger than this use the slice-parallel all_reduce (reduce-scatter + all-gather
#: through files); smaller ones use one round where every rank reads every input.
ALLREDUCE_SLICED_MIN_BYTES = 256 * 1024

#: File and directory modes: private to the user unless they opt into group access by
#: setting FSDIST_GROUP_ACCESS=1 (ranks running as different users of one group).
ENV_GROUP_ACCESS = "FSDIST_GROUP_ACCESS"
_GROUP = os.environ.get(ENV_GROUP_ACCESS, "") not in ("", "0")
DIR_MODE = 0o770 if _GROUP else 0o700
FILE_MODE = 0o660 if _GROUP else 0o600
