"""Shared pieces of operator definitions: type checks, broadcasting, axis handling."""

from __future__ import annotations

from typing import Optional, Sequence

from ..ir.errors import AttrError
from ..ir.types import Any, TensorType, Type, is_float
from .registry import type_error


def tensor_arg(op: str, arg_types: Sequence[Type], i: int) -> TensorType:
    """Argument ``i`` as a TensorType, or a clear error naming the op."""
    t = arg_types[i]
    if not isinstance(t, TensorType):
        raise type_error(op, arg_types, f"argument {i} must be a tensor, got {t!r}")
    return t


def tensor_args(op: str, arg_types: Sequence[Type]) -> list[TensorType]:
    return [tensor_arg(op, arg_types, i) for i in range(len(arg_types))]


def same_dtype(op: str, arg_types: Sequence[Type]) -> str:
    ts = tensor_args(op, arg_types)
    dtypes = {t.dtype for t in ts}
    if len(dtypes) > 1:
        raise type_error(op, arg_types, f"dtypes differ ({', '.join(sorted(dtypes))}); insert a cast")
    return ts[0].dtype


def float_arg(op: str, arg_types: Sequence[Type], i: int) -> TensorType:
    t = tensor_arg(op, arg_types, i)
    if not is_float(t.dtype):
        raise type_error(op, arg_types, f"argument {i} must be a floating-point tensor, got {t.dtype}")
    return t


def broadcast_shapes(op: str, arg_types: Sequence[Type], *shapes: tuple) -> tuple:
    """NumPy broadcasting of shapes that may hold ``Any``."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(ndim):
        dims = [s[len(s) - ndim + k] for s in shapes if len(s) - ndim + k >= 0]
        known = {d for d in dims if d is not Any and d != 1}
        if len(known) > 1:
            pretty = " and ".join(str(tuple(s)) for s in shapes)
            raise type_error(op, arg_types, f"cannot broadcast shapes {pretty} (dimension {k - ndim}: {sorted(known)})")
        if known:
            out.append(known.pop())
        elif any(d is Any for d in dims):
            out.append(Any)
        else:
            out.append(1)
    return tuple(out)


def normalize_axis(op: str, axis: int, ndim: int, arg_types: Sequence[Type] = ()) -> int:
    if not -ndim <= axis < max(ndim, 1) or (ndim == 0 and axis not in (0, -1)):
        raise type_error(op, arg_types, f"axis {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim if ndim else 0


def normalize_axes(op: str, axes: Optional[Sequence[int]], ndim: int, arg_types: Sequence[Type] = (), exclude: bool = False) -> tuple:
    """Sorted non-negative axes (all of them when ``axes`` is None)."""
    if axes is None:
        picked = tuple(range(ndim))
    else:
        norm = []
        for a in axes:
            if not -ndim <= a < ndim:
                raise type_error(op, arg_types, f"axis {a} is out of range for a tensor of rank {ndim}")
            norm.append(a % ndim)
        if len(set(norm)) != len(norm):
            raise type_error(op, arg_types, f"repeated axis in {tuple(axes)}")
        picked = tuple(sorted(norm))
    if exclude:
        picked = tuple(i for i in range(ndim) if i not in picked)
    return picked


def numel(shape: Sequence) -> int:
    """Number of elements, or 0 when a dim is unknown."""
    n = 1
    for d in shape:
        if d is Any:
            return 0
        n *= d
    return n


def check_shape_attr(shape, what: str = "shape") -> tuple:
    from .registry import seq_of_int

    shape = seq_of_int(shape, what)
    for d in shape:
        if d < 0:
            raise AttrError(f"{what} must not contain negative sizes, got {shape}")
    return shape


def same_layout(g, x):
    """``g`` (a torch tensor) in ``x``'s memory format where both are 4-D and laid out differently (one channels-last,
    one NCHW: a gradient from a convolution of the other layout meeting a saved activation). ATen's elementwise
    gradient kernels (``threshold_backward``, ``silu_backward``, ``gelu_backward``) take 3-20x longer on mixed layouts
    than a conversion and a pass over one: (16, 32, 24, 24) ``threshold_backward`` 678 us mixed, 72 converting."""
    if g.ndim != 4 or x.ndim != 4:
        return g
    import torch

    last = torch.channels_last
    x_last = x.is_contiguous(memory_format=last)
    if x_last == g.is_contiguous(memory_format=last):
        return g
    return g.contiguous(memory_format=last if x_last else torch.contiguous_format)
