"""Neural-network operators (``pullback.op.nn.*``): relu, dense, bias_add, batch_flatten, pad, dropout.

The other ``nn.*`` families live next door: ``activation`` (leaky_relu, gelu, silu,
softplus, mish, softmax, log_softmax), ``linalg`` (matmul, batch_matmul), ``conv``,
``pool``, ``norm`` and ``loss``. The helpers at the top are shared by them: rule
helpers (pullback exprs), attribute checks, and kernel helpers that work on any
array namespace ``xp`` (``numpy``, ``jax.numpy``, array-api-compat's ``torch``).
"""

from __future__ import annotations

from ..ir.types import ALL_DTYPES, FLOAT_DTYPES

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..ir.errors import AttrError
from ..ir.expr import Call, Expr, Tuple, TupleGetItem, const
from ..ir.types import Any, TensorType
from . import elemwise as E
from . import reduce as R
from . import layout as T
from .common import broadcast_shapes, float_arg, normalize_axis, numel, same_dtype, same_layout, tensor_arg
from .kernels import accumulated, device
from .registry import FusionKind, Recompute, array_namespace, defop, get_op, seq_of_int, type_error, zero_flops

# ------------------------------------------------------------------ helpers shared by the nn modules


def lazy(name: str):
    """The op ``name`` looked up when a rule runs (ops of sibling modules register later)."""
    return lambda *args, **kw: get_op(name)(*args, **kw)


def scalar(value: float, like: Expr) -> Expr:
    """A rank-0 constant in the dtype of ``like`` (a node whose type is known)."""
    return const(value, like.checked_type.dtype)


def field(g: Expr, i: int) -> Expr:
    """Field ``i`` of a tuple cotangent (a ``Tuple`` node or any tuple-typed expression)."""
    return g.fields[i] if isinstance(g, Tuple) else TupleGetItem(g, i)


def nonzero(ct: Expr):
    """A cotangent field, or None when it is an explicit zero (``zeros``/``zeros_like``: AD fills the unused
    fields of a tuple cotangent with them), so a rule can skip its terms."""
    return None if isinstance(ct, Call) and getattr(ct.op, "name", None) in ("zeros", "zeros_like") else ct


def count(x: Expr, axes: Sequence[int]) -> Expr:
    """Number of elements of ``x`` along ``axes`` as a scalar of x's dtype; dynamic dims count at run time."""
    shape = x.checked_type.shape
    dims = [shape[a] for a in axes]
    if all(d is not Any for d in dims):
        return scalar(float(np.prod(dims)) if dims else 1.0, x)
    ones = T.ones_like(x)
    kept = R.sum(ones, tuple(axes), True)  # each entry = the count
    return R.sum(kept) / R.sum(T.ones_like(kept))


def check_bool(obj, *names: str) -> None:
    for f in names:
        v = getattr(obj, f)
        if not isinstance(v, (bool, np.bool_)):
            raise AttrError(f"attribute {f} must be a bool, got {v!r}")
        object.__setattr__(obj, f, bool(v))


def check_float(obj, *names: str, positive: bool = False, nonneg: bool = False) -> None:
    for f in names:
        v = getattr(obj, f)
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
            raise AttrError(f"attribute {f} must be a number, got {v!r}")
        v = float(v)
        if (positive and not v > 0) or (nonneg and not v >= 0) or not np.isfinite(v):
            raise AttrError(f"attribute {f} must be {'positive' if positive else 'non-negative' if nonneg else 'finite'}, got {v!r}")
        object.__setattr__(obj, f, v)


def check_int(obj, name: str, lo: int | None = None, allow_none: bool = False) -> None:
    v = getattr(obj, name)
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise AttrError(f"attribute {name} must be an int, got {v!r}")
    if lo is not None and v < lo:
        raise AttrError(f"attribute {name} must be >= {lo}, got {v}")
    object.__setattr__(obj, name, int(v))


def check_choice(obj, name: str, choices: Sequence[str]) -> None:
    v = getattr(obj, name)
    if v not in choices:
        raise AttrError(f"attribute {name}={v!r} is not supported (supported: {', '.join(map(repr, choices))})")


# ------------------------------------------------------------------ kernel helpers (any array namespace ``xp``)


def is_jax(xp) -> bool:
    """``xp`` is ``jax.numpy`` (arrays may be traced: no data-dependent Python control flow)."""
    return xp.__name__ == "jax.numpy"


def is_torch(xp) -> bool:
    """``xp`` is array-api-compat's torch (tensors live on a device)."""
    return xp.__name__ == "array_api_compat.torch"


def on_device(xp, like) -> dict:
    """Keyword arguments placing a new array next to ``like`` (torch: its device; NumPy and jax: the default)."""
    return {"device": like.device} if is_torch(xp) else {}


def full(xp, shape: tuple, value, like, dtype=None):
    """``xp.full`` in ``like``'s dtype (or ``dtype``) and on its device (``xp.zeros`` for 0: calloc on NumPy)."""
    kw = dict(dtype=like.dtype if dtype is None else dtype, **on_device(xp, like))
    return xp.zeros(tuple(shape), **kw) if value == 0 else xp.full(tuple(shape), value, **kw)


def constant(xp, value: np.ndarray, like):
    """A NumPy constant (a divisor, an averaging matrix) as an ``xp`` array in ``like``'s dtype and on its device."""
    return xp.asarray(value, dtype=like.dtype, **on_device(xp, like))


def as_dtype(xp, value, dtype):
    """``value`` as an array of ``dtype`` (NumPy's 0-d results are scalars; no copy when it already is one)."""
    return xp.asarray(value, dtype=dtype)


def widen16(xp, x):
    """float16 is computed in float32 (like PyTorch's CPU kernels)."""
    return xp.astype(x, xp.float32) if x.dtype == xp.float16 else x


def add_into(buf, index: tuple, value):
    """``buf[index] += value`` on a buffer the kernel made itself; a new array on jax (immutable arrays)."""
    if hasattr(buf, "at"):
        return buf.at[index].add(value)
    buf[index] += value
    return buf


def _along(axis: int, lo: int, hi: int) -> tuple:
    """The index ``[lo:hi]`` along ``axis``."""
    return (slice(None),) * axis + (slice(lo, hi),)


def take_axis(x, axis: int, lo: int, hi: int):
    """``x[lo:hi]`` along ``axis`` (a view on NumPy and torch)."""
    return x[_along(axis, lo, hi)]


def pad_axis(xp, x, axis: int, before: int, after: int, mode: str = "constant", value=0.0):
    """``x`` padded along ``axis`` by non-negative widths: ``constant`` (``value``), ``edge`` or ``reflect``."""
    if not (before or after):
        return x
    n, shape = x.shape[axis], tuple(x.shape)

    def side(k: int, at_end: bool):
        if mode == "constant":
            return full(xp, shape[:axis] + (k,) + shape[axis + 1:], value, x)
        if mode == "edge":
            edge = take_axis(x, axis, n - 1, n) if at_end else take_axis(x, axis, 0, 1)
            return xp.broadcast_to(edge, shape[:axis] + (k,) + shape[axis + 1:])
        return xp.flip(take_axis(x, axis, n - 1 - k, n - 1) if at_end else take_axis(x, axis, 1, k + 1), axis=axis)

    parts = ([side(before, False)] if before else []) + [x] + ([side(after, True)] if after else [])
    return xp.concat(parts, axis=axis)


def constant_pad_numpy(x: np.ndarray, widths, value) -> np.ndarray:
    """NumPy ``x`` padded by non-negative ``(before, after)`` widths per axis with ``value``: a filled array with
    ``x`` copied in (``np.pad`` writes each border face by face, 2-3x slower on small arrays)."""
    out = np.full([d + a + b for d, (a, b) in zip(x.shape, widths)], value, x.dtype)
    out[tuple(slice(a, a + d) for d, (a, _) in zip(x.shape, widths))] = x
    return out


def unary_float_infer(name: str):
    return lambda ts, attrs: float_arg(name, ts, 0)


def numel_flops(per_elem: int):
    return lambda ts, out, attrs: per_elem * numel(out.shape)


def same_shape(a: TensorType, b: TensorType) -> bool:
    """The shapes of ``a`` and ``b`` may be equal (an ``Any`` dimension matches any size)."""
    return a.ndim == b.ndim and all(x is Any or y is Any or x == y for x, y in zip(a.shape, b.shape))


def pair_infer(name: str, what: str):
    """Type relation of a gradient op ``(out_grad, v)`` whose operands are float tensors of one type
    (``what`` names ``v`` in errors, e.g. "the data"); the result has v's type."""

    def infer(arg_types, attrs):
        g, v = float_arg(name, arg_types, 0), float_arg(name, arg_types, 1)
        same_dtype(name, arg_types)
        if not same_shape(g, v):
            raise type_error(name, arg_types, f"the output gradient and {what} must have one shape, got {g.shape} and {v.shape}")
        return v

    return infer


# ------------------------------------------------------------------ relu


def _relu_torch(x, attrs=None):
    import torch

    return torch.relu(x)


relu = defop(
    "nn.relu",
    1,
    unary_float_infer("nn.relu"),
    kernel=lambda xp, x, attrs=None: xp.maximum(x, 0.0),
    impls={"torch": _relu_torch},
    grad=lambda c, g: [threshold_grad(g, c, 0.0)],  # from the output, as PyTorch: relu(x) > 0 exactly where x > 0
    pattern=FusionKind.ELEMWISE,
    torch_name="relu",
    elementwise=True,
    kinks=(0.0,),
    dtypes=FLOAT_DTYPES,
)

# ------------------------------------------------------------------ threshold_grad (ATen's threshold_backward)


@dataclass(frozen=True)
class ThresholdAttrs:
    threshold: float = 0.0

    def __post_init__(self):
        check_float(self, "threshold")


def _threshold_grad_numpy(g, v, attrs):
    """Zero where ``v <= threshold`` as a bitwise AND with a mask (NaN and inf in ``g`` pass unchanged)."""
    keep = np.asarray(np.less_equal(v, v.dtype.type(attrs.threshold)))
    return E.select_or_zero(np.logical_not(keep, out=keep), g)


def _threshold_grad_torch(g, v, attrs):
    import torch

    return torch.ops.aten.threshold_backward(same_layout(g, v), v, attrs.threshold)


threshold_grad = defop(
    "nn.threshold_grad",
    2,
    pair_infer("nn.threshold_grad", "the data"),
    kernel=lambda xp, g, v, attrs: xp.where(v <= attrs.threshold, xp.zeros_like(g), g),
    impls={"numpy": _threshold_grad_numpy, "torch": _threshold_grad_torch},
    attrs_type=ThresholdAttrs,
    grad=lambda c, h: [threshold_grad(h, c.args[1], c.attrs.threshold), None],  # a step in the data: zero a.e.
    pattern=FusionKind.ELEMWISE,
    dtypes=FLOAT_DTYPES,
    torch_name="threshold_backward",
    doc="``(out_grad, data) -> out_grad`` where ``data > threshold``, else 0 (ATen ``threshold_backward``; "
        "``nn.relu``'s gradient reads its output as data). A NaN in data passes the gradient, as in PyTorch.",
)

# ------------------------------------------------------------------ clip_grad (ATen's hardtanh_backward)


def _clip_grad_numpy(g, x, attrs):
    """Zero outside ``[a_min, a_max]`` (and where ``x`` is NaN) as a bitwise AND with a mask."""
    t = x.dtype.type
    inside = np.asarray(np.greater_equal(x, t(attrs.a_min)))
    np.logical_and(inside, np.less_equal(x, t(attrs.a_max)), out=inside)
    return E.select_or_zero(inside, g)


def _clip_grad_torch(g, x, attrs):
    """ATen's ``hardtanh_backward``: one pass where the comparisons, their AND and the select take four
    (MobileNetV2's ReLU6 gradients, 48x32x32 channels, batch 16: 0.41 -> 0.05 ms). It keeps the gradient only
    strictly inside its bounds, and passes it where ``x`` is NaN: bounds widened by one ulp of the compared
    precision make it ``clip``'s closed interval; infinite bounds, NaNs in ``x`` (its maximum is NaN) and other
    devices (no host sync) take the comparisons."""
    import torch

    lo, hi = attrs.a_min, attrs.a_max
    if (x.is_cpu and x.dtype in (torch.float32, torch.float64, torch.float16) and math.isfinite(lo)
            and math.isfinite(hi) and x.numel() and not torch.isnan(x.amax())):
        f = np.float64 if x.dtype == torch.float64 else np.float32  # float16 is compared in float32
        return torch.ops.aten.hardtanh_backward(g, x, float(np.nextafter(f(lo), f(-np.inf))),
                                                float(np.nextafter(f(hi), f(np.inf))))
    return torch.where((x >= lo) & (x <= hi), g, g.new_zeros(()))


clip_grad = defop(
    "nn.clip_grad",
    2,
    pair_infer("nn.clip_grad", "the data"),
    kernel=lambda xp, g, x, attrs: xp.where((x >= attrs.a_min) & (x <= attrs.a_max), g, xp.zeros_like(g)),
    impls={"numpy": _clip_grad_numpy, "torch": _clip_grad_torch},
    attrs_type=E.ClipAttrs,
    grad=lambda c, h: [clip_grad(h, c.args[1], c.attrs.a_min, c.attrs.a_max), None],  # a step in the data: zero a.e.
    pattern=FusionKind.ELEMWISE,
    dtypes=FLOAT_DTYPES,
    torch_name="hardtanh_backward",
    example_attrs={"a_min": -1.0, "a_max": 1.0},
    doc="``(out_grad, data) -> out_grad`` where ``a_min <= data <= a_max``, else 0 (``clip``'s gradient; a NaN "
        "in data gives 0, as PyTorch's ``clamp`` backward).",
)

# ------------------------------------------------------------------ dense


def _dense_infer(arg_types, attrs, name: str = "nn.dense"):
    x = tensor_arg(name, arg_types, 0)
    w = tensor_arg(name, arg_types, 1)
    same_dtype(name, arg_types)
    if x.ndim < 1 or w.ndim != 2:
        raise type_error(name, arg_types, "expects data of rank >= 1 and a weight of rank 2 (units, in_features)")
    k, kw = x.shape[-1], w.shape[1]
    if isinstance(k, int) and isinstance(kw, int) and k != kw:
        raise type_error(name, arg_types, f"in_features differ: data has {k}, weight has {kw}")
    return TensorType(x.shape[:-1] + (w.shape[0],), x.dtype)


def _dense_grad(call: Call, g: Expr):
    return dense_grads(call.args[0], call.args[1], g)


def dense_grads(x: Expr, w: Expr, g: Expr) -> list:
    """dx = dense(g, w^T); dw = dense(g2^T, x2^T) with the leading dims of g and x flattened
    (by reshape when the sizes are static, else by moving the last axis first and batch_flatten)."""
    xt = x.checked_type
    gx = dense(g, T.transpose(w, (1, 0)))
    units, k = w.checked_type.shape[0], xt.shape[-1]
    if xt.ndim == 1:
        gt, xt2 = T.reshape(g, (-1, 1)), T.reshape(x, (-1, 1))
    elif xt.ndim == 2:
        gt, xt2 = T.transpose(g, (1, 0)), T.transpose(x, (1, 0))
    elif isinstance(units, int) and isinstance(k, int):
        gt = T.transpose(T.reshape(g, (-1, units)), (1, 0))
        xt2 = T.transpose(T.reshape(x, (-1, k)), (1, 0))
    else:
        last_first = (xt.ndim - 1,) + tuple(range(xt.ndim - 1))
        gt = batch_flatten(T.transpose(g, last_first))
        xt2 = batch_flatten(T.transpose(x, last_first))
    return [gx, dense(gt, xt2)]


def _dense_flops(arg_types, out_type, attrs):
    k = arg_types[0].shape[-1]
    return 2 * numel(out_type.shape) * (k if isinstance(k, int) else 0)


def dense_in_memory_order(x, w, attrs=None):
    """``x @ w.T`` as one 2-D GEMM over x's rows in memory order, on NumPy arrays and torch tensors: a batched
    matmul of a (B, M, K) array runs B smaller GEMMs (NumPy: 20-30% slower at the transformer's sizes; both
    NumPy and ATen 3-5x slower on a sequence-first view (S, B, K) of batch-first data, as attention's
    in-projection reads it). When x's leading dims, taken in memory order, collapse without a copy, the GEMM
    runs on them and the result is a view in x's axis order. Otherwise, when the features are not x's innermost
    axis (an NCHW gradient met as NHWC rows, EdgeNeXt's pointwise layers), the rows copied once and one GEMM, as
    eager's ``addmm`` backward does (the batched matmul copies them too, then runs 64 GEMMs of 4 rows); else the
    batched matmul."""
    if x.ndim <= 2:
        return x @ w.T
    strides = x.strides if isinstance(x, np.ndarray) else x.stride()
    lead = sorted(range(x.ndim - 1), key=lambda i: -strides[i])  # the leading axes, outermost in memory first
    if any(strides[lead[i]] != x.shape[lead[i + 1]] * strides[lead[i + 1]] for i in range(x.ndim - 2)):
        unit = x.itemsize if isinstance(x, np.ndarray) else 1  # NumPy's strides count bytes
        if x.shape[-1] > 1 and strides[-1] != unit:
            rows = math.prod(x.shape[:-1])
            return (x.reshape(rows, x.shape[-1]) @ w.T).reshape(tuple(x.shape[:-1]) + (w.shape[0],))
        return x @ w.T
    numpy = isinstance(x, np.ndarray)
    perm = lead + [x.ndim - 1]
    base = x.transpose(perm) if numpy else x.permute(perm)
    rows = math.prod(base.shape[:-1])  # not -1: a reshape of an empty array cannot infer it
    y = (base.reshape(rows, x.shape[-1]) @ w.T).reshape(tuple(base.shape[:-1]) + (w.shape[0],))
    back = [lead.index(i) for i in range(x.ndim - 1)] + [x.ndim - 1]
    return y.transpose(back) if numpy else y.permute(back)


dense = defop(
    "nn.dense",
    2,
    _dense_infer,
    kernel=lambda xp, x, w, attrs=None: xp.matmul(x, w.T),
    impls={"numpy": dense_in_memory_order, "torch": dense_in_memory_order},
    grad=_dense_grad,
    pattern=FusionKind.OUT_ELEMWISE_FUSABLE,
    flops=_dense_flops,
    torch_name="linear",
)

# ------------------------------------------------------------------ linear: dense plus a bias


def _linear_infer(arg_types, attrs):
    out = _dense_infer(arg_types[:2], attrs, "nn.linear")
    b = tensor_arg("nn.linear", arg_types, 2)
    units = out.shape[-1]
    if b.dtype != out.dtype or b.ndim != 1 or b.shape[0] is not Any and units is not Any and b.shape[0] != units:
        raise type_error("nn.linear", arg_types, f"the bias must be a {out.dtype} vector of the {units} units")
    return out


def linear_rows(x, w, b, attrs=None):
    """``nn.linear`` on NumPy arrays and torch tensors: the GEMM in x's memory order (``dense_in_memory_order``:
    new memory), then the bias added in place."""
    y = dense_in_memory_order(x, w)
    y += b
    return y


linear = defop(
    "nn.linear",
    3,
    _linear_infer,
    kernel=lambda xp, x, w, b, attrs=None: xp.matmul(x, w.T) + b,
    impls={"numpy": linear_rows, "torch": linear_rows},
    grad=lambda c, g: [*dense_grads(c.args[0], c.args[1], g), T.collapse_sum_like(g, c.args[2])],
    pattern=FusionKind.OUT_ELEMWISE_FUSABLE,
    flops=lambda ts, out, attrs: _dense_flops(ts, out, attrs) + numel(out.shape),
    torch_name="linear",
    doc="``dense(data, weight) + bias`` (PyTorch's ``F.linear``) in one kernel: a bias vector of the units "
        "added to each row as the GEMM writes it (oneDNN's epilogue for float32 rows on torch). The executors run "
        "a ``dense`` whose one use adds such a bias as this operator (``runtime.plan``).",
)

# ------------------------------------------------------------------ bias_add


@dataclass(frozen=True)
class BiasAddAttrs:
    axis: int = 1

    def __post_init__(self):
        check_int(self, "axis")


def _bias_axis(arg_types, attrs) -> int:
    x = tensor_arg("nn.bias_add", arg_types, 0)
    return normalize_axis("nn.bias_add", attrs.axis, x.ndim, arg_types)


def _bias_add_infer(arg_types, attrs):
    x = tensor_arg("nn.bias_add", arg_types, 0)
    b = tensor_arg("nn.bias_add", arg_types, 1)
    same_dtype("nn.bias_add", arg_types)
    axis = _bias_axis(arg_types, attrs)
    if b.ndim != 1:
        raise type_error("nn.bias_add", arg_types, f"bias must be 1-D, got rank {b.ndim}")
    c, cb = x.shape[axis], b.shape[0]
    if c is not Any and cb is not Any and c != cb:
        raise type_error("nn.bias_add", arg_types, f"bias has {cb} elements but data axis {attrs.axis} has {c}")
    return x


def _bias_add_kernel(xp, x, b, attrs):
    axis = attrs.axis % x.ndim
    return x + xp.reshape(b, (-1,) + (1,) * (x.ndim - axis - 1))


def _bias_add_grad(call: Call, g: Expr):
    axis = _bias_axis([a.checked_type for a in call.args], call.attrs)
    return [g, R.sum(g, axis, False, True)]


bias_add = defop(
    "nn.bias_add",
    2,
    _bias_add_infer,
    kernel=_bias_add_kernel,
    attrs_type=BiasAddAttrs,
    grad=_bias_add_grad,
    pattern=FusionKind.BROADCAST,
    torch_name="add",
)

# ------------------------------------------------------------------ batch_flatten


def _batch_flatten_infer(arg_types, attrs):
    x = tensor_arg("nn.batch_flatten", arg_types, 0)
    if x.ndim < 1:
        raise type_error("nn.batch_flatten", arg_types, "expects a tensor of rank >= 1")
    rest = x.shape[1:]
    return TensorType((x.shape[0], Any if any(d is Any for d in rest) else numel(rest)), x.dtype)


batch_flatten = defop(
    "nn.batch_flatten",
    1,
    _batch_flatten_infer,
    kernel=lambda xp, x, attrs=None: xp.reshape(x, (x.shape[0], -1)),
    grad=lambda c, g: [T.reshape_like(g, c.args[0])],
    pattern=FusionKind.INJECTIVE,
    recompute=Recompute.VIEW,
    flops=zero_flops,
    torch_name="flatten",
)

# ------------------------------------------------------------------ pad


PAD_MODES = ("constant", "edge", "reflect")


@dataclass(frozen=True)
class PadAttrs:
    """``pad_width``: one ``(before, after)`` pair per axis; negative widths crop (constant mode)."""

    pad_width: tuple
    pad_value: float = 0.0
    pad_mode: str = "constant"

    def __post_init__(self):
        pw = self.pad_width
        if not isinstance(pw, (list, tuple)):
            raise AttrError(f"attribute pad_width must be a sequence of (before, after) pairs, got {pw!r}")
        pairs = []
        for p in pw:
            p = seq_of_int(p, "attribute pad_width")
            if len(p) != 2:
                raise AttrError(f"attribute pad_width must hold (before, after) pairs, got {p}")
            pairs.append(p)
        object.__setattr__(self, "pad_width", tuple(pairs))
        check_float(self, "pad_value")
        check_choice(self, "pad_mode", PAD_MODES)
        if self.pad_mode != "constant" and any(v < 0 for p in pairs for v in p):
            raise AttrError(f"attribute pad_width: negative widths (cropping) need pad_mode='constant', got {self.pad_width}")


def _pad_infer(arg_types, attrs):
    x = tensor_arg("nn.pad", arg_types, 0)
    if len(attrs.pad_width) != x.ndim:
        raise type_error("nn.pad", arg_types, f"pad_width has {len(attrs.pad_width)} pairs for a tensor of rank {x.ndim}")
    out = []
    for d, (a, b) in zip(x.shape, attrs.pad_width):
        if d is Any:
            out.append(Any)
            continue
        n = d + a + b
        if n < 0 or max(-a, 0) + max(-b, 0) > d:  # a crop is taken before any padding (PyTorch's narrow)
            raise type_error("nn.pad", arg_types, f"pad_width {attrs.pad_width} crops more than the dimension {d}")
        if attrs.pad_mode == "reflect" and max(a, b) >= d:
            raise type_error("nn.pad", arg_types, f"reflect padding {max(a, b)} must be smaller than the dimension {d}")
        if attrs.pad_mode == "edge" and d == 0 and (a or b):
            raise type_error("nn.pad", arg_types, "edge padding of an empty dimension")
        out.append(n)
    return TensorType(tuple(out), x.dtype)


def _crop(x, attrs):
    """``x`` cropped by the negative widths of ``pad_width``."""
    return x[tuple(slice(max(-a, 0), x.shape[i] - max(-b, 0)) for i, (a, b) in enumerate(attrs.pad_width))]


def _pad_kernel(xp, x, attrs):
    x = _crop(x, attrs)
    for axis, (a, b) in enumerate(attrs.pad_width):
        x = pad_axis(xp, x, axis, max(a, 0), max(b, 0), attrs.pad_mode, attrs.pad_value)
    return x


def _pad_numpy(x, attrs):
    """One allocation instead of one concatenation per padded axis (``constant_pad_numpy``: 1.25 -> 0.36 ms for
    ResNet's (512, 512, 1, 1) -> 3x3 weight gradient)."""
    x = _crop(x, attrs)
    widths = [(max(a, 0), max(b, 0)) for a, b in attrs.pad_width]
    if attrs.pad_mode != "constant":
        return np.pad(x, widths, mode=attrs.pad_mode)
    return constant_pad_numpy(x, widths, attrs.pad_value)


def _pad_torch(x, attrs):
    """ATen's ``constant_pad_nd``: one allocation (negative widths crop); other modes by the common kernel."""
    if attrs.pad_mode != "constant":
        return _pad_kernel(array_namespace("torch"), x, attrs)
    import torch

    widths = [w for pair in reversed(attrs.pad_width) for w in pair]
    return torch.constant_pad_nd(x, widths, attrs.pad_value)


def _pad_backward_kernel(xp, g, attrs):
    """Adjoint of edge/reflect padding: fold each padded border back onto the input, axis by axis; float16 and
    bfloat16 added up in float32 and rounded once (a corner's sum rounded after each axis was off by several
    bfloat16 steps on torch: 0.0059 came out -0.0078)."""
    dtype = g.dtype
    g = accumulated(xp, g)
    reflect = attrs.pad_mode == "reflect"
    for axis, (a, b) in enumerate(attrs.pad_width):
        n = g.shape[axis] - a - b
        core = xp.asarray(take_axis(g, axis, a, a + n), copy=True)
        if a:  # padded index k < a came from source a - k (reflect) or 0 (edge)
            border = take_axis(g, axis, 0, a)
            core = add_into(core, _along(axis, 1, a + 1) if reflect else _along(axis, 0, 1),
                            xp.flip(border, axis=axis) if reflect else xp.sum(border, axis=axis, keepdims=True))
        if b:  # padded index a + n + k came from source n - 2 - k (reflect) or n - 1 (edge)
            border = take_axis(g, axis, a + n, a + n + b)
            core = add_into(core, _along(axis, n - 1 - b, n - 1) if reflect else _along(axis, n - 1, n),
                            xp.flip(border, axis=axis) if reflect else xp.sum(border, axis=axis, keepdims=True))
        g = core
    return g if g.dtype == dtype else xp.astype(g, dtype)


def _pad_backward_infer(arg_types, attrs):
    g = tensor_arg("nn.pad_backward", arg_types, 0)
    if len(attrs.pad_width) != g.ndim:
        raise type_error("nn.pad_backward", arg_types, f"pad_width has {len(attrs.pad_width)} pairs for a tensor of rank {g.ndim}")
    out = tuple(Any if d is Any else d - a - b for d, (a, b) in zip(g.shape, attrs.pad_width))
    if any(d is not Any and d < 1 for d in out):
        raise type_error("nn.pad_backward", arg_types, f"pad_width {attrs.pad_width} leaves an empty dimension")
    return TensorType(out, g.dtype)


def _pad_grad(call: Call, g: Expr):
    a = call.attrs
    if a.pad_mode == "constant":
        return [pad(g, tuple((-x, -y) for x, y in a.pad_width), 0.0, "constant")]
    return [pad_backward(g, a.pad_width, 0.0, a.pad_mode)]


pad = defop(
    "nn.pad",
    1,
    _pad_infer,
    kernel=_pad_kernel,
    impls={"numpy": _pad_numpy, "torch": _pad_torch},
    attrs_type=PadAttrs,
    grad=_pad_grad,
    pattern=FusionKind.INJECTIVE,
    flops=zero_flops,
    torch_name="pad",
    dtypes=ALL_DTYPES,
)
pad_backward = defop(
    "nn.pad_backward",
    1,
    _pad_backward_infer,
    kernel=_pad_backward_kernel,
    attrs_type=PadAttrs,
    grad=lambda c, g: [pad(g, c.attrs.pad_width, 0.0, c.attrs.pad_mode)],
    pattern=FusionKind.INJECTIVE,
    doc="Adjoint of ``nn.pad`` in edge/reflect mode (folds borders back; used by its gradient).",
    dtypes=ALL_DTYPES,
)

# ------------------------------------------------------------------ dropout (explicit mask: pure)


@dataclass(frozen=True)
class DropoutAttrs:
    rate: float = 0.5

    def __post_init__(self):
        check_float(self, "rate", nonneg=True)
        if not self.rate < 1.0:
            raise AttrError(f"attribute rate must be in [0, 1), got {self.rate}")


def _dropout_infer(arg_types, attrs):
    x = float_arg("nn.dropout", arg_types, 0)
    m = tensor_arg("nn.dropout", arg_types, 1)
    same_dtype("nn.dropout", arg_types)
    if broadcast_shapes("nn.dropout", arg_types, x.shape, m.shape) != x.shape or m.ndim > x.ndim:
        raise type_error("nn.dropout", arg_types, f"mask of shape {m.shape} must broadcast to the data shape {x.shape}")
    return x


def _dropout_grad(call: Call, g: Expr):
    x, m = call.args
    s = scalar(1.0 / (1.0 - call.attrs.rate), x)
    return [g * m * s, T.collapse_sum_like(g * x * s, m)]


dropout = defop(
    "nn.dropout",
    2,
    _dropout_infer,
    kernel=lambda xp, x, m, attrs: x * m * xp.asarray(1.0 / (1.0 - attrs.rate), dtype=x.dtype, device=device(x)),
    half_native=True,  # the scale rounded to x's dtype first, then one rounding: eager's bits in bfloat16 and float16
    attrs_type=DropoutAttrs,
    grad=_dropout_grad,
    pattern=FusionKind.BROADCAST,
    flops=numel_flops(2),
    torch_name="dropout",
    doc="``out = data * mask / (1 - rate)``: dropout with the random mask as an explicit input (pure).",
)

