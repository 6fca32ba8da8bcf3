"""Profile fsdist's collectives with torch.profiler, as one would Gloo's.

Every operation appears in the trace as one ``fsdist:<op>`` event (``fsdist:all_reduce``,
``fsdist:send``; Gloo's are ``gloo:<op>``), from the call until the operation completed, with its
tensors' shapes. An async all_reduce's event spans the compute it overlapped.

    python -m fsdist run --nproc-per-node 2 --dir /tmp/fsdist-profile examples/profile_collectives.py

Writes ``trace-rank<N>.json`` (open it in https://ui.perfetto.dev or chrome://tracing) in the
current folder, or in PROFILE_DIR (made if missing), and prints rank 0's table of events.
"""

import os

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

dist.init_process_group("fsdist")
rank, world = dist.get_rank(), dist.get_world_size()
grads = torch.randn(1 << 20)  # 4 MiB, like a DDP bucket
weights = torch.randn(1000, 1000)
out = [torch.empty(1000) for _ in range(world)]

with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    for step in range(3):
        with record_function(f"step {step}"):
            dist.all_reduce(torch.ones(1000))
            dist.broadcast(weights[0], src=0)
            dist.all_gather(out, weights[rank])
            if rank == 0:
                dist.send(weights[1], dst=1)
            elif rank == 1:
                dist.recv(weights[1], src=0)
            work = dist.all_reduce(grads, async_op=True)  # overlapped with compute
            with record_function("compute"):
                weights @ weights
            work.wait()

folder = os.environ.get("PROFILE_DIR", ".")
os.makedirs(folder, exist_ok=True)
trace = os.path.join(folder, f"trace-rank{rank}.json")
prof.export_chrome_trace(trace)
assert os.path.getsize(trace) > 0, f"torch wrote no trace to {trace}"
if rank == 0:
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="cpu_time_total", row_limit=20))

# the check: one event per call, each async all_reduce's outlasting the matmul it overlapped
events = [e for e in prof.events() if e.name.startswith("fsdist:")]
counts = {name: sum(e.name == name for e in events) for name in {e.name for e in events}}
p2p = {"fsdist:send": 3} if rank == 0 else {"fsdist:recv": 3} if rank == 1 else {}
assert counts == {"fsdist:all_reduce": 6, "fsdist:broadcast": 3, "fsdist:all_gather": 3, **p2p}, counts
big = [e for e in events if e.name == "fsdist:all_reduce" and e.input_shapes == [[1 << 20]]]
computes = [e for e in prof.events() if e.name == "compute"]
assert len(big) == 3 and all(b.time_range.start <= c.time_range.start for b, c in zip(big, computes, strict=True)), (
    "each async all_reduce is issued before its compute"
)
print(f"rank {rank}: {sum(counts.values())} fsdist events in {trace}", flush=True)
dist.destroy_process_group()
