"""Reduce operations as in-place torch kernels, and which (op, dtype) pairs are defined.

Every rank validates the same (op, dtype) before any communication, so an unsupported
combination raises the same clear error on every rank instead of a hang.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import torch

__all__ = ["ReduceKind", "Reduction", "check_supported", "combine_into", "combine_to", "finish"]


class ReduceKind(Enum):
    SUM = "sum"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"
    PREMUL_SUM = "premul_sum"

    # members are singletons: identity hashing is correct, and C-level (Enum's hashes the name
    # in Python, ~0.3 µs on every kernel lookup and set test of a small operation)
    __hash__ = object.__hash__


@dataclass(frozen=True)
class Reduction:
    """A reduce op with its PREMUL_SUM factor (a float or a one-element tensor)."""

    kind: ReduceKind
    factor: float | torch.Tensor | None = None

    def __str__(self) -> str:
        return self.kind.name


_BITWISE = {ReduceKind.BAND, ReduceKind.BOR, ReduceKind.BXOR}
_ORDERED = {ReduceKind.MIN, ReduceKind.MAX}
_SCALED = {ReduceKind.AVG, ReduceKind.PREMUL_SUM}

#: The one kernel of each op: ``kernel(first, second, out=out)`` computes ``first (op) second``.
#: The same operand order on every rank gives bit-identical results.
_KERNEL: dict[ReduceKind, Callable[..., torch.Tensor]] = {
    ReduceKind.SUM: torch.add,
    ReduceKind.AVG: torch.add,
    ReduceKind.PREMUL_SUM: torch.add,
    ReduceKind.PRODUCT: torch.mul,
    ReduceKind.MIN: torch.minimum,
    ReduceKind.MAX: torch.maximum,
    ReduceKind.BAND: torch.bitwise_and,
    ReduceKind.BOR: torch.bitwise_or,
    ReduceKind.BXOR: torch.bitwise_xor,
}


def check_supported(reduction: Reduction, dtype: torch.dtype) -> None:
    """Raise ``ValueError`` naming the pair if ``reduction`` is not defined on ``dtype``."""
    problem = _problem(reduction.kind, dtype)
    if problem:
        raise ValueError(f"fsdist: reduce op {reduction.kind.name} is not supported for dtype {dtype}: {problem}")


@functools.cache
def _problem(kind: ReduceKind, dtype: torch.dtype) -> str | None:
    """Why ``kind`` is not defined on ``dtype`` (None: it is), worked out once per pair."""
    integral = not (dtype.is_floating_point or dtype.is_complex)
    problem = None
    if kind in _BITWISE and not integral:
        problem = "bitwise ops need an integer or bool dtype"
    elif kind in _ORDERED and dtype.is_complex:
        problem = "complex numbers have no order"
    elif kind in _SCALED and dtype == torch.bool:
        problem = "bool cannot be scaled"
    elif kind is ReduceKind.PREMUL_SUM and integral:
        problem = "PREMUL_SUM needs a floating-point or complex dtype"
    return problem if problem is not None else _kernel_problem(kind, dtype)


@functools.cache
def _kernel_problem(kind: ReduceKind, dtype: torch.dtype) -> str | None:
    """Try the op's kernels on one element: torch's CPU kernels miss some dtypes (uint16/32/64
    cannot add, complex32 cannot divide, ...). Finding out here, before any communication,
    beats failing in the middle of a collective on some ranks only."""
    with warnings.catch_warnings():  # complex32 warns that it is experimental
        warnings.simplefilter("ignore")
        acc, other = torch.ones(1, dtype=dtype), torch.ones(1, dtype=dtype)
    try:
        combine_into(Reduction(kind, 1.0), acc, other)
        finish(Reduction(kind, 1.0), acc, 2)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        return f"torch has no CPU kernel for it ({str(exc).splitlines()[0]})"
    return None


def combine_into(reduction: Reduction, acc: torch.Tensor, other: torch.Tensor) -> None:
    """``acc <- acc (op) other`` in place."""
    _KERNEL[reduction.kind](acc, other, out=acc)


def combine_to(reduction: Reduction, first: torch.Tensor, second: torch.Tensor, out: torch.Tensor) -> None:
    """``out <- first (op) second``; ``out`` may be ``second`` (saves a copy, keeps the order)."""
    _KERNEL[reduction.kind](first, second, out=out)


def finish(reduction: Reduction, acc: torch.Tensor, world_size: int) -> None:
    """Apply the final scaling of AVG (divide by the world size) and PREMUL_SUM (the factor).

    PREMUL_SUM scales the sum instead of each input: equal up to rounding, and one pass
    instead of N. Integer AVG truncates toward zero, as NCCL does.
    """
    if reduction.kind is ReduceKind.AVG:
        if acc.dtype.is_floating_point or acc.dtype.is_complex:
            acc.div_(world_size)
        else:
            acc.div_(world_size, rounding_mode="trunc")
    elif reduction.kind is ReduceKind.PREMUL_SUM:
        factor = reduction.factor
        if factor is None:
            raise ValueError("PREMUL_SUM needs a factor")
        acc.mul_(factor.reshape(()).to(acc.dtype) if isinstance(factor, torch.Tensor) else factor)
