"""Cumulative operators along one axis: ``cumsum`` and ``logcumsumexp`` (forward or reverse), ``cumprod``, and
the indices of running extremes ``cumargmax``/``cumargmin`` (``torch.cummax``'s indices; its values are a gather
at them, so their gradient is the gather's), one kernel for every namespace.

The gradient of a cumulative sum is the cumulative sum of the cotangent in the other direction; that of
``logcumsumexp`` is PyTorch's: the positive and negative parts of the cotangent go through a ``logcumsumexp`` in
the other direction in log space, so nothing overflows. The gradient
of a cumulative product, ``cumprod_grad``, is exact where the input holds zeros (no division by it):
``dx_i = E_i S_i`` with ``E_i = x_0 ... x_{i-1}`` and ``S_i = g_i + x_{i+1} S_{i+1}``, one step per position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.errors import AttrError
from ..ir.expr import Call, Expr, const
from ..ir.types import ALL_DTYPES, DTYPES, FLOAT_DTYPES, TensorType
from .common import normalize_axis, numel, same_dtype, tensor_arg
from .kernels import accumulated, rounded_once
from .registry import FusionKind, defop, get_op, type_error
from .shape import AxisAttrs
from .sorting import NO_GRAD


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
    out = xp.astype(xp.cumulative_sum(accumulated(xp, y), axis=ax), x.dtype)  # half floats: running sums in float32
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
    return xp.astype(xp.cumulative_prod(accumulated(xp, x), axis=attrs.axis % x.ndim), x.dtype)


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


# ------------------------------------------------------------------ logcumsumexp


def _logcumsumexp_kernel(xp, x, attrs):
    """One ``logaddexp`` per position (exact where the values differ by more than exp's range)."""
    if x.ndim == 0:
        return x
    ax = attrs.axis % x.ndim
    xs = xp.moveaxis(x, ax, 0)
    if xs.shape[0] == 0:
        return x
    order = range(xs.shape[0] - 1, -1, -1) if attrs.reverse else range(xs.shape[0])
    out, acc = [None] * xs.shape[0], None
    for i in order:
        acc = xs[i] if acc is None else xp.logaddexp(acc, xs[i])
        out[i] = acc
    return xp.moveaxis(xp.stack(out, axis=0), 0, ax)


def _logcumsumexp_numpy(x, attrs):
    """``np.logaddexp.accumulate``; float16 accumulated in float32 and rounded once (bfloat16 arrives in float32,
    ``runtime.opmath``), as ATen's kernel does."""
    if x.ndim == 0 or x.size == 0:
        return x
    ax = attrs.axis % x.ndim
    if not attrs.reverse:
        return rounded_once(lambda v: np.logaddexp.accumulate(v, axis=ax), x)
    return rounded_once(lambda v: np.flip(np.logaddexp.accumulate(np.flip(v, ax), axis=ax), ax), x)


def _logcumsumexp_jax(x, attrs):
    """``lax.cumlogsumexp``; float16 and bfloat16 accumulated in float32 and rounded once, as the numpy and torch
    targets do (in bfloat16 itself a 64-long scan drifted by whole units)."""
    import jax

    if x.ndim == 0:
        return x
    return rounded_once(lambda v: jax.lax.cumlogsumexp(v, axis=attrs.axis % x.ndim, reverse=attrs.reverse), x)


def _logcumsumexp_torch(x, attrs):
    if x.ndim == 0:
        return x
    ax = attrs.axis % x.ndim
    if not attrs.reverse:
        return x.logcumsumexp(ax)
    return x.flip(ax).logcumsumexp(ax).flip(ax)


def _logcumsumexp_grad(call: Call, g: Expr):
    """``dx_j = sum_{i >= j} g_i exp(x_j - y_i)``, with ``g``'s positive and negative parts in log space."""
    x, a = call.args[0], call.attrs
    dt = call.checked_type.dtype
    where, log_abs = get_op("where"), get_op("log")(get_op("abs")(g))
    lowest = const(float(np.finfo(dt).min), dt)  # log 0, finite: -inf - -inf would be NaN

    def part(side: str):
        log_g = where(get_op(side)(g, 0.0), log_abs, lowest)
        back = logcumsumexp(get_op("subtract")(log_g, call), a.axis, not a.reverse)
        return get_op("exp")(get_op("add")(back, x))

    return [get_op("subtract")(part("greater"), part("less"))]


logcumsumexp = defop(
    "logcumsumexp", 1, _scan_infer("logcumsumexp", 1), kernel=_logcumsumexp_kernel,
    impls={"numpy": _logcumsumexp_numpy, "jax": _logcumsumexp_jax, "torch": _logcumsumexp_torch},
    attrs_type=CumsumAttrs, grad=_logcumsumexp_grad, pattern=FusionKind.OPAQUE, dtypes=FLOAT_DTYPES,
    flops=lambda ts, out, a: 4 * numel(out.shape), torch_name="logcumsumexp",
    doc="``logcumsumexp(x, axis=0, reverse=False)``: ``log(cumsum(exp(x)))`` along ``axis`` without overflow.")

# ------------------------------------------------------------------ cumargmax / cumargmin


def _cumarg_infer(name: str):
    def infer(arg_types, attrs):
        x = tensor_arg(name, arg_types, 0)
        normalize_axis(name, attrs.axis, max(x.ndim, 1), arg_types)
        return TensorType(x.shape, "int64")
    return infer


def _cumarg_kernel(largest: bool):
    """The running extreme's index, position by position: a new entry takes over when it is at least as large
    (small) as the extreme so far, or NaN (which then stays the extreme), as in ``torch.cummax``."""
    def kernel(xp, x, attrs):
        if x.ndim == 0:
            return xp.zeros((), dtype=xp.int64)
        ax = attrs.axis % x.ndim
        xs = xp.moveaxis(x, ax, 0)
        if xs.shape[0] == 0:
            return xp.zeros(x.shape, dtype=xp.int64)
        nan = xp.isdtype(x.dtype, "real floating")
        best, idx = xs[0], xp.zeros(xs.shape[1:], dtype=xp.int64)
        out = [idx]
        for i in range(1, xs.shape[0]):
            take = xs[i] >= best if largest else xs[i] <= best
            if nan:
                take = take | xp.isnan(xs[i])
            best = xp.where(take, xs[i], best)
            idx = xp.where(take, xp.full_like(idx, i), idx)
            out.append(idx)
        return xp.moveaxis(xp.stack(out, axis=0), 0, ax)
    return kernel


def _last_holding(xp, x, attrs, running, cummax):
    """Vectorised: the last position holding the extreme so far (``running(x, axis)``, NaN-propagating) or NaN."""
    if x.ndim == 0 or x.shape[attrs.axis % x.ndim] == 0:
        return xp.zeros(x.shape, dtype=xp.int64)
    ax = attrs.axis % x.ndim
    holds = x == running(x, ax)
    if xp.isdtype(x.dtype, "real floating"):
        holds = holds | xp.isnan(x)
    pos = xp.reshape(xp.arange(x.shape[ax], dtype=xp.int64), (-1,) + (1,) * (x.ndim - 1 - ax))
    return cummax(xp.where(holds, pos, 0), ax)


def _cumarg_numpy(largest: bool):
    uf = np.maximum if largest else np.minimum
    return lambda x, attrs: _last_holding(np, x, attrs, lambda v, ax: uf.accumulate(v, axis=ax),
                                          lambda v, ax: np.maximum.accumulate(v, axis=ax))


def _cumarg_jax(largest: bool):
    def impl(x, attrs):
        import jax
        import jax.numpy as jnp

        run = jax.lax.cummax if largest else jax.lax.cummin
        x = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x  # XLA's running extremes take numbers only
        return _last_holding(jnp, x, attrs, lambda v, ax: run(v, axis=ax), lambda v, ax: jax.lax.cummax(v, axis=ax))
    return impl


def _cumarg_torch(largest: bool):
    def impl(x, attrs):
        import torch

        if x.ndim == 0:
            return x.new_zeros((), dtype=torch.int64)
        ax = attrs.axis % x.ndim
        return (x.cummax(ax) if largest else x.cummin(ax)).indices
    return impl


def _cumarg_op(largest: bool):
    name, word = ("cumargmax", "maximum") if largest else ("cumargmin", "minimum")
    return defop(
        name, 1, _cumarg_infer(name), kernel=_cumarg_kernel(largest), attrs_type=AxisAttrs,
        impls={"numpy": _cumarg_numpy(largest), "jax": _cumarg_jax(largest), "torch": _cumarg_torch(largest)},
        differentiable=False, nondiff_reason=NO_GRAD, pattern=FusionKind.OPAQUE, dtypes=DTYPES,
        flops=lambda ts, out, a: 2 * numel(out.shape), torch_name="cummax" if largest else "cummin",
        doc=f"``{name}(x, axis=0)``: int64 index of the running {word} along ``axis`` (the last among ties; "
            f"a NaN takes over and stays), as ``torch.{name[:3] + name[6:]}``'s indices.")


cumargmax = _cumarg_op(True)
cumargmin = _cumarg_op(False)

__all__ = ["cumsum", "CumsumAttrs", "cumprod", "cumprod_grad", "logcumsumexp", "cumargmax", "cumargmin"]
