"""A rank run as a plain script, so a test can start it inside its own pid namespace.

A process in another pid namespace has another machine id: to its peers it is "on another
host", whose liveness only its heartbeat can tell.

    python other_machine_rank.py DIR RANK WORLD [NUMEL]
Prints "ready" after 20 all_reduces (each checked), then loops until an error, which it prints
as "error <time.time()> <type>: <message>".
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import fsdist  # noqa: F401


def main() -> None:
    directory, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    numel = int(sys.argv[4]) if len(sys.argv) > 4 else 10  # 16384 floats: messages travel as files
    dist.init_process_group(
        "fsdist", init_method=f"fsdist://{directory}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    step = 0
    try:
        while True:
            t = torch.ones(numel)
            dist.all_reduce(t)
            if t[0].item() != world:
                raise AssertionError(f"all_reduce of ones gave {t[0].item()}, not {world}")
            step += 1
            if step == 20:
                print("ready", flush=True)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        print(f"error {time.time()} {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    main()
