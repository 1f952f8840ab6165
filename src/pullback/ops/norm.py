"""Normalisation: ``nn.layer_norm`` and ``nn.batch_norm``.

``nn.batch_norm`` returns Relay's tuple ``(out, new_moving_mean, new_moving_var)``.
Attribute ``training`` (default False, Relay's inference semantics):

- ``training=False``: normalise with ``moving_mean``/``moving_var``; the moving
  statistics are returned unchanged.
- ``training=True`` (PyTorch's ``F.batch_norm(training=True)``): normalise with
  the batch statistics (biased variance over every axis but ``axis``) and return
  ``(1 - momentum) * moving + momentum * batch`` (unbiased variance for the
  moving variance).

One kernel each for every array namespace; torch runs them as ATen's fused
``layer_norm`` (normalised axis last) and ``batch_norm`` (channel axis 1).
Gradients are written with differentiable ops (``sqrt`` from the elementwise
module), so second derivatives work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.expr import Call, Expr
from ..ir.types import Any, TensorType, TupleType
from . import reduce as R
from . import layout as T
from .common import float_arg, normalize_axis, numel, same_dtype, tensor_arg
from .nn import as_dtype, check_bool, check_float, check_int, count, field, lazy, scalar, widen16
from .registry import FusionKind, array_namespace, defop, type_error

_sqrt = lazy("sqrt")


def _vec_arg(op, arg_types, i, x, axis):
    v = tensor_arg(op, arg_types, i)
    c = x.shape[axis]
    if v.ndim != 1 or (v.shape[0] is not Any and c is not Any and v.shape[0] != c):
        raise type_error(op, arg_types, f"argument {i} must have shape ({c},) (data axis {axis}), got {v.shape}")


def _as_axis_vec(v: Expr, ndim: int, axis: int) -> Expr:
    """A 1-D per-channel vector shaped to broadcast along ``axis`` of a rank-``ndim`` tensor."""
    trailing = ndim - axis - 1
    return T.expand_dims(v, 1, trailing) if trailing else v


def _vec(v, ndim, axis):
    """A 1-D array shaped to broadcast along ``axis`` of a rank-``ndim`` array (kernels)."""
    return v.reshape((-1,) + (1,) * (ndim - axis - 1))


def _other_axes(ndim: int, axis: int) -> tuple:
    return tuple(i for i in range(ndim) if i != axis)


def _normalize_grad(x: Expr, xhat: Expr, rstd: Expr, gx: Expr, axes: tuple) -> Expr:
    """d/dx of xhat = (x - mean) * rstd over ``axes`` applied to cotangent ``gx``."""
    n = count(x, axes)
    mean_g = R.sum(gx, axes, True) / n
    mean_gx = R.sum(gx * xhat, axes, True) / n
    return rstd * (gx - mean_g - xhat * mean_gx)


def _stats(x: Expr, axes: tuple, eps: float):
    """(centred x, rstd) with the biased variance over ``axes`` (keepdims)."""
    n = count(x, axes)
    xc = x - R.sum(x, axes, True) / n
    var = R.sum(xc * xc, axes, True) / n
    return xc, scalar(1.0, x) / _sqrt(var + scalar(eps, x))


# ------------------------------------------------------------------ layer_norm


@dataclass(frozen=True)
class LayerNormAttrs:
    axis: int = -1
    epsilon: float = 1e-5
    center: bool = True
    scale: bool = True

    def __post_init__(self):
        check_int(self, "axis")
        check_float(self, "epsilon")  # any finite value, as PyTorch (a negative one can give NaN)
        check_bool(self, "center", "scale")


def _layer_norm_infer(arg_types, attrs):
    op = "nn.layer_norm"
    x = float_arg(op, arg_types, 0)
    same_dtype(op, arg_types)
    axis = normalize_axis(op, attrs.axis, x.ndim, arg_types)
    for i in (1, 2):
        _vec_arg(op, arg_types, i, x, axis)
    return x


def layer_norm_math(xp, x, gamma, beta, a):
    """Layer norm written once for any array namespace ``xp`` (in x's dtype)."""
    axis = a.axis % x.ndim
    mu = xp.mean(x, axis=axis, keepdims=True)
    var = xp.mean((x - mu) ** 2, axis=axis, keepdims=True)
    out = (x - mu) / xp.sqrt(var + a.epsilon)
    if a.scale:
        out = out * _vec(gamma, x.ndim, axis)
    if a.center:
        out = out + _vec(beta, x.ndim, axis)
    return out


def _layer_norm_kernel(xp, x, gamma, beta, a):
    return as_dtype(xp, layer_norm_math(xp, widen16(xp, x), gamma, beta, a), x.dtype)


def _layer_norm_torch(x, gamma, beta, a):
    """ATen's fused kernel when the normalised axis is the last one."""
    if a.axis % x.ndim != x.ndim - 1:
        return _layer_norm_kernel(array_namespace("torch"), x, gamma, beta, a)
    import torch.nn.functional as F

    return F.layer_norm(x, (x.shape[-1],), gamma if a.scale else None, beta if a.center else None, a.epsilon)


def _layer_norm_grad(call: Call, g: Expr):
    x, gamma, beta = call.args
    a = call.attrs
    ndim = x.checked_type.ndim
    axis = a.axis % ndim
    xc, rstd = _stats(x, (axis,), a.epsilon)
    xhat = xc * rstd
    gam = _as_axis_vec(gamma, ndim, axis)
    gx = g * gam if a.scale else g
    others = _other_axes(ndim, axis)
    dgamma = R.sum(g * xhat, others) if a.scale else None
    dbeta = R.sum(g, others) if a.center else None
    return [_normalize_grad(x, xhat, rstd, gx, (axis,)), dgamma, dbeta]


layer_norm = defop("nn.layer_norm", 3, _layer_norm_infer, kernel=_layer_norm_kernel, impls={"torch": _layer_norm_torch},
                   attrs_type=LayerNormAttrs,
                   grad=_layer_norm_grad, pattern=FusionKind.OPAQUE,
                   flops=lambda ts, out, a: 8 * numel(out.shape), torch_name="layer_norm")

# ------------------------------------------------------------------ batch_norm


@dataclass(frozen=True)
class BatchNormAttrs:
    axis: int = 1
    epsilon: float = 1e-5
    center: bool = True
    scale: bool = True
    training: bool = False
    momentum: float = 0.1

    def __post_init__(self):
        check_int(self, "axis")
        check_float(self, "epsilon", nonneg=True)
        check_float(self, "momentum")  # any finite value, as PyTorch
        check_bool(self, "center", "scale", "training")


def _batch_norm_infer(arg_types, attrs):
    op = "nn.batch_norm"
    x = float_arg(op, arg_types, 0)
    same_dtype(op, arg_types)
    axis = normalize_axis(op, attrs.axis, x.ndim, arg_types)
    for i in range(1, 5):
        _vec_arg(op, arg_types, i, x, axis)
    v = TensorType((x.shape[axis],), x.dtype)
    return TupleType((x, v, v))


def batch_norm_math(xp, x, gamma, beta, mm, mv, a):
    """Batch norm written once for any array namespace ``xp``: (out, new moving mean, new moving var)."""
    axis = a.axis % x.ndim
    others = _other_axes(x.ndim, axis)
    if a.training:
        mean = xp.mean(x, axis=others)
        var = xp.var(x, axis=others)
        n = _per_channel(x, axis)
        new_mm = (1 - a.momentum) * mm + a.momentum * mean
        new_mv = (1 - a.momentum) * mv + a.momentum * var * (n / max(n - 1, 1))
    else:
        mean, var, new_mm, new_mv = mm, mv, mm, mv
    out = (x - _vec(mean, x.ndim, axis)) / xp.sqrt(_vec(var, x.ndim, axis) + a.epsilon)
    if a.scale:
        out = out * _vec(gamma, x.ndim, axis)
    if a.center:
        out = out + _vec(beta, x.ndim, axis)
    return out, new_mm, new_mv


def _per_channel(x, axis: int) -> int:
    """Number of entries per channel (the batch statistics' sample size)."""
    return math.prod(x.shape) // max(x.shape[axis], 1)


def _batch_norm_kernel(xp, x, gamma, beta, mm, mv, a):
    return tuple(as_dtype(xp, v, x.dtype) for v in batch_norm_math(xp, widen16(xp, x), gamma, beta, mm, mv, a))


def _batch_norm_torch(x, gamma, beta, mm, mv, a):
    """ATen's fused kernel for channels on axis 1 (it updates the moving statistics in place: of copies)."""
    axis = a.axis % x.ndim
    if axis != 1 or (a.training and _per_channel(x, axis) < 2):  # ATen rejects one value per channel
        return _batch_norm_kernel(array_namespace("torch"), x, gamma, beta, mm, mv, a)
    import torch.nn.functional as F

    if a.training:
        mm, mv = mm.clone(), mv.clone()
    out = F.batch_norm(x, mm, mv, gamma if a.scale else None, beta if a.center else None, a.training, a.momentum, a.epsilon)
    return out, mm, mv


def _batch_norm_grad(call: Call, g: Expr):
    x, gamma, beta, mm, mv = call.args
    a = call.attrs
    ndim = x.checked_type.ndim
    axis = a.axis % ndim
    others = _other_axes(ndim, axis)
    gy, gmm, gmv = field(g, 0), field(g, 1), field(g, 2)
    gam = _as_axis_vec(gamma, ndim, axis)
    gxhat = gy * gam if a.scale else gy
    keep = scalar(1.0 - a.momentum, x) if a.training else None
    if a.training:
        xc, rstd = _stats(x, others, a.epsilon)
        xhat = xc * rstd
        n = count(x, others)
        m = scalar(a.momentum, x)
        # new_mm = (1-m) mm + m mean(x); new_mv = (1-m) mv + m sum(xc^2)/(n-1)
        from_stats = (_as_axis_vec(gmm, ndim, axis) * m / n
                      + xc * _as_axis_vec(gmv, ndim, axis) * (scalar(2.0, x) * m / (n - scalar(1.0, x))))
        gx = _normalize_grad(x, xhat, rstd, gxhat, others) + T.broadcast_to_like(from_stats, x)
        gmean, gvar = gmm * keep, gmv * keep
    else:
        rstd = scalar(1.0, x) / _sqrt(_as_axis_vec(mv, ndim, axis) + scalar(a.epsilon, x))
        xhat = (x - _as_axis_vec(mm, ndim, axis)) * rstd
        gx = gxhat * rstd
        gvec = R.sum(gxhat * xhat, others)  # d out / d rstd-weighted terms
        rstd1 = scalar(1.0, x) / _sqrt(mv + scalar(a.epsilon, x))
        gmean = gmm - R.sum(gxhat, others) * rstd1
        gvar = gmv - gvec * scalar(0.5, x) * rstd1 * rstd1
    dgamma = R.sum(gy * xhat, others) if a.scale else None
    dbeta = R.sum(gy, others) if a.center else None
    return [gx, dgamma, dbeta, gmean, gvar]


batch_norm = defop("nn.batch_norm", 5, _batch_norm_infer, kernel=_batch_norm_kernel, impls={"torch": _batch_norm_torch},
                   attrs_type=BatchNormAttrs,
                   grad=_batch_norm_grad, pattern=FusionKind.OPAQUE,
                   flops=lambda ts, out, a: 8 * numel(ts[0].shape), torch_name="batch_norm")

