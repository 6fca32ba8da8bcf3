"""torch's own tools on fsdist, run inside rank processes: the profiler, ``_get_backend`` and
``device_id=``, ``torch.distributed._dist2``, ``monitored_barrier``."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from datetime import timedelta
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

import fsdist
from fsdist.c10d import compat

N = 1000


def _events(trace: str) -> list[dict[str, Any]]:
    """The complete ('X') events of a chrome trace, with end times, in start order."""
    with open(trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    for event in events:
        event["end"] = event["ts"] + event["dur"]
    return sorted(events, key=lambda e: e["ts"])


def profiled_operations(trace_dir: str, shaped: bool = True) -> dict[str, Any]:
    """Profile one call of each kind (every call inside a user scope ``call:<op>``) and an async
    all_reduce overlapped with a matmul; export the chrome trace and return what the parent checks.

    The async all_reduce cannot complete before rank 0's matmul ended: rank 1 enters it only after
    a message rank 0 sends once its matmul is done. So its event must outlast the matmul's.
    ``shaped=False`` takes the route a torch without TorchScript gets (no input shapes)."""
    saved = list(compat._CONTINUATION)
    if not shaped:
        compat.disable_shaped_records()
    try:
        rank = dist.get_rank()
        x = torch.arange(N, dtype=torch.float32)
        gathered = [torch.empty(N) for _ in range(dist.get_world_size())]
        token = torch.zeros(3, dtype=torch.int64)
        a = torch.randn(300, 300)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            with record_function("call:all_reduce"):
                dist.all_reduce(x)
            with record_function("call:broadcast"):
                dist.broadcast(x, 0)
            with record_function("call:all_gather"):
                dist.all_gather(gathered, x)
            with record_function("call:send_recv"):
                dist.send(token, 1) if rank == 0 else dist.recv(token, 0)
            with record_function("call:barrier"):
                dist.barrier()
            big = torch.ones(1 << 18)
            if rank == 0:
                work = dist.all_reduce(big, async_op=True)
                with record_function("compute"):
                    for _ in range(3):
                        a = a @ a / 300
                dist.send(token, 1)  # rank 1 joins the all_reduce only after this
            else:
                dist.recv(token, 0)
                work = dist.all_reduce(big, async_op=True)
            work.wait()
        trace = os.path.join(trace_dir, f"trace-{'shaped' if shaped else 'plain'}-{rank}.json")
        prof.export_chrome_trace(trace)
        events = _events(trace)
        return {
            "fsdist": [
                {k: e.get(k) for k in ("name", "ts", "end", "tid")} | {"dims": e.get("args", {}).get("Input Dims")}
                for e in events
                if e["name"].startswith("fsdist:")
            ],
            "scopes": {e["name"]: (e["ts"], e["end"]) for e in events if e["name"].startswith(("call:", "compute"))},
            "value": x[:3].tolist(),
            "async_value": float(big[0]),
        }
    finally:
        compat._CONTINUATION[:] = saved


def backends_per_device() -> dict[str, Any]:
    """What c10d's per-device questions get from the world group and a subgroup."""
    from torch.distributed.distributed_c10d import _get_object_coll_device, _get_pg_default_device

    world = dist.group.WORLD
    sub = dist.new_group([0, 1])
    answers: dict[str, Any] = {}
    for name, group in (("world", world), ("sub", sub)):
        answers[name] = {
            "cpu_is_self": group._get_backend(torch.device("cpu")) is group,
            "cuda_is_self": group._get_backend(torch.device("cuda", 0)) is group,
            "name": group._get_backend(torch.device("cpu")).name(),
            "splitting": group._get_backend(torch.device("cpu")).supports_splitting,
            "devices": [str(d) for d in group._device_types],
            "object_device": _get_object_coll_device(group),
        }
    answers["default_device"] = str(_get_pg_default_device(world))
    try:
        world._get_backend(torch.device("meta"))
        answers["meta"] = "no error"
    except RuntimeError as exc:
        answers["meta"] = str(exc)
    dist.destroy_process_group(sub)
    return answers


@contextmanager
def _one_cuda_device():
    """torch's accelerator checks in ``init_process_group(device_id=)`` answered as on a one-GPU
    machine, so a CPU build takes the same path through c10d up to the backend."""
    with (
        mock.patch("torch.accelerator.current_accelerator", return_value=torch.device("cuda")),
        mock.patch("torch.accelerator.device_count", return_value=1),
    ):
        yield


def device_id_init(directory: str, rank: int, world: int) -> dict[str, Any]:
    """``init_process_group("fsdist", device_id=cuda:0)``, torch's recommended GPU recipe: torch
    binds the device, asks the group's backend for it, and later ops and subgroups use the binding."""
    with _one_cuda_device():
        dist.init_process_group(
            "fsdist", init_method=f"fsdist://{directory}", rank=rank, world_size=world,
            device_id=torch.device("cuda", 0), timeout=timedelta(seconds=60),
        )  # fmt: skip
        try:
            world_group = dist.group.WORLD
            x = torch.ones(4) * (rank + 1)
            dist.all_reduce(x)
            sub = dist.new_group(list(range(world)))
            dist.all_reduce(x, group=sub)
            dist.barrier()  # torch passes the bound device in the barrier's options
            # (torch binds the device on the group it made before the backend's: a Python group
            # replaces it, so bound_device_id stays None, and torch takes its unbound paths)
            return {
                "bound": str(world_group.bound_device_id),
                "backend": world_group._get_backend(torch.device("cuda", 0)).name(),
                "value": x.tolist(),
                "sub_backend": dist.get_backend(sub),
            }
        finally:
            dist.destroy_process_group()


def dist2_groups(directory: str, rank: int, world: int, outer_first: bool) -> dict[str, Any]:
    """``torch.distributed._dist2.new_group("fsdist", ...)`` twice through ``env://`` with
    FSDIST_DIR set (as under ``fsdist run``), beside a world group; shut down in either order."""
    import torch.distributed._dist2 as dist2

    os.environ.update(FSDIST_DIR=directory, RANK=str(rank), WORLD_SIZE=str(world))
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)
    dist.init_process_group("fsdist", timeout=timedelta(seconds=60))
    first = dist2.new_group("fsdist", timedelta(seconds=60), "cpu")
    second = dist2.new_group("fsdist", timedelta(seconds=60), torch.device("cpu"))
    x = torch.ones(3) * (rank + 1)
    first.allreduce([x]).wait()
    second.allreduce([x]).wait()
    dist.all_reduce(x)
    with dist2.process_group(second):
        current = dist2.current_process_group() is second
    if outer_first:
        dist.destroy_process_group()
    y = torch.ones(2)
    first.allreduce([y]).wait()  # still running after the world group is gone (or beside it)
    second.shutdown()
    first.shutdown()
    if not outer_first:
        dist.destroy_process_group()
    try:
        dist2.new_group("fsdist", timedelta(seconds=5), "meta")
        meta = "no error"
    except ValueError as exc:
        meta = str(exc)
    return {"value": x.tolist(), "y": y.tolist(), "current": current, "name": first.getBackendName(), "meta": meta}


def second_rendezvous_in_own_directory(directory: str) -> str:
    """fsdist's rendezvous called again in the directory where this process's world group runs
    (not through a handler, which would nest it): refused by name, the running group untouched."""
    from fsdist.errors import RendezvousError
    from fsdist.job.rendezvous import rendezvous

    try:
        rendezvous(directory, dist.get_rank(), dist.get_world_size(), timedelta(seconds=10))
        answer = "no error"
    except RendezvousError as exc:
        answer = str(exc)
    x = torch.ones(2)
    dist.all_reduce(x)  # the world group still runs
    return f"{answer} | {x.tolist()}"


def monitored_barriers(absent: int) -> dict[str, str]:
    """Two monitored barriers every rank passes, then one that rank ``absent`` never calls."""
    outcome = {}
    fsdist.monitored_barrier(timeout=timedelta(seconds=20))
    fsdist.monitored_barrier(timeout=timedelta(seconds=20), wait_all_ranks=True)
    dist.group.WORLD.monitored_barrier(timedelta(seconds=20))  # torch's name on the group, as its tests call it
    outcome["passed"] = "yes"
    if dist.get_rank() != absent:
        try:
            fsdist.monitored_barrier(timeout=timedelta(seconds=1))
            outcome["error"] = "no error"
        except RuntimeError as exc:
            outcome["error"] = str(exc)
    return outcome


def monitored_barrier_all_ranks(absent: tuple[int, ...]) -> str:
    if dist.get_rank() in absent:
        return "absent"
    try:
        fsdist.monitored_barrier(timeout=timedelta(seconds=1), wait_all_ranks=True)
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return "no error"


def monitored_barrier_zero_timeout() -> str:
    """torch's test_monitored_barrier_gloo_rank_0_timeout: rank 0 alone, with no time at all."""
    if dist.get_rank() != 0:
        return "not called"
    try:
        dist.group.WORLD.monitored_barrier(timedelta(seconds=0))
    except RuntimeError as exc:
        return str(exc)
    return "no error"
