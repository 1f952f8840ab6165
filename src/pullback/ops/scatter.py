"""``scatter``: write ``updates`` into ``data`` at gather's positions (``torch.scatter``), the set-valued
sibling of ``scatter_add``; ``scatter_reduce``: combine them instead (``torch.scatter_reduce``).

``scatter(data, indices, updates, axis)``: ``out = data`` except ``out[i][indices[i][j][k]][k] = updates[i][j][k]``
for ``axis=1``; ``indices`` and ``updates`` have one shape, no larger than ``data`` off the axis. Where an index
repeats, the last write wins. Gradients: ``data`` gets ``g`` with the written positions zeroed (a scatter of
zeros), ``updates`` gets ``gather(g, indices)``.

``scatter_reduce(data, indices, updates, axis, reduce, include_self)`` combines, at each position, the updates
written there (and ``data``'s entry when ``include_self``) by ``sum``, ``prod``, ``mean``, ``amax`` or ``amin``;
a position nothing is written to keeps ``data``'s entry. Its gradients are PyTorch's: ``amax``/``amin`` share
``g`` evenly among the entries equal to the result, ``prod`` divides the result by each factor (a single zero
factor gets the product of the others), ``mean`` divides ``g`` by the count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir.errors import AttrError
from ..ir.expr import Call, Expr
from ..ir.types import DTYPES, INT_DTYPES, is_float, is_inexact
from . import layout as T
from .common import normalize_axis, numel, tensor_arg
from .kernels import check_range, grid, is_integer, set_at, wide_index
from .registry import FusionKind, defop, get_op, type_error


@dataclass(frozen=True)
class ScatterAttrs:
    axis: int = 0

    def __post_init__(self):
        if isinstance(self.axis, bool) or not isinstance(self.axis, (int, np.integer)):
            raise AttrError(f"attribute axis must be an int, got {self.axis!r}")
        object.__setattr__(self, "axis", int(self.axis))


def _infer(arg_types, attrs):
    x = tensor_arg("scatter", arg_types, 0)
    idx = tensor_arg("scatter", arg_types, 1)
    u = tensor_arg("scatter", arg_types, 2)
    if idx.dtype not in INT_DTYPES:
        raise type_error("scatter", arg_types, f"argument 1 (indices) must be an integer tensor, got {idx.dtype}")
    ax = normalize_axis("scatter", attrs.axis, max(x.ndim, 1), arg_types)
    if idx.ndim != x.ndim:
        raise type_error("scatter", arg_types, f"indices must have the rank of data ({x.ndim}), got {idx.ndim}")
    for i, (d, k) in enumerate(zip(x.shape, idx.shape)):
        if i != ax and isinstance(d, int) and isinstance(k, int) and k > d:
            raise type_error("scatter", arg_types, f"indices dimension {i} ({k}) exceeds the data's ({d})")
    if u.dtype != x.dtype or u.shape != idx.shape:
        raise type_error("scatter", arg_types, f"updates must be a {x.dtype} tensor of the indices' shape {idx.shape}")
    return x


def _kernel(xp, x, idx, u, attrs):
    if x.ndim == 0:
        return xp.reshape(u, ()) if math.prod(u.shape) else x
    axis = attrs.axis % x.ndim
    check_range("scatter", idx, 0, x.shape[axis], f"[0, {x.shape[axis]}) along axis {axis}")
    return set_at(x, grid(xp, wide_index(idx), axis), u)


def _grad(call: Call, g: Expr):
    x, idx, u = call.args
    if not is_inexact(x.checked_type.dtype):
        return [None, None, None]
    return [scatter(g, idx, T.zeros_like(u), call.attrs.axis), None, get_op("gather")(g, call.attrs.axis, idx)]


scatter = defop("scatter", 3, _infer, kernel=_kernel, attrs_type=ScatterAttrs, grad=_grad,
                pattern=FusionKind.OPAQUE, flops=lambda ts, out, a: numel(ts[1].shape), torch_name="scatter",
                doc="``scatter(data, indices, updates, axis)``: data with updates written at gather's positions.")


# ------------------------------------------------------------------ scatter_reduce

SCATTER_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


@dataclass(frozen=True)
class ScatterReduceAttrs:
    """``reduce``: sum | prod | mean | amax | amin (PyTorch's names); ``include_self``: ``data``'s entry takes
    part in the reduction at the positions written to."""

    axis: int = 0
    reduce: str = "sum"
    include_self: bool = True

    def __post_init__(self):
        if isinstance(self.axis, bool) or not isinstance(self.axis, (int, np.integer)):
            raise AttrError(f"attribute axis must be an int, got {self.axis!r}")
        if self.reduce not in SCATTER_REDUCTIONS:
            raise AttrError(f"attribute reduce must be one of {', '.join(SCATTER_REDUCTIONS)}, got {self.reduce!r}")
        if not isinstance(self.include_self, (bool, np.bool_)):
            raise AttrError(f"attribute include_self must be a bool, got {self.include_self!r}")
        object.__setattr__(self, "axis", int(self.axis))
        object.__setattr__(self, "include_self", bool(self.include_self))


def _reduce_infer(arg_types, attrs):
    x = _infer(arg_types, ScatterAttrs(attrs.axis))
    if x.ndim == 0:
        raise type_error("scatter_reduce", arg_types, "data must have rank 1 or more (reshape a scalar first)")
    if x.dtype == "bool":
        raise type_error("scatter_reduce", arg_types, "data must be a numeric tensor, got bool")
    return x


def _identity(xp, x, how: str):
    """The neutral element of ``how`` in ``x``'s dtype."""
    if how in ("sum", "mean"):
        return 0
    if how == "prod":
        return 1
    if is_integer(xp, x):
        info = np.iinfo(str(x.dtype).removeprefix("torch."))
        return info.min if how == "amax" else info.max
    return -math.inf if how == "amax" else math.inf


_AT = {"sum": ("add", np.add), "mean": ("add", np.add), "prod": ("multiply", np.multiply), "amax": ("max", np.maximum),
       "amin": ("min", np.minimum)}


def _reduce_kernel(xp, x, idx, u, attrs):
    """NumPy (``ufunc.at``) and jax (``.at[]``): start from ``data`` (or the identity where written, without
    ``include_self``) and combine every update in."""
    axis = attrs.axis % x.ndim
    check_range("scatter_reduce", idx, 0, x.shape[axis], f"[0, {x.shape[axis]}) along axis {axis}")
    where_ = grid(xp, wide_index(idx), axis)
    base = x if attrs.include_self else set_at(x, where_, xp.full(u.shape, _identity(xp, x, attrs.reduce), dtype=x.dtype))
    jax_name, ufunc = _AT[attrs.reduce]
    if hasattr(base, "at"):
        out = getattr(base.at[where_], jax_name)(u)
    else:
        out = base.copy()
        ufunc.at(out, where_, u)
    if attrs.reduce != "mean":
        return out
    count = _count(xp, x, where_, u, attrs.include_self)
    return xp.floor_divide(out, count) if is_integer(xp, x) else xp.astype(out / count, x.dtype)


def _count(xp, x, where_, u, include_self: bool):
    """How many entries each position of a mean combines (at least 1)."""
    ones = xp.ones(u.shape, dtype=x.dtype)
    start = xp.ones(x.shape, dtype=x.dtype) if include_self else xp.zeros(x.shape, dtype=x.dtype)
    if hasattr(start, "at"):
        count = start.at[where_].add(ones)
    else:
        count = start.copy()
        np.add.at(count, where_, ones)
    return xp.maximum(count, xp.ones((), dtype=x.dtype))


def _reduce_torch(x, idx, u, attrs):
    axis = attrs.axis % x.ndim
    check_range("scatter_reduce", idx, 0, x.shape[axis], f"[0, {x.shape[axis]}) along axis {axis}")
    return x.scatter_reduce(axis, wide_index(idx), u, attrs.reduce, include_self=attrs.include_self)


def _cast(e: Expr, dtype: str) -> Expr:
    return get_op("cast")(e, dtype)


def _reduce_grad(call: Call, g: Expr):
    x, idx, u = call.args
    if not is_float(x.checked_type.dtype):
        return [None, None, None]
    a = call.attrs
    op = get_op
    gather = lambda v: op("gather")(v, a.axis, idx)  # noqa: E731
    zeros_u = T.zeros_like(u)
    if a.reduce in ("sum", "mean"):
        if a.reduce == "mean":
            start = T.ones_like(x) if a.include_self else T.zeros_like(x)
            count = op("maximum")(op("scatter_add")(start, idx, T.ones_like(u), a.axis), T.ones_like(x))
            g = op("divide")(g, count)
        gx, gu = g, gather(g)
    elif a.reduce == "prod":
        gx, gu = _prod_grads(call, g, gather)
    else:  # amax / amin: g shared evenly among the entries equal to the result
        dt = x.checked_type.dtype
        x_is = _cast(op("equal")(x, call), dt)
        if not a.include_self:
            x_is = scatter(x_is, idx, zeros_u, a.axis)
        u_is = _cast(op("equal")(u, gather(call)), dt)
        share = op("divide")(g, op("scatter_add")(x_is, idx, u_is, a.axis))
        gx, gu = op("multiply")(x_is, share), op("multiply")(u_is, gather(share))
    if not a.include_self:
        gx = scatter(gx, idx, zeros_u, a.axis)
    return [gx, None, gu]


def _prod_grads(call: Call, g: Expr, gather) -> tuple:
    """PyTorch's rule: ``g * result / factor``, where a factor that is the single zero of its position gets
    ``g`` times the product of the others."""
    x, idx, u = call.args
    a, op = call.attrs, get_op
    one_x, one_u = T.ones_like(x), T.ones_like(u)
    x1 = op("where")(op("equal")(x, T.zeros_like(x)), one_x, x)
    gx = op("divide")(op("multiply")(g, scatter_reduce(x1, idx, u, a.axis, "prod", a.include_self)), x1)
    u_zero = op("equal")(u, T.zeros_like(u))
    zeros_at = gather(op("scatter_add")(T.zeros_like(x), idx, _cast(u_zero, u.checked_type.dtype), a.axis))
    single = op("logical_and")(u_zero, op("equal")(zeros_at, one_u))
    others = scatter_reduce(x, idx, op("where")(single, one_u, u), a.axis, "prod", a.include_self)
    gu = op("where")(single, gather(op("multiply")(g, others)),
                     op("divide")(gather(op("multiply")(g, call)), op("where")(u_zero, one_u, u)))
    return gx, gu


scatter_reduce = defop(
    "scatter_reduce", 3, _reduce_infer, kernel=_reduce_kernel, impls={"torch": _reduce_torch},
    attrs_type=ScatterReduceAttrs, grad=_reduce_grad, pattern=FusionKind.OPAQUE, smooth=False,
    dtypes=tuple(d for d in DTYPES if d != "bool"),
    flops=lambda ts, out, a: numel(ts[1].shape), torch_name="scatter_reduce",
    doc="``scatter_reduce(data, indices, updates, axis, reduce, include_self)``: updates combined into data at "
        "gather's positions (``torch.scatter_reduce``).")

__all__ = ["scatter", "scatter_reduce", "ScatterAttrs", "ScatterReduceAttrs", "SCATTER_REDUCTIONS"]
