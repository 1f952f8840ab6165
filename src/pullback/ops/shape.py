"""Shape operators: squeeze, concatenate, stack, split, repeat, tile, flip, arange.

Gradients of ``concatenate`` (along the joined axis), ``repeat`` (dims after
the axis) and ``tile`` need those dims static; the rule says so when they are not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..ir.errors import AttrError, ExecutionError, PullbackError
from ..ir.expr import Call, Expr, Tuple, TupleGetItem
from ..ir.types import ALL_DTYPES, Any, TensorType, TupleType, check_dtype
from . import layout as T
from .common import normalize_axes, normalize_axis, same_dtype, tensor_arg, tensor_args
from .registry import FusionKind, Recompute, defop, seq_of_int, type_error, zero_flops


def _int_attr(obj, name: str, minimum: Optional[int] = None) -> None:
    v = getattr(obj, name)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise AttrError(f"attribute {name} must be an int, got {v!r}")
    if minimum is not None and v < minimum:
        raise AttrError(f"attribute {name} must be >= {minimum}, got {v}")
    object.__setattr__(obj, name, int(v))


def _dims_agree(a, b) -> bool:
    return a is Any or b is Any or a == b


def _shape_mul(d, k: int):
    return Any if d is Any else d * k


# ------------------------------------------------------------------ squeeze


@dataclass(frozen=True)
class SqueezeAttrs:
    axis: Optional[tuple] = None

    def __post_init__(self):
        object.__setattr__(self, "axis", seq_of_int(self.axis, "attribute axis", allow_none=True))


def _squeeze_axes(arg_types, attrs, shape) -> tuple:
    if attrs.axis is None:
        return tuple(i for i, d in enumerate(shape) if d == 1)
    axes = normalize_axes("squeeze", attrs.axis, len(shape), arg_types)
    for a in axes:
        if shape[a] is not Any and shape[a] != 1:
            raise type_error("squeeze", arg_types, f"axis {a} has size {shape[a]}, not 1")
    return axes


def _squeeze_infer(arg_types, attrs):
    x = tensor_arg("squeeze", arg_types, 0)
    if attrs.axis is None and any(d is Any for d in x.shape):
        # whether a ? dim is 1 is only known at run time, so the result's rank would be too
        raise type_error("squeeze", arg_types, f"axis=None on shape {x.shape} with a ? dimension: give the axes to squeeze")
    axes = _squeeze_axes(arg_types, attrs, x.shape)
    return TensorType(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)


def _squeeze(xp, x, a):
    shape = tuple(x.shape)
    drop = _squeeze_axes((), a, shape)
    return xp.reshape(x, tuple(d for i, d in enumerate(shape) if i not in drop))


squeeze = defop("squeeze", 1, _squeeze_infer, kernel=_squeeze, attrs_type=SqueezeAttrs,
                grad=lambda c, g: [T.reshape_like(g, c.args[0])], pattern=FusionKind.INJECTIVE, recompute=Recompute.VIEW,
                flops=zero_flops, torch_name="squeeze", dtypes=ALL_DTYPES)

# ------------------------------------------------------------------ concatenate / stack


@dataclass(frozen=True)
class AxisAttrs:
    axis: int = 0

    def __post_init__(self):
        _int_attr(self, "axis")


def _joined(op: str, arg_types, axis: int, new_axis: bool):
    if not arg_types:
        raise type_error(op, arg_types, "needs at least one tensor")
    ts = tensor_args(op, arg_types)
    dtype = same_dtype(op, arg_types)
    ndim = ts[0].ndim
    if any(t.ndim != ndim for t in ts):
        raise type_error(op, arg_types, f"all inputs must have the same rank, got {[t.ndim for t in ts]}")
    ax = normalize_axis(op, axis, ndim + 1 if new_axis else ndim, arg_types)
    shape = list(ts[0].shape)
    for t in ts[1:]:
        for i, (a, b) in enumerate(zip(shape, t.shape)):
            if i == ax and not new_axis:
                continue
            if not _dims_agree(a, b):
                raise type_error(op, arg_types, f"shapes differ in dimension {i}: {ts[0].shape} vs {t.shape}")
            shape[i] = b if a is Any else a
    return ts, ax, shape, dtype


def _concat_infer(arg_types, attrs):
    ts, ax, shape, dtype = _joined("concatenate", arg_types, attrs.axis, False)
    dims = [t.shape[ax] for t in ts]
    shape[ax] = Any if any(d is Any for d in dims) else sum(dims)
    return TensorType(tuple(shape), dtype)


def _concat_grad(call: Call, g: Expr):
    ax = normalize_axis("concatenate", call.attrs.axis, call.checked_type.ndim)
    sizes = [a.checked_type.shape[ax] for a in call.args]
    if len(sizes) == 1:
        return [g]
    dynamic = [i for i, d in enumerate(sizes) if d is Any]
    if len(dynamic) > 1:
        shown = ["?" if d is Any else d for d in sizes]
        raise PullbackError(f"concatenate: the gradient needs static sizes along axis {ax} for all parts but one, "
                            f"got {shown} (rows a mask selects have a size known only at run time)")
    if dynamic:
        return _slices_around(g, sizes, dynamic[0], ax)
    parts = split(g, tuple(int(v) for v in np.cumsum(sizes)[:-1]), ax)
    return [TupleGetItem(parts, i) for i in range(len(sizes))]


def _slices_around(g: Expr, sizes: list, k: int, ax: int) -> list:
    """The cotangents of parts of static ``sizes`` around part ``k`` of a run-time size: the parts before it
    sliced from the start of ``g``, those after it from its end, part ``k`` what lies between."""
    from .indexing import strided_slice

    after, end = sum(sizes[k + 1:]), np.iinfo(np.int64).max  # (a slice's end past the last: Python's clamp)
    bounds, start = [], 0
    for i, d in enumerate(sizes):
        if i < k:
            bounds.append((start, start + d))
            start += d
        elif i == k:
            bounds.append((start, -after if after else end))
        else:  # (an empty part at the end: an empty slice past the last)
            rest = sum(sizes[i:])
            bounds.append((-rest if rest else end, -rest + d if rest > d else end))
    return [strided_slice(g, (b,), (e,), None, (ax,)) for b, e in bounds]


concatenate = defop("concatenate", -1, _concat_infer, kernel=lambda xp, *xs: xp.concat(xs[:-1], axis=xs[-1].axis),
                    attrs_type=AxisAttrs, grad=_concat_grad, pattern=FusionKind.INJECTIVE, flops=zero_flops,
                    torch_name="cat", dtypes=ALL_DTYPES)


def _stack_infer(arg_types, attrs):
    ts, ax, shape, dtype = _joined("stack", arg_types, attrs.axis, True)
    return TensorType(tuple(shape[:ax]) + (len(ts),) + tuple(shape[ax:]), dtype)


def _stack_grad(call: Call, g: Expr):
    ax = normalize_axis("stack", call.attrs.axis, call.checked_type.ndim)
    parts = split(g, len(call.args), ax)
    return [T.reshape_like(TupleGetItem(parts, i), a) for i, a in enumerate(call.args)]


stack = defop("stack", -1, _stack_infer, kernel=lambda xp, *xs: xp.stack(xs[:-1], axis=xs[-1].axis), attrs_type=AxisAttrs,
              grad=_stack_grad, pattern=FusionKind.INJECTIVE, flops=zero_flops, torch_name="stack", dtypes=ALL_DTYPES)

# ------------------------------------------------------------------ split


@dataclass(frozen=True)
class SplitAttrs:
    indices_or_sections: object
    axis: int = 0

    def __post_init__(self):
        v = self.indices_or_sections
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            if v < 1:
                raise AttrError(f"attribute indices_or_sections: the number of sections must be >= 1, got {v}")
            object.__setattr__(self, "indices_or_sections", int(v))
        else:
            idx = seq_of_int(v, "attribute indices_or_sections", allow_negative=False)
            if any(b < a for a, b in zip(idx, idx[1:])):
                raise AttrError(f"attribute indices_or_sections: split indices must be ascending, got {idx}")
            object.__setattr__(self, "indices_or_sections", idx)
        _int_attr(self, "axis")


def _split_sizes(arg_types, attrs, dim) -> list:
    v = attrs.indices_or_sections
    if isinstance(v, int):
        if dim is Any:
            return [Any] * v
        if dim % v:
            raise type_error("split", arg_types, f"dimension of size {dim} does not split into {v} equal sections")
        return [dim // v] * v
    if dim is not Any and v and v[-1] > dim:
        raise type_error("split", arg_types, f"split index {v[-1]} is beyond the dimension of size {dim}")
    bounds = (0,) + v
    return [b - a for a, b in zip(bounds, bounds[1:])] + [Any if dim is Any else dim - bounds[-1]]


def _split_infer(arg_types, attrs):
    x = tensor_arg("split", arg_types, 0)
    ax = normalize_axis("split", attrs.axis, x.ndim, arg_types)
    sizes = _split_sizes(arg_types, attrs, x.shape[ax])
    return TupleType(tuple(TensorType(x.shape[:ax] + (s,) + x.shape[ax + 1:], x.dtype) for s in sizes))


def _split_grad(call: Call, g: Expr):
    n = len(call.checked_type.fields)
    parts = list(g.fields) if isinstance(g, Tuple) else [TupleGetItem(g, i) for i in range(n)]
    return [concatenate(parts, normalize_axis("split", call.attrs.axis, call.args[0].checked_type.ndim))]


def _split(xp, x, a):
    """Slices along the axis (views, as ``np.split`` gives; the array API has no split)."""
    ax = a.axis % x.ndim
    n = x.shape[ax]
    v = a.indices_or_sections
    if isinstance(v, int) and n % v:
        raise ExecutionError(f"split: a dimension of size {n} does not split into {v} equal sections")
    bounds = [k * (n // v) for k in range(v + 1)] if isinstance(v, int) else [0, *v, n]
    lead = (slice(None),) * ax
    return tuple(x[lead + (slice(b, e),)] for b, e in zip(bounds, bounds[1:]))


split = defop("split", 1, _split_infer, kernel=_split, attrs_type=SplitAttrs, grad=_split_grad,
              pattern=FusionKind.INJECTIVE, flops=zero_flops,
              torch_name="tensor_split", doc="Split into a tuple along ``axis``: a number of equal sections or split indices.",
              dtypes=ALL_DTYPES)

# ------------------------------------------------------------------ repeat / tile / flip


@dataclass(frozen=True)
class RepeatAttrs:
    repeats: int
    axis: int = 0

    def __post_init__(self):
        _int_attr(self, "repeats", 0)
        _int_attr(self, "axis")


def _repeat_infer(arg_types, attrs):
    x = tensor_arg("repeat", arg_types, 0)
    ax = normalize_axis("repeat", attrs.axis, x.ndim, arg_types)
    return TensorType(x.shape[:ax] + (_shape_mul(x.shape[ax], attrs.repeats),) + x.shape[ax + 1:], x.dtype)


def _static_dims(op: str, dims) -> tuple:
    if any(d is Any for d in dims):
        raise PullbackError(f"{op}: the gradient needs static dimensions, got {tuple(dims)}")
    return tuple(dims)


def _repeat_grad(call: Call, g: Expr):
    from .reduce import sum as _sum

    x = call.args[0]
    ax = normalize_axis("repeat", call.attrs.axis, x.checked_type.ndim)
    if call.attrs.repeats == 0:
        return [T.zeros_like(x)]
    trailing = _static_dims("repeat", x.checked_type.shape[ax + 1:])
    split_g = T.reshape(g, (0,) * ax + (-1, call.attrs.repeats) + trailing)
    return [T.reshape_like(_sum(split_g, ax + 1), x)]


repeat = defop("repeat", 1, _repeat_infer, kernel=lambda xp, x, a: xp.repeat(x, a.repeats, axis=a.axis),
               attrs_type=RepeatAttrs,
               grad=_repeat_grad, pattern=FusionKind.BROADCAST, flops=zero_flops, torch_name="repeat_interleave",
               dtypes=ALL_DTYPES)


@dataclass(frozen=True)
class TileAttrs:
    reps: tuple

    def __post_init__(self):
        object.__setattr__(self, "reps", seq_of_int(self.reps, "attribute reps", allow_negative=False))


def _tile_layout(shape: tuple, reps: tuple):
    n = max(len(shape), len(reps))
    return (1,) * (n - len(shape)) + tuple(shape), (1,) * (n - len(reps)) + tuple(reps)


def _tile_infer(arg_types, attrs):
    x = tensor_arg("tile", arg_types, 0)
    shape, reps = _tile_layout(x.shape, attrs.reps)
    return TensorType(tuple(_shape_mul(d, r) for d, r in zip(shape, reps)), x.dtype)


def _tile_grad(call: Call, g: Expr):
    from .reduce import sum as _sum

    x = call.args[0]
    shape, reps = _tile_layout(_static_dims("tile", x.checked_type.shape), call.attrs.reps)
    if 0 in shape or 0 in reps:  # an empty input or result: an empty (zero) gradient (reshape's 0 copies a dim)
        return [T.zeros_like(x)]
    interleaved = tuple(v for r, d in zip(reps, shape) for v in (r, d))
    summed = _sum(T.reshape(g, interleaved), tuple(range(0, 2 * len(shape), 2)))
    return [T.reshape_like(summed, x)]


tile = defop("tile", 1, _tile_infer, kernel=lambda xp, x, a: xp.tile(x, a.reps), attrs_type=TileAttrs, grad=_tile_grad,
             pattern=FusionKind.BROADCAST, flops=zero_flops, torch_name="tile", dtypes=ALL_DTYPES)


@dataclass(frozen=True)
class FlipAttrs:
    axis: tuple = 0

    def __post_init__(self):
        object.__setattr__(self, "axis", seq_of_int(self.axis, "attribute axis"))


def _flip_infer(arg_types, attrs):
    x = tensor_arg("flip", arg_types, 0)
    normalize_axes("flip", attrs.axis, x.ndim, arg_types)
    return x


flip = defop("flip", 1, _flip_infer, kernel=lambda xp, x, a: xp.flip(x, axis=a.axis),
             impls={"numpy": lambda x, a: np.flip(x, axis=a.axis).copy()},  # NumPy's flip is a view of x
             attrs_type=FlipAttrs,
             grad=lambda c, g: [flip(g, c.attrs.axis)], pattern=FusionKind.INJECTIVE, flops=zero_flops,
             torch_name="flip", doc="Reverse along ``axis`` (Relay's ``reverse``; an int or a tuple of ints).",
             dtypes=ALL_DTYPES)

# ------------------------------------------------------------------ arange


@dataclass(frozen=True)
class ArangeAttrs:
    start: float
    stop: Optional[float] = None
    step: float = 1
    dtype: str = "float32"

    def __post_init__(self):
        for f in ("start", "stop", "step"):
            v = getattr(self, f)
            if v is None and f == "stop":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise AttrError(f"attribute {f} must be a number, got {v!r}")
        if self.stop is None:  # arange(n) counts from 0, as in NumPy
            object.__setattr__(self, "stop", self.start)
            object.__setattr__(self, "start", 0)
        if self.step == 0:
            raise AttrError("attribute step must not be zero")
        try:
            object.__setattr__(self, "dtype", check_dtype(self.dtype))
        except PullbackError as e:
            raise AttrError(f"attribute dtype: {e}") from None

    @property
    def length(self) -> int:
        return max(0, math.ceil((self.stop - self.start) / self.step))


def _arange(xp, a):
    """Attributes only: the values computed once in float64 (NumPy), like a constant."""
    return xp.asarray((np.arange(a.length, dtype="float64") * a.step + a.start).astype(a.dtype))


arange = defop("arange", 0, lambda ts, a: TensorType((a.length,), a.dtype), kernel=_arange, attrs_type=ArangeAttrs, grad=lambda c, g: [], pattern=FusionKind.INJECTIVE, torch_name="arange",
               doc="``arange(start, stop=None, step=1, dtype)``; attributes only, like NumPy.")

