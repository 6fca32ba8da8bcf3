"""Give collectives contiguous CPU tensors, and copy results back where they belong.

CUDA tensors are staged through host memory (pinned when CUDA is available, so the copies can
use DMA); non-contiguous CPU tensors go through a contiguous copy. Everything that was staged
as an output is copied back by ``finish``.
"""

from __future__ import annotations

import torch

__all__ = ["Staging", "check_stageable"]


def check_stageable(tensor: torch.Tensor) -> None:
    """Refuse, in the calling thread and before any communication, what no file can carry."""
    if tensor.layout != torch.strided:
        raise NotImplementedError(
            f"fsdist moves dense (strided) tensors only, not {tensor.layout}: convert with .to_dense() first"
        )
    if tensor.is_meta:
        raise ValueError("fsdist cannot communicate a tensor on the 'meta' device: it holds no data")


class Staging:
    """Collects the staged copies of one operation."""

    def __init__(self) -> None:
        self._copy_back: list[tuple[torch.Tensor, torch.Tensor]] = []

    def input(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous CPU tensor with ``tensor``'s values (``tensor`` itself when it is one)."""
        if _ready(tensor):
            return tensor
        host = _host_buffer(tensor)
        host.copy_(tensor)
        return host

    def output(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous CPU tensor whose final values ``finish`` copies into ``tensor``."""
        if _ready(tensor):
            return tensor
        host = _host_buffer(tensor)
        self._copy_back.append((tensor, host))
        return host

    def inout(self, tensor: torch.Tensor) -> torch.Tensor:
        """Both: staged with its values, copied back after."""
        if _ready(tensor):
            return tensor
        host = self.input(tensor)
        self._copy_back.append((tensor, host))
        return host

    def finish(self) -> None:
        for original, host in self._copy_back:
            original.copy_(host)
        if any(original.is_cuda for original, _ in self._copy_back):
            torch.cuda.current_stream().synchronize()
        self._copy_back.clear()


def _ready(tensor: torch.Tensor) -> bool:
    return tensor.is_cpu and tensor.is_contiguous() and not tensor.is_conj()


def _host_buffer(tensor: torch.Tensor) -> torch.Tensor:
    pin = tensor.is_cuda and torch.cuda.is_available()
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
