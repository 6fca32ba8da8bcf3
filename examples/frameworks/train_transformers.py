"""Hugging Face transformers 5 ``Trainer`` on fsdist (CPU, DDP), under fsdist's launcher:

    python -m fsdist run --nproc-per-node 2 --dir /tmp/fsdist-run-$(id -u) examples/frameworks/train_transformers.py

``TrainingArguments`` cannot name fsdist: ``--ddp_backend`` only accepts nccl, gloo, mpi, xccl,
hccl, cncl and mccl, and ``TrainingArguments(use_cpu=True, ddp_backend="fsdist")`` fails inside
accelerate ("Your assigned backend fsdist is not available, please use gloo"). The Trainer sets
itself up through accelerate, which adopts a process group that already exists: create the fsdist
group first, then ``TrainingArguments(use_cpu=True)`` without ``ddp_backend``. The Trainer then
wraps the model in DDP over the fsdist group (accelerate still *reports* ``backend=gloo``).

``use_cpu=True`` matters: without it, on a machine without an accelerator, the Trainer does not
distribute at all (each rank trains its own copy); the script checks ``parallel_mode``.

The model is a tiny GPT-2 built from its config (nothing is downloaded), trained on generated
tokens. ``--backend gloo`` runs the same training over Gloo; ``--save FILE`` keeps rank 0's final
parameters to compare.
"""

from __future__ import annotations

import tempfile
import weakref

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from _common import BATCH, check, check_released, finish, flat, parse_args


class Tokens(torch.utils.data.Dataset):
    """Generated token sequences (the labels are the inputs: causal language modelling)."""

    def __init__(self, samples: int) -> None:
        self.ids = torch.randint(0, 32, (samples, 8), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    args = parse_args(__doc__)
    # The one fsdist-specific line: the group exists before TrainingArguments sets up accelerate.
    dist.init_process_group(args.backend, init_method=args.init_method)
    world = dist.get_world_size()

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    model = GPT2LMHeadModel(config)
    initial = flat(model)
    with tempfile.TemporaryDirectory() as output_dir:  # the Trainer makes it; nothing is saved there
        training = TrainingArguments(
            output_dir=output_dir,
            use_cpu=True,  # and no ddp_backend: accelerate adopts the fsdist group
            max_steps=args.steps,
            per_device_train_batch_size=BATCH,
            learning_rate=1e-2,
            seed=0,
            ddp_find_unused_parameters=False,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
        )
        check(training.parallel_mode.name == "DISTRIBUTED", f"the Trainer is not distributed: {training.parallel_mode}")
        if dist.get_rank() == 0:
            state = training.distributed_state
            print(
                f"[rank 0] transformers: accelerate reports backend={state.backend} "
                f"num_processes={state.num_processes}; dist.get_backend()={dist.get_backend()}",
                flush=True,
            )
        check(dist.get_backend() == args.backend, f"the default group is {dist.get_backend()}, not {args.backend}")
        trainer = Trainer(model=model, args=training, train_dataset=Tokens(world * args.steps * BATCH))
        trainer.train()
    finish("transformers", trainer.model, initial, args)
    ddp = weakref.ref(trainer.model_wrapped)
    del trainer  # with it DDP, before the group goes (_common.check_released says why)
    check_released(ddp)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
