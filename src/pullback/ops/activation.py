"""Activations and normalised exponentials: leaky_relu, gelu, silu, softplus, softmax, log_softmax.

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
from . import reduce as R
from . import special
from .common import float_arg, normalize_axis
from .nn import as_dtype, check_choice, check_float, check_int, lazy, numel_flops, scalar, unary_float_infer, widen16
from .registry import FusionKind, Recompute, defop

_sigmoid, _erf = lazy("sigmoid"), lazy("erf")


def _sigmoid_kernel(xp, x):
    """1 / (1 + e^-x) as exp(-log(1 + e^-x)): no overflow for any x."""
    return xp.exp(-xp.logaddexp(0.0, -x))


def activation(name: str, attrs_type, kernel, grad, per_elem: int, torch_name: str, impls=None, kinks=(), decompose=None):
    """An elementwise activation: ``kernel(xp, x, attrs)`` gives the result in x's dtype."""

    def typed(xp, x, attrs=None):
        return as_dtype(xp, kernel(xp, x, attrs), x.dtype)

    return defop(name, 1, unary_float_infer(name), kernel=typed, impls=impls, attrs_type=attrs_type, grad=grad,
                 pattern=FusionKind.ELEMWISE, recompute=Recompute.SPECIAL, flops=numel_flops(per_elem), torch_name=torch_name,
                 elementwise=True, kinks=kinks, dtypes=FLOAT_DTYPES, decompose=decompose)


# ------------------------------------------------------------------ leaky_relu


@dataclass(frozen=True)
class LeakyReluAttrs:
    alpha: float = 0.01

    def __post_init__(self):
        check_float(self, "alpha")


def _leaky_grad(call: Call, g: Expr):
    x = call.args[0]
    return [E.where(E.greater(x, scalar(0.0, x)), g, g * scalar(call.attrs.alpha, x))]


def _leaky_relu_torch(x, attrs):
    import torch.nn.functional as F

    return F.leaky_relu(x, attrs.alpha)


leaky_relu = activation("nn.leaky_relu", LeakyReluAttrs, lambda xp, x, a: xp.where(x > 0, x, x * a.alpha),
                        _leaky_grad, 2, "leaky_relu", impls={"torch": _leaky_relu_torch}, kinks=(0.0,))

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
    """``_gelu_kernel`` on NumPy in place (two temporaries fewer)."""
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


def _gelu_inner(x: Expr, attrs) -> Expr:
    """The special-function term of gelu: ``tanh(k (x + c x^3))`` or ``erf(x / sqrt 2)``, as the kernels compute it."""
    s = lambda v: scalar(v, x)  # noqa: E731
    if attrs.approximate == "tanh":
        return E.tanh(s(_K_TANH) * (x + s(_C_TANH) * x * x * x))
    return _erf(x * s(1.0 / math.sqrt(2.0)))


def _gelu_grad(call: Call, g: Expr):
    x = call.args[0]
    s = lambda v: scalar(v, x)  # noqa: E731
    inner = _gelu_inner(x, call.attrs)
    if call.attrs.approximate == "tanh":
        dt = (s(1.0) - inner * inner) * (s(_K_TANH) + s(3 * _K_TANH * _C_TANH) * x * x)
        return [g * (s(0.5) * (s(1.0) + inner) + s(0.5) * x * dt)]
    cdf = s(0.5) * (s(1.0) + inner)
    pdf = E.exp(x * x * s(-0.5)) * s(1.0 / math.sqrt(2.0 * math.pi))
    return [g * (cdf + x * pdf)]


def _gelu_decompose(call: Call):
    """``(inner + 1) x / 2`` sharing ``inner`` (the erf or tanh) with ``_gelu_grad``, operation for operation as
    the NumPy kernel computes it (float32/float64 only: the kernel computes float16 in float32)."""
    x = call.args[0]
    if x.checked_type.dtype not in ("float32", "float64"):
        return None
    return (_gelu_inner(x, call.attrs) + scalar(1.0, x)) * x * scalar(0.5, x)


def _gelu_torch(x, attrs):
    import torch.nn.functional as F

    return F.gelu(x, approximate=attrs.approximate)


gelu = activation("nn.gelu", GeluAttrs, _gelu_kernel, _gelu_grad, 8, "gelu",
                  impls={"numpy": _gelu_numpy, "torch": _gelu_torch}, decompose=_gelu_decompose)

# ------------------------------------------------------------------ silu


def _silu_grad(call: Call, g: Expr):
    x = call.args[0]
    sg = _sigmoid(x)
    return [g * (sg + x * sg * (scalar(1.0, x) - sg))]


def _silu_torch(x, attrs=None):
    import torch.nn.functional as F

    return F.silu(x)


silu = activation("nn.silu", None, lambda xp, x, a: x * _sigmoid_kernel(xp, x), _silu_grad, 4, "silu",
                  impls={"torch": _silu_torch})

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


def _softplus_grad(call: Call, g: Expr):
    x = call.args[0]
    bx = x * scalar(call.attrs.beta, x)
    return [E.where(E.greater(bx, scalar(call.attrs.threshold, x)), g, g * _sigmoid(bx))]


softplus = activation("nn.softplus", SoftplusAttrs, _softplus_kernel, _softplus_grad, 4, "softplus")

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
    z = x - xp.max(x, axis=attrs.axis, keepdims=True)
    e = xp.exp(z)
    return as_dtype(xp, e / xp.sum(e, axis=attrs.axis, keepdims=True), x.dtype)


def _log_softmax_kernel(xp, x, attrs):
    z = x - xp.max(x, axis=attrs.axis, keepdims=True)
    return as_dtype(xp, z - xp.log(xp.sum(xp.exp(z), axis=attrs.axis, keepdims=True)), x.dtype)


def _softmax_torch(x, attrs):
    import torch

    return torch.softmax(x, attrs.axis)


def _log_softmax_torch(x, attrs):
    import torch

    return torch.log_softmax(x, attrs.axis)


def _softmax_grad(call: Call, g: Expr):
    y = call
    return [y * (g - R.sum(g * y, call.attrs.axis, True))]


def _log_softmax_grad(call: Call, g: Expr):
    return [g - E.exp(call) * R.sum(g, call.attrs.axis, True)]


softmax = defop("nn.softmax", 1, _softmax_infer("nn.softmax"), kernel=_softmax_kernel, impls={"torch": _softmax_torch},
                attrs_type=SoftmaxAttrs,
                grad=_softmax_grad, pattern=FusionKind.OPAQUE, flops=numel_flops(5), torch_name="softmax")
log_softmax = defop("nn.log_softmax", 1, _softmax_infer("nn.log_softmax"), kernel=_log_softmax_kernel,
                    impls={"torch": _log_softmax_torch}, attrs_type=SoftmaxAttrs,
                    grad=_log_softmax_grad, pattern=FusionKind.OPAQUE, flops=numel_flops(5), torch_name="log_softmax")
