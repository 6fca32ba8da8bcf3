"""Training cases run inside rank processes: DDP, FSDP2 and DTensor against single-process references."""

from __future__ import annotations

import torch
import torch.distributed as dist

STEPS = 20
BATCH = 8  # per rank


def _model() -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 1000 + rank)
    return torch.randn(BATCH, 6, generator=g, dtype=torch.float64), torch.randn(
        BATCH, 3, generator=g, dtype=torch.float64
    )


def _reference(world: int) -> list[torch.Tensor]:
    """One process, the summed batch of every rank (mean loss over ranks): what DDP must match."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(model(x), y) for x, y in (_batch(step, r) for r in range(world)))
        (loss / world).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def ddp_matches_reference(variant: str) -> float:
    """Max abs difference between DDP-over-fsdist parameters and the reference after 20 steps."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    kwargs = {"bucket_cap_mb": 0.0001}  # many buckets: async all_reduces overlap backward
    if variant == "static_graph":
        kwargs["static_graph"] = True
    if variant == "unused":
        kwargs["find_unused_parameters"] = True
    if variant == "bucket_view":
        kwargs["gradient_as_bucket_view"] = True
    ddp = DistributedDataParallel(_model(), **kwargs)
    if variant == "fp16_hook":
        ddp.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    if variant == "bf16_hook":
        ddp.register_comm_hook(dist.group.WORLD, _bf16_compress_on_cpu)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = _batch(step, rank)
        opt.zero_grad()
        if variant == "no_sync" and step % 2 == 0:
            with ddp.no_sync():  # accumulate locally, then sync on the next step
                torch.nn.functional.mse_loss(ddp(x), y).backward()
            x, y = _batch(step + 100, rank)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    if variant == "no_sync":
        return 0.0 if _replicas_identical(ddp.module) else 1.0
    ref = _reference(world)
    return max((p.detach() - r).abs().max().item() for p, r in zip(ddp.module.parameters(), ref, strict=True))


def ddp_matches_gloo() -> float:
    """Max abs difference between the parameters of DDP over fsdist (the world group) and over
    Gloo (a group of every rank beside it), after the same 20 steps of the same data."""
    from torch.nn.parallel import DistributedDataParallel

    gloo = dist.new_group(backend="gloo")
    trained = []
    try:
        for group in (dist.group.WORLD, gloo):
            ddp = DistributedDataParallel(_model(), process_group=group, bucket_cap_mb=0.0001)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
            for step in range(STEPS):
                x, y = _batch(step, dist.get_rank())
                opt.zero_grad()
                torch.nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
            trained.append([p.detach().clone() for p in ddp.module.parameters()])
            # DDP's reducer goes before its group, on every rank: its destructor waits on the
            # group's work, and one left for the garbage collector after the Gloo group was
            # destroyed once hung a rank in C++ (3 ranks, the whole suite on 2 cores)
            del ddp, opt
            dist.barrier(group=group)
    finally:
        dist.destroy_process_group(gloo)
    fsdist, by_gloo = trained
    return max((a - b).abs().max().item() for a, b in zip(fsdist, by_gloo, strict=True))


def _bf16_compress_on_cpu(
    process_group: dist.ProcessGroup, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's bf16_compress_hook under another name: torch refuses that name unless NCCL is
    present, though the hook itself (compress, async all_reduce, ``then`` decompress) is generic."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import _compress_hook

    return _compress_hook(torch.bfloat16, process_group, bucket)


# DDP checks a hook's annotations as objects; `from __future__ import annotations` made them strings
_bf16_compress_on_cpu.__annotations__ = {
    "process_group": dist.ProcessGroup,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}


def _replicas_identical(model: torch.nn.Module) -> bool:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    copies = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, flat)
    return all(torch.equal(c, flat) for c in copies)


def _fsdp2_model() -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    model = _model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def fsdp2_matches_reference() -> float:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = _fsdp2_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = _batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    full = [p.full_tensor().detach() for p in model.parameters()]
    return max((p - r).abs().max().item() for p, r in zip(full, _reference(world), strict=True))


def checkpoint_round_trip(directory: str) -> float:
    """Save an FSDP2-sharded model with torch.distributed.checkpoint, load it into a fresh one.

    Returns the max difference between the loaded full parameters and the trained ones (0 when
    every shard came back) plus 1.0 if the fresh model had not differed before loading.
    """
    import torch.distributed.checkpoint as dcp

    rank = dist.get_rank()
    model = _fsdp2_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = _batch(0, rank)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()  # the saved weights differ from the seeded initial ones
    trained = [p.full_tensor().detach().clone() for p in model.parameters()]
    dcp.save({"model": model.state_dict()}, checkpoint_id=directory)
    fresh = _fsdp2_model()
    unchanged = all(torch.equal(p.full_tensor(), t) for p, t in zip(fresh.parameters(), trained, strict=True))
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=directory)
    fresh.load_state_dict(state["model"])
    loaded = [p.full_tensor().detach() for p in fresh.parameters()]
    return max((a - b).abs().max().item() for a, b in zip(loaded, trained, strict=True)) + float(unchanged)


def dtensor_1d_mesh() -> float:
    """Row-sharded matmul, a reduction and a redistribute on a 1-D mesh of every rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    g = torch.Generator().manual_seed(11)
    a = torch.randn(12, 5, generator=g, dtype=torch.float64)
    b = torch.randn(5, 3, generator=g, dtype=torch.float64)
    da = distribute_tensor(a, mesh, [Shard(0)])
    db = distribute_tensor(b, mesh, [Replicate()])
    out = (da @ db).redistribute(mesh, [Replicate()]).to_local()
    column = distribute_tensor(a, mesh, [Shard(1)]).full_tensor()
    return max((out - a @ b).abs().max().item(), (da.sum().full_tensor() - a.sum()).abs().item(),
               (column - a).abs().max().item())  # fmt: skip


def dtensor_2x2_matmul() -> float:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    g = torch.Generator().manual_seed(7)
    a = torch.randn(8, 6, generator=g, dtype=torch.float64)
    b = torch.randn(6, 4, generator=g, dtype=torch.float64)
    da = distribute_tensor(a, mesh, [Shard(0), Shard(1)])
    db = distribute_tensor(b, mesh, [Replicate(), Shard(0)])
    out = (da @ db).full_tensor()
    summed = da.sum().full_tensor()
    return max((out - a @ b).abs().max().item(), (summed - a.sum()).abs().item())


def object_collectives() -> list[str]:
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "text": "x" * rank})
    if gathered != [{"rank": r, "text": "x" * r} for r in range(world)]:
        failures.append(f"all_gather_object {gathered}")
    objs = [f"from root {rank}", 42] if rank == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0)
    if objs != ["from root 0", 42]:
        failures.append(f"broadcast_object_list {objs}")
    out: list[object] = [None]
    dist.scatter_object_list(out, [f"for {r}" for r in range(world)] if rank == 0 else None, src=0)
    if out != [f"for {rank}"]:
        failures.append(f"scatter_object_list {out}")
    got = [None] * world if rank == 0 else None
    dist.gather_object(rank * 10, got, dst=0)
    if rank == 0 and got != [r * 10 for r in range(world)]:
        failures.append(f"gather_object {got}")
    return failures
