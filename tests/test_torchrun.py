"""torchrun --rdzv-backend=fsdist: agents and workers meet through the directory alone."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import os, torch, torch.distributed as dist
dist.init_process_group("fsdist", init_method="fsdist://")
t = torch.ones(2) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} got {t.tolist()}", flush=True)
dist.destroy_process_group()
"""


def test_torchrun_with_the_fsdist_rendezvous_backend(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    endpoint = f"--rdzv-endpoint={tmp_path / 'run'}"
    # torchrun's agent otherwise makes (and never removes) a torchelastic_* log folder in TMPDIR
    logs = f"--log-dir={tmp_path / 'logs'}"
    command = [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend=fsdist", endpoint, logs,
               "--rdzv-id=job1", "--nnodes=1", "--nproc-per-node=2", str(script)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("got [3.0, 3.0]") == 2, result.stdout
