"""Hugging Face accelerate 1.16 on fsdist (CPU, DDP), under fsdist's launcher:

    python -m fsdist run --nproc-per-node 2 --dir /tmp/fsdist-run-$(id -u) examples/frameworks/train_accelerate.py

accelerate refuses every backend but gloo and mpi on CPU (``Accelerator(cpu=True)`` with
``InitProcessGroupKwargs(backend="fsdist")`` raises "Your assigned backend fsdist is not available,
please use gloo"), but it adopts a process group that already exists. So: create the fsdist group
first, then ``Accelerator(cpu=True)`` without a backend. accelerate then *reports*
``backend=gloo`` (its ``state.backend``) while every collective goes through the fsdist group:
``dist.get_backend()`` says "fsdist". This script prints both and checks the latter.

With no ``--init-method`` the group is made through torch's ``env://``, which fsdist serves through
the run directory under ``fsdist run`` (``--init-method fsdist://`` says so explicitly).
``--backend gloo`` runs the same training over Gloo (under ``fsdist run`` fsdist serves Gloo's
``env://`` too, unless FSDIST_ENV_INIT=torch with MASTER_ADDR/MASTER_PORT); ``--save FILE`` keeps
rank 0's final parameters to compare.
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from accelerate import Accelerator

from _common import BATCH, check, check_released, finish, flat, make_data, make_model, parse_args


def main() -> None:
    args = parse_args(__doc__)
    # The one fsdist-specific line: the group exists before accelerate looks for one.
    dist.init_process_group(args.backend, init_method=args.init_method)
    accelerator = Accelerator(cpu=True)
    if accelerator.is_main_process:
        print(
            f"[rank 0] accelerate reports backend={accelerator.state.backend} "
            f"distributed_type={accelerator.distributed_type} num_processes={accelerator.num_processes}; "
            f"dist.get_backend()={dist.get_backend()}",
            flush=True,
        )
    check(dist.get_backend() == args.backend, f"the default group is {dist.get_backend()}, not {args.backend}")
    check(accelerator.num_processes == dist.get_world_size(), "accelerate did not adopt the whole group")

    model = make_model()
    initial = flat(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(make_data(dist.get_world_size(), args.steps), batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # DDP over the fsdist group
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    finish("accelerate", accelerator.unwrap_model(model), initial, args)
    ddp = weakref.ref(model)
    accelerator.free_memory()  # drops accelerate's references to DDP ...
    del model, optimizer, loss  # ... and ours, before the group goes (_common.check_released says why)
    check_released(ddp)
    accelerator.end_training()  # destroys the process group: the run directory is left clean


if __name__ == "__main__":
    main()
