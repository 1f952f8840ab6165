"""Reductions over axes (Relay's ``axis``, ``keepdims``, ``exclude``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..ir.errors import AttrError
from ..ir.expr import Call, Expr
from ..ir.types import TensorType
from . import transform as T
from .common import normalize_axes, numel, tensor_arg
from .registry import OpPattern, defop, seq_of_int


@dataclass(frozen=True)
class ReduceAttrs:
    axis: Optional[tuple] = None
    keepdims: bool = False
    exclude: bool = False

    def __post_init__(self):
        object.__setattr__(self, "axis", seq_of_int(self.axis, "attribute axis", allow_none=True))
        for f in ("keepdims", "exclude"):
            if not isinstance(getattr(self, f), (bool, np.bool_)):
                raise AttrError(f"attribute {f} must be a bool, got {getattr(self, f)!r}")
            object.__setattr__(self, f, bool(getattr(self, f)))


def reduced_axes(op: str, arg_types, attrs, ndim: int) -> tuple:
    return normalize_axes(op, attrs.axis, ndim, arg_types, attrs.exclude)


def reduce_shape(shape: tuple, axes: tuple, keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduce_infer(op):
    def infer(arg_types, attrs):
        x = tensor_arg(op, arg_types, 0)
        axes = reduced_axes(op, arg_types, attrs, x.ndim)
        return TensorType(reduce_shape(x.shape, axes, attrs.keepdims), x.dtype)

    return infer


def np_axes(x: np.ndarray, attrs) -> tuple:
    return reduced_axes("reduce", (), attrs, x.ndim)


def keepdims_grad(call: Call, g: Expr) -> Expr:
    """``g`` reshaped so it broadcasts against the reduction's input (reduced axes kept as 1)."""
    x = call.args[0]
    if call.attrs.keepdims:
        return g
    axes = reduced_axes(call.op.name, [x.checked_type], call.attrs, x.checked_type.ndim)
    for a in axes:  # ascending: each insertion keeps later axes aligned
        g = T.expand_dims(g, a)
    return g


def _reduce_flops(arg_types, out_type, attrs):
    return numel(arg_types[0].shape)


def _sum_grad(call: Call, g: Expr):
    return [T.broadcast_to_like(keepdims_grad(call, g), call.args[0])]


sum = defop(  # noqa: A001 - Relay's name
    "sum",
    1,
    _reduce_infer("sum"),
    lambda x, attrs: np.sum(x, axis=np_axes(x, attrs), keepdims=attrs.keepdims, dtype=x.dtype),
    attrs_type=ReduceAttrs,
    grad=_sum_grad,
    pattern=OpPattern.COMM_REDUCE,
    flops=_reduce_flops,
    torch_name="sum",
)
