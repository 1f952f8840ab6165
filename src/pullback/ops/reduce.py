"""Reductions over axes (Relay's ``axis``, ``keepdims``, ``exclude``).

Gradient notes: ``max``/``min`` split the gradient evenly among tied maxima
(PyTorch's ``amax`` rule); ``prod``'s rule is ``g * prod / x`` and so needs
non-zero inputs; ``argmax``/``argmin`` return int32 indices (flat over the
reduced axes when several are reduced) and have no gradient.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Optional

import math

import numpy as np

from ..ir.errors import AttrError
from ..ir.expr import Call, Expr
from ..ir.types import ALL_DTYPES, HALF_DTYPES, Any, TensorType
from . import layout as T
from .common import normalize_axes, numel, tensor_arg
from .kernels import as_array, dtype, is_integer, numpy_quiet, sum_of
from .registry import FusionKind, defop, seq_of_int


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


def np_axes(x, attrs) -> tuple:
    """The axes a reduction with ``attrs`` reduces of array ``x`` (any target's)."""
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


def _rank_axes(call: Call) -> tuple:
    xt = call.args[0].checked_type
    return reduced_axes(call.op.name, [xt], call.attrs, xt.ndim)


def reduced_count(call: Call, minus: int = 0) -> Expr:
    """Number of reduced elements (less ``minus``) as a constant, or a tensor when dims are ``Any``."""
    from .elemwise import scalar_like, subtract

    x = call.args[0]
    axes = _rank_axes(call)
    dims = [x.checked_type.shape[a] for a in axes]
    if all(d is not Any for d in dims):
        return scalar_like(float(math.prod(dims) - minus), x)
    n = sum(T.ones_like(x), axes, True)
    return subtract(n, scalar_like(float(minus), x)) if minus else n


def _acc(xp, x):
    """``x`` in the dtype NumPy's reductions accumulate it in: float16 in float32, integers in float64."""
    if x.dtype == xp.float16:
        return xp.astype(x, xp.float32)
    return xp.astype(x, xp.float64) if is_integer(xp, x) else x


def reduction(name: str, kernel, grad=None, *, attrs_type=ReduceAttrs, out_dtype=None, quiet: bool = False, **kw):
    """Define a reduction from ``kernel(xp, x, axes, keepdims, attrs)``; the result is cast to the inferred
    dtype. ``quiet``: NumPy's divide warnings off (jax and torch give -inf silently)."""

    def infer(arg_types, attrs):
        t = _reduce_infer(name)(arg_types, attrs)
        return TensorType(t.shape, out_dtype) if out_dtype else t

    def run(xp, x, attrs):
        out = as_array(kernel(xp, x, np_axes(x, attrs), attrs.keepdims, attrs))
        want = dtype(xp, out_dtype) if out_dtype else x.dtype
        return out if out.dtype == want else xp.astype(out, want)

    if quiet:
        kw["impls"] = {"numpy": numpy_quiet(run, divide="ignore")}
    return defop(name, 1, infer, kernel=run, attrs_type=attrs_type, grad=grad, pattern=FusionKind.COMM_REDUCE,
                 flops=_reduce_flops, **kw)


def _sum_grad(call: Call, g: Expr):
    return [T.broadcast_to_like(keepdims_grad(call, g), call.args[0])]


sum = reduction("sum", lambda xp, x, ax, kd, a: sum_of(xp, x, ax, kd), _sum_grad,  # noqa: A001
                torch_name="sum", dtypes=ALL_DTYPES)


def _mean_grad(call: Call, g: Expr):
    from .elemwise import divide

    return [divide(T.broadcast_to_like(keepdims_grad(call, g), call.args[0]), reduced_count(call))]


mean = reduction("mean", lambda xp, x, ax, kd, a: xp.mean(_acc(xp, x), axis=ax, keepdims=kd), _mean_grad,
                 torch_name="mean", dtypes=ALL_DTYPES)


def _extreme_grad(call: Call, g: Expr):
    """Ties share the gradient evenly: g * [x == y] / count(x == y). A slice holding NaN has a NaN
    extreme and every entry of it gets a NaN gradient (torch.amax's rule, stated explicitly: XLA
    simplifies the 0 / 0 of the formula to 0)."""
    from .elemwise import divide, equal, isnan, multiply, where

    x = call.args[0]
    y = keepdims_grad(call, call)
    mask = T.cast_like(equal(x, y), x)
    share = where(isnan(y), y, divide(mask, sum(mask, _rank_axes(call), True)))
    return [multiply(share, keepdims_grad(call, g))]


max = reduction("max", lambda xp, x, ax, kd, a: xp.max(x, axis=ax, keepdims=kd), _extreme_grad, smooth=False,  # noqa: A001
                torch_name="amax", doc="Maximum over axes; tied maxima share the gradient evenly (like torch.amax).")
min = reduction("min", lambda xp, x, ax, kd, a: xp.min(x, axis=ax, keepdims=kd), _extreme_grad, smooth=False,  # noqa: A001
                torch_name="amin", doc="Minimum over axes; tied minima share the gradient evenly (like torch.amin).")


def _prod_grad(call: Call, g: Expr):
    """d prod / d x_i = product of the other elements, exact with zeros (like torch.prod):
    no zero in the slice: prod / x_i; one zero: the product of the non-zeros at the zero, 0
    elsewhere; two or more zeros: 0."""
    from .elemwise import divide, equal, multiply, scalar_like, where

    x = call.args[0]
    zero, one = scalar_like(0.0, x), scalar_like(1.0, x)
    is_zero = equal(x, zero)
    kd = dataclasses.replace(call.attrs, keepdims=True)
    nonzero_prod = prod(where(is_zero, T.ones_like(x), x), *_attr_values(kd))
    zeros_in_slice = sum(T.cast_like(is_zero, x), *_attr_values(kd))
    others = where(is_zero,
                   where(equal(zeros_in_slice, one), nonzero_prod, zero),
                   where(equal(zeros_in_slice, zero), divide(nonzero_prod, where(is_zero, one, x)), zero))
    return [multiply(T.broadcast_to_like(keepdims_grad(call, g), x), others)]


def _attr_values(attrs) -> tuple:
    return tuple(getattr(attrs, f.name) for f in dataclasses.fields(attrs))


prod = reduction("prod", lambda xp, x, ax, kd, a: xp.prod(x, axis=ax, keepdims=kd, dtype=x.dtype), _prod_grad,
                 torch_name="prod", doc="Product over axes; the gradient is exact with zeros (the product of the other elements).")


@dataclass(frozen=True)
class VarianceAttrs(ReduceAttrs):
    unbiased: bool = False

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.unbiased, (bool, np.bool_)):
            raise AttrError(f"attribute unbiased must be a bool, got {self.unbiased!r}")
        object.__setattr__(self, "unbiased", bool(self.unbiased))


def _first_of_slice(x, ax: tuple):
    """The first entry of every reduced slice of array ``x`` (reduced axes kept as 1)."""
    return x[tuple(slice(0, 1) if i in ax else slice(None) for i in range(x.ndim))]


def _var(xp, x, ax, kd, a):
    """The variance around each slice's first entry (the same value; exactly 0 for a constant slice on
    every target, where the mean's rounding would leave a target-dependent 1e-17)."""
    x = _acc(xp, x)
    if not ax:  # each entry its own slice: 0, NaN for NaN/inf (array-api-compat's torch var gives zeros here)
        d = x - x
        return d * d / (1 - int(a.unbiased))
    if math.prod(x.shape):
        x = x - _first_of_slice(x, ax)
    return xp.var(x, axis=ax, keepdims=kd, correction=int(a.unbiased))


def _centered_over_n(call: Call) -> Expr:
    """(x - mean(x)) / (N - unbiased), the shared factor of the variance and std gradients; centred
    like the kernel (around each slice's first entry), so a constant slice gives exactly 0."""
    from .elemwise import divide, subtract
    from .indexing import strided_slice

    x = call.args[0]
    axes = _rank_axes(call)
    first = strided_slice(x, (0,) * len(axes), (1,) * len(axes), None, axes) if axes else x
    shifted = subtract(x, first)
    return divide(subtract(shifted, mean(shifted, axes, True)), reduced_count(call, int(call.attrs.unbiased)))


def _variance_grad(call: Call, g: Expr):
    """``2 g (x - mean) / (N - unbiased)``. In float16/bfloat16 (N static) PyTorch's formula and roundings,
    ``(2 / (N - unbiased)) * g * (x - mean)``: a constant slice's mean is exact there (sums of fewer than 2^13
    of its values are exact in float32), so no centring is needed."""
    from .elemwise import multiply, scalar_like, subtract
    from .math import scaled

    x, axes = call.args[0], _rank_axes(call)
    dims = [x.checked_type.shape[a] for a in axes]
    n = math.prod(dims) - int(call.attrs.unbiased) if all(d is not Any for d in dims) else 0
    if call.checked_type.dtype in HALF_DTYPES and 0 < n < 2 ** 13:
        return [multiply(scaled(keepdims_grad(call, g), 2.0 / n), subtract(x, mean(x, axes, True)))]
    return [multiply(multiply(keepdims_grad(call, g), scalar_like(2.0, call)), _centered_over_n(call))]


def _std_grad(call: Call, g: Expr):
    """g * (x - mean) / ((N - unbiased) * std); 0 where the std is 0 (a constant slice), as in PyTorch."""
    from .elemwise import divide, equal, multiply, scalar_like, where

    zero = scalar_like(0.0, call)
    safe = where(equal(call, zero), T.zeros_like(g), divide(g, call))
    return [multiply(keepdims_grad(call, safe), _centered_over_n(call))]


variance = reduction("variance", _var, _variance_grad, attrs_type=VarianceAttrs, torch_name="var",
                     doc="Variance over axes; ``unbiased=True`` divides by N - 1.")
std = reduction("std", lambda xp, x, ax, kd, a: xp.sqrt(_var(xp, x, ax, kd, a)), _std_grad, attrs_type=VarianceAttrs,
                smooth=False,  # not differentiable where a reduced slice is constant
                torch_name="std", doc="Standard deviation over axes; ``unbiased=True`` divides by N - 1.")


def _logsumexp(xp, x, ax, kd, a):
    if not math.prod(x.shape):
        return xp.log(xp.sum(xp.exp(x), axis=ax, keepdims=kd))
    m = xp.max(x, axis=ax, keepdims=True)
    m = xp.where(xp.isfinite(m), m, xp.zeros_like(m))
    out = xp.log(xp.sum(xp.exp(x - m), axis=ax, keepdims=True)) + m
    return out if kd else xp.squeeze(out, axis=ax)


def _logsumexp_grad(call: Call, g: Expr):
    from .elemwise import exp, multiply, subtract

    x = call.args[0]
    return [multiply(keepdims_grad(call, g), exp(subtract(x, keepdims_grad(call, call))))]


logsumexp = reduction("logsumexp", _logsumexp, _logsumexp_grad, quiet=True, torch_name="logsumexp")


@dataclass(frozen=True)
class ArgReduceAttrs(ReduceAttrs):
    select_last_index: bool = False

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.select_last_index, (bool, np.bool_)):
            raise AttrError(f"attribute select_last_index must be a bool, got {self.select_last_index!r}")
        object.__setattr__(self, "select_last_index", bool(self.select_last_index))


def _arg(fn: str):
    """argmax/argmin over the reduced axes moved last and flattened (the first or last extreme)."""

    def kernel(xp, x, ax, kd, a):
        keep = [i for i in range(x.ndim) if i not in ax]
        flat = xp.reshape(xp.permute_dims(x, tuple(keep + list(ax))), tuple(x.shape[i] for i in keep) + (-1,))
        if a.select_last_index:
            idx = flat.shape[-1] - 1 - getattr(xp, fn)(xp.flip(flat, axis=-1), axis=-1)
        else:
            idx = getattr(xp, fn)(flat, axis=-1)
        return xp.reshape(idx, reduce_shape(tuple(x.shape), ax, kd))

    return kernel


_NO_GRAD_INDEX = "the result is an integer index: it carries no gradient"
argmax = reduction("argmax", _arg("argmax"), attrs_type=ArgReduceAttrs, out_dtype="int32", differentiable=False,
                   nondiff_reason=_NO_GRAD_INDEX, torch_name="argmax")
argmin = reduction("argmin", _arg("argmin"), attrs_type=ArgReduceAttrs, out_dtype="int32", differentiable=False,
                   nondiff_reason=_NO_GRAD_INDEX, torch_name="argmin")
