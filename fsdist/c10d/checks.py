"""Argument checks of the ProcessGroup methods, before any communication.

Each check depends only on the call's own arguments and the group's shape, so every rank of a
bad call raises the same ``ValueError`` before it touches a file: the group stays usable (torch's
tests call, catch, and go on), and no rank waits for a peer that already gave up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .staging import check_stageable

__all__ = ["exactly_one", "peer", "root", "same", "same_list", "split_even", "splits"]


def root(rank: int, size: int) -> int:
    """``rank`` if it is a rank of a group of ``size``."""
    if not 0 <= rank < size:
        raise ValueError(f"root rank {rank} is outside the group of size {size}")
    return rank


def peer(other: int, verb: str, rank: int, size: int) -> None:
    """A point-to-point partner must be another rank of the group."""
    if not 0 <= other < size:
        raise ValueError(f"cannot {verb} rank {other}: it is outside the group's ranks 0..{size - 1}")
    if other == rank:
        raise ValueError(f"rank {other} cannot {verb} itself")


def same(tensor: torch.Tensor, like: torch.Tensor, name: str) -> None:
    """``tensor`` can stand in for ``like``: stageable, same dtype and element count."""
    check_stageable(tensor)
    if tensor.numel() != like.numel() or tensor.dtype != like.dtype:
        got, expected = f"{tensor.dtype} {list(tensor.shape)}", f"{like.dtype} {list(like.shape)}"
        raise ValueError(f"{name}: tensor {got} does not match {expected}")


def same_list(tensors: Sequence[torch.Tensor], like: torch.Tensor, size: int, name: str) -> None:
    """One tensor per rank, each like ``like``."""
    if len(tensors) != size:
        raise ValueError(f"{name}: expected a list of {size} tensors, got {len(tensors)}")
    for tensor in tensors:
        same(tensor, like, name)


def exactly_one(items: Sequence[Any], name: str) -> Sequence[Any]:
    """c10d passes lists for multi-device calls; fsdist, like Gloo on CPU, takes one per rank."""
    if len(items) != 1:
        raise ValueError(f"{name}: fsdist takes exactly one tensor (list) per rank, got {len(items)}")
    return items


def split_even(tensor: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """``tensor`` flattened into ``parts`` views (all empty when it is)."""
    flat = tensor.view(-1)
    return list(flat.chunk(parts)) if flat.numel() else [flat] * parts


def splits(tensor: torch.Tensor, sizes: list[int], parts: int, name: str) -> list[int]:
    """all_to_all_single's row counts per rank: as given, or even when none are."""
    rows = tensor.shape[0] if tensor.dim() else 1
    if not sizes:
        if rows % parts:
            raise ValueError(f"all_to_all_single: {name} has {rows} rows, not divisible by {parts} ranks")
        return [rows // parts] * parts
    if len(sizes) != parts or sum(sizes) != rows:
        raise ValueError(f"all_to_all_single: {name} splits {sizes} must be {parts} sizes summing to {rows}")
    return list(sizes)
