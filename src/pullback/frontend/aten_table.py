"""ATen operator -> pullback converters: one table, one small function per operator.

A converter is ``fn(cx, *args, **kwargs)``: ``args`` are the FX node's
arguments with every FX node replaced by its pullback value (an ``Expr``, or a
Python list of Exprs for tuple-valued ATen ops, read by ``getitem``); plain
Python values (ints, lists, dtypes) stay as they are. ``cx`` is the importer's
context (``context.ConvertContext``): the node being converted, its output shape and
dtype (from ``node.meta["val"]``), the torch values of its arguments (for type
promotion and strides), and ``cx.random_input(...)`` / ``cx.dropout_mask(shape, rate)``,
which add an explicit random input parameter (programs stay pure).

This module holds the table, the shared helpers, and the elementwise, creation,
shape and reduction converters; ``aten_nn`` (convolution, pooling,
normalisation, attention, losses, dropout) and ``aten_indexing`` (indexing,
scatter/gather, sorting, scans) register the rest. The table is keyed by the
overload's string (``str(torch.ops.aten.relu.default)`` is
``"aten.relu.default"``), so these modules never import torch at import time.
"""

from __future__ import annotations

import math
import operator
from typing import Callable, Optional, Sequence

import numpy as np

from ..ir.errors import PullbackError
from ..ir.expr import Expr, const
from ..ir.types import Any, FLOAT_DTYPES, HALF_DTYPES, is_complex
from ..ops.math import scaled
from ..ops.registry import get_op
from .context import size_key, static_dim, torch_shape

ATEN_TABLE: dict[str, Callable] = {}


def _op(name: str):
    return get_op(name)


def aten(*names: str):
    """Register the decorated converter for the ATen overloads ``names``."""

    def deco(fn):
        for n in names:
            ATEN_TABLE[n] = fn
        return fn

    return deco


def scalar(v, dtype: str) -> Expr:
    return const(np.asarray(v, dtype=dtype))


def cast(cx, x: Expr, dtype: str) -> Expr:
    """``x`` in ``dtype`` (no cast when it already is)."""
    return x if cx.dtype_of(x) == dtype else _op("cast")(x, dtype)


def as_dtype(cx, v, dtype: str) -> Expr:
    """A tensor operand or a Python number as an expression of ``dtype`` (a symbolic size: counted off the
    input that carries it, ``ConvertContext.size_scalar``)."""
    if isinstance(v, Expr):
        return cast(cx, v, dtype)
    if hasattr(v, "node") and static_dim(v) is Any:
        return cx.size_scalar(v, dtype)
    return scalar(v, dtype)


def operand(cx, v, like: Expr) -> Expr:
    """``v`` as an expression; Python numbers take the dtype of ``like`` (weak typing, as in PyTorch)."""
    return v if isinstance(v, Expr) else as_dtype(cx, v, cx.dtype_of(like))


def result_dtype(cx, *positions: int) -> str:
    """The dtype PyTorch's type promotion gives the node's arguments at ``positions`` (tensors and numbers)."""
    import torch

    from .context import torch_dtype_name

    vals = []
    for i in positions:
        v = cx.arg_val(i)
        if hasattr(v, "dtype"):
            vals.append(v)
        elif isinstance(v, (bool, int, float)):
            vals.append(v)
        elif v is not None:  # a SymInt / SymFloat
            vals.append(float(v) if "Float" in type(v).__name__ else 1)
    if len(vals) == 1:
        v = vals[0]
        return torch_dtype_name(v.dtype) if hasattr(v, "dtype") else torch_dtype_name(torch.tensor(v).dtype)
    out = torch.result_type(vals[0], vals[1])
    for v in vals[2:]:
        out = torch.promote_types(out, v.dtype if hasattr(v, "dtype") else torch.tensor(v).dtype)
    return torch_dtype_name(out)


def norm_axis(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


_norm_axis = norm_axis


def axes_of(dims, ndim: int) -> Optional[tuple]:
    """Reduction axes from ATen's ``dim`` (None / [] means every axis), non-negative."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return None
    dims = [dims] if isinstance(dims, int) else dims
    return tuple(sorted({norm_axis(d, max(ndim, 1)) for d in dims})) if ndim else None


def static(cx, what: str, shape: Sequence) -> tuple:
    """``shape`` when every dimension is known, else a clear error about ``what``."""
    if any(d is Any for d in shape):
        raise PullbackError(f"{what} needs static shapes, got {tuple('?' if d is Any else d for d in shape)}")
    return tuple(shape)


def newshape(cx, what: str, shape: Sequence) -> tuple:
    """``shape`` as a reshape target: one dynamic (batch) dimension becomes ``-1`` (inferred at run time); more
    than one is a clear error about ``what``."""
    if sum(d is Any for d in shape) == 1:
        return tuple(-1 if d is Any else d for d in shape)
    return static(cx, what, shape)


def reshape_to(cx, what: str, x: Expr, have: Sequence, want: Sequence) -> Expr:
    """``x`` (torch sizes ``have``) reshaped to the torch sizes ``want``. With more than one dynamic dimension,
    each dynamic size must pass through (the same sizes, in order) and the static dimensions between them regroup
    among themselves (``(B*H, S, S)`` to ``(B, H, S, S)``): a ``reshape_like`` of each such run of dimensions onto
    a constant of the static shape it becomes."""
    shape = torch_shape(want)
    if sum(d is Any for d in shape) <= 1:
        return _op("reshape")(x, newshape(cx, what, shape))

    def runs(sizes):
        """The static runs between dynamic sizes (as start, dims), and the dynamic sizes' keys."""
        out, keys, start = [], [], 0
        for i, d in enumerate((*sizes, None)):
            if d is None or static_dim(d) is Any:
                out.append((start, tuple(int(static_dim(v)) for v in sizes[start:i])))
                keys.append(size_key(d) if d is not None else None)
                start = i + 1
        return out, keys

    (have_runs, have_keys), (want_runs, want_keys) = runs(tuple(have)), runs(tuple(want))
    if have_keys != want_keys or any(math.prod(a) != math.prod(b) for (_, a), (_, b) in zip(have_runs, want_runs)):
        shown = tuple("?" if d is Any else d for d in shape)
        raise PullbackError(f"{what} to {shown} needs static shapes: its dynamic sizes do not pass through unchanged")
    for (start, a), (_, b) in reversed(list(zip(have_runs, want_runs))):  # right to left: the starts stay valid
        if a != b:
            like = const(np.zeros(b, cx.dtype_of(x)))
            x = _op("reshape_like")(x, like, lhs_begin=start, lhs_end=start + len(a), rhs_begin=0, rhs_end=None)
    return x


def expand_to(cx, x: Expr, shape: tuple, sizes: Optional[Sequence] = None) -> Expr:
    """``x`` broadcast to ``shape``. With dynamic dimensions, by adding zeros (``broadcast_to`` needs a static
    shape); a dynamic dimension ``x`` does not have takes its zeros from the input carrying ``sizes[axis]``
    (the torch sizes of the result)."""
    have = tuple(cx.shape_of(x))
    if have == tuple(shape):
        return x
    if Any not in shape:
        return _op("broadcast_to")(x, tuple(shape))
    dt, n = cx.dtype_of(x), len(shape)
    aligned = (1,) * (n - len(have)) + have
    out = _op("add")(x, const(np.zeros(tuple(1 if d is Any else d for d in shape), dtype=dt)))
    for axis, (d, a) in enumerate(zip(shape, aligned)):
        if d is Any and a is not Any:
            if sizes is None:
                raise PullbackError(f"expand of {have} to a dynamic size needs the input to carry that dimension")
            zeros = cx.size_zeros(sizes[axis], dt)
            out = _op("add")(out, _op("reshape")(zeros, tuple(-1 if k == axis else 1 for k in range(n))))
    return out


def no_value(cx, *args, **kwargs):
    """Assertions and other nodes that produce nothing the program uses."""
    return None


# ------------------------------------------------------------------ elementwise

_UNARY = {
    "relu": "nn.relu", "tanh": "tanh", "sigmoid": "sigmoid", "exp": "exp", "log": "log", "sqrt": "sqrt",
    "rsqrt": "rsqrt", "neg": "negative", "abs": "abs", "erf": "erf", "sin": "sin", "cos": "cos", "tan": "tan",
    "silu": "nn.silu", "mish": "nn.mish", "hardswish": "nn.hardswish", "hardsigmoid": "nn.hardsigmoid", "reciprocal": "reciprocal",
    "log1p": "log1p", "log2": "log2", "log10": "log10", "square": "square",
    "acos": "acos", "asin": "asin", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "acosh": "acosh", "asinh": "asinh",
    "atanh": "atanh", "expm1": "expm1", "sign": "sign", "lgamma": "lgamma", "digamma": "digamma",
    "erfc": "erfc", "erfinv": "erfinv", "special_ndtri": "ndtri", "special_log_ndtr": "log_ndtr", "i0": "i0",
    "special_i0e": "i0e", "special_i1": "i1", "special_i1e": "i1e",
}


def _unary(pb: str):
    def conv(cx, x):
        return _op(pb)(cast(cx, x, cx.out_dtype))  # integers -> float where PyTorch promotes

    return conv


for _aten_name, _pb_name in _UNARY.items():
    ATEN_TABLE[f"aten.{_aten_name}.default"] = _unary(_pb_name)


@aten("aten.exp2.default")
def _exp2(cx, x):
    x = cast(cx, x, cx.out_dtype)
    return _op("power")(scalar(2.0, cx.out_dtype), x)  # exact at integers, as PyTorch's exp2


@aten("aten.ldexp.Tensor")
def _ldexp(cx, x, e):
    """``x * 2 ** e`` in the result's (floating) dtype."""
    return _op("multiply")(cast(cx, x, cx.out_dtype), _exp2(cx, e))


@aten("aten.polygamma.default")
def _polygamma(cx, n, x):
    x = cast(cx, x, cx.out_dtype)
    return _op("digamma")(x) if n == 0 else _op("polygamma")(x, n=int(n))


def _rounding(pb: str):
    def conv(cx, x):
        return _op(pb)(x) if cx.dtype_of(x) in FLOAT_DTYPES else x  # integers are already whole

    return conv


for _aten_name in ("floor", "ceil", "round", "trunc"):
    ATEN_TABLE[f"aten.{_aten_name}.default"] = _rounding(_aten_name)


@aten("aten.round.decimals")
def _round_decimals(cx, x, decimals=0):
    """PyTorch's rule: ``round(x * 10**d) / 10**d`` (``round(x / 10**-d) * 10**-d`` for negative ``d``)."""
    dt = cx.dtype_of(x)
    p = scalar(10.0 ** abs(decimals), dt)
    if decimals >= 0:
        return _op("divide")(_op("round")(_op("multiply")(x, p)), p)
    return _op("multiply")(_op("round")(_op("divide")(x, p)), p)


@aten("aten.isnan.default")
def _isnan(cx, x):
    return _op("isnan")(x) if cx.dtype_of(x) in FLOAT_DTYPES else _falses(cx, x)


@aten("aten.isinf.default")
def _isinf(cx, x):
    if cx.dtype_of(x) not in FLOAT_DTYPES:
        return _falses(cx, x)
    return _op("logical_not")(_op("logical_or")(_op("isfinite")(x), _op("isnan")(x)))


@aten("aten.signbit.default")
def _signbit(cx, x):
    return _op("signbit")(x) if cx.dtype_of(x) in FLOAT_DTYPES else _op("less")(x, scalar(0, cx.dtype_of(x)))


@aten("aten.copysign.Tensor", "aten.copysign.Scalar")
def _copysign(cx, x, y):
    """``|x|`` with the sign of ``y`` (``-0.0`` counts as negative); gradient 0 at ``x = 0``, as in PyTorch."""
    dt = cx.out_dtype
    x, y = as_dtype(cx, x, dt), as_dtype(cx, y, dt)
    a = _op("abs")(x)
    return _op("where")(_op("signbit")(y), _op("negative")(a), a)


@aten("aten.hypot.default")
def _hypot(cx, x, y):
    dt = cx.out_dtype
    x, y = as_dtype(cx, x, dt), as_dtype(cx, y, dt)
    return _op("sqrt")(_op("add")(_op("multiply")(x, x), _op("multiply")(y, y)))


@aten("aten.dist.default")
def _dist(cx, x, y, p=2):
    """``torch.dist``: the p-norm of ``x - y`` over every entry."""
    return _vector_norm(cx, _op("subtract")(x, y), p)


@aten("aten.isfinite.default")
def _isfinite(cx, x):
    return _op("isfinite")(x) if cx.dtype_of(x) in FLOAT_DTYPES else _op("logical_not")(_falses(cx, x))


def _falses(cx, x):
    return _op("not_equal")(x, x)  # False everywhere, of x's shape


@aten("aten.gelu.default")
def _gelu(cx, x, approximate="none"):
    return _op("nn.gelu")(x, approximate=approximate)


@aten("aten.leaky_relu.default")
def _leaky_relu(cx, x, negative_slope=0.01):
    return _op("nn.leaky_relu")(x, alpha=float(negative_slope))


@aten("aten.softplus.default")
def _softplus(cx, x, beta=1.0, threshold=20.0):
    return _op("nn.softplus")(x, beta=float(beta), threshold=float(threshold))


@aten("aten.elu.default")
def _elu(cx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    """``scale * x`` where ``x > 0``, else ``alpha * scale * expm1(input_scale * x)``."""
    dt = cx.dtype_of(x)
    neg = _op("multiply")(_op("expm1")(_op("multiply")(x, scalar(input_scale, dt))), scalar(alpha * scale, dt))
    pos = _op("multiply")(x, scalar(scale, dt)) if scale != 1 else x
    return _op("where")(_op("greater")(x, scalar(0, dt)), pos, neg)


@aten("aten.hardtanh.default")
def _hardtanh(cx, x, lo=-1.0, hi=1.0):
    return _clamp(cx, x, lo, hi)


@aten("aten.clamp.default")
def _clamp(cx, x, lo=None, hi=None):
    x = cast(cx, x, cx.out_dtype)  # an integer tensor clamped to float bounds becomes float
    if lo is not None and hi is not None and lo > hi:  # PyTorch: every element becomes max
        return _op("full_like")(x, scalar(hi, cx.dtype_of(x)))
    return _op("clip")(x, -math.inf if lo is None else float(lo), math.inf if hi is None else float(hi))


@aten("aten.clamp.Tensor")
def _clamp_tensor(cx, x, lo=None, hi=None):
    dt = cx.out_dtype
    out = cast(cx, x, dt)
    if lo is not None:
        out = _op("maximum")(out, as_dtype(cx, lo, dt))
    if hi is not None:
        out = _op("minimum")(out, as_dtype(cx, hi, dt))
    return out if cx.shape_of(out) == cx.out_shape else _op("broadcast_to")(out, cx.out_shape)


def by_number(cx, x, y, dt: str, divide: bool) -> Optional[Expr]:
    """``x * y`` or ``x / y`` as ATen computes it on a float16/bfloat16 tensor ``x`` when ``y`` is a number (a
    Python one, or a rank-0 tensor of a wider float dtype): in float32, ``y`` unrounded, the result rounded once.
    None when that is the plain operator's result."""
    if dt not in HALF_DTYPES or not isinstance(x, Expr) or cx.dtype_of(x) != dt:
        return None
    if isinstance(y, (int, float)) and not isinstance(y, bool):
        return scaled(x, float(y), divide)
    if isinstance(y, Expr) and cx.shape_of(y) == () and cx.dtype_of(y) in ("float32", "float64"):
        wide = _op("divide" if divide else "multiply")(cast(cx, x, "float32"), cast(cx, y, "float32"))
        return _op("cast")(wide, dt)
    return None


def _arith(pb: str):
    """A promoting binary operator: both operands in the node's result dtype (PyTorch's type promotion); a
    float16/bfloat16 tensor times or over a number computed in float32 (``by_number``)."""

    def conv(cx, x, y, alpha=1):
        dt = cx.out_dtype
        if pb in ("multiply", "divide"):
            exact = by_number(cx, x, y, dt, pb == "divide")
            if exact is not None:
                return exact
        a, b = as_dtype(cx, x, dt), as_dtype(cx, y, dt)
        if alpha != 1:
            b = _op("multiply")(b, scalar(alpha, dt))
        return _op(pb)(a, b)

    return conv


for _aten_name, _pb_name in (("add", "add"), ("sub", "subtract"), ("mul", "multiply"), ("div", "divide"), ("pow", "power"),
                             ("maximum", "maximum"), ("minimum", "minimum"), ("atan2", "atan2"), ("fmax", "maximum"),
                             ("fmin", "minimum")):
    for _ov in ("Tensor", "Scalar", "Tensor_Scalar", "Tensor_Tensor", "default"):
        ATEN_TABLE[f"aten.{_aten_name}.{_ov}"] = _arith(_pb_name)


ATEN_TABLE["aten.atan2.out"] = lambda cx, x, y, out=None: _arith("atan2")(cx, x, y)


@aten("aten.resize_.default", "aten.resize.default")
def _resize(cx, x, size, memory_format=None):
    """The first elements of ``x`` in the new shape; elements beyond ``x``'s are zeros (uninitialised in PyTorch)."""
    size = tuple(int(s) for s in size)
    n, have = math.prod(size), math.prod(static(cx, "resize_", cx.shape_of(x)))
    flat = _op("reshape")(x, (have,))
    if n < have:
        flat = _op("strided_slice")(flat, (0,), (n,), (1,), (0,))
    elif n > have:
        flat = _op("nn.pad")(flat, ((0, n - have),), 0.0, "constant")
    return _op("reshape")(flat, size) if n else _filled(cx, 0)


@aten("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(cx, x, y, alpha=1):
    dt = cx.out_dtype
    a = as_dtype(cx, x, dt)
    if alpha != 1:
        a = _op("multiply")(a, scalar(alpha, dt))
    return _op("subtract")(as_dtype(cx, y, dt), a)


@aten("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(cx, x, y, rounding_mode=None):
    dt = cx.out_dtype
    a, b = as_dtype(cx, x, dt), as_dtype(cx, y, dt)
    if rounding_mode is None:
        return _op("divide")(a, b)
    if dt in FLOAT_DTYPES:
        return _op("floor" if rounding_mode == "floor" else "trunc")(_op("divide")(a, b))
    if rounding_mode == "floor":
        return _op("floor_divide")(a, b)
    return _op("divide")(_op("subtract")(a, _op("mod")(a, b)), b)  # exact: a - fmod(a, b) is a multiple of b


@aten("aten.remainder.Tensor", "aten.remainder.Scalar", "aten.remainder.Scalar_Tensor")
def _remainder(cx, x, y):
    dt = cx.out_dtype
    return _op("remainder")(as_dtype(cx, x, dt), as_dtype(cx, y, dt))


@aten("aten.fmod.Tensor", "aten.fmod.Scalar")
def _fmod(cx, x, y):
    dt = cx.out_dtype
    return _op("mod")(as_dtype(cx, x, dt), as_dtype(cx, y, dt))


def _compare(pb: str):
    def conv(cx, x, y):
        dt = result_dtype(cx, 0, 1)
        return _op(pb)(as_dtype(cx, x, dt), as_dtype(cx, y, dt))

    return conv


for _aten_name, _pb_name in (("eq", "equal"), ("ne", "not_equal"), ("gt", "greater"), ("ge", "greater_equal"),
                             ("lt", "less"), ("le", "less_equal")):
    for _ov in ("Tensor", "Scalar"):
        ATEN_TABLE[f"aten.{_aten_name}.{_ov}"] = _compare(_pb_name)


def as_bool(cx, x) -> Expr:
    return x if cx.dtype_of(x) == "bool" else _op("not_equal")(x, scalar(0, cx.dtype_of(x)))


@aten("aten.logical_not.default")
def _logical_not(cx, x):
    return _op("logical_not")(as_bool(cx, x))


def _logical(pb: str):
    def conv(cx, x, y):
        return _op(pb)(as_bool(cx, x), as_bool(cx, y))

    return conv


ATEN_TABLE["aten.logical_and.default"] = _logical("logical_and")
ATEN_TABLE["aten.logical_or.default"] = _logical("logical_or")
ATEN_TABLE["aten.logical_xor.default"] = _logical("not_equal")


def _bitwise(pb: str):
    def conv(cx, x, y):
        dt = cx.out_dtype
        return _op(pb)(as_dtype(cx, x, dt), as_dtype(cx, y, dt))

    return conv


for _aten_name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    for _ov in ("Tensor", "Scalar", "Scalar_Tensor"):
        ATEN_TABLE[f"aten.{_aten_name}.{_ov}"] = _bitwise(_aten_name)
ATEN_TABLE["aten.gcd.default"] = _bitwise("gcd")
ATEN_TABLE["aten.lcm.default"] = _bitwise("lcm")


@aten("aten.bitwise_not.default")
def _bitwise_not(cx, x):
    return _op("bitwise_not")(x)


@aten("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(cx, c, x, y):
    dt = cx.out_dtype
    return _op("where")(as_bool(cx, c), as_dtype(cx, x, dt), as_dtype(cx, y, dt))


@aten("aten._to_copy.default", "aten.to.dtype", "aten.type_as.default", "aten.to.dtype_layout")
def _to_copy(cx, x, *args, **kwargs):
    return cast(cx, x, cx.out_dtype)


@aten("aten.clone.default", "aten.contiguous.default", "aten.alias.default", "aten.lift_fresh_copy.default",
      "aten.lift_fresh.default")
def _identity(cx, x, *args, **kwargs):
    return x


@aten("aten.detach.default")
def _detach(cx, x):
    return _op("stop_gradient")(x)


@aten("aten.copy.default")
def _copy(cx, dst, src, non_blocking=False):
    """``dst`` overwritten by ``src`` (broadcast to ``dst``'s shape, cast to its dtype)."""
    out = cast(cx, src, cx.dtype_of(dst))
    return expand_to(cx, out, tuple(cx.shape_of(dst)), cx.val.shape)


# ------------------------------------------------------------------ creation


@aten("aten.scalar_tensor.default")
def _scalar_tensor(cx, value, **kwargs):
    return as_dtype(cx, value, cx.out_dtype) if isinstance(value, Expr) else scalar(value, cx.out_dtype)


def _filled(cx, fill) -> Expr:
    """The node's result filled with ``fill``; a dynamic (batch) dimension is broadcast from 1 (``expand_to``)."""
    shape = tuple(cx.out_shape)
    ones = tuple(1 if d is Any else d for d in shape)
    if isinstance(fill, Expr):  # a value computed in the program (e.g. ``x.item()``)
        out = _op("full")(as_dtype(cx, fill, cx.out_dtype), ones, cx.out_dtype)
    else:
        out = const(np.full(ones, fill, dtype=cx.out_dtype))
    return expand_to(cx, out, shape, cx.val.shape) if Any in shape else out


@aten("aten.full.default", "aten.new_full.default")
def _full(cx, *args, **kwargs):
    return _filled(cx, args[-1] if str(cx.node.target) == "aten.full.default" else args[2])


@aten("aten.zeros.default", "aten.new_zeros.default", "aten.empty.memory_format", "aten.empty_strided.default",
      "aten.new_empty.default", "aten.new_empty_strided.default", "aten.empty_like.default", "aten.zeros_like.default",
      "aten.empty_permuted.default")
def _zeros(cx, *args, **kwargs):
    return _filled(cx, 0)  # uninitialised memory in PyTorch (empty*): zeros here


@aten("aten.ones.default", "aten.new_ones.default", "aten.ones_like.default")
def _ones(cx, *args, **kwargs):
    return _filled(cx, 1)


# what a tensor filled in place (``h.zero_()``, ``h.fill_(v)``) decomposes from
IN_PLACE_FILLS = frozenset({"aten.zero.default", "aten.fill.Scalar", "aten.fill.Tensor"})


def _overwritten(cx, x: Expr, fill) -> Expr:
    """``x`` filled with ``fill``. Filled in place, ``x`` stays in autograd's graph with a zero gradient, so the
    parameters it was computed from get a zero ``.grad`` as in eager, not None: the fill is ``x`` overwritten whole
    (``strided_set``, which SimplifyExpr turns into the fill itself once the gradient is taken)."""
    out = _filled(cx, fill)
    origin = cx.node.meta.get("original_aten", cx.node.target)
    shape = tuple(cx.shape_of(x))
    if str(origin) not in IN_PLACE_FILLS or Any in shape or not shape or cx.dtype_of(x) != cx.out_dtype:
        return out
    return _op("strided_set")(x, out, (0,) * len(shape), shape)


@aten("aten.full_like.default")
def _full_like(cx, x, fill, **kwargs):
    return _overwritten(cx, x, fill)


@aten("aten.fill.Scalar", "aten.fill.Tensor")
def _fill(cx, x, value):
    return _overwritten(cx, x, value)


@aten("aten.arange.start_step", "aten.arange.start", "aten.arange.default")
def _arange(cx, *args, **kwargs):
    """``arange``; a dynamic length (``arange(batch)``) is ``start + step * (cumsum(ones) - 1)`` over the
    input axis that carries it."""
    nums = [int(a) if isinstance(a, bool) else a for a in args if isinstance(a, (int, float)) or hasattr(a, "node")]
    start, stop, step = (0, nums[0], 1) if len(nums) == 1 else (nums[0], nums[1], nums[2] if len(nums) > 2 else 1)
    length = cx.val.shape[0]
    if static_dim(length) is not Any:
        return _op("arange")(start, int(stop) if hasattr(stop, "node") else stop, step, cx.out_dtype)
    if hasattr(start, "node") or hasattr(step, "node"):
        raise PullbackError("arange with a dynamic start or step is not supported (a dynamic end is)")
    return dynamic_range(cx, length, start, step, cx.out_dtype)


@aten("aten.tril_indices.default", "aten.triu_indices.default")
def _triangle_indices(cx, row, col, offset=0, **kwargs):
    """``torch.tril_indices``/``triu_indices``: the (2, N) coordinates of a triangle, a constant of the program."""
    if not all(isinstance(v, int) for v in (row, col, offset)):
        raise PullbackError(f"{cx.node.target.__name__.split('.')[0]} of a size the input decides is not supported "
                            f"(row, col and offset must be static), got {row}, {col}, {offset}")
    pick = np.tril_indices if "tril" in str(cx.node.target) else np.triu_indices
    return const(np.stack(pick(row, offset, col)).astype(cx.out_dtype).reshape(2, -1))


def dynamic_range(cx, length, start, step, dt: str) -> Expr:
    """``start + step * arange(length)`` for a symbolic ``length`` (a ``SymInt`` an input carries):
    ``start + step * (cumsum(ones) - 1)`` over the input axis that carries it."""
    count = _op("cumsum")(_op("add")(cx.size_zeros(length, dt), scalar(1, dt)), axis=0)
    out = _op("add")(_op("multiply")(_op("subtract")(count, scalar(1, dt)), scalar(step, dt)), scalar(start, dt))
    if start == 0 and step == 1:
        cx.ranges[out] = size_key(length)  # 0, 1, ..., length - 1: what a causal mask compares (``causal_over``)
    return out


for _name in ("aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten._assert_async.msg",
              "aten.sym_constrain_range_for_size.default", "aten.sym_constrain_range.default", "aten._assert_async.default"):
    ATEN_TABLE[_name] = no_value


def _python_scalar(fn):
    """``operator.*`` on shape values: computed when they are numbers; on symbolic sizes, the symbolic value the
    export recorded (``seq + 1``: a slice's end; computing it here could fix the size); on values the data
    decides, nothing (they only feed PyTorch's runtime assertions, which the importer drops)."""

    def conv(cx, *args):
        if all(isinstance(a, (bool, int, float)) for a in args):
            return fn(*args)
        return cx.val if hasattr(cx.val, "node") and all(isinstance(a, (bool, int, float)) or hasattr(a, "node")
                                                          for a in args) else None

    return conv


for _fn in (operator.ge, operator.gt, operator.le, operator.lt, operator.eq, operator.ne, operator.add, operator.sub,
            operator.mul, operator.floordiv, operator.truediv, operator.mod, operator.neg, operator.and_, operator.or_):
    ATEN_TABLE[str(_fn)] = _python_scalar(_fn)


def _over_terms(fn):
    """A ``torch.sym_*`` function of a list of shape values (Dynamo's graphs of data-dependent sizes: the rows a
    ``torch.cat`` of masked selections has, ``torch.sym_sum``), as ``_python_scalar`` computes operators."""
    scalar_fn = _python_scalar(lambda *terms: fn(terms))
    return lambda cx, terms: scalar_fn(cx, *terms)


# keyed as the importer names a Python function in a graph: "module.qualname"
ATEN_TABLE["torch.sym_sum"] = _over_terms(sum)
ATEN_TABLE["torch.sym_max"] = _python_scalar(max)
ATEN_TABLE["torch.sym_min"] = _python_scalar(min)


@aten("aten._local_scalar_dense.default", "aten.item.default")
def _item(cx, x):
    """``x.item()``: the one element as a rank-0 tensor (later operators take it as an operand)."""
    return _op("reshape")(x, ())


@aten("aten.sym_size.int")
def _sym_size(cx, x, dim):
    return cx.arg_val(0).shape[dim]


@aten("aten.sym_numel.default")
def _sym_numel(cx, x):
    return cx.arg_val(0).numel()


@aten("aten.sym_stride.int")
def _sym_stride(cx, x, dim):
    return cx.arg_val(0).stride(dim)


@aten("aten.sym_storage_offset.default")
def _sym_storage_offset(cx, x):
    return 0


@aten("aten.sym_is_contiguous.default")
def _sym_is_contiguous(cx, x, *args):
    return True


# ------------------------------------------------------------------ shapes


@aten("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.flatten.using_ints",
      "aten.unflatten.int", "aten.view_as.default", "aten.reshape_as.default", "aten._reshape_alias.default",
      "aten.view_copy.default")
def _reshape(cx, x, *args):
    shape = cx.out_shape
    if cx.shape_of(x) == shape:
        return x
    if 0 in shape:  # an empty result (reshape's 0 would mean "copy this dim")
        return _op("zeros")(static(cx, "reshape", shape), cx.out_dtype)
    return reshape_to(cx, "reshape", x, cx.arg_val(0).shape, cx.val.shape)


@aten("aten.permute.default", "aten.permute_copy.default")
def _permute(cx, x, dims):
    n = cx.ndim_of(x)
    perm = tuple(norm_axis(d, n) for d in dims)
    return x if perm == tuple(range(n)) else _op("transpose")(x, perm)


@aten("aten.transpose.int")
def _transpose(cx, x, d0, d1):
    n = cx.ndim_of(x)
    if n < 2:
        return x
    perm = list(range(n))
    d0, d1 = norm_axis(d0, n), norm_axis(d1, n)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return x if d0 == d1 else _op("transpose")(x, tuple(perm))


@aten("aten.t.default", "aten.numpy_T.default")
def _t(cx, x):
    return _op("transpose")(x, tuple(reversed(range(cx.ndim_of(x))))) if cx.ndim_of(x) >= 2 else x


@aten("aten.unsqueeze.default")
def _unsqueeze(cx, x, dim):
    return _op("expand_dims")(x, norm_axis(dim, cx.ndim_of(x) + 1))


@aten("aten.squeeze.dims", "aten.squeeze.dim", "aten.squeeze.default")
def _squeeze(cx, x, dims=None):
    shape = cx.shape_of(x)
    dims = range(len(shape)) if dims is None else [dims] if isinstance(dims, int) else dims
    axes = tuple(sorted({norm_axis(d, len(shape)) for d in dims if len(shape) and shape[d] == 1}))
    return _op("squeeze")(x, axes) if axes else x


@aten("aten.expand.default", "aten.expand_as.default", "aten.expand_copy.default")
def _expand(cx, x, *args):
    return expand_to(cx, x, tuple(cx.out_shape), cx.val.shape)


@aten("aten.select.int")
def _select(cx, x, dim, index):
    n = cx.ndim_of(x)
    dim = norm_axis(dim, n)
    if isinstance(index, Expr):  # an index computed by the program (``x[:, t.argmax()]``)
        return _op("take")(x, cast(cx, index, "int64"), axis=dim, mode="fast")
    size = cx.shape_of(x)[dim]
    if index < 0:
        index = index + static(cx, "select with a negative index", (size,))[0]
    part = _op("strided_slice")(x, (index,), (index + 1,), (1,), (dim,))
    return _op("squeeze")(part, (dim,))


def slice_bounds(size, start, end, step) -> tuple:
    """ATen's slice bounds made explicit (None start/end, ends past the size)."""
    start = 0 if start is None else start
    big = 2 ** 62
    end = big if end is None or (size is not Any and end > size) else end
    return start, end, step


@aten("aten.slice.Tensor")
def _slice(cx, x, dim=0, start=None, end=None, step=1):
    dim = norm_axis(dim, cx.ndim_of(x))
    size = cx.shape_of(x)[dim]
    if any(static_dim(b) is Any for b in (start, end) if hasattr(b, "node")):  # a bound of a dynamic size
        return _dynamic_slice(cx, x, dim, start, step)
    start, end, step = slice_bounds(size, start, end, step)
    if start == 0 and end >= (size if size is not Any else 2 ** 62) and step == 1:
        return x
    return _op("strided_slice")(x, (start,), (end,), (step,), (dim,))


def _dynamic_slice(cx, x, dim: int, start, step) -> Expr:
    """A slice whose bounds are symbolic sizes (``mask[:, :seq]``; comparing them in Python would fix the
    size): the whole axis when the result keeps it (the same size), else the rows ``start + step * k`` taken."""
    length, have = cx.val.shape[dim], cx.arg_val(0).shape[dim]
    if hasattr(start, "node") and static_dim(start) is Any:
        raise PullbackError(f"slice: a dynamic start ({start}) is not supported (a dynamic end is)")
    if size_key(length) == size_key(have):
        return x
    index = dynamic_range(cx, length, start or 0, step, "int64")
    return _op("take")(x, index, axis=dim, mode="fast")


@aten("aten.narrow_copy.default", "aten.narrow.default")
def _narrow(cx, x, dim, start, length):
    return _slice(cx, x, dim, start, start + length)


@aten("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default", "aten.unbind.int",
      "aten.split_with_sizes_copy.default", "aten.unbind_copy.int")
def _split(cx, x, sizes=None, dim=0):
    """Every piece is a strided_slice (chunk/split/unbind); the sizes come from the node's outputs."""
    if str(cx.node.target).startswith("aten.unbind"):
        dim = sizes if sizes is not None else 0
    n = cx.ndim_of(x)
    dim = norm_axis(dim, n)
    out, start = [], 0
    for shape in cx.out_shapes:
        stop = start + (shape[dim] if len(shape) == n else 1)
        piece = _op("strided_slice")(x, (start,), (stop,), (1,), (dim,))
        out.append(piece if len(shape) == n else _op("squeeze")(piece, (dim,)))
        start = stop
    return out


@aten("aten.cat.default")
def _cat(cx, xs, dim=0):
    """``concatenate``; PyTorch's legacy empty 1-D tensors (shape ``(0,)``) are skipped, as ``torch.cat`` does."""
    rank = len(cx.out_shape)
    parts = [cast(cx, x, cx.out_dtype) for x in xs if not (rank != 1 and cx.shape_of(x) == (0,))]
    if not parts:
        return _filled(cx, 0)
    return parts[0] if len(parts) == 1 else _op("concatenate")(parts, norm_axis(dim, rank))


@aten("aten.stack.default")
def _stack(cx, xs, dim=0):
    return _op("stack")([cast(cx, x, cx.out_dtype) for x in xs], norm_axis(dim, len(cx.out_shape)))


@aten("aten.flip.default")
def _flip(cx, x, dims):
    axes = tuple(norm_axis(d, cx.ndim_of(x)) for d in dims)
    return _op("flip")(x, axes) if axes and cx.ndim_of(x) else x


@aten("aten.repeat.default")
def _repeat(cx, x, repeats):
    return _op("tile")(x, tuple(int(r) for r in repeats))


@aten("aten.constant_pad_nd.default")
def _constant_pad_nd(cx, x, pad, value=0):
    """``pad`` holds (before, after) pairs from the last dimension backwards; negative sizes crop."""
    n = cx.ndim_of(x)
    widths = [(0, 0)] * n
    for k in range(len(pad) // 2):
        widths[n - 1 - k] = (int(pad[2 * k]), int(pad[2 * k + 1]))
    if all(w == (0, 0) for w in widths):
        return x
    return _op("nn.pad")(x, tuple(widths), float(value), "constant")


# ------------------------------------------------------------------ reductions and softmax


def _reduce(pb: str, cast_to_out: bool = True):
    def conv(cx, x, dims=None, keepdim=False, dtype=None, **kwargs):
        if cast_to_out:
            x = cast(cx, x, cx.out_dtype)  # sum of integers/bools is int64, as in PyTorch
        axis = axes_of(dims, cx.ndim_of(x))
        if cx.ndim_of(x) == 0:
            return x
        return _op(pb)(x, axis, bool(keepdim))

    return conv


for _aten_name, _pb_name in (("sum", "sum"), ("mean", "mean"), ("amax", "max"), ("amin", "min")):
    for _ov in ("dim_IntList", "dim", "default"):
        ATEN_TABLE[f"aten.{_aten_name}.{_ov}"] = _reduce(_pb_name, _aten_name in ("sum", "mean"))
ATEN_TABLE["aten.max.default"] = _reduce("max", False)
ATEN_TABLE["aten.min.default"] = _reduce("min", False)


@aten("aten.prod.default", "aten.prod.dim_int")
def _prod(cx, x, dim=None, keepdim=False, dtype=None):
    x = cast(cx, x, cx.out_dtype)
    if cx.ndim_of(x) == 0:
        return x
    return _op("prod")(x, None if dim is None else (norm_axis(dim, cx.ndim_of(x)),), bool(keepdim))


def _extreme_with_index(pb: str, arg: str):
    def conv(cx, x, dim, keepdim=False):
        if cx.ndim_of(x) == 0:
            return [x, _op("zeros")((), "int64")]
        axis = (norm_axis(dim, cx.ndim_of(x)),)
        return [_op(pb)(x, axis, bool(keepdim)), _op("cast")(_op(arg)(x, axis, bool(keepdim)), "int64")]

    return conv


ATEN_TABLE["aten.max.dim"] = _extreme_with_index("max", "argmax")
ATEN_TABLE["aten.min.dim"] = _extreme_with_index("min", "argmin")


def _arg_extreme(pb: str):
    def conv(cx, x, dim=None, keepdim=False):
        if cx.ndim_of(x) == 0:
            return _op("zeros")((), "int64")
        axis = None if dim is None else (norm_axis(dim, cx.ndim_of(x)),)
        out = _op(pb)(x, axis, bool(keepdim))
        if dim is None and keepdim:
            out = _op("reshape")(out, cx.out_shape)
        return _op("cast")(out, "int64")

    return conv


ATEN_TABLE["aten.argmax.default"] = _arg_extreme("argmax")
ATEN_TABLE["aten.argmin.default"] = _arg_extreme("argmin")


@aten("aten.any.default", "aten.any.dim", "aten.any.dims")
def _any(cx, x, dims=None, keepdim=False):
    b = _op("cast")(as_bool(cx, x), "int64")
    if cx.ndim_of(x) == 0:
        return as_bool(cx, x)
    return _op("greater")(_op("sum")(b, axes_of(dims, cx.ndim_of(x)), bool(keepdim)), scalar(0, "int64"))


@aten("aten.all.default", "aten.all.dim", "aten.all.dims")
def _all(cx, x, dims=None, keepdim=False):
    if cx.ndim_of(x) == 0:
        return as_bool(cx, x)
    b = _op("cast")(_op("logical_not")(as_bool(cx, x)), "int64")
    return _op("equal")(_op("sum")(b, axes_of(dims, cx.ndim_of(x)), bool(keepdim)), scalar(0, "int64"))


def _var_flags(cx, args: tuple, keepdim, unbiased) -> tuple:
    """``(keepdim, unbiased)`` of a ``var``/``var_mean`` call: ``.dim`` overloads pass ``(unbiased, keepdim)``
    positionally after ``dim``, ``.correction`` ones ``keepdim`` alone."""
    if str(cx.node.target).endswith(".dim") and args:
        return (args[1] if len(args) > 1 else keepdim), args[0]
    return (args[0] if args else keepdim), unbiased


@aten("aten.var.correction", "aten.var.dim")
def _var(cx, x, dims=None, *args, correction=None, keepdim=False, unbiased=None):
    keepdim, unbiased = _var_flags(cx, args, keepdim, unbiased)
    ddof = (1 if unbiased is None or unbiased else 0) if correction is None else correction
    x = cast(cx, x, cx.out_dtype)
    if cx.ndim_of(x) == 0:
        x = _op("reshape")(x, (1,))
        dims = None
    axis = axes_of(dims, cx.ndim_of(x))
    if ddof in (0, 1):
        return _op("variance")(x, axis, bool(keepdim), False, bool(ddof))
    shape = static(cx, "var with a correction other than 0 or 1", cx.shape_of(x))
    n = math.prod(shape[a] for a in (axis if axis is not None else range(len(shape))))
    biased = _op("variance")(x, axis, bool(keepdim), False, False)
    return _op("multiply")(biased, scalar(n / (n - ddof) if n != ddof else math.inf, cx.out_dtype))


@aten("aten.var_mean.correction", "aten.var_mean.dim")
def _var_mean(cx, x, dims=None, *args, correction=None, keepdim=False, unbiased=None):
    """``torch.var_mean`` (weight standardisation, hand-written norms): ``(var, mean)`` over the same axes."""
    var = _var(cx, x, dims, *args, correction=correction, keepdim=keepdim, unbiased=unbiased)
    keepdim, _ = _var_flags(cx, args, keepdim, unbiased)
    x = cast(cx, x, cx.out_dtype)
    if cx.ndim_of(x) == 0:
        return [var, x]
    return [var, _op("mean")(x, axes_of(dims, cx.ndim_of(x)), bool(keepdim))]


@aten("aten.linalg_vector_norm.default")
def _vector_norm(cx, x, ord=2, dim=None, keepdim=False, dtype=None):
    """``torch.linalg.vector_norm`` (``F.normalize``, Swin v2, ConvNeXt v2): ord 2, 1, inf, -inf, 0 or any p.
    An all-zero slice has norm 0 and gradient 0 (PyTorch's subgradient), not NaN."""
    if cx.ndim_of(x) == 0:  # the norm of one element, a scalar whatever dim and keepdim say
        return _vector_norm(cx, _op("reshape")(x, (1,)), ord, None, False, dtype)
    dt = cx.out_dtype
    a = _op("complex_abs")(x) if is_complex(cx.dtype_of(x)) else x
    a = cast(cx, a, dt)
    axis, keep, p = axes_of(dim, cx.ndim_of(a)), bool(keepdim), float(ord)
    if dt in HALF_DTYPES and p not in (math.inf, -math.inf, 0.0):  # ATen sums and roots in float32
        return _op("cast")(_p_norm(_op("cast")(a, "float32"), axis, keep, p, "float32"), dt)
    return _p_norm(a, axis, keep, p, dt)


def _p_norm(a: Expr, axis, keep: bool, p: float, dt: str) -> Expr:
    if p in (math.inf, -math.inf):
        return _op("max" if p > 0 else "min")(_op("abs")(a), axis, keep)
    if p == 0:
        return _op("sum")(_op("cast")(_op("not_equal")(a, scalar(0, dt)), dt), axis, keep)
    if p == 1:
        return _op("sum")(_op("abs")(a), axis, keep)
    s = _op("sum")(_op("multiply")(a, a) if p == 2 else _op("power")(_op("abs")(a), scalar(p, dt)), axis, keep)
    if p < 0:
        return _op("power")(s, scalar(1.0 / p, dt))
    nonzero = _op("greater")(s, scalar(0, dt))
    safe = _op("where")(nonzero, s, scalar(1, dt))  # the root's gradient at 0 would be inf * 0
    root = _op("sqrt")(safe) if p == 2 else _op("power")(safe, scalar(1.0 / p, dt))
    return _op("where")(nonzero, root, scalar(0, dt))


@aten("aten.histc.default")
def _histc(cx, x, bins=100, min=0, max=0):
    """Counts of ``x`` in ``bins`` equal bins over [min, max] (the data's range when min == max, widened by one
    each way if that is empty too); values outside are left out, the maximum falls in the last bin. The
    token counts of mixture-of-experts routing; no gradient, as in PyTorch."""
    dt = cx.out_dtype
    if 0 in tuple(cx.shape_of(x)):  # nothing to count
        return _op("zeros")((int(bins),), dt)
    x = _op("reshape")(x, (-1,))
    if min == max:
        lo, hi = _op("min")(x, None, False), _op("max")(x, None, False)
        same = _op("equal")(lo, hi)
        lo = _op("where")(same, _op("subtract")(lo, scalar(1, dt)), lo)
        hi = _op("where")(same, _op("add")(hi, scalar(1, dt)), hi)
    else:
        lo, hi = scalar(min, dt), scalar(max, dt)
    pos = _op("floor")(_op("divide")(_op("multiply")(_op("subtract")(x, lo), scalar(bins, dt)), _op("subtract")(hi, lo)))
    idx = _op("clip")(_op("cast")(pos, "int64"), 0, int(bins) - 1)
    inside = _op("logical_and")(_op("greater_equal")(x, lo), _op("less_equal")(x, hi))
    counts = _op("zeros")((int(bins),), dt)
    return _op("index_add")(counts, _op("where")(inside, idx, scalar(0, "int64")), _op("cast")(inside, dt), axis=0)


@aten("aten._softmax.default", "aten.softmax.int")
def _softmax(cx, x, dim, *rest):
    x = cast(cx, x, cx.out_dtype)
    return _op("nn.softmax")(x, axis=dim) if cx.ndim_of(x) else _op("ones_like")(x)


def safe_softmax(cx, x: Expr, axis: int) -> Expr:
    """Softmax over ``axis`` with 0 on a slice that is -inf throughout (an attention row masked everywhere) and
    gradient 0 there: the slice is replaced by zeros before the softmax, so no NaN reaches the gradient."""
    dt = cx.dtype_of(x)
    axis = norm_axis(axis, cx.ndim_of(x))
    empty = _op("equal")(_op("max")(x, (axis,), True), scalar(-np.inf, dt))
    p = _op("nn.softmax")(_op("where")(empty, scalar(0.0, dt), x), axis=axis)
    return _op("where")(empty, scalar(0.0, dt), p)


@aten("aten._safe_softmax.default")
def _safe_softmax(cx, x, dim, dtype=None):
    x = cast(cx, x, cx.out_dtype)
    return safe_softmax(cx, x, dim) if cx.ndim_of(x) else _op("ones_like")(x)


@aten("aten._log_softmax.default", "aten.log_softmax.int")
def _log_softmax(cx, x, dim, *rest):
    x = cast(cx, x, cx.out_dtype)
    return _op("nn.log_softmax")(x, axis=dim) if cx.ndim_of(x) else _op("zeros_like")(x)


__all__ = ["ATEN_TABLE", "aten", "scalar", "cast", "as_dtype", "operand", "result_dtype", "norm_axis", "axes_of", "static",
           "newshape", "reshape_to", "expand_to", "safe_softmax", "dynamic_range"]

from . import aten_complex, aten_indexing, aten_linalg, aten_nn, library_ops  # noqa: E402,F401  (registration)
