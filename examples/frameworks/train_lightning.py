"""PyTorch Lightning 2.6 on fsdist (CPU, 2 devices, DDP). Either Lightning starts the second rank:

    python examples/frameworks/train_lightning.py

or fsdist's launcher starts both (Lightning sees LOCAL_RANK and starts nothing):

    python -m fsdist run --nproc-per-node 2 --dir /tmp/fsdist-run-$(id -u) examples/frameworks/train_lightning.py

The only change from a Gloo script is the backend string in ``DDPStrategy`` (and, under SLURM, the
cluster environment: see ``plugins`` below). Lightning creates the group itself with
``init_process_group(backend, rank=, world_size=)``, i.e. torch's ``env://``: under its own
launcher through a TCPStore at MASTER_ADDR:MASTER_PORT (fsdist then keeps its files on this
machine, in FSDIST_LOCAL_DIR or /dev/shm); under ``fsdist run`` through the run directory
(FSDIST_DIR), with no port.

``--backend gloo`` runs the same training over Gloo; ``--save FILE`` keeps rank 0's final
parameters to compare. Nothing else is written: no logger, no checkpoint.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from lightning import LightningModule, Trainer
from lightning.pytorch.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy

from _common import BATCH, finish, flat, make_data, make_model, parse_args


class Regression(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_model()

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    args = parse_args(__doc__, init_method=False)
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", 2))  # fsdist run sets it; Lightning's launcher does not
    num_nodes = int(os.environ.get("WORLD_SIZE", devices)) // devices
    # Under `srun ... fsdist run` Lightning would detect SLURM and take each launcher's SLURM task id
    # for the ranks' ids; LightningEnvironment reads LOCAL_RANK and GROUP_RANK, which fsdist run sets.
    plugins = [LightningEnvironment()] if "FSDIST_DIR" in os.environ else []
    module = Regression()
    initial = flat(module.net)
    trainer = Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=num_nodes,
        strategy=DDPStrategy(process_group_backend=args.backend),  # "gloo" in a Gloo script
        plugins=plugins,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = torch.utils.data.DataLoader(make_data(devices * num_nodes, args.steps), batch_size=BATCH)
    trainer.fit(module, data)
    finish("lightning", module.net, initial, args)
    dist.destroy_process_group()  # Lightning leaves the group up; destroying it leaves the directory clean


if __name__ == "__main__":
    main()
