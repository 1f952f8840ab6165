"""Cumulative operators along one axis: ``cumsum`` (forward or reverse), one kernel for every namespace.

The gradient of a cumulative sum is the cumulative sum of the cotangent in the other direction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.errors import AttrError
from ..ir.expr import Call, Expr
from ..ir.types import ALL_DTYPES
from .common import normalize_axis, numel, tensor_arg
from .registry import FusionKind, defop, type_error


@dataclass(frozen=True)
class CumsumAttrs:
    """``reverse``: sum from the end of the axis (``out[i] = x[i] + ... + x[n-1]``)."""

    axis: int = 0
    reverse: bool = False

    def __post_init__(self):
        if isinstance(self.axis, bool) or not isinstance(self.axis, (int, np.integer)):
            raise AttrError(f"attribute axis must be an int, got {self.axis!r}")
        if not isinstance(self.reverse, (bool, np.bool_)):
            raise AttrError(f"attribute reverse must be a bool, got {self.reverse!r}")
        object.__setattr__(self, "axis", int(self.axis))
        object.__setattr__(self, "reverse", bool(self.reverse))


def _cumsum_infer(arg_types, attrs):
    x = tensor_arg("cumsum", arg_types, 0)
    if x.dtype == "bool":
        raise type_error("cumsum", arg_types, "argument 0 must be a numeric tensor, got bool (cast it first)")
    normalize_axis("cumsum", attrs.axis, max(x.ndim, 1), arg_types)
    return x


def _cumsum_kernel(xp, x, attrs):
    if x.ndim == 0:
        return x
    ax = attrs.axis % x.ndim
    y = xp.flip(x, axis=ax) if attrs.reverse else x
    out = xp.astype(xp.cumulative_sum(y, axis=ax), x.dtype)
    return xp.flip(out, axis=ax) if attrs.reverse else out


def _cumsum_grad(call: Call, g: Expr):
    return [cumsum(g, call.attrs.axis, not call.attrs.reverse)]


cumsum = defop("cumsum", 1, _cumsum_infer, kernel=_cumsum_kernel, attrs_type=CumsumAttrs, grad=_cumsum_grad,
               pattern=FusionKind.OPAQUE, dtypes=tuple(d for d in ALL_DTYPES if d != "bool"), flops=lambda ts, out, a: numel(out.shape), torch_name="cumsum",
               doc="``cumsum(x, axis=0, reverse=False)``: running sums along ``axis`` in the input's dtype.")

__all__ = ["cumsum", "CumsumAttrs"]
