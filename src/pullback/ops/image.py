"""Image operators: ``image.resize2d`` (bilinear resizing of NCHW images, PyTorch's ``F.interpolate(mode="bilinear")``)
and its gradient ``image.resize2d_grad``.

Each output pixel interpolates the four input pixels around its source position, PyTorch's way: with
``coordinate_transformation_mode="half_pixel"`` (``align_corners=False``) the source of output index ``i`` is
``(i + 0.5) s - 0.5`` clamped at 0, ``s`` the input over the output size, or ``1 / scale`` where a scale factor is
given (``scales``: PyTorch's ``scale_factor`` reaches the coordinates, not only the output size); with
``"align_corners"`` it is ``i (in - 1) / (out - 1)``. One ATen kernel each way on torch (eager's
``upsample_bilinear2d`` and its backward), where PyTorch's decomposition takes four gathers and three blends forward
and four scatters backward (a U-Net's (16, 8, 32, 32) halved, corners aligned: 1.0 -> 0.3 ms a step on the torch
target).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np

from ..ir.errors import AttrError
from ..ir.types import HALF_DTYPES, TensorType
from .common import float_arg, numel
from .kernels import add_at, dtype_name
from .nn import check_choice, constant, on_device, widen16
from .registry import FusionKind, defop, type_error

MODES = ("half_pixel", "align_corners")


def _pair(value, what: str, positive_int: bool) -> Optional[tuple]:
    if value is None:
        return None
    v = tuple(value) if isinstance(value, (list, tuple)) else (value, value)
    ok = len(v) == 2 and all((isinstance(e, (int, np.integer)) and not isinstance(e, bool) and e >= 1) if positive_int
                             else (isinstance(e, (int, float, np.floating, np.integer)) and not isinstance(e, bool) and e > 0)
                             for e in v)
    if not ok:
        kind = "positive ints" if positive_int else "positive numbers"
        raise AttrError(f"attribute {what} must be two {kind} (height, width), got {value!r}")
    return tuple(int(e) if positive_int else float(e) for e in v)


@dataclass(frozen=True)
class Resize2DAttrs:
    """``size``: the output (height, width); ``scales``: PyTorch's scale factors (height, width) when the resize
    was given them (they set the source coordinates under ``half_pixel``), else None; ``in_size``: the input's
    (height, width), for the gradient only."""

    size: tuple = None
    coordinate_transformation_mode: str = "half_pixel"
    method: str = "linear"
    scales: Optional[tuple] = None
    layout: str = "NCHW"
    in_size: Optional[tuple] = None

    def __post_init__(self):
        object.__setattr__(self, "size", _pair(self.size, "size", True))
        if self.size is None:
            raise AttrError("attribute size (the output height and width) is required")
        object.__setattr__(self, "scales", _pair(self.scales, "scales", False))
        object.__setattr__(self, "in_size", _pair(self.in_size, "in_size", True))
        check_choice(self, "coordinate_transformation_mode", MODES)
        check_choice(self, "method", ("linear",))
        check_choice(self, "layout", ("NCHW",))

    @property
    def align_corners(self) -> bool:
        return self.coordinate_transformation_mode == "align_corners"


def _image(op: str, arg_types) -> TensorType:
    x = float_arg(op, arg_types, 0)
    if x.ndim != 4:
        raise type_error(op, arg_types, f"expects NCHW images (rank 4), got rank {x.ndim}")
    return x


def _resize_infer(arg_types, attrs):
    x = _image("image.resize2d", arg_types)
    if not all(isinstance(d, int) for d in x.shape[2:]):
        raise type_error("image.resize2d", arg_types, "needs static image sizes (height and width)")
    return TensorType(x.shape[:2] + attrs.size, x.dtype)


def _resize_grad_infer(arg_types, attrs):
    g = _image("image.resize2d_grad", arg_types)
    if attrs.in_size is None:
        raise type_error("image.resize2d_grad", arg_types, "needs attribute in_size (the input's height and width)")
    if tuple(g.shape[2:]) != attrs.size:
        raise type_error("image.resize2d_grad", arg_types, f"the output gradient's image must be {attrs.size}")
    return TensorType(g.shape[:2] + attrs.in_size, g.dtype)


@lru_cache(maxsize=256)
def _taps(n_in: int, n_out: int, align_corners: bool, scale: Optional[float], dtype: str) -> tuple:
    """(lower, upper, weight of upper) along one axis: PyTorch's source indices and blend weights, computed in the
    data's precision as its decomposition does (once per size, scale and dtype; the kernels never write into them)."""
    dtype = np.dtype(dtype)
    if align_corners:
        s = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        src = s * np.arange(n_out, dtype=dtype)
    else:
        s = 1.0 / scale if scale else n_in / n_out
        src = s * (np.arange(n_out, dtype=dtype) + dtype.type(0.5)) - dtype.type(0.5)
    src = np.maximum(src, dtype.type(0.0))
    lo = src.astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    return lo, hi, np.clip(src - lo, 0.0, 1.0).astype(dtype)


def _all_taps(xp, x, in_hw, out_hw, a: Resize2DAttrs) -> tuple:
    """The taps of both axes as ``xp`` arrays (weights in x's dtype; the height's as a column); computed in
    float32 for 16-bit data, as ATen does."""
    name = dtype_name(x)
    dtype = "float32" if name in HALF_DTYPES else name
    scales = a.scales or (None, None)
    h = _taps(in_hw[0], out_hw[0], a.align_corners, scales[0], dtype)
    w = _taps(in_hw[1], out_hw[1], a.align_corners, scales[1], dtype)
    index = lambda v: xp.asarray(v, **on_device(xp, x))  # noqa: E731
    return ((index(h[0]), index(h[1]), constant(xp, h[2][:, None], x)),
            (index(w[0]), index(w[1]), constant(xp, w[2], x)))


def _resize_kernel(xp, x, a):
    """Blend along the width, then along the height (PyTorch's decomposition: ``v0 + (v1 - v0) t``)."""
    w16 = widen16(xp, x)
    (h0, h1, th), (w0, w1, tw) = _all_taps(xp, w16, x.shape[2:], a.size, a)
    rows = []
    for hi in (h0, h1):
        r = xp.take(w16, hi, axis=2)
        v0, v1 = xp.take(r, w0, axis=3), xp.take(r, w1, axis=3)
        rows.append(v0 + (v1 - v0) * tw)
    out = rows[0] + (rows[1] - rows[0]) * th
    return xp.astype(out, x.dtype) if out.dtype != x.dtype else out


def _resize_grad_kernel(xp, g, a):
    """The blends' adjoints, each tap's share added at its index: along the width into each row, then the rows."""
    gw = widen16(xp, g)
    n, c = g.shape[:2]
    (h0, h1, th), (w0, w1, tw) = _all_taps(xp, gw, a.in_size, a.size, a)
    out = xp.zeros((n, c) + a.in_size, dtype=gw.dtype)
    full = (slice(None),) * 2
    for hi, gr in ((h0, gw * (1.0 - th)), (h1, gw * th)):
        cols = xp.zeros((n, c, a.size[0], a.in_size[1]), dtype=gw.dtype)
        cols = add_at(cols, full + (slice(None), w0), gr * (1.0 - tw))
        cols = add_at(cols, full + (slice(None), w1), gr * tw)
        out = add_at(out, full + (hi,), cols)
    return xp.astype(out, g.dtype) if out.dtype != g.dtype else out


def _scales(a: Resize2DAttrs) -> tuple:
    return (None, None) if a.scales is None else a.scales


def _resize_torch(x, a):
    """ATen's ``upsample_bilinear2d``: eager's kernel and bits."""
    import torch

    return torch.ops.aten.upsample_bilinear2d.default(x, list(a.size), a.align_corners, *_scales(a))


def _resize_grad_torch(g, a):
    """ATen's ``upsample_bilinear2d_backward``."""
    import torch

    return torch.ops.aten.upsample_bilinear2d_backward.default(g, list(a.size), [*g.shape[:2], *a.in_size],
                                                               a.align_corners, *_scales(a))


def _grad_attrs(a: Resize2DAttrs, in_size: tuple) -> dict:
    return dict(size=a.size, coordinate_transformation_mode=a.coordinate_transformation_mode, scales=a.scales,
                in_size=in_size)


def _resize_grad_rule(call, g):
    a = call.attrs
    return [resize2d_grad(g, **_grad_attrs(a, tuple(call.args[0].checked_type.shape[2:])))]


def _resize_grad_grad(call, h):
    a = call.attrs
    return [resize2d(h, size=a.size, coordinate_transformation_mode=a.coordinate_transformation_mode, scales=a.scales)]


def _blend_flops(ts, out, a):
    return 6 * numel(out.shape)


resize2d = defop(
    "image.resize2d", 1, _resize_infer, kernel=_resize_kernel, impls={"torch": _resize_torch}, attrs_type=Resize2DAttrs,
    grad=_resize_grad_rule, pattern=FusionKind.INJECTIVE, flops=_blend_flops, torch_name="upsample_bilinear2d",
    example_attrs=dict(size=(5, 7)),
    doc="``image.resize2d(data, size, coordinate_transformation_mode='half_pixel', method='linear', scales=None)``: "
        "bilinear resizing of NCHW images to ``size``, PyTorch's ``F.interpolate(mode='bilinear')`` (``align_corners`` "
        "as the mode ``'align_corners'``).")
resize2d_grad = defop(
    "image.resize2d_grad", 1, _resize_grad_infer, kernel=_resize_grad_kernel, impls={"torch": _resize_grad_torch},
    attrs_type=Resize2DAttrs, grad=_resize_grad_grad, pattern=FusionKind.OPAQUE, flops=_blend_flops,
    torch_name="upsample_bilinear2d_backward", example_attrs=dict(size=(5, 7), in_size=(3, 4)),
    doc="Gradient of ``image.resize2d``: ``(out_grad) -> data-shaped`` (``in_size``: the data's height and width).")

__all__ = ["Resize2DAttrs", "resize2d", "resize2d_grad", "MODES"]
