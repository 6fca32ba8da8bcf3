"""Inputs and expected results computed in the test, independently of fsdist's own kernels.

Each rank can generate every rank's input (seeded by case and rank), so it checks its own
output against a reference computed locally in float64/int64.
"""

from __future__ import annotations

import functools
import hashlib
import operator

import torch
import torch.distributed as dist

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "PREMUL_SUM"]
PREMUL_FACTOR = 0.5
LARGE = 1 << 19

#: (label, shape, make the tensor a non-contiguous view)
SHAPES = [
    ("0-d", (), False),
    ("empty", (0,), False),
    ("one", (1,), False),
    ("1000", (1000,), False),
    ("non-contiguous", (6, 8), True),
    ("large", (LARGE,), False),
]


def supported(op: str, dtype: torch.dtype, all_reduce: bool = False) -> bool:
    """What torch defines (mirrors NCCL/Gloo docs); the test's own table, not fsdist's.

    torch's own ``all_reduce`` views complex tensors as real pairs and so refuses PRODUCT on them
    before the backend sees the call; ``reduce`` and ``reduce_scatter`` pass complex through.
    """
    if all_reduce and dtype.is_complex and op == "PRODUCT":
        return False
    integral = not (dtype.is_floating_point or dtype.is_complex)
    if op in ("BAND", "BOR", "BXOR"):
        return integral
    if op in ("MIN", "MAX"):
        return not dtype.is_complex
    if op == "AVG":
        return dtype != torch.bool
    if op == "PREMUL_SUM":
        return not integral
    return True


def reduce_op(op: str) -> dist.ReduceOp:
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    return getattr(dist.ReduceOp, op)


def make_input(seed: int, rank: int, shape: tuple[int, ...], dtype: torch.dtype, op: str = "SUM") -> torch.Tensor:
    """Rank ``rank``'s input for case ``seed``: the same on every rank that asks.

    Floating and complex values are drawn in float32 and then converted: torch's float64
    ``randn`` is ~6× slower here, and drawing inputs was most of the collectives suite's time.
    float64 and complex128 values are then scaled by a factor with bits far below float32's, so
    that their sums round (a few float32 values add exactly in float64, and a rank reducing in
    another order would go unseen).
    """
    g = torch.Generator().manual_seed(seed * 7919 + rank * 104729 + 17)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g, dtype=torch.uint8).bool()
    if dtype.is_complex:
        parts = torch.randn((*shape, 2), generator=g)
        if op == "PRODUCT":
            parts = parts * 0.3 + torch.tensor([1.0, 0.0])
        return _past_float32(torch.view_as_complex(parts).to(dtype))
    if dtype.is_floating_point:
        if op == "PRODUCT":
            return _past_float32((0.5 + torch.rand(shape, generator=g)).to(dtype))
        return _past_float32(torch.randn(shape, generator=g).to(dtype))
    if op == "PRODUCT":
        return torch.randint(1, 3, shape, generator=g, dtype=dtype)
    low = 0 if dtype == torch.uint8 else -50
    return torch.randint(low, 50, shape, generator=g, dtype=dtype)


#: 1 + 2⁻²⁰/3: its bits go on to the end of a float64's mantissa
_WIDEN = 1 + 2**-20 / 3


def _past_float32(values: torch.Tensor) -> torch.Tensor:
    """float64/complex128 values with bits past float32's (others as they are)."""
    return values * _WIDEN if values.dtype in (torch.float64, torch.complex128) else values


def non_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """The same values in a transposed (non-contiguous) view."""
    return tensor.t().contiguous().t() if tensor.dim() == 2 else tensor


def reduce_reference(inputs: list[torch.Tensor], op: str) -> torch.Tensor:
    dtype = inputs[0].dtype
    world = len(inputs)
    if dtype == torch.bool:
        stacked = torch.stack(inputs)
        if op in ("SUM", "MAX", "BOR"):
            return stacked.any(0)
        if op in ("PRODUCT", "MIN", "BAND"):
            return stacked.all(0)
        return functools.reduce(operator.xor, inputs)
    wide = torch.complex128 if dtype.is_complex else torch.float64 if dtype.is_floating_point else torch.int64
    xs = [x.to(wide) for x in inputs]
    if op in ("SUM", "AVG", "PREMUL_SUM"):
        result = functools.reduce(operator.add, xs)
    elif op == "PRODUCT":
        result = functools.reduce(operator.mul, xs)
    elif op == "MIN":
        result = functools.reduce(torch.minimum, xs)
    elif op == "MAX":
        result = functools.reduce(torch.maximum, xs)
    else:
        result = functools.reduce({"BAND": operator.and_, "BOR": operator.or_, "BXOR": operator.xor}[op], xs)
    if op == "PREMUL_SUM":
        result = result * PREMUL_FACTOR
    if op == "AVG":
        if wide == torch.int64:  # integer AVG: wrapped sum, truncated division (as NCCL)
            return torch.div(result.to(dtype), world, rounding_mode="trunc")
        result = result / world
    return result.to(dtype)


def mismatch(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """None if equal (within the dtype's rounding), else a short description."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return f"got {actual.dtype}{list(actual.shape)}, expected {expected.dtype}{list(expected.shape)}"
    tolerances = {
        torch.float16: (1e-2, 1e-2),
        torch.bfloat16: (5e-2, 1e-1),
        torch.float32: (1e-5, 1e-5),
        torch.complex64: (1e-5, 1e-5),
    }
    if torch.equal(actual, expected):  # most results are exact; assert_close is ~10× slower
        return None
    rtol, atol = tolerances.get(
        actual.dtype, (1e-12, 1e-12) if actual.dtype.is_floating_point or actual.dtype.is_complex else (0, 0)
    )
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as exc:
        return str(exc).splitlines()[0] + " " + " ".join(str(exc).split())[:300]
    return None


def digest(tensor: torch.Tensor) -> str:
    flat = tensor.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return hashlib.sha1(raw).hexdigest()[:16]
