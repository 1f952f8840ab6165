"""Shape operators and the like-family with their explicit-shape twins.

AD gradient rules use the ``*_like`` forms so they stay valid for dynamic
shapes; ``transform.ConcretizeLike`` turns them into the explicit forms when
the shapes are static.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..ir.errors import AttrError
from ..ir.expr import Call, Expr
from ..ir.types import ALL_DTYPES, Any, TensorType, check_dtype, is_complex, is_inexact
from .common import check_shape_attr, normalize_axis, numel, tensor_arg
from .kernels import dtype, dtype_name, is_complex_array, reduced_view, sum_of
from .registry import FusionKind, Recompute, defop, seq_of_int, type_error, zero_flops


def _set(obj, name, value):
    object.__setattr__(obj, name, value)


def _dtype_attr(obj, field: str = "dtype"):
    try:
        _set(obj, field, check_dtype(getattr(obj, field)))
    except Exception as e:  # PullbackError from check_dtype
        raise AttrError(f"attribute {field}: {e}") from None


# ------------------------------------------------------------------ reshape


@dataclass(frozen=True)
class ReshapeAttrs:
    newshape: tuple

    def __post_init__(self):
        shape = seq_of_int(self.newshape, "attribute newshape")
        if sum(1 for d in shape if d == -1) > 1:
            raise AttrError(f"attribute newshape: at most one -1 allowed, got {shape}")
        if any(d < -1 for d in shape):
            raise AttrError(f"attribute newshape: sizes must be >= -1 (0 copies a dim, -1 infers one), got {shape}")
        _set(self, "newshape", shape)


def reshape_shape(op: str, arg_types, in_shape: tuple, newshape: tuple) -> tuple:
    """Relay's reshape rule for 0 (copy the input dim) and -1 (infer)."""
    out = []
    for i, d in enumerate(newshape):
        if d == 0:
            if i >= len(in_shape):
                raise type_error(op, arg_types, f"newshape {newshape}: 0 at position {i} has no input dim to copy")
            out.append(in_shape[i])
        else:
            out.append(d)
    if -1 in out:
        k = out.index(-1)
        known = [d for j, d in enumerate(out) if j != k]
        total = numel(in_shape) if all(d is not Any for d in in_shape) else None
        if total is None or any(d is Any for d in known):
            out[k] = Any
        else:
            rest = int(np.prod(known)) if known else 1
            if rest == 0 or total % rest:
                raise type_error(op, arg_types, f"cannot reshape {in_shape} to {newshape}")
            out[k] = total // rest
    if all(d is not Any for d in in_shape) and all(d is not Any for d in out):
        if numel(in_shape) != numel(out):
            raise type_error(op, arg_types, f"cannot reshape {in_shape} ({numel(in_shape)} elements) to {tuple(out)} ({numel(out)} elements)")
    return tuple(out)


def _reshape_infer(arg_types, attrs):
    x = tensor_arg("reshape", arg_types, 0)
    return TensorType(reshape_shape("reshape", arg_types, x.shape, attrs.newshape), x.dtype)


def _reshape(xp, x, attrs):
    return xp.reshape(x, tuple(x.shape[i] if d == 0 else d for i, d in enumerate(attrs.newshape)))


reshape = defop(
    "reshape",
    1,
    _reshape_infer,
    kernel=_reshape,
    attrs_type=ReshapeAttrs,
    grad=lambda c, g: [reshape_like(g, c.args[0])],
    pattern=FusionKind.INJECTIVE,
    recompute=Recompute.VIEW,
    flops=zero_flops,
    torch_name="reshape",
    dtypes=ALL_DTYPES,
)

# ------------------------------------------------------------------ transpose


@dataclass(frozen=True)
class TransposeAttrs:
    axes: Optional[tuple] = None

    def __post_init__(self):
        _set(self, "axes", seq_of_int(self.axes, "attribute axes", allow_none=True))


def _perm(arg_types, attrs, ndim):
    if attrs.axes is None:
        return tuple(range(ndim - 1, -1, -1))
    axes = tuple(normalize_axis("transpose", a, ndim, arg_types) for a in attrs.axes)
    if sorted(axes) != list(range(ndim)):
        raise type_error("transpose", arg_types, f"axes {attrs.axes} is not a permutation of {ndim} dims")
    return axes


def _transpose_infer(arg_types, attrs):
    x = tensor_arg("transpose", arg_types, 0)
    perm = _perm(arg_types, attrs, x.ndim)
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _transpose_grad(call: Call, g: Expr):
    perm = _perm([call.args[0].checked_type], call.attrs, call.args[0].checked_type.ndim)
    inv = tuple(int(i) for i in np.argsort(perm))
    return [transpose(g, inv)]


def _transpose(xp, x, attrs):
    nd = x.ndim
    return xp.permute_dims(x, tuple(range(nd - 1, -1, -1)) if attrs.axes is None else tuple(a % nd for a in attrs.axes))


transpose = defop(
    "transpose",
    1,
    _transpose_infer,
    kernel=_transpose,
    attrs_type=TransposeAttrs,
    grad=_transpose_grad,
    pattern=FusionKind.INJECTIVE,
    recompute=Recompute.VIEW,
    flops=zero_flops,
    torch_name="permute",
    dtypes=ALL_DTYPES,
)

# ------------------------------------------------------------------ expand_dims


@dataclass(frozen=True)
class ExpandDimsAttrs:
    axis: int
    num_newaxis: int = 1

    def __post_init__(self):
        if isinstance(self.axis, bool) or not isinstance(self.axis, int):
            raise AttrError(f"attribute axis must be an int, got {self.axis!r}")
        if isinstance(self.num_newaxis, bool) or not isinstance(self.num_newaxis, int) or self.num_newaxis < 0:
            raise AttrError(f"attribute num_newaxis must be a non-negative int, got {self.num_newaxis!r}")


def _expand_axis(arg_types, attrs, ndim):
    axis = attrs.axis
    if not -ndim - 1 <= axis <= ndim:
        raise type_error("expand_dims", arg_types, f"axis {axis} is out of range for a tensor of rank {ndim}")
    return axis % (ndim + 1) if axis < 0 else axis


def _expand_dims_infer(arg_types, attrs):
    x = tensor_arg("expand_dims", arg_types, 0)
    a = _expand_axis(arg_types, attrs, x.ndim)
    return TensorType(x.shape[:a] + (1,) * attrs.num_newaxis + x.shape[a:], x.dtype)


def _expand_dims(xp, x, attrs):
    a = attrs.axis % (x.ndim + 1) if attrs.axis < 0 else attrs.axis
    shape = tuple(x.shape)
    return xp.reshape(x, shape[:a] + (1,) * attrs.num_newaxis + shape[a:])


expand_dims = defop(
    "expand_dims",
    1,
    _expand_dims_infer,
    kernel=_expand_dims,
    attrs_type=ExpandDimsAttrs,
    grad=lambda c, g: [reshape_like(g, c.args[0])],
    pattern=FusionKind.BROADCAST,
    recompute=Recompute.VIEW,
    flops=zero_flops,
    torch_name="unsqueeze",
    dtypes=ALL_DTYPES,
)

# ------------------------------------------------------------------ broadcast_to / collapse_sum_to


@dataclass(frozen=True)
class ShapeAttrs:
    shape: tuple

    def __post_init__(self):
        _set(self, "shape", check_shape_attr(self.shape, "attribute shape"))


def _broadcastable(src: tuple, dst: tuple) -> bool:
    if len(src) > len(dst):
        return False
    for s, d in zip(src[::-1], dst[::-1]):
        if s is Any or d is Any:
            continue
        if s != 1 and s != d:
            return False
    return True


def _broadcast_to_infer(arg_types, attrs):
    x = tensor_arg("broadcast_to", arg_types, 0)
    if not _broadcastable(x.shape, attrs.shape):
        raise type_error("broadcast_to", arg_types, f"cannot broadcast {x.shape} to {attrs.shape}")
    return TensorType(attrs.shape, x.dtype)


broadcast_to = defop(
    "broadcast_to",
    1,
    _broadcast_to_infer,
    kernel=lambda xp, x, attrs: xp.broadcast_to(x, attrs.shape),
    attrs_type=ShapeAttrs,
    grad=lambda c, g: [collapse_sum_like(g, c.args[0])],
    pattern=FusionKind.BROADCAST,
    recompute=Recompute.VIEW,
    flops=zero_flops,
    torch_name="expand",
    dtypes=ALL_DTYPES,
)


def collapse_axes(have: tuple, shape: tuple) -> tuple:
    """The axes of an array of shape ``have`` that summing down to ``shape`` reduces (its leading axes, and those
    ``shape`` has as 1 where ``have`` does not)."""
    lead = len(have) - len(shape)
    return tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and have[lead + i] != 1)


def collapse_sum(xp, x, shape: tuple):
    """Sum ``x`` down to ``shape`` (the reverse of broadcasting)."""
    shape, have = tuple(shape), tuple(x.shape)
    if have == shape:
        return x
    axes = collapse_axes(have, shape)
    merged = reduced_view(x, axes) if axes else None
    if merged is not None:  # a bias gradient: (B, L, C) -> (C,) as (B * L, C) -> (C,)
        return xp.reshape(sum_of(xp, xp.reshape(x, merged[0]), merged[1], False), shape)
    out = sum_of(xp, x, axes, True) if axes else x
    return xp.reshape(out, shape)


def _collapse_infer(op):
    def infer(arg_types, attrs, target=None):
        x = tensor_arg(op, arg_types, 0)
        shape = attrs.shape if target is None else target
        if not _broadcastable(shape, x.shape):
            raise type_error(op, arg_types, f"cannot collapse {x.shape} to {shape}: {shape} does not broadcast to it")
        return TensorType(shape, x.dtype)

    return infer


collapse_sum_to = defop(
    "collapse_sum_to",
    1,
    _collapse_infer("collapse_sum_to"),
    kernel=lambda xp, x, attrs: collapse_sum(xp, x, attrs.shape),
    attrs_type=ShapeAttrs,
    grad=lambda c, g: [broadcast_to_like(g, c.args[0])],
    pattern=FusionKind.COMM_REDUCE,
    torch_name="sum_to_size",
    dtypes=ALL_DTYPES,
)

# ------------------------------------------------------------------ zeros / ones / full


@dataclass(frozen=True)
class InitAttrs:
    shape: tuple
    dtype: str = "float32"

    def __post_init__(self):
        _set(self, "shape", check_shape_attr(self.shape, "attribute shape"))
        _dtype_attr(self)


def _init_infer(arg_types, attrs):
    return TensorType(attrs.shape, attrs.dtype)


zeros = defop("zeros", 0, _init_infer, kernel=lambda xp, a: xp.zeros(a.shape, dtype=dtype(xp, a.dtype)),
              attrs_type=InitAttrs, grad=lambda c, g: [], pattern=FusionKind.ELEMWISE, flops=zero_flops,
              torch_name="zeros", dtypes=ALL_DTYPES)
ones = defop("ones", 0, _init_infer, kernel=lambda xp, a: xp.ones(a.shape, dtype=dtype(xp, a.dtype)),
             attrs_type=InitAttrs, grad=lambda c, g: [], pattern=FusionKind.ELEMWISE, flops=zero_flops,
             torch_name="ones", dtypes=ALL_DTYPES)


def _full_infer(arg_types, attrs):
    fill = tensor_arg("full", arg_types, 0)
    if fill.ndim != 0:
        raise type_error("full", arg_types, f"fill_value must be a scalar (rank 0), got shape {fill.shape}")
    return TensorType(attrs.shape, attrs.dtype)


def _fill_grad(fill: Expr, g: Expr):
    """Gradient of a broadcast scalar fill value: the sum of ``g`` in the fill's dtype."""
    if not is_inexact(fill.checked_type.dtype):
        return None
    from .reduce import sum as _sum

    return cast_like(_sum(g), fill)


full = defop("full", 1, _full_infer, kernel=lambda xp, f, a: xp.full(a.shape, f, dtype=dtype(xp, a.dtype)),
             attrs_type=InitAttrs,
             grad=lambda c, g: [_fill_grad(c.args[0], g)], pattern=FusionKind.ELEMWISE, flops=zero_flops, torch_name="full")

# ------------------------------------------------------------------ the like-family


def _like_result(op):
    def infer(arg_types, attrs):
        tensor_arg(op, arg_types, 0)
        return tensor_arg(op, arg_types, 0)

    return infer


zeros_like = defop("zeros_like", 1, _like_result("zeros_like"), type_only=(0,),
                   kernel=lambda xp, x, attrs=None: xp.zeros_like(x),
                   grad=lambda c, g: [None], pattern=FusionKind.ELEMWISE, flops=zero_flops, torch_name="zeros_like",
                   dtypes=ALL_DTYPES)
ones_like = defop("ones_like", 1, _like_result("ones_like"), type_only=(0,),
                  kernel=lambda xp, x, attrs=None: xp.ones_like(x),
                  grad=lambda c, g: [None], pattern=FusionKind.ELEMWISE, flops=zero_flops, torch_name="ones_like",
                  dtypes=ALL_DTYPES)


def _full_like_infer(arg_types, attrs):
    x = tensor_arg("full_like", arg_types, 0)
    fill = tensor_arg("full_like", arg_types, 1)
    if fill.ndim != 0:
        raise type_error("full_like", arg_types, f"fill_value must be a scalar (rank 0), got shape {fill.shape}")
    return x


full_like = defop("full_like", 2, _full_like_infer, type_only=(0,),
                  kernel=lambda xp, x, f, attrs=None: xp.full(tuple(x.shape), f, dtype=x.dtype),
                  grad=lambda c, g: [None, _fill_grad(c.args[1], g)], pattern=FusionKind.ELEMWISE, flops=zero_flops,
                  torch_name="full_like")


@dataclass(frozen=True)
class ReshapeLikeAttrs:
    lhs_begin: int = 0
    lhs_end: Optional[int] = None
    rhs_begin: int = 0
    rhs_end: Optional[int] = None

    def __post_init__(self):
        for f in ("lhs_begin", "lhs_end", "rhs_begin", "rhs_end"):
            v = getattr(self, f)
            if v is None and f.endswith("end"):
                continue
            if isinstance(v, bool) or not isinstance(v, int):
                raise AttrError(f"attribute {f} must be an int{' or None' if f.endswith('end') else ''}, got {v!r}")


def _slice_bounds(begin, end, ndim):
    b = begin + ndim if begin < 0 else begin
    e = ndim if end is None else (end + ndim if end < 0 else end)
    return b, e


def reshape_like_shape(arg_types, data_shape, like_shape, attrs) -> tuple:
    lb, le = _slice_bounds(attrs.lhs_begin, attrs.lhs_end, len(data_shape))
    rb, re_ = _slice_bounds(attrs.rhs_begin, attrs.rhs_end, len(like_shape))
    if not (0 <= lb <= le <= len(data_shape)) or not (0 <= rb <= re_ <= len(like_shape)):
        raise type_error("reshape_like", arg_types, f"bad dimension ranges lhs [{attrs.lhs_begin}:{attrs.lhs_end}] rhs [{attrs.rhs_begin}:{attrs.rhs_end}]")
    out = tuple(data_shape[:lb]) + tuple(like_shape[rb:re_]) + tuple(data_shape[le:])
    if all(d is not Any for d in data_shape) and all(d is not Any for d in out) and numel(data_shape) != numel(out):
        raise type_error("reshape_like", arg_types, f"cannot reshape {data_shape} to {out}")
    return out


def _reshape_like_infer(arg_types, attrs):
    x = tensor_arg("reshape_like", arg_types, 0)
    like = tensor_arg("reshape_like", arg_types, 1)
    return TensorType(reshape_like_shape(arg_types, x.shape, like.shape, attrs), x.dtype)


def _reshape_like(xp, x, like, attrs):
    return xp.reshape(x, reshape_like_shape((), tuple(x.shape), tuple(like.shape), attrs))


reshape_like = defop(
    "reshape_like",
    2,
    _reshape_like_infer,
    type_only=(1,),
    kernel=_reshape_like,
    attrs_type=ReshapeLikeAttrs,
    grad=lambda c, g: [reshape_like(g, c.args[0]), None],
    pattern=FusionKind.INJECTIVE,
    recompute=Recompute.VIEW,
    flops=zero_flops,
    torch_name="reshape_as",
    dtypes=ALL_DTYPES,
)


def _collapse_sum_like_infer(arg_types, attrs):
    like = tensor_arg("collapse_sum_like", arg_types, 1)
    return _collapse_infer("collapse_sum_like")(arg_types, attrs, like.shape)


collapse_sum_like = defop(
    "collapse_sum_like",
    2,
    _collapse_sum_like_infer,
    type_only=(1,),
    kernel=lambda xp, x, like, attrs=None: collapse_sum(xp, x, like.shape),
    grad=lambda c, g: [broadcast_to_like(g, c.args[0]), None],
    pattern=FusionKind.COMM_REDUCE,
    torch_name="sum_to_size",
    dtypes=ALL_DTYPES,
)


def _broadcast_to_like_infer(arg_types, attrs):
    x = tensor_arg("broadcast_to_like", arg_types, 0)
    like = tensor_arg("broadcast_to_like", arg_types, 1)
    if not _broadcastable(x.shape, like.shape):
        raise type_error("broadcast_to_like", arg_types, f"cannot broadcast {x.shape} to {like.shape}")
    return TensorType(like.shape, x.dtype)


broadcast_to_like = defop(
    "broadcast_to_like",
    2,
    _broadcast_to_like_infer,
    type_only=(1,),
    kernel=lambda xp, x, like, attrs=None: xp.broadcast_to(x, tuple(like.shape)),
    grad=lambda c, g: [collapse_sum_like(g, c.args[0]), None],
    pattern=FusionKind.BROADCAST,
    recompute=Recompute.VIEW,
    flops=zero_flops,
    torch_name="expand_as",
    dtypes=ALL_DTYPES,
)

# ------------------------------------------------------------------ cast


@dataclass(frozen=True)
class CastAttrs:
    dtype: str

    def __post_init__(self):
        _dtype_attr(self)


def _cast_grad_to(x: Expr, g: Expr):
    return cast_like(g, x) if is_inexact(x.checked_type.dtype) else None


def _astype(xp, x, name: str):
    """``x`` in the dtype named ``name``; a complex ``x`` cast to a real dtype keeps its real part (as PyTorch does)."""
    if is_complex_array(x) and not is_complex(name):
        x = xp.real(x)
    return xp.astype(x, dtype(xp, name))


cast = defop(
    "cast",
    1,
    lambda ts, attrs: TensorType(tensor_arg("cast", ts, 0).shape, attrs.dtype),
    kernel=lambda xp, x, attrs: _astype(xp, x, attrs.dtype),
    attrs_type=CastAttrs,
    grad=lambda c, g: [_cast_grad_to(c.args[0], g) if is_inexact(c.checked_type.dtype) else None],
    pattern=FusionKind.ELEMWISE,
    flops=zero_flops,
    torch_name="to",
    dtypes=ALL_DTYPES,
)
cast_like = defop(
    "cast_like",
    2,
    lambda ts, attrs: TensorType(tensor_arg("cast_like", ts, 0).shape, tensor_arg("cast_like", ts, 1).dtype),
    type_only=(1,),
    kernel=lambda xp, x, like, attrs=None: _astype(xp, x, dtype_name(like)),
    grad=lambda c, g: [_cast_grad_to(c.args[0], g) if is_inexact(c.checked_type.dtype) else None, None],
    pattern=FusionKind.ELEMWISE,
    flops=zero_flops,
    torch_name="type_as",
    dtypes=ALL_DTYPES,
)
