"""2-D convolutions (NCHW data, OIHW / IOHW kernels) and the shared window helpers of pooling.

- ``nn.conv2d(data, weight)``: the convolution; ``nn.conv2d_bias(data, weight, bias)`` with a bias per output
  channel (how a plan runs a convolution whose one use adds its bias);
- ``nn.conv2d_transpose(data, weight)``: the adjoint of conv2d w.r.t. its data
  (PyTorch's ``conv_transpose2d``, IOHW weight, ``output_padding < strides``);
- ``nn.conv2d_backward_weight(grad, data)``: the adjoint w.r.t. the weight (Relay's op).

Each has one kernel for any array namespace (im2col from strided slices and a
batched matmul per group; the transpose scatters its taps back) and the fast
kernel of each target as an override: NumPy's im2col with
``sliding_window_view`` (``einsum`` per group), XLA's ``conv_general_dilated``
on jax, ATen's convolutions (oneDNN on CPU) on torch.

The three are linear in each argument and each one's gradient is made of the
three, so derivatives of any order work: conv2d -> (conv2d_transpose,
conv2d_backward_weight), conv2d_transpose -> (conv2d, conv2d_backward_weight),
conv2d_backward_weight -> (conv2d, conv2d_transpose).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..ir.errors import AttrError, PullbackError
from ..ir.expr import Call, Expr
from ..ir.types import Any, TensorType
from . import reduce as R
from .common import numel, same_dtype, tensor_arg
from .nn import add_into, check_int, constant_pad_numpy, full, pad_axis
from .onednn import rows_times_t
from .registry import FusionKind, defop, seq_of_int, type_error

# ------------------------------------------------------------------ attribute helpers


def pair(obj, name: str, lo: int) -> None:
    """Normalise an int or 2-sequence attribute to a pair of ints >= lo."""
    v = seq_of_int(getattr(obj, name), f"attribute {name}")
    if len(v) == 1:
        v = v * 2
    if len(v) != 2:
        raise AttrError(f"attribute {name} must be an int or a pair, got {getattr(obj, name)!r}")
    if min(v) < lo:
        raise AttrError(f"attribute {name} must hold values >= {lo}, got {v}")
    object.__setattr__(obj, name, v)


def padding4(obj, name: str = "padding") -> None:
    """Relay's padding: int, (pad_h, pad_w) or (top, left, bottom, right); stored as the 4-tuple."""
    v = seq_of_int(getattr(obj, name), f"attribute {name}")
    if len(v) == 1:
        v = v * 4
    elif len(v) == 2:
        v = (v[0], v[1], v[0], v[1])
    if len(v) != 4:
        raise AttrError(f"attribute {name} must be an int, a pair or (top, left, bottom, right), got {getattr(obj, name)!r}")
    if min(v) < 0:
        raise AttrError(f"attribute {name} must not be negative, got {v}")
    object.__setattr__(obj, name, v)


def layout(obj, name: str, want: str) -> None:
    if getattr(obj, name) != want:
        raise AttrError(f"attribute {name}={getattr(obj, name)!r} is not supported (only {want!r})")


def optional_pair(obj, name: str) -> None:
    if getattr(obj, name) is not None:
        pair(obj, name, 1)


def eff(k: int, d: int) -> int:
    """Extent of a dilated kernel."""
    return d * (k - 1) + 1


def conv_out(n, k: int, s: int, d: int, pad_before: int, pad_after: int):
    """Output size of a convolution along one dim (Any stays Any)."""
    return Any if n is Any else (n + pad_before + pad_after - eff(k, d)) // s + 1


def convT_out(n, k: int, s: int, d: int, pad_before: int, pad_after: int, out_pad: int):
    return Any if n is Any else (n - 1) * s - pad_before - pad_after + eff(k, d) + out_pad


def windows(x: np.ndarray, k: tuple, s: tuple, d: tuple, out: tuple) -> np.ndarray:
    """View ``(N, C, OH, OW, KH, KW)`` of the windows of a padded NCHW NumPy array (no copy)."""
    v = sliding_window_view(x, (eff(k[0], d[0]), eff(k[1], d[1])), axis=(2, 3))
    return v[:, :, : (out[0] - 1) * s[0] + 1 : s[0], : (out[1] - 1) * s[1] + 1 : s[1], :: d[0], :: d[1]]


def im2col_t(win: np.ndarray) -> np.ndarray:
    """The windows (N, C, OH, OW, KH, KW) as a contiguous (C*KH*KW, N*OH*OW) matrix.

    The copy keeps (OH, OW) innermost, so it reads the input nearly contiguously,
    and the matmuls using it are wide."""
    n, c, oh, ow, kh, kw = win.shape
    cols = np.empty((c, kh, kw, n, oh, ow), win.dtype)
    cols[...] = win.transpose(1, 4, 5, 0, 2, 3)
    return cols.reshape(c * kh * kw, n * oh * ow)


def pad_spatial(xp, x, pad: tuple, value=0.0):
    """The two spatial dims of NCHW ``x`` padded by (top, left, bottom, right) with ``value`` (NumPy: one allocation)."""
    top, left, bottom, right = pad
    if not (top or left or bottom or right):
        return x
    if xp is np:
        return constant_pad_numpy(x, ((0, 0), (0, 0), (top, bottom), (left, right)), value)
    return pad_axis(xp, pad_axis(xp, x, 2, top, bottom, value=value), 3, left, right, value=value)


def tap_index(i: int, j: int, s: tuple, d: tuple, out: tuple) -> tuple:
    """The index of kernel offset (i, j)'s inputs in a padded NCHW array: one strided (N, C, OH, OW) view."""
    return (slice(None), slice(None), slice(i * d[0], i * d[0] + (out[0] - 1) * s[0] + 1, s[0]),
            slice(j * d[1], j * d[1] + (out[1] - 1) * s[1] + 1, s[1]))


def window_slices(x, k: tuple, s: tuple, d: tuple, out: tuple) -> list:
    """One (N, C, OH, OW) strided view of padded NCHW ``x`` per kernel offset, row-major (any namespace)."""
    return [x[tap_index(i, j, s, d, out)] for i in range(k[0]) for j in range(k[1])]


def scatter_windows(xp, parts, shape: tuple, k: tuple, s: tuple, d: tuple, pad: tuple, out: tuple, like):
    """Adjoint of ``window_slices``: add ``parts(i, j)`` (N, C, OH, OW) into a padded buffer, then crop the padding.

    ``shape`` is the unpadded (N, C, H, W); the buffer (``like``'s dtype) also covers windows that run past the padding.
    """
    n, c, h, w = shape
    hp = max(h + pad[0] + pad[2], (out[0] - 1) * s[0] + eff(k[0], d[0]))
    wp = max(w + pad[1] + pad[3], (out[1] - 1) * s[1] + eff(k[1], d[1]))
    buf = full(xp, (n, c, hp, wp), 0, like)
    for i in range(k[0]):
        for j in range(k[1]):
            part = parts(i, j)
            if part is not None:
                buf = add_into(buf, tap_index(i, j, s, d, out), part)
    return buf[:, :, pad[0] : pad[0] + h, pad[1] : pad[1] + w]


def torch_padding(x, pad: tuple, value=0.0):
    """``(x, (pad_h, pad_w))`` for ATen, which pads both sides equally: x pre-padded when ``pad`` is not symmetric."""
    pre, pad = _padder(pad, value)
    return (x if pre is None else pre(x)), pad


def _padder(pad: tuple, value=0.0) -> tuple:
    """``(pre, (pad_h, pad_w))``: ``torch_padding`` decided once for the padding ``pad``, ``pre`` None where ATen
    pads alone (symmetric padding), else ``fn(x)`` padding ``x`` before."""
    top, left, bottom, right = pad
    if top == bottom and left == right:
        return None, (top, left)
    import torch.nn.functional as F

    return (lambda x: F.pad(x, (left, right, top, bottom), value=value)), (0, 0)


def channels_last(x):
    """A 4-D tensor in channels-last (NHWC) memory order, its NCHW shape kept (a no-op when it is already)."""
    import torch

    return x.contiguous(memory_format=torch.channels_last) if x.ndim == 4 else x


def conv_layout(x, weight_numel: int, groups: int = 1, out_numel: int = 0):
    """The memory order a convolution of data ``x`` runs fastest in, as a function to apply to its tensors:
    ``channels_last`` where the activations outweigh the weight (``4 * weight <= data``; a CNN's early layers:
    oneDNN is 2-7x faster on them, e.g. a 3-channel stem 2.0 -> 0.3 ms, and batch norm and pooling after them
    keep the order and run 2-7x faster too) and for every depthwise convolution (``groups`` = channels: its
    weight has no layout to convert, and NCHW is 1.3-3x slower, its weight gradient 1.5-4x, a 7x7 one on a 2x2
    plane 60x: 2.1 against 0.035 ms, ConvNeXt's last stage), else ``nchw``: with an NCHW weight ATen would
    convert the whole weight on every call (deep layers). Data arriving channels-last stays so while it outweighs
    the weight at all: converting it would cost more than converting the weight, and the layer after would convert
    back (DenseNet's 3x3 convolutions after channels-last 1x1 ones, in the forward and again in the backward); so
    does data with its channels innermost, not contiguous (a channel slice of a channels-last concatenation's
    gradient: DenseNet's backward, whose NCHW result met a channels-last activation). The data's size is the
    larger of the input's and the result's (``out_numel``), so a layer's data gradient runs in its forward's
    layout: a 3x3 convolution from 128 channels to 32 weighs its 128-channel side, both ways."""
    return _layout_of(tuple(x.shape), weight_numel, groups, out_numel)(x)


def _layout_rule(shape: tuple, weight_numel: int, groups: int, out_numel: int):
    """``conv_layout``'s choice where the shapes alone decide it, else None: the data's layout does (channels-last
    where it arrives with its channels innermost, ``stride(1) == 1``)."""
    if len(shape) != 4:
        return nchw
    if groups > 1 and groups == shape[1]:
        return channels_last
    data = max(math.prod(shape), out_numel)
    if 4 * weight_numel <= data:
        return channels_last
    if weight_numel > data or shape[2] * shape[3] <= 1 or shape[1] <= 1:
        return nchw
    return None


def _layout_of(shape: tuple, weight_numel: int, groups: int, out_numel: int):
    """``conv_layout`` decided once for data of ``shape``: ``fn(x)``, the layout (``channels_last`` or ``nchw``)
    for the data ``x`` and the tensors convolved with it."""
    rule = _layout_rule(tuple(shape), weight_numel, groups, out_numel)
    if rule is not None:
        return lambda x: rule
    return lambda x: channels_last if x.stride(1) == 1 else nchw


def nchw(x):
    """``x`` with NCHW strides: ``contiguous()`` keeps a channels-last layout where H = W = 1 (such a tensor is
    both), and ATen would then run a deep layer's convolution channels-last, converting its weight each call."""
    if x.ndim != 4:
        return x
    n, c, h, w = x.shape
    if x.stride() == (c * h * w, h * w, w, 1):
        return x
    import torch

    return x.clone(memory_format=torch.contiguous_format)


# ------------------------------------------------------------------ attrs


@dataclass(frozen=True)
class Conv2DAttrs:
    strides: tuple = (1, 1)
    padding: tuple = (0, 0)
    dilation: tuple = (1, 1)
    groups: int = 1
    channels: Optional[int] = None
    kernel_size: Optional[tuple] = None
    data_layout: str = "NCHW"
    kernel_layout: str = "OIHW"

    def __post_init__(self):
        _common(self, "OIHW")


@dataclass(frozen=True)
class Conv2DTransposeAttrs:
    strides: tuple = (1, 1)
    padding: tuple = (0, 0)
    dilation: tuple = (1, 1)
    groups: int = 1
    output_padding: tuple = (0, 0)
    channels: Optional[int] = None
    kernel_size: Optional[tuple] = None
    data_layout: str = "NCHW"
    kernel_layout: str = "IOHW"

    def __post_init__(self):
        _common(self, "IOHW")
        pair(self, "output_padding", 0)
        if any(p >= s for p, s in zip(self.output_padding, self.strides)):
            raise AttrError(f"attribute output_padding {self.output_padding} must be smaller than strides {self.strides}")


@dataclass(frozen=True)
class Conv2DBackwardWeightAttrs:
    kernel_size: tuple = None
    strides: tuple = (1, 1)
    padding: tuple = (0, 0)
    dilation: tuple = (1, 1)
    groups: int = 1
    channels: Optional[int] = None
    grad_layout: str = "NCHW"
    data_layout: str = "NCHW"
    kernel_layout: str = "OIHW"

    def __post_init__(self):
        if self.kernel_size is None:
            raise AttrError("attribute kernel_size is required")
        _common(self, "OIHW")
        layout(self, "grad_layout", "NCHW")


def _common(a, kernel_layout: str) -> None:
    pair(a, "strides", 1)
    padding4(a)
    pair(a, "dilation", 1)
    check_int(a, "groups", 1)
    check_int(a, "channels", 1, allow_none=True)
    optional_pair(a, "kernel_size")
    layout(a, "data_layout", "NCHW")
    layout(a, "kernel_layout", kernel_layout)


def _static(op: str, arg_types, what: str, dims) -> None:
    if any(d is Any for d in dims):
        raise type_error(op, arg_types, f"{what} must be static, got {tuple(dims)}")


def _check_kernel(op: str, arg_types, attrs, kshape: tuple) -> None:
    if attrs.kernel_size is not None and tuple(kshape) != attrs.kernel_size:
        raise type_error(op, arg_types, f"kernel_size {attrs.kernel_size} does not match the weight's spatial shape {kshape}")


def _mismatch(a, b) -> bool:
    return a is not Any and b is not Any and a != b


# ------------------------------------------------------------------ conv2d


def _conv_out_hw(attrs, hw, k):
    return _out_hw(hw, k, attrs.strides, attrs.dilation, attrs.padding)


def _out_hw(hw, k, s, d, p) -> tuple:
    return tuple(conv_out(hw[i], k[i], s[i], d[i], p[i], p[i + 2]) for i in range(2))


def _check_out_hw(op, arg_types, out_hw, hw, k):
    if any(o is not Any and o < 1 for o in out_hw):
        raise type_error(op, arg_types, f"the (dilated) kernel {k} does not fit the padded input {hw}")


def _rank4(op: str, arg_types, what: str):
    """The two same-dtype rank-4 tensor arguments of a convolution."""
    a, b = tensor_arg(op, arg_types, 0), tensor_arg(op, arg_types, 1)
    same_dtype(op, arg_types)
    if a.ndim != 4 or b.ndim != 4:
        raise type_error(op, arg_types, f"expects {what} (rank 4)")
    return a, b


def _data_weight(op: str, arg_types, attrs, layout: str, dim0: str):
    """Data and a static ``layout`` weight whose dim 0 (the ``dim0`` channels) splits into ``attrs.groups``."""
    x, w = _rank4(op, arg_types, f"NCHW data and an {layout} weight")
    _static(op, arg_types, "the weight shape", w.shape)
    if w.shape[0] % attrs.groups:
        raise type_error(op, arg_types, f"{dim0} channels {w.shape[0]} are not divisible by groups={attrs.groups}")
    return x, w


def _conv2d_infer(arg_types, attrs, op: str = "nn.conv2d"):
    x, w = _data_weight(op, arg_types, attrs, "OIHW", "output")
    o, cg, kh, kw = w.shape
    g = attrs.groups
    if _mismatch(x.shape[1], cg * g):
        raise type_error(op, arg_types, f"data has {x.shape[1]} channels but the weight expects {cg} x groups={g} = {cg * g}")
    if attrs.channels is not None and attrs.channels != o:
        raise type_error(op, arg_types, f"channels={attrs.channels} but the weight has {o} output channels")
    _check_kernel(op, arg_types, attrs, (kh, kw))
    out_hw = _conv_out_hw(attrs, x.shape[2:], (kh, kw))
    _check_out_hw(op, arg_types, out_hw, x.shape[2:], (kh, kw))
    return TensorType((x.shape[0], o) + out_hw, x.dtype)


def conv2d_nchw(x, w, strides: tuple, padding: tuple, dilation: tuple, groups: int) -> np.ndarray:
    """NCHW x OIHW convolution; padding is (top, left, bottom, right); returns a new C-contiguous array."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    g = groups
    out_hw = _out_hw((h, wd), (kh, kw), strides, dilation, padding)
    win = windows(pad_spatial(np, x, padding), (kh, kw), strides, dilation, out_hw)
    if g == 1:  # im2col: one (C*KH*KW, N*OH*OW) copy, one BLAS matmul
        out = (w.reshape(o, -1) @ im2col_t(win)).reshape(o, n, *out_hw).transpose(1, 0, 2, 3)
    else:
        wg = win.reshape((n, g, cg) + win.shape[2:])
        out = np.einsum("ngchwij,gocij->ngohw", wg, w.reshape(g, o // g, cg, kh, kw), optimize=True)
        out = out.reshape((n, o) + out_hw)
    return np.ascontiguousarray(out, dtype=x.dtype)


def _conv2d_numpy(x, w, attrs):
    return conv2d_nchw(x, w, attrs.strides, attrs.padding, attrs.dilation, attrs.groups)


def _columns(xp, x, k: tuple, a, out: tuple):
    """The windows of padded x as (N, groups, C/groups * KH * KW, OH * OW) columns (any namespace)."""
    n, c = x.shape[:2]
    taps = window_slices(pad_spatial(xp, x, a.padding), k, a.strides, a.dilation, out)
    return xp.reshape(xp.stack(taps, axis=2), (n, a.groups, c // a.groups * k[0] * k[1], out[0] * out[1]))


def _conv2d_kernel(xp, x, w, attrs):
    """im2col from strided slices, one matmul per group."""
    o, cg, kh, kw = w.shape
    g = attrs.groups
    out = _conv_out_hw(attrs, x.shape[2:], (kh, kw))
    y = xp.matmul(xp.reshape(w, (g, o // g, cg * kh * kw)), _columns(xp, x, (kh, kw), attrs, out))
    return xp.reshape(y, (x.shape[0], o) + out)


def _conv2d_jax(x, w, attrs):
    from jax import lax

    top, left, bottom, right = attrs.padding
    return lax.conv_general_dilated(x, w, window_strides=attrs.strides, padding=[(top, bottom), (left, right)],
                                    rhs_dilation=attrs.dilation, dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                    feature_group_count=attrs.groups)


def single_tap(hw_in: tuple, hw_out: tuple, k: tuple, attrs) -> Optional[tuple]:
    """``(i, j)``: the one kernel tap a 1x1 map meets when the result is 1x1 too (padding ``(i * d, j * d)``
    before it), else None. Such a convolution is one GEMM with that tap: the last stage of a ResNet on 32x32
    images (3x3 convolutions of padding 1 on 1x1 maps), where oneDNN takes 4-6 ms for a 0.1 ms GEMM."""
    if tuple(hw_in) != (1, 1) or tuple(hw_out) != (1, 1) or attrs.groups != 1:
        return None
    taps = []
    for i in range(2):
        before, d = attrs.padding[i], attrs.dilation[i]
        if before % d or before // d >= k[i]:
            return None
        taps.append(before // d)
    return tuple(taps)


def tap_window(hw_data: tuple, hw_out: tuple, k: tuple, attrs) -> Optional[tuple]:
    """``((i, j), (kh, kw), attrs')`` where a convolution's outputs meet the data through a window of its kernel
    taps alone (the others read only padding: ConvNeXt's 7x7 depthwise convolutions of padding 3 on a 2x2 map
    use their centre 3x3), else None: the convolution equals the one with the kernel cropped to that window at
    ``(i, j)`` and ``attrs'`` (the padding less the taps dropped, ``kernel_size`` the window's), its transposed
    convolution likewise, and its weight gradient is zero off the window. ``hw_data``: the convolution's data
    plane; ``hw_out``: its result's (for a transposed convolution: the reverse). Unit dilation only."""
    if tuple(attrs.dilation) != (1, 1):
        return None
    start, size, pad = [], [], list(attrs.padding)
    for i in range(2):
        before, after = pad[i], pad[i + 2]
        lo = max(0, before - (hw_out[i] - 1) * attrs.strides[i])  # taps below read padding for every output
        hi = min(k[i] - 1, hw_data[i] - 1 + before)  # taps above likewise
        if hi < lo or after < k[i] - 1 - hi:
            return None
        start.append(lo)
        size.append(hi - lo + 1)
        pad[i], pad[i + 2] = before - lo, after - (k[i] - 1 - hi)
    if tuple(size) == tuple(k):
        return None
    kernel = None if attrs.kernel_size is None else tuple(size)
    return tuple(start), tuple(size), replace(attrs, padding=tuple(pad), kernel_size=kernel)


def _cropped(w, at: tuple, size: tuple):
    return w[:, :, at[0]: at[0] + size[0], at[1]: at[1] + size[1]]


# ATen's convolutions (oneDNN) are slow where the output plane is tiny: a ResNet's last stages on 32x32 images.
# There a convolution producing at most SMALL_PLANE positions is im2col (ATen's ``unfold``) and one GEMM.
# Measured (batch 16, 2 threads, ms, ATen -> unfold + GEMM): weight gradient of a 3x3/2 convolution 256 -> 512
# channels from 2x2 to 1x1 10.2 -> 0.6, of a 3x3 256 -> 256 at 2x2 1.7 -> 0.9, of a 3x3/2 128 -> 256 from 4x4 to
# 2x2 0.8 -> 0.5; at 4x4 outputs ATen wins (0.8 vs 1.0). The forward gains only on a 1x1 output (1.0 -> 0.6).
SMALL_PLANE = 4


def _torch_columns(x, k: tuple, attrs):
    """The windows of NCHW tensor ``x`` as ATen's im2col columns ``(N, C * KH * KW, OH * OW)``."""
    import torch.nn.functional as F

    x, pad = torch_padding(x, attrs.padding)
    return F.unfold(x, k, attrs.dilation, pad, attrs.strides)


def _conv2d_torch(x, w, attrs, b=None):
    """ATen's convolution (oneDNN), in the layout ``conv_layout`` picks, with the bias ``b`` (None: none) added
    by the convolution itself; a convolution meeting one tap, or of a 1x1 output, as one GEMM."""
    return _conv2d_prepared(tuple(x.shape), tuple(w.shape), attrs)(x, w, b)


def _conv2d_prepared(x_shape: tuple, w_shape: tuple, attrs):
    """``_conv2d_torch`` for data and weight of these shapes, as ``fn(x, w, b)``: what the shapes decide (the
    GEMM paths, the layout rule, the padding) decided once (10-20 us of Python a call otherwise)."""
    import torch.nn.functional as F

    out = _conv_out_hw(attrs, x_shape[2:], w_shape[2:])
    tap = single_tap(x_shape[2:], out, w_shape[2:], attrs)
    o = w_shape[0]
    window = None if tap is not None else tap_window(x_shape[2:], out, w_shape[2:], attrs)
    if window is not None:
        at, size, cropped = window
        run = _conv2d_prepared(x_shape, tuple(w_shape[:2]) + size, cropped)
        return lambda x, w, b: run(x, _cropped(w, at, size), b)
    if tap is not None:
        i, j = tap

        def rows_of(x, w):
            return rows_times_t(x.reshape(x.shape[:2]), w[:, :, i, j])
    elif tuple(out) == (1, 1) and attrs.groups == 1:
        k = tuple(w_shape[2:])

        def rows_of(x, w):
            cols = _torch_columns(x, k, attrs)
            return rows_times_t(cols.reshape(cols.shape[:2]), w.reshape(o, -1))
    else:
        order = _layout_of(x_shape, math.prod(w_shape), attrs.groups, x_shape[0] * o * out[0] * out[1])
        pre, pad = _padder(attrs.padding)
        strides, dilation, groups, conv = attrs.strides, attrs.dilation, attrs.groups, F.conv2d
        if pre is None:
            return lambda x, w, b: conv(order(x)(x), w, b, strides, pad, dilation, groups)
        return lambda x, w, b: conv(pre(order(x)(x)), w, b, strides, pad, dilation, groups)

    def gemm(x, w, b):
        rows = rows_of(x, w)
        if b is not None:
            rows += b
        return rows.reshape(x.shape[0], o, 1, 1)

    return gemm


def conv2d_torch_maker(call: Call):
    """The torch target's kernel of a ``nn.conv2d`` / ``nn.conv2d_bias`` call of static shapes (``_conv2d_prepared``),
    or None."""
    shapes = _static_shapes(call)
    if shapes is None:
        return None
    run = _conv2d_prepared(shapes[0], shapes[1], call.attrs)
    if len(call.args) == 3:
        return lambda x, w, b, attrs=None: run(x, w, b)
    return lambda x, w, attrs=None: run(x, w, None)


def _static_shapes(call: Call) -> Optional[list]:
    """The static shapes of ``call``'s two rank-4 operands, or None."""
    shapes = []
    for a in call.args[:2]:
        t = a.checked_type
        if not isinstance(t, TensorType) or t.ndim != 4 or not all(isinstance(d, int) for d in t.shape):
            return None
        shapes.append(tuple(t.shape))
    return shapes


def _spatial_grad_pad(call: Call, x_type: TensorType, kshape: tuple) -> tuple:
    """output_padding for the conv2d_transpose that maps the conv output back onto ``x_type``'s H, W."""
    a = call.attrs
    out = []
    for i in range(2):
        n = x_type.shape[2 + i]
        s, d = a.strides[i], a.dilation[i]
        if n is Any:
            if s == 1:
                out.append(0)
                continue
            raise PullbackError(f"{call.op.name}: the gradient of a strided convolution needs static spatial dims, got {x_type.shape}")
        out.append((n + a.padding[i] + a.padding[i + 2] - eff(kshape[i], d)) % s)
    return tuple(out)


def _conv_kw(a) -> dict:
    return dict(strides=a.strides, padding=a.padding, dilation=a.dilation, groups=a.groups)


def _conv2d_grad(call: Call, g: Expr):
    x, w = call.args[:2]
    kshape = w.checked_type.shape[2:]
    kw = _conv_kw(call.attrs)
    gx = conv2d_transpose(g, w, output_padding=_spatial_grad_pad(call, x.checked_type, kshape), **kw)
    gw = conv2d_backward_weight(g, x, kernel_size=kshape, **kw)
    return [gx, gw]


def _conv2d_flops(arg_types, out_type, attrs):
    o, cg, kh, kw = arg_types[1].shape
    return 2 * numel(out_type.shape) * cg * kh * kw


conv2d = defop("nn.conv2d", 2, _conv2d_infer, kernel=_conv2d_kernel,
               impls={"numpy": _conv2d_numpy, "jax": _conv2d_jax, "torch": _conv2d_torch}, attrs_type=Conv2DAttrs, grad=_conv2d_grad,
               pattern=FusionKind.OUT_ELEMWISE_FUSABLE, flops=_conv2d_flops, torch_name="conv2d")

# ------------------------------------------------------------------ conv2d_bias: conv2d plus a bias per output channel


def _conv2d_bias_infer(arg_types, attrs):
    op = "nn.conv2d_bias"
    out = _conv2d_infer(arg_types[:2], attrs, op)
    b = tensor_arg(op, arg_types, 2)
    o = out.shape[1]
    if b.dtype != out.dtype or b.ndim != 1 or _mismatch(b.shape[0], o):
        raise type_error(op, arg_types, f"the bias must be a {out.dtype} vector of the {o} output channels")
    return out


def _conv2d_bias_numpy(x, w, b, attrs):
    y = _conv2d_numpy(x, w, attrs)  # new memory: the bias goes in in place
    y += b[:, None, None]
    return y


def _conv2d_bias_grad(call: Call, g: Expr):
    return [*_conv2d_grad(call, g), R.sum(g, axis=(0, 2, 3))]


conv2d_bias = defop(
    "nn.conv2d_bias", 3, _conv2d_bias_infer,
    kernel=lambda xp, x, w, b, attrs: _conv2d_kernel(xp, x, w, attrs) + b[:, None, None],
    impls={"numpy": _conv2d_bias_numpy, "jax": lambda x, w, b, attrs: _conv2d_jax(x, w, attrs) + b[:, None, None],
           "torch": lambda x, w, b, attrs: _conv2d_torch(x, w, attrs, b)},
    attrs_type=Conv2DAttrs, grad=_conv2d_bias_grad, pattern=FusionKind.OUT_ELEMWISE_FUSABLE,
    flops=lambda ts, out, attrs: _conv2d_flops(ts, out, attrs) + numel(out.shape), torch_name="conv2d",
    doc="``nn.conv2d`` plus a bias per output channel: ``(data, weight, bias (O,)) -> conv2d(data, weight) + bias`` "
        "(ATen's convolution with its bias; what a plan runs for a convolution whose one use adds its bias).")

# ------------------------------------------------------------------ conv2d_transpose


def _convT_out_hw(attrs, hw, k):
    a, p = attrs, attrs.padding
    return tuple(convT_out(hw[i], k[i], a.strides[i], a.dilation[i], p[i], p[i + 2], a.output_padding[i]) for i in range(2))


def _conv2d_transpose_infer(arg_types, attrs):
    op = "nn.conv2d_transpose"
    x, w = _data_weight(op, arg_types, attrs, "IOHW", "input")
    ci, og, kh, kw = w.shape
    g = attrs.groups
    if _mismatch(x.shape[1], ci):
        raise type_error(op, arg_types, f"data has {x.shape[1]} channels but the weight expects {ci}")
    if attrs.channels is not None and attrs.channels != og * g:
        raise type_error(op, arg_types, f"channels={attrs.channels} but the weight gives {og * g} output channels")
    _check_kernel(op, arg_types, attrs, (kh, kw))
    out_hw = _convT_out_hw(attrs, x.shape[2:], (kh, kw))
    if any(o is not Any and o < 1 for o in out_hw):
        raise type_error(op, arg_types, f"padding {attrs.padding} leaves an empty output {out_hw}")
    return TensorType((x.shape[0], og * g) + out_hw, x.dtype)


def _conv2d_transpose_kernel(xp, x, w, attrs):
    """One matmul per group giving every tap's contribution, scattered into place (``scatter_windows``)."""
    n, ci, h, wd = x.shape
    _, og, kh, kw = w.shape
    g = attrs.groups
    wt = xp.matrix_transpose(xp.reshape(w, (g, ci // g, og * kh * kw)))
    cols = xp.reshape(xp.matmul(wt, xp.reshape(x, (n, g, ci // g, h * wd))), (n, g * og, kh, kw, h, wd))
    out_shape = (n, g * og) + _convT_out_hw(attrs, (h, wd), (kh, kw))
    return scatter_windows(xp, lambda i, j: cols[:, :, i, j], out_shape, (kh, kw), attrs.strides, attrs.dilation,
                           attrs.padding, (h, wd), x)


def _conv2d_transpose_numpy(x, w, attrs):
    """One matmul per output tap, scattered into place (``scatter_windows``); with stride 1 and fewer input
    than output channels (or as many, on planes of 16 positions or more: ResNet's 3x3 convolutions at 8x8 and
    4x4, 15-20% faster), a conv2d of the padded input with the flipped kernel (less data to copy)."""
    n, ci, h, wd = x.shape
    _, og, kh, kw = w.shape
    g = attrs.groups
    if attrs.strides == (1, 1) and (g > 1 or ci < og or (ci == og and h * wd >= 16)):
        return _conv2d_transpose_as_conv(x, w, attrs)
    out_hw = _convT_out_hw(attrs, (h, wd), (kh, kw))
    if g == 1:  # (O*KH*KW, Ci) @ (Ci, N*H*W): channel-major taps, each a contiguous (O, N, H, W) block
        cols = (w.reshape(ci, -1).T @ x.transpose(1, 0, 2, 3).reshape(ci, -1)).reshape(og, kh, kw, n, h, wd)
        out = scatter_windows(np, lambda i, j: cols[:, i, j], (og, n) + out_hw, (kh, kw), attrs.strides, attrs.dilation,
                              attrs.padding, (h, wd), x)
        return np.ascontiguousarray(out.transpose(1, 0, 2, 3))
    cols = np.einsum("ngchw,gcoij->ngoijhw", x.reshape(n, g, ci // g, h, wd), w.reshape(g, ci // g, og, kh, kw), optimize=True)
    cols = cols.reshape((n, g * og, kh, kw, h, wd))
    out = scatter_windows(np, lambda i, j: cols[:, :, i, j], (n, g * og) + out_hw, (kh, kw), attrs.strides, attrs.dilation,
                          attrs.padding, (h, wd), x)
    return np.ascontiguousarray(out)


def _conv2d_transpose_as_conv(x, w, attrs):
    """Stride 1: a conv2d of x padded by (dilated kernel extent - 1 - padding) with the flipped, IO-swapped kernel.

    A negative pad (padding wider than the kernel) crops x instead; the im2col path of conv2d does the work."""
    ci, og, kh, kw = w.shape
    g = attrs.groups
    p, d = attrs.padding, attrs.dilation
    ext = (eff(kh, d[0]) - 1, eff(kw, d[1]) - 1)
    pads = (ext[0] - p[0], ext[1] - p[1], ext[0] - p[2] + attrs.output_padding[0], ext[1] - p[3] + attrs.output_padding[1])
    if min(pads) < 0:
        h, wd = x.shape[2:]
        x = x[:, :, max(-pads[0], 0): h - max(-pads[2], 0), max(-pads[1], 0): wd - max(-pads[3], 0)]
        pads = tuple(max(v, 0) for v in pads)
    wf = w.reshape(g, ci // g, og, kh, kw).transpose(0, 2, 1, 3, 4).reshape(g * og, ci // g, kh, kw)[:, :, ::-1, ::-1]
    return conv2d_nchw(x, wf, (1, 1), pads, d, g)


def _jax_adjoint(f, shape: tuple, ct):
    """The adjoint of the linear ``f`` at ``ct`` (``jax.vjp``; the forward at zeros is dead code XLA removes)."""
    import jax
    import jax.numpy as jnp

    return jax.vjp(f, jnp.zeros(shape, ct.dtype))[1](ct)[0]


def _conv2d_transpose_jax(x, w, attrs):
    """The adjoint of XLA's convolution w.r.t. its data."""
    out_shape = (x.shape[0], w.shape[1] * attrs.groups) + _convT_out_hw(attrs, x.shape[2:], w.shape[2:])
    return _jax_adjoint(lambda z: _conv2d_jax(z, w, attrs), out_shape, x)


def _conv2d_transpose_torch(x, w, attrs):
    """ATen's transposed convolution; asymmetric padding crops its unpadded result."""
    return _conv2d_transpose_prepared(tuple(x.shape), tuple(w.shape), attrs)(x, w)


def _conv2d_transpose_prepared(x_shape: tuple, w_shape: tuple, attrs):
    """``_conv2d_transpose_torch`` for operands of these shapes, as ``fn(x, w)``, its path decided once."""
    import torch.nn.functional as F

    top, left, bottom, right = attrs.padding
    out = _convT_out_hw(attrs, x_shape[2:], w_shape[2:])
    tap = single_tap(x_shape[2:], out, w_shape[2:], attrs)
    window = None if tap is not None or any(attrs.output_padding) else tap_window(out, x_shape[2:], w_shape[2:], attrs)
    if window is not None:
        at, size, cropped = window
        run = _conv2d_transpose_prepared(x_shape, tuple(w_shape[:2]) + size, cropped)
        return lambda x, w: run(x, _cropped(w, at, size))
    if tap is not None:
        i, j = tap
        return lambda x, w: rows_times_t(x.reshape(x.shape[:2]), w[:, :, i, j].T).reshape(x.shape[0], w.shape[1], 1, 1)
    if (tuple(w_shape[2:]) == (1, 1) and tuple(attrs.strides) == (1, 1) and not any(attrs.padding)
            and attrs.groups == 1 and not any(attrs.output_padding)):
        # a pointwise convolution's data gradient is one GEMM over the positions (ATen runs such a transposed
        # convolution as slow_conv_transpose2d: ConvNeXt's 1x1 MLP on a 2x2 plane, 0.18 ms a call)
        def pointwise(x, w):
            n, c, h, wd = x.shape
            rows = x.permute(0, 2, 3, 1).reshape(n * h * wd, c)
            return rows_times_t(rows, w[:, :, 0, 0].T).reshape(n, h, wd, w.shape[1]).permute(0, 3, 1, 2)

        return pointwise
    g = attrs.groups
    order = _layout_of(x_shape, math.prod(w_shape), g, x_shape[0] * w_shape[1] * g * out[0] * out[1])
    strides, output_padding, dilation, conv = attrs.strides, attrs.output_padding, attrs.dilation, F.conv_transpose2d
    if top == bottom and left == right:
        return lambda x, w: conv(order(x)(x), w, None, strides, (top, left), output_padding, g, dilation)

    def cropped(x, w):
        y = conv(order(x)(x), w, None, strides, 0, output_padding, g, dilation)
        return y[:, :, top: y.shape[2] - bottom, left: y.shape[3] - right]

    return cropped


def _conv2d_transpose_grad(call: Call, g: Expr):
    x, w = call.args
    kw = _conv_kw(call.attrs)
    return [conv2d(g, w, **kw), conv2d_backward_weight(x, g, kernel_size=w.checked_type.shape[2:], **kw)]


def _conv2d_transpose_flops(arg_types, out_type, attrs):
    ci, og, kh, kw = arg_types[1].shape
    return 2 * numel(arg_types[0].shape) * og * kh * kw


conv2d_transpose = defop("nn.conv2d_transpose", 2, _conv2d_transpose_infer, kernel=_conv2d_transpose_kernel,
                         impls={"numpy": _conv2d_transpose_numpy, "jax": _conv2d_transpose_jax, "torch": _conv2d_transpose_torch},
                         attrs_type=Conv2DTransposeAttrs, grad=_conv2d_transpose_grad,
                         pattern=FusionKind.OUT_ELEMWISE_FUSABLE, flops=_conv2d_transpose_flops,
                         torch_name="conv_transpose2d")

# ------------------------------------------------------------------ conv2d_backward_weight


def _backward_weight_infer(arg_types, attrs):
    op = "nn.conv2d_backward_weight"
    gy, x = _rank4(op, arg_types, "an NCHW output gradient and NCHW data")
    _static(op, arg_types, "the channel dims", (gy.shape[1], x.shape[1]))
    o, c, g = gy.shape[1], x.shape[1], attrs.groups
    if o % g or c % g:
        raise type_error(op, arg_types, f"channels ({o} out, {c} in) are not divisible by groups={g}")
    if _mismatch(gy.shape[0], x.shape[0]):
        raise type_error(op, arg_types, f"batch sizes differ: {gy.shape[0]} vs {x.shape[0]}")
    out_hw = _conv_out_hw(attrs, x.shape[2:], attrs.kernel_size)
    _check_out_hw(op, arg_types, out_hw, x.shape[2:], attrs.kernel_size)
    if any(_mismatch(a, b) for a, b in zip(out_hw, gy.shape[2:])):
        raise type_error(op, arg_types, f"the gradient's spatial shape {gy.shape[2:]} is not the conv2d output {out_hw}")
    return TensorType((o, c // g) + attrs.kernel_size, x.dtype)


def _backward_weight_kernel(xp, gy, x, attrs):
    """The columns of x (as conv2d's kernel) times the output gradient, one matmul per group."""
    n, o, oh, ow = gy.shape
    g = attrs.groups
    kh, kw = attrs.kernel_size
    cols = _columns(xp, x, (kh, kw), attrs, (oh, ow))  # (N, g, C/g*KH*KW, OH*OW)
    cols = xp.reshape(xp.permute_dims(cols, (1, 0, 3, 2)), (g, n * oh * ow, cols.shape[2]))
    gy = xp.reshape(xp.permute_dims(xp.reshape(gy, (n, g, o // g, oh * ow)), (1, 2, 0, 3)), (g, o // g, n * oh * ow))
    return xp.reshape(xp.matmul(gy, cols), (o, x.shape[1] // g, kh, kw))


def _backward_weight_jax(gy, x, attrs):
    """The adjoint of XLA's convolution w.r.t. the weight."""
    w_shape = (gy.shape[1], x.shape[1] // attrs.groups) + tuple(attrs.kernel_size)
    return _jax_adjoint(lambda w: _conv2d_jax(x, w, attrs), w_shape, gy)


def _onednn_strided_1x1(x_shape: tuple, attrs) -> bool:
    """The weight gradient oneDNN gets wrong: a strided 1x1 convolution of 2 to 7 channels (the layout
    ``conv_layout`` picks for them is channels-last). Measured with torch 2.13's CPU build on an AVX2 machine:
    some calls return a gradient 20-40% off, and with one thread the heap is corrupted (``double free``);
    NCHW, other kernel sizes, one or 8+ channels are right. Such a layer (a narrow ResNet's downsampling)
    is small: one GEMM instead."""
    return tuple(attrs.kernel_size) == (1, 1) and tuple(attrs.strides) != (1, 1) and 1 < x_shape[1] < 8


def _backward_weight_torch(gy, x, attrs):
    """ATen's ``convolution_backward`` for the weight alone."""
    return _backward_weight_prepared(tuple(gy.shape), tuple(x.shape), attrs)(gy, x)


def _backward_weight_prepared(gy_shape: tuple, x_shape: tuple, attrs):
    """``_backward_weight_torch`` for operands of these shapes, as ``fn(gy, x)``, its path decided once (and
    ``convolution_backward`` called as ``torch.nn.grad.conv2d_weight`` does, without its 20 us of Python)."""
    import torch

    w_shape = (gy_shape[1], x_shape[1] // attrs.groups) + tuple(attrs.kernel_size)
    tap = single_tap(x_shape[2:], gy_shape[2:], attrs.kernel_size, attrs)
    window = None if tap is not None else tap_window(x_shape[2:], gy_shape[2:], attrs.kernel_size, attrs)
    if window is not None:
        at, size, cropped = window
        run = _backward_weight_prepared(gy_shape, x_shape, cropped)

        def on_window(gy, x):
            gw = gy.new_zeros(w_shape)
            _cropped(gw, at, size).copy_(run(gy, x))
            return gw

        return on_window
    if tap is not None:
        i, j = tap

        def one_tap(gy, x):
            gw = gy.new_zeros(w_shape)
            gw[:, :, i, j] = rows_times_t(gy.reshape(gy.shape[:2]).T, x.reshape(x.shape[:2]).T)
            return gw

        return one_tap
    n, o, oh, ow = gy_shape
    if attrs.groups == 1 and (oh * ow <= SMALL_PLANE or _onednn_strided_1x1(x_shape, attrs)):
        k = tuple(attrs.kernel_size)

        def columns(gy, x):
            cols = _torch_columns(x, k, attrs)  # (N, C*KH*KW, L) -> (N*L, C*KH*KW)
            gy = gy.reshape(n, o, oh * ow).permute(1, 0, 2).reshape(o, n * oh * ow)
            return rows_times_t(gy, cols.permute(0, 2, 1).reshape(n * oh * ow, cols.shape[1]).T).reshape(w_shape)

        return columns
    order = _layout_of(x_shape, math.prod(w_shape), attrs.groups, math.prod(gy_shape))
    pre, pad = _padder(attrs.padding)
    backward = torch.ops.aten.convolution_backward.default
    args = (None, list(attrs.strides), list(pad), list(attrs.dilation), False, [0, 0], attrs.groups, [False, True, False])

    def aten(gy, x):
        layout = order(x)  # the data's, for the output gradient too
        x = layout(x)
        if pre is not None:
            x = pre(x)
        gw = backward(layout(gy), x, gy.new_empty(1).expand(w_shape), *args)[1]
        return gw.contiguous()  # the parameter's own layout (autograd would copy it otherwise)

    return aten


def _prepared_maker(prepared):
    """The torch target's kernel maker (``runtime.torch_kernels.MAKERS``) of an op of two rank-4 operands whose
    kernel ``prepared(shape_0, shape_1, attrs)`` returns for static shapes: None where the shapes are not."""

    def make(call: Call):
        shapes = _static_shapes(call)
        if shapes is None:
            return None
        run = prepared(shapes[0], shapes[1], call.attrs)
        return lambda a, b, attrs=None: run(a, b)

    return make


conv2d_transpose_torch_maker = _prepared_maker(_conv2d_transpose_prepared)
conv2d_backward_weight_torch_maker = _prepared_maker(_backward_weight_prepared)


def _backward_weight_numpy(gy, x, attrs):
    n, o, oh, ow = gy.shape
    c, g = x.shape[1], attrs.groups
    kh, kw = attrs.kernel_size
    win = windows(pad_spatial(np, x, attrs.padding), (kh, kw), attrs.strides, attrs.dilation, (oh, ow))
    if g == 1:
        dw = (gy.transpose(1, 0, 2, 3).reshape(o, -1) @ im2col_t(win).T).reshape(o, c, kh, kw)
    else:
        dw = np.einsum("ngohw,ngchwij->gocij", gy.reshape(n, g, o // g, oh, ow), win.reshape((n, g, c // g) + win.shape[2:]), optimize=True)
        dw = dw.reshape(o, c // g, kh, kw)
    return np.ascontiguousarray(dw, dtype=x.dtype)


def _backward_weight_grad(call: Call, gw: Expr):
    gy, x = call.args
    kw = _conv_kw(call.attrs)
    op = _spatial_grad_pad(call, x.checked_type, call.attrs.kernel_size)
    return [conv2d(x, gw, **kw), conv2d_transpose(gy, gw, output_padding=op, **kw)]


def _backward_weight_flops(arg_types, out_type, attrs):
    o, cg, kh, kw = out_type.shape
    return 2 * numel(arg_types[0].shape) * cg * kh * kw


conv2d_backward_weight = defop(
    "nn.conv2d_backward_weight", 2, _backward_weight_infer, kernel=_backward_weight_kernel,
    impls={"numpy": _backward_weight_numpy, "jax": _backward_weight_jax, "torch": _backward_weight_torch},
    attrs_type=Conv2DBackwardWeightAttrs, grad=_backward_weight_grad, pattern=FusionKind.OUT_ELEMWISE_FUSABLE,
    flops=_backward_weight_flops, torch_name="convolution_backward",
    doc="The gradient of ``nn.conv2d`` w.r.t. its weight: ``(grad (N,O,OH,OW), data (N,C,H,W)) -> (O, C/groups, KH, KW)``.")
