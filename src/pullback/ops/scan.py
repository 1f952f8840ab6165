"""Cumulative operators along one axis: ``cumsum`` (forward or reverse) and ``cumprod``, one kernel for every
namespace.

The gradient of a cumulative sum is the cumulative sum of the cotangent in the other direction. The gradient
of a cumulative product, ``cumprod_grad``, is exact where the input holds zeros (no division by it):
``dx_i = E_i S_i`` with ``E_i = x_0 ... x_{i-1}`` and ``S_i = g_i + x_{i+1} S_{i+1}``, one step per position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.errors import AttrError
from ..ir.expr import Call, Expr
from ..ir.types import ALL_DTYPES
from .common import normalize_axis, numel, same_dtype, tensor_arg
from .registry import FusionKind, defop, type_error
from .shape import AxisAttrs


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



def _scan_infer(name: str, nargs: int):
    def infer(arg_types, attrs):
        x = tensor_arg(name, arg_types, nargs - 1)
        if nargs == 2:
            same_dtype(name, arg_types)
            if arg_types[0].shape != x.shape:
                raise type_error(name, arg_types, f"the cotangent's shape {arg_types[0].shape} is not the input's {x.shape}")
        normalize_axis(name, attrs.axis, max(x.ndim, 1), arg_types)
        return x
    return infer


def _cumprod_kernel(xp, x, attrs):
    if x.ndim == 0:
        return x
    return xp.astype(xp.cumulative_prod(x, axis=attrs.axis % x.ndim), x.dtype)


def _cumprod_grad_kernel(xp, g, x, attrs):
    if x.ndim == 0:
        return g
    ax = attrs.axis % x.ndim
    gs, xs = xp.moveaxis(g, ax, 0), xp.moveaxis(x, ax, 0)
    n = xs.shape[0]
    if n == 0:
        return g
    s, out = gs[n - 1], [None] * n
    for i in range(n - 1, 0, -1):  # S_i, last first
        out[i] = s
        s = gs[i - 1] + xs[i] * s
    out[0], e = s, None
    for i in range(1, n):  # times E_i = x_0 ... x_{i-1}
        e = xs[0] if e is None else e * xs[i - 1]
        out[i] = out[i] * e
    return xp.moveaxis(xp.stack(out, axis=0), 0, ax)


def _cumprod_grad(call: Call, g: Expr):
    return [cumprod_grad(g, call.args[0], call.attrs.axis)]


_NUMERIC = tuple(d for d in ALL_DTYPES if d != "bool")
cumprod = defop("cumprod", 1, _scan_infer("cumprod", 1), kernel=_cumprod_kernel, attrs_type=AxisAttrs,
                grad=_cumprod_grad, pattern=FusionKind.OPAQUE, dtypes=_NUMERIC,
                flops=lambda ts, out, a: numel(out.shape), torch_name="cumprod",
                doc="``cumprod(x, axis=0)``: running products along ``axis`` in the input's dtype.")
cumprod_grad = defop(
    "cumprod_grad", 2, _scan_infer("cumprod_grad", 2), kernel=_cumprod_grad_kernel, attrs_type=AxisAttrs,
    differentiable=False, nondiff_reason="second derivatives of cumprod are not implemented",
    pattern=FusionKind.OPAQUE, dtypes=_NUMERIC, flops=lambda ts, out, a: 3 * numel(out.shape), torch_name="cumprod_backward",
    doc="Gradient of ``cumprod``: ``(out_grad, data) -> data-shaped``, exact where ``data`` holds zeros.")

__all__ = ["cumsum", "CumsumAttrs", "cumprod", "cumprod_grad"]
