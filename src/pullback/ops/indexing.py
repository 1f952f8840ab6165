"""Indexing operators and their scatter-style adjoints.

``strided_slice`` / ``strided_set``, ``take`` / ``index_add``, ``gather`` /
``scatter_add`` come in adjoint pairs: the gradient of each is written with
the other, so gradients of any order stay inside this set. ``one_hot`` too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..ir.errors import AttrError, PullbackError
from ..ir.expr import Call, Expr
from ..ir.types import ALL_DTYPES, Any, INT_DTYPES, TensorType, check_dtype, is_float, is_inexact
from . import layout as T
from .common import normalize_axis, tensor_arg
from .kernels import add_at, check_range, device, dtype, grid, is_traced, set_at, wide_index
from .nn import is_torch
from .registry import OpDef, FusionKind, defop, register, seq_of_int, type_error, zero_flops


def _index_arg(op: str, arg_types, i: int) -> TensorType:
    t = tensor_arg(op, arg_types, i)
    if t.dtype not in INT_DTYPES:
        raise type_error(op, arg_types, f"argument {i} (indices) must be an integer tensor, got {t.dtype}")
    return t


def _compatible(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is Any or y is Any or x == y for x, y in zip(a, b))


def _float_only(e: Expr, grad: Expr) -> Optional[Expr]:
    return grad if is_inexact(e.checked_type.dtype) else None


# ------------------------------------------------------------------ strided_slice / strided_set


@dataclass(frozen=True)
class StridedSliceAttrs:
    """Python slice semantics per axis: negative indices count from the end, bounds clamp."""

    begin: tuple
    end: tuple
    strides: Optional[tuple] = None
    axes: Optional[tuple] = None

    def __post_init__(self):
        begin = seq_of_int(self.begin, "attribute begin")
        end = seq_of_int(self.end, "attribute end")
        strides = seq_of_int(self.strides, "attribute strides", allow_none=True)
        axes = seq_of_int(self.axes, "attribute axes", allow_none=True)
        if len(begin) != len(end):
            raise AttrError(f"attribute end has {len(end)} entries but begin has {len(begin)}")
        if strides is not None:
            if len(strides) not in (1, len(begin)):
                raise AttrError(f"attribute strides must have 1 or {len(begin)} entries, got {strides}")
            if 0 in strides:
                raise AttrError(f"attribute strides must not contain 0, got {strides}")
        if axes is not None and len(axes) != len(begin):
            raise AttrError(f"attribute axes must have {len(begin)} entries like begin, got {axes}")
        for f, v in (("begin", begin), ("end", end), ("strides", strides), ("axes", axes)):
            object.__setattr__(self, f, v)

    def slices(self, op: str, arg_types, ndim: int) -> dict:
        """axis -> (begin, end, stride) for the sliced axes."""
        axes = self.axes if self.axes is not None else tuple(range(len(self.begin)))
        if self.axes is None and len(self.begin) > ndim:
            raise type_error(op, arg_types, f"begin has {len(self.begin)} entries for a tensor of rank {ndim}")
        strides = self.strides or (1,)
        out = {}
        for i, a in enumerate(axes):
            ax = normalize_axis(op, a, ndim, arg_types)
            if ax in out:
                raise type_error(op, arg_types, f"axis {ax} is sliced twice")
            out[ax] = (self.begin[i], self.end[i], strides[i] if len(strides) > 1 else strides[0])
        return out

    def np_index(self, shape: tuple) -> tuple:
        sl = self.slices("strided_slice", (), len(shape))
        return tuple(slice(*sl[i]) if i in sl else slice(None) for i in range(len(shape)))

    def forward_index(self, shape: tuple) -> tuple:
        """``(index, flipped)``: slices with positive steps and the axes to reverse after them, selecting
        what ``np_index`` selects (torch slices only with positive steps)."""
        index, flipped = [], []
        for i, s in enumerate(self.np_index(shape)):
            start, stop, step = s.indices(shape[i])
            if step < 0:
                r = range(start, stop, step)
                s = slice(r[-1], start + 1, -step) if r else slice(0, 0)
                flipped.append(i)
            index.append(s)
        return tuple(index), tuple(flipped)

    def out_shape(self, op: str, arg_types, shape: tuple) -> tuple:
        sl = self.slices(op, arg_types, len(shape))
        return tuple(d if i not in sl else (Any if d is Any else len(range(*slice(*sl[i]).indices(d))))
                     for i, d in enumerate(shape))


def _strided_slice_infer(arg_types, attrs):
    x = tensor_arg("strided_slice", arg_types, 0)
    return TensorType(attrs.out_shape("strided_slice", arg_types, x.shape), x.dtype)


def _slice_attrs(a: StridedSliceAttrs) -> tuple:
    return a.begin, a.end, a.strides, a.axes


def _strided_slice(xp, x, a):
    index, flipped = a.forward_index(tuple(x.shape))
    v = x[index]
    return xp.asarray(xp.flip(v, axis=flipped) if flipped else v, copy=True)  # not a view pinning x


strided_slice = defop(
    "strided_slice", 1, _strided_slice_infer, kernel=_strided_slice, attrs_type=StridedSliceAttrs,
    grad=lambda c, g: [_float_only(c, strided_set(T.zeros_like(c.args[0]), g, *_slice_attrs(c.attrs)))],
    pattern=FusionKind.INJECTIVE, flops=zero_flops, torch_name="slice",
    dtypes=ALL_DTYPES, doc="``strided_slice(x, begin, end, strides=None, axes=None)`` with Python slice semantics per axis.")


def _strided_set_infer(arg_types, attrs):
    x = tensor_arg("strided_set", arg_types, 0)
    v = tensor_arg("strided_set", arg_types, 1)
    want = attrs.out_shape("strided_set", arg_types, x.shape)
    if v.dtype != x.dtype or not _compatible(want, v.shape):
        raise type_error("strided_set", arg_types, f"the value must be a {x.dtype} tensor of the slice's shape {want}")
    return x


def _strided_set(xp, x, v, a):
    index, flipped = a.forward_index(tuple(x.shape))
    return set_at(x, index, xp.flip(v, axis=flipped) if flipped else v)


def _strided_set_grad(c: Call, g: Expr):
    x, v = c.args
    return [_float_only(x, strided_set(g, T.zeros_like(v), *_slice_attrs(c.attrs))),
            _float_only(v, strided_slice(g, *_slice_attrs(c.attrs)))]


strided_set = defop(
    "strided_set", 2, _strided_set_infer, kernel=_strided_set, attrs_type=StridedSliceAttrs, grad=_strided_set_grad,
    pattern=FusionKind.INJECTIVE, flops=zero_flops, torch_name="slice_scatter",
    dtypes=ALL_DTYPES, doc="``x`` with the strided slice replaced by ``v`` (the adjoint of strided_slice).")

# ------------------------------------------------------------------ take / index_add


_TAKE_MODES = ("clip", "wrap", "fast")


@dataclass(frozen=True)
class TakeAttrs:
    """``mode``: clip indices into range, wrap them (modulo), or ``fast`` (out of range is an error).
    ``sequential``: on the torch target, ``index_add``'s float16/bfloat16 sums are rounded after each addition, in
    index order, as PyTorch's embedding and indexing backward and ``index_put(accumulate=True)`` round them, instead
    of ATen ``index_add``'s (eager's bits either way); ``take`` passes it to its gradient. The numpy target sums
    bfloat16 in float32 and rounds once, float16 and jax's scatter round each addition, whichever is asked."""

    axis: Optional[int] = None
    mode: str = "clip"
    sequential: bool = False

    def __post_init__(self):
        if self.axis is not None and (isinstance(self.axis, bool) or not isinstance(self.axis, (int, np.integer))):
            raise AttrError(f"attribute axis must be an int or None, got {self.axis!r}")
        if self.mode not in _TAKE_MODES:
            raise AttrError(f"attribute mode must be one of {', '.join(_TAKE_MODES)}, got {self.mode!r}")
        if not isinstance(self.sequential, (bool, np.bool_)):
            raise AttrError(f"attribute sequential must be a bool, got {self.sequential!r}")


def _take_attrs(a: TakeAttrs) -> tuple:
    return a.axis, a.mode, a.sequential


def _take_layout(op: str, arg_types, data: TensorType, idx: TensorType, attrs) -> tuple:
    if attrs.axis is None:
        return idx.shape
    ax = normalize_axis(op, attrs.axis, data.ndim, arg_types)
    return data.shape[:ax] + idx.shape + data.shape[ax + 1:]


def _positions(xp, op: str, idx, n: int, mode: str):
    """``idx`` as flat positions in ``[0, n)`` by ``mode`` (``fast``: out of range is an error where
    the indices are concrete; jax.jit clamps them), of at least 32 bits (``wide_index``)."""
    idx = wide_index(idx)
    if mode == "clip":
        idx = xp.clip(idx, 0, max(n - 1, 0))
    elif mode == "wrap":
        idx = xp.remainder(idx, n) if n else idx
    else:
        if check_range(op, idx, -n, n, f"for a dimension of size {n} (mode='fast')") < 0:
            idx = xp.where(idx < 0, idx + n, idx)
        if is_traced(idx):
            idx = xp.clip(idx, 0, max(n - 1, 0))
    return idx if idx.ndim == 1 else xp.reshape(idx, (-1,))


def _flat_view(xp, x, a) -> tuple:
    """(array, axis) with axis=None meaning the flattened array."""
    return (xp.reshape(x, (-1,)), 0) if a.axis is None else (x, a.axis % x.ndim)


def _select(xp, src, pos, ax: int):
    """``src``'s entries at positions ``pos`` (in range, non-negative) along axis ``ax``: on torch ATen's
    ``index_select`` alone (array-api-compat's ``take`` wraps negative positions again: three kernels more)."""
    if is_torch(xp):
        import torch

        return torch.index_select(src, ax, pos)
    return xp.take(src, pos, axis=ax)


def _take(xp, x, idx, a):
    src, ax = _flat_view(xp, x, a)
    shape = tuple(src.shape)
    out = _select(xp, src, _positions(xp, "take", idx, shape[ax], a.mode), ax)
    return out if idx.ndim == 1 else xp.reshape(out, shape[:ax] + tuple(idx.shape) + shape[ax + 1:])


def _take_infer(arg_types, attrs):
    x = tensor_arg("take", arg_types, 0)
    idx = _index_arg("take", arg_types, 1)
    return TensorType(_take_layout("take", arg_types, x, idx, attrs), x.dtype)


take = defop(
    "take", 2, _take_infer, kernel=_take, attrs_type=TakeAttrs,
    grad=lambda c, g: [_float_only(c, index_add(T.zeros_like(c.args[0]), c.args[1], g, *_take_attrs(c.attrs))), None],
    pattern=FusionKind.INJECTIVE, flops=zero_flops, torch_name="take",
    dtypes=ALL_DTYPES, doc="``take(data, indices, axis=None, mode='clip')``: Relay's take (embedding lookup along ``axis``).")


def _index_add_infer(arg_types, attrs):
    x = tensor_arg("index_add", arg_types, 0)
    idx = _index_arg("index_add", arg_types, 1)
    u = tensor_arg("index_add", arg_types, 2)
    want = _take_layout("index_add", arg_types, x, idx, attrs)
    if u.dtype != x.dtype or not _compatible(want, u.shape):
        raise type_error("index_add", arg_types, f"updates must be a {x.dtype} tensor of shape {want} (take's output)")
    return x


def _index_add(xp, x, idx, u, a, into: bool = False):
    """``index_add``'s kernel; ``into`` (torch): added into ``x``'s memory (``add_at``)."""
    dst, ax = _flat_view(xp, x, a)
    shape = tuple(dst.shape)
    pos = _positions(xp, "index_add", idx, shape[ax], a.mode)
    k = math.prod(idx.shape)  # not -1: ambiguous when the other dims hold no element
    out = add_at(dst, (slice(None),) * ax + (pos,), xp.reshape(u, shape[:ax] + (k,) + shape[ax + 1:]), a.sequential, into)
    return xp.reshape(out, tuple(x.shape))


def _index_add_grad(c: Call, g: Expr):
    x, idx, u = c.args
    return [_float_only(x, g), None, _float_only(u, take(g, idx, *_take_attrs(c.attrs)))]


index_add = defop(
    "index_add", 3, _index_add_infer, kernel=_index_add, attrs_type=TakeAttrs, grad=_index_add_grad,
    pattern=FusionKind.OPAQUE, torch_name="index_add",
    dtypes=ALL_DTYPES, doc="``data`` plus ``updates`` scattered (added) at take's positions: the adjoint of take.")

# ------------------------------------------------------------------ gather / scatter_add


@dataclass(frozen=True)
class GatherAttrs:
    axis: int = 0

    def __post_init__(self):
        if isinstance(self.axis, bool) or not isinstance(self.axis, (int, np.integer)):
            raise AttrError(f"attribute axis must be an int, got {self.axis!r}")
        object.__setattr__(self, "axis", int(self.axis))


def _gather_check(op: str, arg_types, data: TensorType, idx: TensorType, axis: int) -> int:
    ax = normalize_axis(op, axis, data.ndim, arg_types)
    if idx.ndim != data.ndim:
        raise type_error(op, arg_types, f"indices must have the rank of data ({data.ndim}), got {idx.ndim}")
    for i, (d, k) in enumerate(zip(data.shape, idx.shape)):
        if i != ax and d is not Any and k is not Any and k > d:
            raise type_error(op, arg_types, f"indices dimension {i} ({k}) exceeds the data's ({d})")
    return ax


def _gather_range(op: str, x, idx, axis: int) -> int:
    """The axis ``axis`` names; the program is an error where an index is outside it."""
    ax = axis % x.ndim
    n = x.shape[ax]
    check_range(op, idx, 0, n, f"[0, {n}) along axis {ax}")
    return ax


def _gather_index(xp, op: str, x, idx, axis: int) -> tuple:
    return grid(xp, idx, _gather_range(op, x, idx, axis))


def _gather_infer(arg_types, attrs):
    x = tensor_arg("gather", arg_types, 0)
    idx = _index_arg("gather", arg_types, 1)
    _gather_check("gather", arg_types, x, idx, attrs.axis)
    return TensorType(idx.shape, x.dtype)


def _gather(xp, x, idx, a):
    return x[_gather_index(xp, "gather", x, idx, a.axis)]


def _checked_by_aten(op: str, fn):
    """A torch kernel ``fn(x, idx, *rest, a)`` of ``op`` calling ATen's own (``gather``, ``scatter_add``: eager's
    kernels and bits), which checks the indices as it reads them: no pass over them first (an expanded (B, H, L,
    S) index: 0.35 ms), and an index out of range the pullback error ``check_range`` gives."""
    def run(x, idx, *rest):
        import torch

        try:
            return fn(x, idx if idx.dtype == torch.int64 else idx.long(), *rest)
        except (RuntimeError, IndexError):
            _gather_range(op, x, idx, rest[-1].axis)  # raises the pullback error when an index is out of range
            raise

    return run


class _DataAxisIndicesOp(OpDef):
    """Builder with Relay's argument order ``gather(data, axis, indices)``; ``gather(data, indices, axis=...)`` also works."""

    def __call__(self, data, *args, **kwargs):
        if args and isinstance(args[0], (int, np.integer)) and not isinstance(args[0], bool):
            axis, rest = args[0], args[1:]
            return super().__call__(data, *rest, axis=axis, **kwargs)
        return super().__call__(data, *args, **kwargs)


gather = register(_DataAxisIndicesOp(
    "gather", 2, _gather_infer, kernel=_gather, attrs_type=GatherAttrs,
    impls={"torch": _checked_by_aten("gather", lambda x, idx, a: x.gather(a.axis, idx))},
    grad=lambda c, g: [_float_only(c, scatter_add(T.zeros_like(c.args[0]), c.args[1], g, c.attrs.axis)), None],
    pattern=FusionKind.INJECTIVE, flops=zero_flops, torch_name="gather",
    doc="``gather(data, axis, indices)``: out[i][j][k] = data[i][indices[i][j][k]][k] for axis=1 (torch.gather).",
    dtypes=ALL_DTYPES))


def _scatter_add_infer(arg_types, attrs):
    x = tensor_arg("scatter_add", arg_types, 0)
    idx = _index_arg("scatter_add", arg_types, 1)
    u = tensor_arg("scatter_add", arg_types, 2)
    _gather_check("scatter_add", arg_types, x, idx, attrs.axis)
    if u.dtype != x.dtype or not _compatible(idx.shape, u.shape):
        raise type_error("scatter_add", arg_types, f"updates must be a {x.dtype} tensor of the indices' shape {idx.shape}")
    return x


def _scatter_add(xp, x, idx, u, a):
    return add_at(x, _gather_index(xp, "scatter_add", x, idx, a.axis), u)


def _scatter_add_grad(c: Call, g: Expr):
    x, idx, u = c.args
    return [_float_only(x, g), None, _float_only(u, gather(g, c.attrs.axis, idx))]


scatter_add = defop(
    "scatter_add", 3, _scatter_add_infer, kernel=_scatter_add, attrs_type=GatherAttrs, grad=_scatter_add_grad,
    impls={"torch": _checked_by_aten("scatter_add", lambda x, idx, u, a: x.scatter_add(a.axis, idx, u))},
    pattern=FusionKind.OPAQUE, torch_name="scatter_add",
    dtypes=ALL_DTYPES, doc="``scatter_add(data, indices, updates, axis)``: data with updates added at gather's positions.")

# ------------------------------------------------------------------ one_hot


@dataclass(frozen=True)
class OneHotAttrs:
    depth: int
    axis: int = -1
    dtype: str = "float32"

    def __post_init__(self):
        for f in ("depth", "axis"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise AttrError(f"attribute {f} must be an int, got {v!r}")
        if self.depth < 0:
            raise AttrError(f"attribute depth must be >= 0, got {self.depth}")
        try:
            object.__setattr__(self, "dtype", check_dtype(self.dtype))
        except PullbackError as e:
            raise AttrError(f"attribute dtype: {e}") from None


def _one_hot_axis(op, arg_types, axis: int, ndim: int) -> int:
    if not -ndim - 1 <= axis <= ndim:
        raise type_error(op, arg_types, f"axis {axis} is out of range for indices of rank {ndim}")
    return axis % (ndim + 1)


def _one_hot_infer(arg_types, attrs):
    idx = _index_arg("one_hot", arg_types, 0)
    on, off = tensor_arg("one_hot", arg_types, 1), tensor_arg("one_hot", arg_types, 2)
    if on.ndim != 0 or off.ndim != 0 or on.dtype != off.dtype:
        raise type_error("one_hot", arg_types, "on_value and off_value must be scalars (rank 0) of one dtype")
    ax = _one_hot_axis("one_hot", arg_types, attrs.axis, idx.ndim)
    return TensorType(idx.shape[:ax] + (attrs.depth,) + idx.shape[ax:], attrs.dtype)


def _one_hot(xp, idx, on, off, a):
    hot = idx[..., None] == xp.arange(a.depth, device=device(idx))
    mask = xp.moveaxis(hot, -1, _one_hot_axis("one_hot", (), a.axis, idx.ndim))
    return xp.astype(xp.where(mask, on, off), dtype(xp, a.dtype))


def _one_hot_grad(c: Call, g: Expr):
    from .elemwise import multiply, subtract
    from .reduce import sum as _sum

    idx, on, off = c.args
    if not (is_float(c.attrs.dtype) and is_float(on.checked_type.dtype)):
        return [None, None, None]
    mask = one_hot(idx, T.ones_like(on), T.zeros_like(off), c.attrs.depth, c.attrs.axis, c.attrs.dtype)
    on_grad = _sum(multiply(g, mask))
    return [None, T.cast_like(on_grad, on), T.cast_like(subtract(_sum(g), on_grad), off)]


one_hot = defop(
    "one_hot", 3, _one_hot_infer, kernel=_one_hot, attrs_type=OneHotAttrs, grad=_one_hot_grad,
    pattern=FusionKind.INJECTIVE, torch_name="one_hot",
    doc="``one_hot(indices, on_value, off_value, depth, axis=-1, dtype)``; out-of-range indices give off_value.")

