"""Activations and normalised exponentials: leaky_relu, gelu, silu, softplus, mish, softmax, log_softmax; the gradients
of tanh and sigmoid from their results (``tanh_grad``, ``sigmoid_grad``).

One kernel per operator for every array namespace; torch runs gelu, silu,
softmax and log_softmax as the single ATen kernels of ``torch.nn.functional``,
NumPy runs gelu in place. Gradient rules are written in differentiable pullback
ops (some defined by the elementwise module, looked up when the rule runs), so
second derivatives work.
"""

from __future__ import annotations

from ..ir.types import FLOAT_DTYPES

import math
from dataclasses import dataclass

import numpy as np

from ..ir.expr import Call, Expr
from . import elemwise as E
from . import layout as T
from . import reduce as R
from . import numba_kernels, special
from .npfast import as_rows, blockwise, row_blocks, sum_along
from .common import float_arg, normalize_axis, same_layout
from .kernels import numpy_quiet
from .nn import (as_dtype, check_choice, check_float, check_int, lazy, numel_flops, pair_infer, scalar, unary_float_infer,
                 widen16)
from .registry import FusionKind, Recompute, defop

_sigmoid = lazy("sigmoid")


def elementwise_grad(name: str, kernel, aten: str, grad, per_elem: int, doc: str, what: str = "the data",
                     attrs_type=None, aten_attrs=lambda a: (), aten_float64: bool = True):
    """An activation's gradient op ``(out_grad, v) -> d input``, elementwise: ``kernel(xp, g, v, attrs)`` on every
    namespace (quiet on NumPy), one ATen call on torch (``aten(g, v, *aten_attrs(attrs))``, the gradient in v's
    memory layout; not ``aten_float64``: float64 through ``kernel``, where ATen's rounds a constant to float32),
    ``grad`` its own gradient rule."""

    def on_torch(g, v, attrs=None):
        import torch

        if not aten_float64 and v.dtype == torch.float64:
            return kernel(torch, g, v, attrs)
        return getattr(torch.ops.aten, aten)(same_layout(g, v), v, *aten_attrs(attrs))

    return defop(name, 2, pair_infer(name, what), kernel=kernel,
                 impls={"torch": on_torch, "numpy": numpy_quiet(kernel, over="ignore", invalid="ignore")},
                 grad=grad, attrs_type=attrs_type, pattern=FusionKind.ELEMWISE, flops=numel_flops(per_elem),
                 dtypes=FLOAT_DTYPES, torch_name=aten, doc=doc)


def activation(name: str, attrs_type, kernel, grad, per_elem: int, torch_name: str, impls=None, kinks=()):
    """An elementwise activation: ``kernel(xp, x, attrs)`` gives the result in x's dtype."""

    def typed(xp, x, attrs=None):
        return as_dtype(xp, kernel(xp, x, attrs), x.dtype)

    return defop(name, 1, unary_float_infer(name), kernel=typed, impls=impls, attrs_type=attrs_type, grad=grad,
                 pattern=FusionKind.ELEMWISE, recompute=Recompute.SPECIAL, flops=numel_flops(per_elem),
                 torch_name=torch_name, elementwise=True, kinks=kinks, dtypes=FLOAT_DTYPES)


# ------------------------------------------------------------------ leaky_relu


@dataclass(frozen=True)
class LeakyReluAttrs:
    alpha: float = 0.01

    def __post_init__(self):
        check_float(self, "alpha")


def _leaky_relu_torch(x, attrs):
    import torch.nn.functional as F

    return F.leaky_relu(x, attrs.alpha)


_where_numpy = E.where.impl("numpy")


def _leaky_numpy(v, x, alpha: float):
    """``v`` where ``x > 0``, else ``alpha * v`` (the forward: ``v = x``; the gradient: ``v = g``): the shared
    kernels with ``where``'s bitwise select (np.where: 4 ms on 1M float32 elements, this 0.85)."""
    return as_dtype(np, _where_numpy(np.greater(x, 0), v, v * alpha), v.dtype)


leaky_relu = activation("nn.leaky_relu", LeakyReluAttrs, lambda xp, x, a: xp.where(x > 0, x, x * a.alpha),
                        lambda c, g: [leaky_relu_grad(g, c.args[0], c.attrs.alpha)], 2, "leaky_relu",
                        impls={"torch": _leaky_relu_torch, "numpy": lambda x, attrs: _leaky_numpy(x, x, attrs.alpha)}, kinks=(0.0,))


def _leaky_relu_grad_torch(g, x, attrs):
    import torch

    return torch.ops.aten.leaky_relu_backward(g, x, attrs.alpha, False)


# one kernel where the comparison, the product and the select take three (torch.where alone took 2.3 ms on a
# 1M-element float32 tensor on the 2-core bench machine; ATen's leaky_relu_backward 0.17 ms)
leaky_relu_grad = defop(
    "nn.leaky_relu_grad",
    2,
    pair_infer("nn.leaky_relu_grad", "the data"),
    kernel=lambda xp, g, x, attrs: xp.where(x > 0, g, g * attrs.alpha),
    impls={"torch": _leaky_relu_grad_torch,
           "numpy": lambda g, x, attrs: _leaky_numpy(g, x, attrs.alpha)},
    attrs_type=LeakyReluAttrs,
    grad=lambda c, h: [leaky_relu_grad(h, c.args[1], c.attrs.alpha), None],  # linear in out_grad; a step in the data
    pattern=FusionKind.ELEMWISE,
    dtypes=FLOAT_DTYPES,
    torch_name="leaky_relu_backward",
    doc="``(out_grad, data) -> out_grad`` where ``data > 0``, else ``alpha * out_grad`` (ATen "
        "``leaky_relu_backward``: ``nn.leaky_relu``'s gradient).",
)

# ------------------------------------------------------------------ gelu

_K_TANH = math.sqrt(2.0 / math.pi)
_C_TANH = 0.044715


@dataclass(frozen=True)
class GeluAttrs:
    approximate: str = "none"

    def __post_init__(self):
        check_choice(self, "approximate", ("none", "tanh"))


def _gelu_kernel(xp, x, attrs):
    """In the input's precision (float16 in float32), like PyTorch's CPU kernel."""
    w = widen16(xp, x)
    if attrs.approximate == "tanh":
        inner = xp.tanh(_K_TANH * (w + _C_TANH * w * w * w))
    else:
        inner = special.erf_of(xp)(w * (1.0 / math.sqrt(2.0)))
    return (inner + 1.0) * w * 0.5


def _gelu_numpy(x, attrs):
    """``_gelu_kernel`` compiled by numba (float32, ``numba_kernels``), else on NumPy in place (two temporaries
    fewer), on blocks that stay in the cache."""
    out = numba_kernels.gelu(x, attrs.approximate)
    return blockwise(lambda b: _gelu_block(b, attrs), x) if out is None else out


def _gelu_block(x, attrs):
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    c = w.dtype.type
    if attrs.approximate == "tanh":
        inner = np.tanh(c(_K_TANH) * (w + c(_C_TANH) * w * w * w))
    else:
        inner = special.erf(w * c(1.0 / math.sqrt(2.0)))
    inner += c(1.0)
    inner *= w
    inner *= c(0.5)
    return np.asarray(inner, dtype=x.dtype)


def _gelu_torch(x, attrs):
    import torch.nn.functional as F

    return F.gelu(x, approximate=attrs.approximate)


gelu = activation("nn.gelu", GeluAttrs, _gelu_kernel, lambda c, g: [gelu_grad(g, c.args[0], c.attrs.approximate)], 8,
                  "gelu", impls={"numpy": _gelu_numpy, "torch": _gelu_torch})

# ------------------------------------------------------------------ gelu_grad: g * gelu'(x) in one kernel


def _gelu_slope_kernel(xp, x, tanh: bool):
    """gelu'(x) in x's precision."""
    if tanh:
        x2 = x * x
        t = xp.tanh(x * (_K_TANH + _K_TANH * _C_TANH * x2))
        return (t + 1.0) * 0.5 + x * 0.5 * (1.0 - t * t) * (_K_TANH + 3 * _K_TANH * _C_TANH * x2)
    cdf = (special.erf_of(xp)(x * (1.0 / math.sqrt(2.0))) + 1.0) * 0.5
    return cdf + x * xp.exp(x * x * -0.5) * (1.0 / math.sqrt(2.0 * math.pi))


def _gelu_grad_kernel(xp, g, x, attrs):
    w = widen16(xp, x)
    return as_dtype(xp, widen16(xp, g) * _gelu_slope_kernel(xp, w, attrs.approximate == "tanh"), x.dtype)


def _gelu_grad_numpy(g, x, attrs):
    """``_gelu_grad_kernel`` compiled by numba (float32, ``numba_kernels``), else in place (two buffers), on blocks
    that stay in the cache."""
    out = numba_kernels.gelu_grad(g, x, attrs.approximate)
    return blockwise(lambda gb, xb: _gelu_grad_block(gb, xb, attrs), g, x) if out is None else out


def _gelu_grad_block(g, x, attrs):
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    c = w.dtype.type
    if attrs.approximate == "tanh":
        s = np.multiply(w, w)  # x^2, then the slope of the tanh's argument
        t = np.multiply(s, c(_K_TANH * _C_TANH))
        t += c(_K_TANH)
        t *= w
        np.tanh(t, out=t)
        s *= c(3 * _K_TANH * _C_TANH)
        s += c(_K_TANH)
        d = np.multiply(t, t)  # 0.5 x (1 - t^2) u'
        np.subtract(c(1.0), d, out=d)
        d *= s
        d *= w
        t += c(1.0)
        t += d
        t *= c(0.5)
        out = t
    else:
        out = special.erf(np.multiply(w, c(1.0 / math.sqrt(2.0))))
        out += c(1.0)
        out *= c(0.5)
        e = np.multiply(w, w)  # x pdf(x)
        e *= c(-0.5)
        np.exp(e, out=e)
        e *= w
        e *= c(1.0 / math.sqrt(2.0 * math.pi))
        out += e
    out *= g
    return np.asarray(out, dtype=x.dtype)


def _gelu_grad_torch(g, x, attrs):
    import torch

    return torch.ops.aten.gelu_backward(same_layout(g, x), x, approximate=attrs.approximate)


def _gelu_grad_grad(call: Call, h: Expr):
    """d/dg = gelu_grad(h, x); d/dx = h g gelu''(x)."""
    g, x = call.args
    s = lambda v: scalar(v, x)  # noqa: E731
    if call.attrs.approximate == "tanh":
        x2 = x * x
        t = E.tanh(x * (s(_K_TANH) + s(_K_TANH * _C_TANH) * x2))
        du = s(_K_TANH) + s(3 * _K_TANH * _C_TANH) * x2  # d/dx of the tanh's argument
        curve = (s(1.0) - t * t) * (du + s(3 * _K_TANH * _C_TANH) * x2 - x * t * du * du)
    else:
        pdf = E.exp(x * x * s(-0.5)) * s(1.0 / math.sqrt(2.0 * math.pi))
        curve = pdf * (s(2.0) - x * x)
    return [gelu_grad(h, x, call.attrs.approximate), h * g * curve]


gelu_grad = defop("nn.gelu_grad", 2, pair_infer("nn.gelu_grad", "the data"), kernel=_gelu_grad_kernel,
                  impls={"numpy": _gelu_grad_numpy, "torch": _gelu_grad_torch}, attrs_type=GeluAttrs,
                  grad=_gelu_grad_grad, pattern=FusionKind.ELEMWISE, flops=numel_flops(10), dtypes=FLOAT_DTYPES,
                  torch_name="gelu_backward",
                  doc="Gradient of ``nn.gelu``: ``(out_grad, data) -> out_grad * gelu'(data)`` (ATen ``gelu_backward``).")

# ------------------------------------------------------------------ silu


def _silu_torch(x, attrs=None):
    import torch.nn.functional as F

    return F.silu(x)


def _silu_kernel(xp, x, attrs=None):
    w = widen16(xp, x)
    return as_dtype(xp, w * E.sigmoid_kernel(xp, w), x.dtype)


silu = activation("nn.silu", None, _silu_kernel, lambda c, g: [silu_grad(g, c.args[0])], 4, "silu",
                  impls={"torch": _silu_torch, "numpy": numpy_quiet(_silu_kernel, over="ignore", invalid="ignore")})


def _silu_grad_kernel(xp, g, x, attrs=None):
    """``g * silu'(x)``, ``silu'(x) = s (1 + x (1 - s))`` with ``s = sigmoid(x)``."""
    w = widen16(xp, x)
    s = E.sigmoid_kernel(xp, w)
    return as_dtype(xp, widen16(xp, g) * (s * (1.0 + w * (1.0 - s))), x.dtype)


def _silu_grad_grad(call: Call, h: Expr):
    """d/dg = silu_grad(h, x); d/dx = h g silu''(x), ``silu''(x) = s (1 - s) (2 + x (1 - 2 s))``."""
    g, x = call.args
    one = scalar(1.0, x)
    sg = _sigmoid(x)
    return [silu_grad(h, x), h * g * (sg * (one - sg) * (scalar(2.0, x) + x * (one - scalar(2.0, x) * sg)))]


# one kernel where the sigmoid, four products and a sum took six passes (SwiGLU's gradient in every Llama-style MLP:
# (8, 128, 1024) float32 on the torch target 3.3 -> 0.3 ms)
silu_grad = elementwise_grad("nn.silu_grad", _silu_grad_kernel, "silu_backward", _silu_grad_grad, 8,
                             "Gradient of ``nn.silu``: ``(out_grad, data) -> out_grad * silu'(data)`` (ATen ``silu_backward``).")

# ------------------------------------------------------------------ hardswish and hardsigmoid (MobileNetV3, LeViT)


def _hard_kernel(swish: bool):
    """``relu6(x + 3) / 6``, times x for hardswish, in x's precision (float16/bfloat16 in float32, one rounding)."""

    def kernel(xp, x, attrs=None):
        w = widen16(xp, x)
        gate = xp.clip(w + 3.0, 0.0, 6.0)
        return as_dtype(xp, (w * gate if swish else gate) / 6.0, x.dtype)

    return kernel


def _torch_activation(name: str):
    def run(x, attrs=None):
        import torch.nn.functional as F

        return getattr(F, name)(x)

    return run


def _hardswish_grad_kernel(xp, g, x, attrs=None):
    """ATen's ``hardswish_backward``: 0 up to -3 (a zero, also where ``g`` is NaN or infinite), ``g * (x / 3 + 1/2)``
    strictly between -3 and 3, ``g`` from 3."""
    w, gw = widen16(xp, x), widen16(xp, g)
    return as_dtype(xp, xp.where(w <= -3.0, xp.zeros_like(gw), xp.where(w < 3.0, gw * (w / 3.0 + 0.5), gw)), x.dtype)


def _hardsigmoid_grad_kernel(xp, g, x, attrs=None):
    """ATen's ``hardsigmoid_backward``: ``g / 6`` strictly between -3 and 3, else 0 (its float64 kernel multiplies by
    1/6 rounded to float32, 3e-8 off: ours is exact there)."""
    w, gw = widen16(xp, x), widen16(xp, g)  # else a zero, also where g is NaN or infinite (ATen's)
    return as_dtype(xp, xp.where((w > -3.0) & (w < 3.0), gw * (1.0 / 6.0), xp.zeros_like(gw)), x.dtype)


def _inside(x: Expr) -> Expr:
    """1 where ``-3 < x < 3``, else 0, in x's dtype."""
    three = scalar(3.0, x)
    return T.cast(E.logical_and(E.less(-three, x), E.less(x, three)), x.checked_type.dtype)


def _hardswish_grad_grad(call: Call, h: Expr):
    """d/dg = hardswish_grad(h, x); d/dx = h g / 3 strictly inside (-3, 3) (PyTorch's double backward)."""
    g, x = call.args
    return [hardswish_grad(h, x), h * g * _inside(x) / scalar(3.0, x)]


hardswish = activation("nn.hardswish", None, _hard_kernel(True), lambda c, g: [hardswish_grad(g, c.args[0])], 4,
                       "hardswish", impls={"torch": _torch_activation("hardswish")}, kinks=(-3.0, 3.0))
hardswish_grad = elementwise_grad("nn.hardswish_grad", _hardswish_grad_kernel, "hardswish_backward", _hardswish_grad_grad,
                                  5, "Gradient of ``nn.hardswish``: ``(out_grad, data) -> out_grad * hardswish'(data)`` "
                                  "(ATen ``hardswish_backward``).")
hardsigmoid = activation("nn.hardsigmoid", None, _hard_kernel(False), lambda c, g: [hardsigmoid_grad(g, c.args[0])], 3,
                         "hardsigmoid", impls={"torch": _torch_activation("hardsigmoid")}, kinks=(-3.0, 3.0))
# linear in out_grad; a step in the data (its gradient there is zero)
hardsigmoid_grad = elementwise_grad("nn.hardsigmoid_grad", _hardsigmoid_grad_kernel, "hardsigmoid_backward",
                                    lambda c, h: [hardsigmoid_grad(h, c.args[1]), None], 3,
                                    "Gradient of ``nn.hardsigmoid``: ``(out_grad, data) -> out_grad * hardsigmoid'(data)`` "
                                    "(ATen ``hardsigmoid_backward``).", aten_float64=False)

# ------------------------------------------------------------------ tanh and sigmoid gradients


def _result_grad(name: str, slope, slope_grad, aten: str):
    """The gradient op ``(out_grad, y) -> out_grad * f'(x)`` of an activation whose derivative is a function of its
    result ``y = f(x)``: ``slope(y)`` (on arrays) is ``f'(x)``, ``slope_grad(y)`` (on pullback exprs) its derivative
    in ``y``. One kernel (ATen's ``<aten>``: float16 and bfloat16 computed in float32 and rounded once) where the
    products and the difference took two or three passes, each rounded (bfloat16: 1.2-1.4x eager's error)."""

    def kernel(xp, g, y, attrs=None):
        w = widen16(xp, y)
        return as_dtype(xp, widen16(xp, g) * slope(w), y.dtype)

    def grad(call: Call, h: Expr):
        g, y = call.args
        return [result_grad(h, y), h * g * slope_grad(y)]

    result_grad = elementwise_grad(name, kernel, aten, grad, 3, f"Gradient of ``{name[:-5]}`` from its result: "
                                   f"``(out_grad, result) -> out_grad * {name[:-5]}'`` (ATen ``{aten}``).", "the result")
    return result_grad


tanh_grad = _result_grad("tanh_grad", lambda y: 1.0 - y * y, lambda y: scalar(-2.0, y) * y, "tanh_backward")
sigmoid_grad = _result_grad("sigmoid_grad", lambda y: y * (1.0 - y), lambda y: scalar(1.0, y) - scalar(2.0, y) * y,
                            "sigmoid_backward")

# ------------------------------------------------------------------ softplus


@dataclass(frozen=True)
class SoftplusAttrs:
    beta: float = 1.0
    threshold: float = 20.0

    def __post_init__(self):
        check_float(self, "beta", positive=True)
        check_float(self, "threshold")


def _softplus_kernel(xp, x, a):
    bx = x * a.beta
    soft = xp.logaddexp(0.0, bx) / a.beta
    return xp.where(bx > a.threshold, x, soft)


def _softplus_torch(x, a):
    """ATen's ``softplus``, eager's kernel (one pass; the shared formula takes four, ``logaddexp`` the slowest)."""
    import torch

    return torch.ops.aten.softplus(x, a.beta, a.threshold)


softplus = activation("nn.softplus", SoftplusAttrs, _softplus_kernel,
                      lambda c, g: [softplus_grad(g, c.args[0], c.attrs.beta, c.attrs.threshold)], 4, "softplus",
                      impls={"torch": _softplus_torch})


def _softplus_grad_kernel(xp, g, x, a):
    """``g * sigmoid(beta x)``, or ``g`` where ``beta x > threshold`` (softplus is ``x`` there)."""
    w = widen16(xp, x)
    bx = w * a.beta
    return as_dtype(xp, xp.where(bx > a.threshold, widen16(xp, g), widen16(xp, g) * E.sigmoid_kernel(xp, bx)), x.dtype)


def _softplus_grad_grad(call: Call, h: Expr):
    """d/dg = softplus_grad(h, x); d/dx = h g beta s (1 - s) with ``s = sigmoid(beta x)``, 0 above the threshold."""
    g, x = call.args
    a = call.attrs
    bx = x * scalar(a.beta, x)
    s = _sigmoid(bx)
    curve = h * g * scalar(a.beta, x) * s * (scalar(1.0, x) - s)
    return [softplus_grad(h, x, a.beta, a.threshold), E.where(E.greater(bx, scalar(a.threshold, x)), T.zeros_like(x), curve)]


# one kernel (ATen's softplus_backward) where the scaling, the compare, the sigmoid, the product and the select took
# five; bfloat16 computed in float32 and rounded once
softplus_grad = elementwise_grad("nn.softplus_grad", _softplus_grad_kernel, "softplus_backward", _softplus_grad_grad, 6,
                                 "Gradient of ``nn.softplus``: ``(out_grad, data) -> out_grad * sigmoid(beta data)`` "
                                 "(``out_grad`` where ``beta data > threshold``; ATen ``softplus_backward``).",
                                 attrs_type=SoftplusAttrs, aten_attrs=lambda a: (a.beta, a.threshold))

# ------------------------------------------------------------------ mish (YOLOv4, CSPDarknet, U-Nets)


def _tanh_softplus(xp, w):
    """``tanh(log1p(exp(w)))``, ATen's formula; w clipped at 20, where the tanh is 1 in float64 already (no
    overflow)."""
    return xp.tanh(xp.log1p(xp.exp(xp.minimum(w, 20.0))))


def _mish_kernel(xp, x, attrs=None):
    """``x tanh(softplus(x))``."""
    w = widen16(xp, x)
    return as_dtype(xp, w * _tanh_softplus(xp, w), x.dtype)


mish = activation("nn.mish", None, _mish_kernel, lambda c, g: [mish_grad(g, c.args[0])], 6, "mish",
                  impls={"torch": _torch_activation("mish")})


def _mish_grad_kernel(xp, g, x, attrs=None):
    """``g * mish'(x)``, ``mish'(x) = t + x s (1 - t^2)`` with ``t = tanh(softplus(x))``, ``s = sigmoid(x)``."""
    w = widen16(xp, x)
    t = _tanh_softplus(xp, w)
    return as_dtype(xp, widen16(xp, g) * (t + w * E.sigmoid_kernel(xp, w) * (1.0 - t * t)), x.dtype)


def _mish_grad_grad(call: Call, h: Expr):
    """d/dg = mish_grad(h, x); d/dx = h g mish''(x), ``mish''(x) = (1 - t^2) s (2 + x (1 - s) - 2 x t s)``."""
    g, x = call.args
    one, two = scalar(1.0, x), scalar(2.0, x)
    s, t = _sigmoid(x), E.tanh(softplus(x))
    return [mish_grad(h, x), h * g * ((one - t * t) * s * (two + x * (one - s) - two * x * t * s))]


# one kernel each way (ATen's mish / mish_backward) where PyTorch's decomposition takes softplus, tanh and a product
# forward and seven kernels backward: eager's kernels and bits, fewer saved tensors (a U-Net's Mish, (16, 8, 32, 32)
# float32 on torch: 0.9 -> 0.75 ms a step, ATen's mish kernels being slow themselves)
mish_grad = elementwise_grad("nn.mish_grad", _mish_grad_kernel, "mish_backward", _mish_grad_grad, 12,
                             "Gradient of ``nn.mish``: ``(out_grad, data) -> out_grad * mish'(data)`` "
                             "(ATen ``mish_backward``).")

# ------------------------------------------------------------------ softmax / log_softmax


@dataclass(frozen=True)
class SoftmaxAttrs:
    axis: int = -1

    def __post_init__(self):
        check_int(self, "axis")


def _softmax_infer(name):
    def infer(arg_types, attrs):
        x = float_arg(name, arg_types, 0)
        normalize_axis(name, attrs.axis, x.ndim, arg_types)
        return x

    return infer


def _softmax_kernel(xp, x, attrs):
    if not math.prod(x.shape):  # nothing to normalise (a max over an empty axis has no identity)
        return x
    z = x - xp.max(x, axis=attrs.axis, keepdims=True)
    e = xp.exp(z)
    return as_dtype(xp, e / xp.sum(e, axis=attrs.axis, keepdims=True), x.dtype)


def _log_softmax_kernel(xp, x, attrs):
    if not math.prod(x.shape):
        return x
    z = x - xp.max(x, axis=attrs.axis, keepdims=True)
    return as_dtype(xp, z - xp.log(xp.sum(xp.exp(z), axis=attrs.axis, keepdims=True)), x.dtype)


def numpy_rows(kernel, block, compiled: str):
    """A NumPy implementation for arrays of one shape, float32/64, ``attrs.axis`` last: the numba row loop
    ``compiled`` (float32, ``numba_kernels.rows``), else ``block(out, *arrays, attrs)`` on blocks of rows (in place
    in ``out``'s rows); ``kernel`` on NumPy for other arrays."""

    def run(*args):
        *arrays, attrs = args
        x = arrays[-1]
        if (not x.size or x.ndim == 0 or attrs.axis % x.ndim != x.ndim - 1 or x.dtype not in (np.float32, np.float64)
                or any(a.shape != x.shape or a.dtype != x.dtype for a in arrays)):
            return kernel(np, *arrays, attrs)
        rows = [as_rows(a) for a in arrays]
        out = np.empty_like(rows[-1])
        if not numba_kernels.rows(compiled, out, *rows):
            for r in row_blocks(*out.shape):
                block(out[r], *(a[r] for a in rows), attrs)
        return out.reshape(x.shape)

    return run


def _softmax_block(out, x, attrs):
    np.subtract(x, x.max(axis=1, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= sum_along(out, 1)


def _log_softmax_block(out, x, attrs):
    np.subtract(x, x.max(axis=1, keepdims=True), out=out)
    out -= np.log(sum_along(np.exp(out), 1))


def _softmax_torch(x, attrs):
    import torch

    return torch.softmax(x, attrs.axis)


def _log_softmax_torch(x, attrs):
    import torch

    return torch.log_softmax(x, attrs.axis)


softmax = defop("nn.softmax", 1, _softmax_infer("nn.softmax"), kernel=_softmax_kernel,
                impls={"numpy": numpy_rows(_softmax_kernel, _softmax_block, "softmax"), "torch": _softmax_torch},
                attrs_type=SoftmaxAttrs, grad=lambda c, g: [softmax_grad(g, c, c.attrs.axis)],
                pattern=FusionKind.OPAQUE, flops=numel_flops(5), torch_name="softmax")
log_softmax = defop("nn.log_softmax", 1, _softmax_infer("nn.log_softmax"), kernel=_log_softmax_kernel,
                    impls={"numpy": numpy_rows(_log_softmax_kernel, _log_softmax_block, "log_softmax"), "torch": _log_softmax_torch},
                    attrs_type=SoftmaxAttrs,
                    grad=lambda c, g: [log_softmax_grad(g, c, c.attrs.axis)],
                    pattern=FusionKind.OPAQUE, flops=numel_flops(5), torch_name="log_softmax")

# ------------------------------------------------------------------ softmax_grad / log_softmax_grad
# (out_grad, forward output) -> input gradient, one kernel each, as ATen's _softmax_backward_data and
# _log_softmax_backward_data; their own gradients are written in pullback ops.


def _softmax_grad_infer(name: str):
    same = pair_infer(name, "the forward output")

    def infer(arg_types, attrs):
        y = same(arg_types, attrs)
        normalize_axis(name, attrs.axis, y.ndim, arg_types)
        return y

    return infer


def _softmax_grad_kernel(xp, g, y, attrs):
    return as_dtype(xp, y * (g - xp.sum(g * y, axis=attrs.axis, keepdims=True)), y.dtype)


def _softmax_grad_block(out, g, y, attrs):
    """``y * (g - sum(g y))`` on rows: one pass for the sum, two in place."""
    np.subtract(g, np.vecdot(g, y)[:, None], out=out)
    out *= y


def _softmax_grad_torch(g, y, attrs):
    import torch

    return torch._softmax_backward_data(g, y, attrs.axis % y.ndim, y.dtype)


def _softmax_grad_grad(call: Call, h: Expr):
    """dx = y (g - s) with s = sum(g y): d/dg = softmax_grad(h, y) (the Jacobian is symmetric);
    d/dy = h (g - s) - g sum(h y)."""
    g, y = call.args
    axis = call.attrs.axis
    return [softmax_grad(h, y, axis), h * (g - R.sum(g * y, axis, True)) - g * R.sum(h * y, axis, True)]


def _log_softmax_grad_kernel(xp, g, y, attrs):
    return as_dtype(xp, g - xp.exp(y) * xp.sum(g, axis=attrs.axis, keepdims=True), y.dtype)


def _log_softmax_grad_block(out, g, y, attrs):
    """``g - exp(y) sum(g)`` on rows, in place."""
    np.exp(y, out=out)
    out *= sum_along(g, 1)
    np.subtract(g, out, out=out)


def _log_softmax_grad_torch(g, y, attrs):
    import torch

    return torch._log_softmax_backward_data(g, y, attrs.axis % y.ndim, y.dtype)


def _log_softmax_grad_grad(call: Call, h: Expr):
    """dx = g - e^y sum(g): d/dg = h - sum(h e^y); d/dy = -h e^y sum(g)."""
    g, y = call.args
    axis = call.attrs.axis
    he = h * E.exp(y)
    return [h - R.sum(he, axis, True), E.negative(he * R.sum(g, axis, True))]


softmax_grad = defop("nn.softmax_grad", 2, _softmax_grad_infer("nn.softmax_grad"), kernel=_softmax_grad_kernel,
                     impls={"numpy": numpy_rows(_softmax_grad_kernel, _softmax_grad_block, "softmax_grad"), "torch": _softmax_grad_torch}, attrs_type=SoftmaxAttrs,
                     grad=_softmax_grad_grad, pattern=FusionKind.OPAQUE, flops=numel_flops(4), dtypes=FLOAT_DTYPES,
                     torch_name="_softmax_backward_data",
                     doc="Gradient of ``nn.softmax``: ``(out_grad, output) -> output * (out_grad - sum(out_grad * output))``.")
log_softmax_grad = defop(
    "nn.log_softmax_grad", 2, _softmax_grad_infer("nn.log_softmax_grad"), kernel=_log_softmax_grad_kernel,
    impls={"numpy": numpy_rows(_log_softmax_grad_kernel, _log_softmax_grad_block, "log_softmax_grad"), "torch": _log_softmax_grad_torch}, attrs_type=SoftmaxAttrs,
    grad=_log_softmax_grad_grad, pattern=FusionKind.OPAQUE, flops=numel_flops(4), dtypes=FLOAT_DTYPES,
    torch_name="_log_softmax_backward_data",
    doc="Gradient of ``nn.log_softmax``: ``(out_grad, output) -> out_grad - exp(output) * sum(out_grad)``.")
