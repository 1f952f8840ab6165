"""2-D pooling over NCHW data: max, average, global average, adaptive average.

Each op has one kernel for any array namespace over the strided window views of
the padded input (``conv.window_slices``; ``conv.scatter_windows`` adds them
back). Overrides: NumPy's in-place masks for max pooling and its gradient, XLA's
``reduce_window`` on jax, ATen's pooling kernels on torch (pre-padding the input
where ATen's symmetric padding cannot express the attributes). Gradients are
helper ops that are linear in the incoming gradient, and the gradient of each
helper is the forward op again (or a gather), so the family is closed:

- ``nn.max_pool2d`` -> ``nn.max_pool2d_grad(g, data)``: routes each window's
  gradient to its *first* maximum (row-major), like PyTorch;
  ``nn.max_pool2d_grad`` -> ``nn.max_pool2d_gather(data, gg)`` (``gg`` read at
  the same positions), whose gradient is ``nn.max_pool2d_grad`` again.
- ``nn.avg_pool2d`` <-> ``nn.avg_pool2d_grad``; ``nn.adaptive_avg_pool2d`` <->
  ``nn.adaptive_avg_pool2d_grad`` (the data argument of a ``*_grad`` op only
  gives the shape).
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..ir.errors import AttrError
from ..ir.expr import Call, Expr, TupleGetItem
from ..ir.types import Any, TensorType, TupleType
from . import layout as T
from .common import float_arg, numel, same_dtype, tensor_arg
from .elemwise import select_or_zero
from .conv import channels_last, eff, layout, pad_spatial, padding4, pair, scatter_windows, torch_padding, window_slices
from .indexing import gather
from .kernels import add_at, grid
from .nn import check_bool, constant, count, field, full, nonzero, on_device
from .registry import FusionKind, array_namespace, defop, type_error

# ------------------------------------------------------------------ attrs and shapes


@dataclass(frozen=True)
class MaxPool2DAttrs:
    pool_size: tuple = (1, 1)
    strides: tuple = (1, 1)
    dilation: tuple = (1, 1)
    padding: tuple = (0, 0)
    layout: str = "NCHW"
    ceil_mode: bool = False

    def __post_init__(self):
        _pool_common(self)


@dataclass(frozen=True)
class AvgPool2DAttrs:
    pool_size: tuple = (1, 1)
    strides: tuple = (1, 1)
    dilation: tuple = (1, 1)
    padding: tuple = (0, 0)
    layout: str = "NCHW"
    ceil_mode: bool = False
    count_include_pad: bool = False

    def __post_init__(self):
        _pool_common(self)
        check_bool(self, "count_include_pad")


def _pool_common(a) -> None:
    pair(a, "pool_size", 1)
    pair(a, "strides", 1)
    pair(a, "dilation", 1)
    padding4(a)
    layout(a, "layout", "NCHW")
    check_bool(a, "ceil_mode")


def pool_out(n, k: int, s: int, d: int, pb: int, pa: int, ceil_mode: bool):
    """Output size along one dim (PyTorch's rule: in ceil mode the last window must start inside input or left padding)."""
    if n is Any:
        return Any
    span = n + pb + pa - eff(k, d)
    if not ceil_mode:
        return span // s + 1 if span >= 0 else 0
    # in ceil mode a window wider than the padded input still gives one output (EfficientNet's head pools 8x8
    # with a 128 window): the window is cut at the padded input's end, as PyTorch does
    out = -(-span // s) + 1
    if (out - 1) * s >= n + pb:
        out -= 1
    return out


def _out_hw(a, hw):
    p = a.padding
    return tuple(pool_out(hw[i], a.pool_size[i], a.strides[i], a.dilation[i], p[i], p[i + 2], a.ceil_mode) for i in range(2))


def _pool_infer(op: str):
    def infer(arg_types, attrs):
        x = float_arg(op, arg_types, 0)
        if x.ndim != 4:
            raise type_error(op, arg_types, f"expects NCHW data (rank 4), got rank {x.ndim}")
        out = _out_hw(attrs, x.shape[2:])
        if any(o is not Any and o < 1 for o in out):
            raise type_error(op, arg_types, f"pool_size {attrs.pool_size} (dilation {attrs.dilation}) does not fit the padded input {x.shape[2:]}")
        return TensorType(x.shape[:2] + out, x.dtype)

    return infer


def _grad_infer(op: str, fwd_infer):
    """Type of a ``*_grad(out_grad, data)`` op: data's type; out_grad must have the pooled shape."""

    def infer(arg_types, attrs):
        same_dtype(op, arg_types)
        y, x = tensor_arg(op, arg_types, 0), tensor_arg(op, arg_types, 1)
        want = fwd_infer([x], attrs)
        if y.ndim != 4 or any(a is not Any and b is not Any and a != b for a, b in zip(y.shape, want.shape)):
            raise type_error(op, arg_types, f"the output gradient must have the pooled shape {want.shape}, got {y.shape}")
        return x

    return infer


def _pool_pads(a, hw, out) -> tuple:
    """(top, left, bottom, right) padding holding exactly ``out`` windows: the bottom/right padding is cut to
    what the last window reads, or grown to it in ceil mode."""
    after = [max(0, (out[i] - 1) * a.strides[i] + eff(a.pool_size[i], a.dilation[i]) - hw[i] - a.padding[i])
             for i in range(2)]
    return (a.padding[0], a.padding[1], after[0], after[1])


def _slices(xp, x, a, value) -> tuple[list, tuple]:
    """One (N, C, OH, OW) view per kernel offset (row-major) of x padded with ``value``, and the output size."""
    out = _out_hw(a, x.shape[2:])
    pads = _pool_pads(a, x.shape[2:], out)
    return window_slices(pad_spatial(xp, x, pads, value), a.pool_size, a.strides, a.dilation, out), out


def _scatter(xp, parts, x, a, out):
    """Adjoint of ``_slices``: a data-shaped array (``x`` gives shape, dtype, device)."""
    return scatter_windows(xp, parts, tuple(x.shape), a.pool_size, a.strides, a.dilation, a.padding, out, x)


def _torch_native(a) -> bool:
    """ATen pools these attributes itself: symmetric padding of at most half the window (and ceil mode as ours)."""
    t, left, b, r = a.padding
    return t == b and left == r and 2 * t <= a.pool_size[0] and 2 * left <= a.pool_size[1]


def _torch_input(x, a, value) -> tuple:
    """``(input, padding, ceil_mode)`` for an ATen pooling kernel giving exactly our windows: x itself when
    ATen can pad it, else x pre-padded (``_pool_pads``)."""
    if _torch_native(a):
        return x, a.padding[:2], a.ceil_mode
    return torch_padding(x, _pool_pads(a, x.shape[2:], _out_hw(a, x.shape[2:])), value)[0], (0, 0), False


def _pool_flops(arg_types, out_type, attrs):
    return numel(out_type.shape) * attrs.pool_size[0] * attrs.pool_size[1]


def _grad_flops(arg_types, out_type, attrs):
    return numel(arg_types[0].shape) * attrs.pool_size[0] * attrs.pool_size[1]


# ------------------------------------------------------------------ max pooling


# Which tap is a window's maximum: ATen's rule, scanning the taps in row-major order, a tap replaces the best so
# far when it is greater (ties keep the earlier tap) or NaN (so a window holding NaN has the max NaN, at its last
# NaN), as PyTorch's max pooling, its indices and its gradient do on every device.


def _first_max(xp, views):
    """(max, index of the first max in row-major window order) per window, by ATen's rule (see above)."""
    best, idx = views[0], full(xp, views[0].shape, 0, views[0], dtype=xp.int32)
    for k in range(1, len(views)):
        better = (views[k] > best) | xp.isnan(views[k])
        best, idx = xp.where(better, views[k], best), xp.where(better, k, idx)
    return best, idx


def _max_pool_kernel(xp, x, a):
    views, _ = _slices(xp, x, a, -np.inf)
    best = views[0]
    for v in views[1:]:
        best = xp.maximum(best, v)
    return best


def _max_pool_grad_kernel(xp, g, x, a):
    views, out = _slices(xp, x, a, -np.inf)
    idx = _first_max(xp, views)[1]
    kw = a.pool_size[1]
    return _scatter(xp, lambda i, j: xp.where(idx == i * kw + j, g, 0.0), x, a, out)


def _max_pool_gather_kernel(xp, x, src, a):
    idx = _first_max(xp, _slices(xp, x, a, -np.inf)[0])[1]
    picked = None
    for k, v in enumerate(_slices(xp, src, a, 0.0)[0]):
        picked = v if picked is None else xp.where(idx == k, v, picked)
    return picked


# NumPy: in place, and equality masks against the window max where no window holds NaN


def _max_scan(views):
    """(max, index of the first max in row-major window order) per window, by ATen's rule (see ``_first_max``)."""
    best = np.array(views[0], copy=True)
    idx = np.zeros(best.shape, np.int64)
    for k in range(1, len(views)):
        v = views[k]
        better = v > best
        better |= np.isnan(v)
        np.copyto(best, v, where=better)
        np.copyto(idx, k, where=better)
    return best, idx


def _window_max(views):
    """The max of each window by ``np.maximum``, or None when a window holds NaN (then ``_max_scan`` decides)."""
    best = np.array(views[0], copy=True) if len(views) == 1 else np.maximum(views[0], views[1])
    for v in views[2:]:
        np.maximum(best, v, out=best)
    return None if np.isnan(best).any() else best


def _first_max_hits(views) -> list:
    """One bool mask per kernel offset: True where that offset holds its window's first maximum."""
    best = _window_max(views)
    if best is None:
        idx = _max_scan(views)[1]
        return [idx == k for k in range(len(views))]
    hits, found = [], None
    for k, v in enumerate(views):
        hit = np.equal(v, best)
        if found is None:
            found = hit.copy() if len(views) > 1 else hit
        else:
            np.greater(hit, found, out=hit)  # hit and not found before
            if k + 1 < len(views):
                np.logical_or(found, hit, out=found)
        hits.append(hit)
    return hits


def _max_pool_numpy(x, a):
    views, _ = _slices(np, x, a, -np.inf)
    best = _window_max(views)
    if best is None:
        best = _max_scan(views)[0]
    return np.ascontiguousarray(best, dtype=x.dtype)


def _tiles(a, hw, out) -> bool:
    """True when the windows tile the input exactly (no padding, stride = pool size, no dilation)."""
    return (a.strides == a.pool_size and a.dilation == (1, 1) and not any(a.padding)
            and all(out[i] * a.pool_size[i] == hw[i] for i in range(2)))


def _max_pool_grad_numpy(g, x, a):
    views, out = _slices(np, x, a, -np.inf)
    hits = _first_max_hits(views)
    kh, kw = a.pool_size
    if _tiles(a, x.shape[2:], out):  # disjoint windows covering x: write each offset's share in place
        res = np.empty(x.shape[:2] + (out[0], kh, out[1], kw), g.dtype)
        for k, hit in enumerate(hits):
            select_or_zero(hit, g, out=res[:, :, :, k // kw, :, k % kw])
        return res.reshape(x.shape)
    return _scatter(np, lambda i, j: select_or_zero(hits[i * kw + j], g), x, a, out)


def _max_pool_gather_numpy(x, src, a):
    idx = _max_scan(_slices(np, x, a, -np.inf)[0])[1]
    views = _slices(np, src, a, 0)[0]
    picked = np.array(views[0], copy=True)
    for k in range(1, len(views)):
        np.copyto(picked, views[k], where=idx == k)
    return picked


# jax: XLA's reduce_window


def _reduce_window(x, a, init, op):
    from jax import lax

    pads = _pool_pads(a, x.shape[2:], _out_hw(a, x.shape[2:]))
    return lax.reduce_window(x, np.array(init, x.dtype), op, (1, 1) + a.pool_size, (1, 1) + a.strides,
                             ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), window_dilation=(1, 1) + a.dilation)


def _max_pool_jax(x, a):
    from jax import lax

    return _reduce_window(x, a, -np.inf, lax.max)


# torch: ATen's max_pool2d with indices (first maximum of each window) into the (pre-padded) input


def _torch_argmax(x, a):
    """(flat index of each window's first max into the ATen input, that input (channels-last), its padding, ceil)."""
    import torch

    xin, pad, ceil = _torch_input(x, a, -np.inf)
    xin = channels_last(xin)
    return torch.ops.aten.max_pool2d_with_indices(xin, a.pool_size, a.strides, pad, a.dilation, ceil)[1], xin, pad, ceil


def _crop_torch(y, x, a):
    """The data-shaped part of a result on the pre-padded ATen input (``y`` itself when ATen padded)."""
    if _torch_native(a):
        return y
    return y[:, :, a.padding[0]: a.padding[0] + x.shape[2], a.padding[1]: a.padding[1] + x.shape[3]]


def _max_pool_torch(x, a):
    import torch.nn.functional as F

    xin, pad, ceil = _torch_input(x, a, -np.inf)
    return F.max_pool2d(channels_last(xin), a.pool_size, a.strides, pad, a.dilation, ceil)  # 3-7x faster than on NCHW


def _max_pool_grad_torch(g, x, a):
    """ATen's max_pool2d_with_indices then its backward (no scatter where ATen pads itself); both take ``x``
    channels-last, converted once here. Where we pad (wider than ATen allows), on the padded input, then cropped:
    a window lying wholly in the padding sends its gradient to a padding position, dropped (mapping its index
    into the data first, as ``max_pool2d_with_indices`` does, had it land on a data element)."""
    import torch

    x = channels_last(x)
    if _torch_native(a):
        return _with_indices_grad_torch(g, x, _with_indices_torch(x, a)[1], a)
    idx, xin, pad, ceil = _torch_argmax(x, a)
    gin = torch.ops.aten.max_pool2d_with_indices_backward(channels_last(g), xin, a.pool_size, a.strides, pad,
                                                          a.dilation, ceil, idx)
    return _crop_torch(gin, x, a)


def _max_pool_gather_torch(x, src, a):
    idx = _torch_argmax(x, a)[0]
    src = _torch_input(src, a, 0.0)[0]
    return src.flatten(2).gather(2, idx.flatten(2)).reshape(idx.shape)


_max_infer = _pool_infer("nn.max_pool2d")
max_pool2d = defop("nn.max_pool2d", 1, _max_infer, kernel=_max_pool_kernel,
                   impls={"numpy": _max_pool_numpy, "jax": _max_pool_jax, "torch": _max_pool_torch}, attrs_type=MaxPool2DAttrs,
                   grad=lambda c, g: [max_pool2d_grad(g, c.args[0], **_attrs_kw(c))],
                   pattern=FusionKind.OPAQUE, flops=_pool_flops, torch_name="max_pool2d")
max_pool2d_grad = defop(
    "nn.max_pool2d_grad", 2, _grad_infer("nn.max_pool2d_grad", _max_infer), kernel=_max_pool_grad_kernel,
    impls={"numpy": _max_pool_grad_numpy, "torch": _max_pool_grad_torch},
    attrs_type=MaxPool2DAttrs,
    grad=lambda c, gg: [max_pool2d_gather(c.args[1], gg, **_attrs_kw(c)), T.zeros_like(c.args[1])],
    pattern=FusionKind.OPAQUE, flops=_grad_flops, torch_name="max_pool2d_with_indices_backward",
    doc="Gradient of ``nn.max_pool2d``: ``(out_grad, data) -> data-shaped``; each window's gradient goes to its first maximum.")


def _gather_infer(arg_types, attrs):
    x, src = tensor_arg("nn.max_pool2d_gather", arg_types, 0), tensor_arg("nn.max_pool2d_gather", arg_types, 1)
    same_dtype("nn.max_pool2d_gather", arg_types)
    if src.ndim != x.ndim or any(a is not Any and b is not Any and a != b for a, b in zip(x.shape, src.shape)):
        raise type_error("nn.max_pool2d_gather", arg_types, f"src must have the data shape {x.shape}, got {src.shape}")
    return _max_infer([x], attrs)


max_pool2d_gather = defop(
    "nn.max_pool2d_gather", 2, _gather_infer, kernel=_max_pool_gather_kernel,
    impls={"numpy": _max_pool_gather_numpy, "torch": _max_pool_gather_torch},
    attrs_type=MaxPool2DAttrs,
    grad=lambda c, g: [T.zeros_like(c.args[0]), max_pool2d_grad(g, c.args[0], **_attrs_kw(c))],
    pattern=FusionKind.OPAQUE, flops=_pool_flops,
    doc="``(data, src) -> pooled``: ``src`` read at the position of each window's first maximum of ``data``.")


# ------------------------------------------------------------------ max pooling that saves its indices
# ``nn.max_pool2d_with_indices(data) -> (pooled, indices)``: indices (int64) are PyTorch's, the flat position
# ``row * W + col`` in the unpadded input of each window's first maximum (row-major; a window whose entries
# are all -inf or NaN points at the in-bounds position nearest its first tap). ``nn.max_pool2d_with_indices_grad
# (out_grad, data, indices)`` adds each window's gradient at its index (data gives the shape): no search for
# the maximum again, no scatter on NumPy; its gradient gathers at the indices.


def _tap_origin(a, out) -> tuple:
    """Row (OH, 1) and column (1, OW) of each window's first tap in the unpadded input."""
    rows = np.arange(out[0]) * a.strides[0] - a.padding[0]
    cols = np.arange(out[1]) * a.strides[1] - a.padding[1]
    return rows[:, None], cols[None, :]


def _flat_index(xp, k, a, hw, out, like):
    """Flat input positions (int64) of window offsets ``k`` (row-major in the window), clipped into the input."""
    r0, c0 = (xp.asarray(v, **on_device(xp, like)) for v in _tap_origin(a, out))
    kw = a.pool_size[1]
    row = xp.clip(r0 + (k // kw) * a.dilation[0], 0, hw[0] - 1)
    col = xp.clip(c0 + (k % kw) * a.dilation[1], 0, hw[1] - 1)
    return xp.astype(row * hw[1] + col, xp.int64)


def _with_indices_kernel(xp, x, a):
    views, out = _slices(xp, x, a, -np.inf)
    best, k = _first_max(xp, views)
    return best, _flat_index(xp, xp.astype(k, xp.int64), a, x.shape[2:], out, x)


def _with_indices_numpy(x, a):
    """The window max by ``np.maximum`` (``_max_scan`` when NaN is present), each window's first offset holding
    it (offsets in reverse, the last write wins, by bit masks: ``np.copyto(where=)`` is 40x slower), its flat
    position read from a (K, OH, OW) table."""
    views, out = _slices(np, x, a, -np.inf)
    best = _window_max(views) if len(views) < 128 else None
    if best is None:
        best, k = _max_scan(views)
    else:
        k, d = np.zeros(best.shape, np.int8), np.empty(best.shape, np.int8)
        for i in range(len(views) - 1, -1, -1):  # down to offset 0: an earlier tie overwrites
            hit = np.equal(views[i], best).view(np.int8)  # 0 / 1
            np.bitwise_xor(k, np.int8(i), out=d)
            d &= np.negative(hit, out=hit)  # k ^ i where hit, else 0
            k ^= d
    taps = np.arange(len(views)).reshape(-1, 1, 1)
    table = _flat_index(np, taps, a, x.shape[2:], out, x).reshape(-1)  # (K * OH * OW,)
    plane = out[0] * out[1]
    at = np.multiply(k, plane, dtype=np.intp)
    at += np.arange(plane).reshape(out)
    return np.ascontiguousarray(best, dtype=x.dtype), table[at]


def _with_indices_torch(x, a):
    """ATen's max_pool2d_with_indices; on a pre-padded input its indices are mapped back to the data."""
    import torch

    def aten(v, pad, ceil):
        return torch.ops.aten.max_pool2d_with_indices(channels_last(v), a.pool_size, a.strides, pad, a.dilation, ceil)

    if _torch_native(a):
        return aten(x, a.padding[:2], a.ceil_mode)
    xin = _torch_input(x, a, -np.inf)[0]
    y, idx = aten(xin, (0, 0), False)
    h, w = x.shape[2:]
    row = (idx // xin.shape[3] - a.padding[0]).clamp_(0, h - 1)
    col = (idx % xin.shape[3] - a.padding[1]).clamp_(0, w - 1)
    return y, row * w + col


def _with_indices_grad_kernel(xp, g, x, idx, a):
    n, c, h, w = x.shape
    flat = full(xp, (n, c, h * w), 0, g)
    pooled = (n, c, math.prod(g.shape[2:]))  # not -1: ambiguous for an empty batch
    return xp.reshape(add_at(flat, grid(xp, xp.reshape(idx, pooled), 2), xp.reshape(g, pooled)), tuple(x.shape))


def _with_indices_grad_numpy(g, x, idx, a):
    """Per window offset, the gradient where the index is that offset's position: disjoint windows write the
    result in place, overlapping ones add strided views (``scatter_windows``); never ``np.add.at``."""
    out, (h, w) = g.shape[2:], x.shape[2:]
    r0, c0 = _tap_origin(a, out)
    kh, kw = a.pool_size
    dh, dw = a.dilation

    def hits(i: int, j: int):
        return np.equal(idx, (r0 + i * dh) * w + (c0 + j * dw))

    if _tiles(a, (h, w), out):
        res = np.empty(x.shape[:2] + (out[0], kh, out[1], kw), g.dtype)
        for i in range(kh):
            for j in range(kw):
                select_or_zero(hits(i, j), g, out=res[:, :, :, i, :, j])
        return res.reshape(x.shape)
    return _scatter(np, lambda i, j: select_or_zero(hits(i, j), g), x, a, out)


def _with_indices_grad_torch(g, x, idx, a):
    """ATen's max_pool2d_with_indices_backward where ATen pads itself, else a scatter-add at the indices."""
    import torch

    if _torch_native(a):  # in the forward's channels-last order: ATen's NCHW kernels are 5-10x slower
        return torch.ops.aten.max_pool2d_with_indices_backward(channels_last(g), channels_last(x), a.pool_size, a.strides,
                                                                a.padding[:2], a.dilation, a.ceil_mode, idx)
    n, c, h, w = x.shape
    return g.new_zeros((n, c, h * w)).scatter_add_(2, idx.flatten(2), g.flatten(2)).view(n, c, h, w)


def _with_indices_infer(arg_types, attrs):
    y = _max_infer(arg_types, attrs)
    return TupleType((y, TensorType(y.shape, "int64")))


def _with_indices_grad_infer(arg_types, attrs):
    op = "nn.max_pool2d_with_indices_grad"
    x = _grad_infer(op, _max_infer)(arg_types[:2], attrs)
    idx = tensor_arg(op, arg_types, 2)
    g = arg_types[0]
    if idx.dtype not in ("int64", "int32") or idx.ndim != 4 or any(
            p is not Any and q is not Any and p != q for p, q in zip(idx.shape, g.shape)):
        raise type_error(op, arg_types, f"indices must be an integer tensor of the pooled shape {g.shape}, got {idx!r}")
    return x


def _gather_at(src: Expr, idx: Expr, like: Expr) -> Expr:
    """``src`` (N, C, H, W) read at flat indices ``idx`` (N, C, OH, OW), shaped like ``like``."""
    flat = T.reshape(src, (0, 0, -1))
    return T.reshape_like(gather(flat, 2, T.reshape(idx, (0, 0, -1))), like)


def _with_indices_grad(call: Call, g: Expr):
    gy = nonzero(field(g, 0))
    if gy is None:
        return [None]
    return [max_pool2d_with_indices_grad(gy, call.args[0], TupleGetItem(call, 1), **_attrs_kw(call))]


max_pool2d_with_indices = defop(
    "nn.max_pool2d_with_indices", 1, _with_indices_infer, kernel=_with_indices_kernel,
    impls={"numpy": _with_indices_numpy, "torch": _with_indices_torch}, attrs_type=MaxPool2DAttrs,
    grad=_with_indices_grad, pattern=FusionKind.OPAQUE, flops=_pool_flops, torch_name="max_pool2d_with_indices",
    doc="``data -> (pooled, indices)``: max pooling and the flat input position (int64) of each window's first maximum.")
max_pool2d_with_indices_grad = defop(
    "nn.max_pool2d_with_indices_grad", 3, _with_indices_grad_infer, kernel=_with_indices_grad_kernel,
    impls={"numpy": _with_indices_grad_numpy, "torch": _with_indices_grad_torch}, attrs_type=MaxPool2DAttrs,
    grad=lambda c, gg: [_gather_at(gg, c.args[2], c.args[0]), None, None],
    pattern=FusionKind.OPAQUE, flops=lambda ts, out, a: numel(ts[0].shape), torch_name="max_pool2d_with_indices_backward",
    doc="Gradient of ``nn.max_pool2d_with_indices``: ``(out_grad, data, indices) -> data-shaped``, each window's "
        "gradient added at its index.")


def _attrs_kw(call: Call) -> dict:
    import dataclasses

    return {f.name: getattr(call.attrs, f.name) for f in dataclasses.fields(call.attrs)}


# ------------------------------------------------------------------ average pooling


def _divisor(a, hw, out):
    """Per-output element count of each window (separable: rows x cols)."""
    counts = []
    for i in range(2):
        k, s, d, pb, pa = a.pool_size[i], a.strides[i], a.dilation[i], a.padding[i], a.padding[i + 2]
        pos = (np.arange(out[i]) * s - pb)[:, None] + np.arange(k) * d
        inside = (pos < hw[i] + pa) if a.count_include_pad else (pos >= 0) & (pos < hw[i])
        counts.append(np.maximum(inside.sum(axis=1), 1))
    return np.outer(counts[0], counts[1])


def _avg_pool_kernel(xp, x, a):
    views, out = _slices(xp, x, a, 0.0)
    total = views[0]
    for v in views[1:]:
        total = total + v
    return total / constant(xp, _divisor(a, x.shape[2:], out), x)


def _avg_pool_grad_kernel(xp, g, x, a):
    out = g.shape[2:]
    q = g / constant(xp, _divisor(a, x.shape[2:], out), g)
    return _scatter(xp, lambda i, j: q, x, a, out)


def _avg_pool_numpy(x, a):
    """The window sum in one buffer."""
    views, out = _slices(np, x, a, 0)
    total = np.array(views[0], copy=True)
    for v in views[1:]:
        total += v
    total /= _divisor(a, x.shape[2:], out).astype(x.dtype)
    return total


def _avg_pool_jax(x, a):
    from jax import lax

    return _reduce_window(x, a, 0, lax.add) / np.asarray(_divisor(a, x.shape[2:], _out_hw(a, x.shape[2:])), x.dtype)


def _torch_avg_native(a) -> bool:
    return a.dilation == (1, 1) and _torch_native(a)


def _avg_pool_torch(x, a):
    """ATen's average pooling (no dilation, symmetric padding), else the shared kernel."""
    if not _torch_avg_native(a):
        return _avg_pool_kernel(array_namespace("torch"), x, a)
    import torch.nn.functional as F

    return F.avg_pool2d(x, a.pool_size, a.strides, a.padding[:2], a.ceil_mode, a.count_include_pad)


def _avg_pool_grad_torch(g, x, a):
    if not _torch_avg_native(a):
        return _avg_pool_grad_kernel(array_namespace("torch"), g, x, a)
    import torch

    return torch.ops.aten.avg_pool2d_backward(g, x, a.pool_size, a.strides, a.padding[:2], a.ceil_mode,
                                              a.count_include_pad, None)


_avg_infer = _pool_infer("nn.avg_pool2d")
avg_pool2d = defop("nn.avg_pool2d", 1, _avg_infer, kernel=_avg_pool_kernel,
                   impls={"numpy": _avg_pool_numpy, "jax": _avg_pool_jax, "torch": _avg_pool_torch}, attrs_type=AvgPool2DAttrs,
                   grad=lambda c, g: [avg_pool2d_grad(g, c.args[0], **_attrs_kw(c))],
                   pattern=FusionKind.OPAQUE, flops=_pool_flops, torch_name="avg_pool2d")
avg_pool2d_grad = defop(
    "nn.avg_pool2d_grad", 2, _grad_infer("nn.avg_pool2d_grad", _avg_infer), kernel=_avg_pool_grad_kernel,
    impls={"torch": _avg_pool_grad_torch},
    attrs_type=AvgPool2DAttrs, grad=lambda c, gg: [avg_pool2d(gg, **_attrs_kw(c)), None],
    pattern=FusionKind.OPAQUE, flops=_grad_flops, torch_name="avg_pool2d_backward",
    doc="Gradient of ``nn.avg_pool2d``: ``(out_grad, data) -> data-shaped`` (data gives only the shape).")

# ------------------------------------------------------------------ global average pooling


@dataclass(frozen=True)
class GlobalPool2DAttrs:
    layout: str = "NCHW"

    def __post_init__(self):
        layout(self, "layout", "NCHW")


def _global_infer(arg_types, attrs):
    x = float_arg("nn.global_avg_pool2d", arg_types, 0)
    if x.ndim != 4:
        raise type_error("nn.global_avg_pool2d", arg_types, f"expects NCHW data (rank 4), got rank {x.ndim}")
    return TensorType(x.shape[:2] + (1, 1), x.dtype)


def _global_grad(call: Call, g: Expr):
    x = call.args[0]
    return [T.broadcast_to_like(g / count(x, (2, 3)), x)]


global_avg_pool2d = defop("nn.global_avg_pool2d", 1, _global_infer,
                          kernel=lambda xp, x, a: xp.mean(x, axis=(2, 3), keepdims=True),
                          attrs_type=GlobalPool2DAttrs, grad=_global_grad, pattern=FusionKind.OPAQUE,
                          flops=lambda ts, out, a: numel(ts[0].shape), torch_name="adaptive_avg_pool2d")

# ------------------------------------------------------------------ adaptive average pooling


@dataclass(frozen=True)
class AdaptivePool2DAttrs:
    """``output_size``: int or pair; a ``None`` entry keeps the input size (Relay)."""

    output_size: Optional[tuple] = None
    layout: str = "NCHW"

    def __post_init__(self):
        v = self.output_size
        v = (v, v) if v is None or isinstance(v, int) else tuple(v)
        if len(v) == 1:
            v = v * 2
        if len(v) != 2 or any(not (e is None or (isinstance(e, int) and not isinstance(e, bool) and e >= 1)) for e in v):
            raise AttrError(f"attribute output_size must be positive ints or None (keep the input size), got {self.output_size!r}")
        object.__setattr__(self, "output_size", v)
        layout(self, "layout", "NCHW")


def _adaptive_hw(a, hw):
    return tuple(hw[i] if a.output_size[i] is None else a.output_size[i] for i in range(2))


def _adaptive_infer(arg_types, attrs):
    x = float_arg("nn.adaptive_avg_pool2d", arg_types, 0)
    if x.ndim != 4:
        raise type_error("nn.adaptive_avg_pool2d", arg_types, f"expects NCHW data (rank 4), got rank {x.ndim}")
    return TensorType(x.shape[:2] + _adaptive_hw(attrs, x.shape[2:]), x.dtype)


def _adaptive_matrix(n: int, out: int, dtype) -> np.ndarray:
    """(out, n) averaging matrix: row i averages [floor(i n / out), ceil((i+1) n / out))."""
    m = np.zeros((out, n), dtype)
    for i in range(out):
        lo, hi = (i * n) // out, -(-((i + 1) * n) // out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m


def _adaptive_kernel(xp, x, a):
    """Separable: (OH, H) @ x @ (W, OW)."""
    oh, ow = _adaptive_hw(a, x.shape[2:])
    mh = constant(xp, _adaptive_matrix(x.shape[2], oh, np.float64), x)
    mw = constant(xp, _adaptive_matrix(x.shape[3], ow, np.float64).T, x)
    return xp.matmul(xp.matmul(mh, x), mw)


def _adaptive_grad_kernel(xp, g, x, a):
    mh = constant(xp, _adaptive_matrix(x.shape[2], g.shape[2], np.float64).T, g)
    mw = constant(xp, _adaptive_matrix(x.shape[3], g.shape[3], np.float64), g)
    return xp.matmul(xp.matmul(mh, g), mw)


def _adaptive_torch(x, a):
    """ATen's adaptive average pooling (the same bins; 9 us against 330 us for the two matmuls on a CNN's head)."""
    import torch.nn.functional as F

    return F.adaptive_avg_pool2d(x, _adaptive_hw(a, x.shape[2:]))


def _adaptive_grad_torch(g, x, a):
    import torch

    if tuple(g.shape[-2:]) == (1, 1):
        # a global average pool, which eager computes as a mean: its gradient is eager's MeanBackward, the output
        # gradient over the plane's size as a broadcast view, instead of a filled tensor (a CNN head's
        # (32, 64, 32, 32): 4 ms on the 2-core bench machine)
        return (g / (x.shape[-2] * x.shape[-1])).expand(x.shape)
    return torch.ops.aten._adaptive_avg_pool2d_backward(g, x)


adaptive_avg_pool2d = defop("nn.adaptive_avg_pool2d", 1, _adaptive_infer, kernel=_adaptive_kernel, attrs_type=AdaptivePool2DAttrs,
                            impls={"torch": _adaptive_torch},
                            grad=lambda c, g: [adaptive_avg_pool2d_grad(g, c.args[0], c.attrs.output_size)],
                            pattern=FusionKind.OPAQUE, flops=lambda ts, out, a: numel(ts[0].shape),
                            torch_name="adaptive_avg_pool2d")
adaptive_avg_pool2d_grad = defop(
    "nn.adaptive_avg_pool2d_grad", 2, _grad_infer("nn.adaptive_avg_pool2d_grad", _adaptive_infer),
    kernel=_adaptive_grad_kernel, impls={"torch": _adaptive_grad_torch}, attrs_type=AdaptivePool2DAttrs,
    grad=lambda c, gg: [adaptive_avg_pool2d(gg, c.attrs.output_size), None],
    pattern=FusionKind.OPAQUE, flops=lambda ts, out, a: numel(out.shape),
    doc="Gradient of ``nn.adaptive_avg_pool2d``: ``(out_grad, data) -> data-shaped`` (data gives only the shape).")

