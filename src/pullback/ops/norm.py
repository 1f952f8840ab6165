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

Gradients are single fused operators, as ATen's backward functions:
``nn.layer_norm_grad`` and ``nn.batch_norm_grad`` (training) map ``(out_grad,
data, gamma)`` to ``(d data, d gamma, d beta)``, recomputing the statistics
from the data (one reduction; ATen's ``native_*_backward`` on torch, a few
in-place passes on NumPy). Their own gradients, the inference-mode gradient of
``nn.batch_norm`` and the moving statistics' terms are written with
differentiable ops (``sqrt`` from the elementwise module), so second
derivatives work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir.expr import Call, Expr, TupleGetItem
from ..ir.types import FLOAT_DTYPES, Any, TensorType, TupleType
from . import elemwise as E
from . import reduce as R
from . import layout as T
from .common import float_arg, normalize_axis, numel, same_dtype, tensor_arg
from . import numba_kernels
from .nn import as_dtype, check_bool, check_float, check_int, count, field, lazy, nonzero, same_shape, scalar, widen16
from .npfast import along, as_rows, row_blocks, sum_along, sum_except
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


def _rows_ok(x, a) -> bool:
    """The NumPy row-block kernels apply: normalised axis last, float32/64."""
    return x.ndim > 0 and a.axis % x.ndim == x.ndim - 1 and x.dtype in (np.float32, np.float64)


def _normalized_rows(x, eps: float, out=None) -> tuple:
    """(xhat (in ``out`` if given), rstd (rows, 1)) of a block of rows."""
    n = x.dtype.type(x.shape[1])
    xh = np.subtract(x, sum_along(x, 1) / n, out=out)
    rstd = np.vecdot(xh, xh)[:, None]
    rstd /= n
    rstd += x.dtype.type(eps)
    np.sqrt(rstd, out=rstd)
    np.reciprocal(rstd, out=rstd)
    xh *= rstd
    return xh, rstd


def _layer_norm_numpy(x, gamma, beta, a):
    """Row blocks (normalised axis last, float32/64), in place in the result."""
    if not _rows_ok(x, a):
        return _layer_norm_kernel(np, x, gamma, beta, a)
    x2 = as_rows(x)
    out = numba_kernels.layer_norm(x2, gamma, beta, a)
    if out is not None:
        return out.reshape(x.shape)
    out = np.empty_like(x2)
    for r in row_blocks(*x2.shape):
        ob = out[r]
        _normalized_rows(x2[r], a.epsilon, out=ob)
        if a.scale:
            ob *= gamma
        if a.center:
            ob += beta
    return out.reshape(x.shape)


def _layer_norm_torch(x, gamma, beta, a):
    """ATen's fused kernel when the normalised axis is the last one."""
    if a.axis % x.ndim != x.ndim - 1:
        return _layer_norm_kernel(array_namespace("torch"), x, gamma, beta, a)
    import torch.nn.functional as F

    return F.layer_norm(x, (x.shape[-1],), gamma if a.scale else None, beta if a.center else None, a.epsilon)


def _fields_of(t: Expr, a) -> list:
    """``[dx, dgamma or None, dbeta or None]`` of a ``(dx, dgamma, dbeta)`` gradient call (None: no scale/center)."""
    return [TupleGetItem(t, 0), TupleGetItem(t, 1) if a.scale else None, TupleGetItem(t, 2) if a.center else None]


def _layer_norm_grad(call: Call, g: Expr):
    x, gamma, beta = call.args
    a = call.attrs
    return _fields_of(layer_norm_grad(g, x, gamma, a.axis, a.epsilon, a.center, a.scale), a)


layer_norm = defop("nn.layer_norm", 3, _layer_norm_infer, kernel=_layer_norm_kernel,
                   impls={"numpy": _layer_norm_numpy, "torch": _layer_norm_torch},
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


def _batch_norm_numpy(x, gamma, beta, mm, mv, a):
    """Statistics by einsum, then ``x * k + c`` per channel in the result's buffer (float32/64)."""
    if x.dtype not in (np.float32, np.float64) or x.size == 0:
        return _batch_norm_kernel(np, x, gamma, beta, mm, mv, a)
    axis, nd = a.axis % x.ndim, x.ndim
    if a.training:
        n = _per_channel(x, axis)
        mean = sum_except(axis, x) / x.dtype.type(n)
        out = np.subtract(x, along(mean, nd, axis))
        var = sum_except(axis, out, out) / x.dtype.type(n)
        new_mm = (1 - a.momentum) * mm + a.momentum * mean
        new_mv = (1 - a.momentum) * mv + a.momentum * var * (n / max(n - 1, 1))
    else:
        mean, var, new_mm, new_mv = mm, mv, mm, mv
        out = None
    k = 1 / np.sqrt(var + a.epsilon)
    if a.scale:
        k = k * gamma
    if out is None:
        out = np.multiply(x, along(k.astype(x.dtype, copy=False), nd, axis))
        shift = -mean * k
        if a.center:
            shift = shift + beta
        out += along(shift.astype(x.dtype, copy=False), nd, axis)
    else:
        out *= along(k.astype(x.dtype, copy=False), nd, axis)
        if a.center:
            out += along(beta, nd, axis)
    return out, np.asarray(new_mm, x.dtype), np.asarray(new_mv, x.dtype)


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
    gy, gmm, gmv = field(g, 0), field(g, 1), field(g, 2)
    if a.training:
        return _batch_norm_training_grad(call, nonzero(gy), nonzero(gmm), nonzero(gmv))
    ndim = x.checked_type.ndim
    axis = a.axis % ndim
    others = _other_axes(ndim, axis)
    gxhat = gy * _as_axis_vec(gamma, ndim, axis) if a.scale else gy
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


def _batch_norm_training_grad(call: Call, gy, gmm, gmv) -> list:
    """Training mode: ``nn.batch_norm_grad`` for the normalised output; the moving statistics
    ``(1-m) moving + m batch`` (unbiased batch variance) add their own terms where their cotangents are not zeros."""
    x, gamma = call.args[:2]
    a = call.attrs
    ndim = x.checked_type.ndim
    axis = a.axis % ndim
    out = [None] * 5
    if gy is not None:
        out[:3] = _fields_of(batch_norm_grad(gy, x, gamma, a.axis, a.epsilon, a.center, a.scale), a)
    others = _other_axes(ndim, axis)
    n = count(x, others)
    m = scalar(a.momentum, x)
    from_stats = []
    if gmm is not None:  # new_mm = (1-m) mm + m mean(x)
        from_stats.append(T.broadcast_to_like(_as_axis_vec(gmm, ndim, axis) * (m / n), x))
        out[3] = gmm * scalar(1.0 - a.momentum, x)
    if gmv is not None:  # new_mv = (1-m) mv + m sum(xc^2)/(n-1)
        xc = x - R.sum(x, others, True) / n
        from_stats.append(xc * _as_axis_vec(gmv, ndim, axis) * (scalar(2.0, x) * m / (n - scalar(1.0, x))))
        out[4] = gmv * scalar(1.0 - a.momentum, x)
    for term in from_stats:
        out[0] = term if out[0] is None else out[0] + term
    return out


batch_norm = defop("nn.batch_norm", 5, _batch_norm_infer, kernel=_batch_norm_kernel,
                   impls={"numpy": _batch_norm_numpy, "torch": _batch_norm_torch},
                   attrs_type=BatchNormAttrs,
                   grad=_batch_norm_grad, pattern=FusionKind.OPAQUE,
                   flops=lambda ts, out, a: 8 * numel(ts[0].shape), torch_name="batch_norm")


# ------------------------------------------------------------------ layer_norm_grad / batch_norm_grad
# ``(out_grad, data, gamma) -> (d data, d gamma, d beta)`` in one kernel each, as ATen's
# native_layer_norm_backward / native_batch_norm_backward (training): the statistics over the normalised
# axes (layer norm: ``axis``; batch norm: every axis but ``axis``) are recomputed from the data. gamma and
# beta lie along ``axis``; d gamma / d beta are zeros when ``scale`` / ``center`` is off.


@dataclass(frozen=True)
class BatchNormGradAttrs(LayerNormAttrs):
    axis: int = 1


def _stat_axes(layer: bool, ndim: int, axis: int) -> tuple:
    return (axis,) if layer else _other_axes(ndim, axis)


def _norm_grad_infer(op: str):
    def infer(arg_types, attrs):
        g, x = float_arg(op, arg_types, 0), float_arg(op, arg_types, 1)
        same_dtype(op, arg_types)
        if not same_shape(g, x):
            raise type_error(op, arg_types, f"the output gradient must have the data's shape {x.shape}, got {g.shape}")
        axis = normalize_axis(op, attrs.axis, x.ndim, arg_types)
        _vec_arg(op, arg_types, 2, x, axis)
        v = TensorType((x.shape[axis],), x.dtype)
        return TupleType((x, v, v))

    return infer


def _norm_grad_kernel(layer: bool):
    def kernel(xp, g, x, gamma, a):
        dt = x.dtype
        g, x, gamma = widen16(xp, g), widen16(xp, x), widen16(xp, gamma)
        axis = a.axis % x.ndim
        stat, others = _stat_axes(layer, x.ndim, axis), _other_axes(x.ndim, axis)
        xc = x - xp.mean(x, axis=stat, keepdims=True)
        rstd = 1.0 / xp.sqrt(xp.mean(xc * xc, axis=stat, keepdims=True) + a.epsilon)
        xhat = xc * rstd
        gx = g * _vec(gamma, x.ndim, axis) if a.scale else g
        dx = rstd * (gx - xp.mean(gx, axis=stat, keepdims=True) - xhat * xp.mean(gx * xhat, axis=stat, keepdims=True))
        dgamma = xp.sum(g * xhat, axis=others) if a.scale else xp.zeros_like(gamma)
        dbeta = xp.sum(g, axis=others) if a.center else xp.zeros_like(gamma)
        return tuple(as_dtype(xp, v, dt) for v in (dx, dgamma, dbeta))

    return kernel


def _layer_norm_grad_numpy(g, x, gamma, a):
    """Row blocks (normalised axis last, float32/64): about a dozen in-cache passes in two buffers."""
    if not _rows_ok(x, a):
        return _norm_grad_kernel(True)(np, g, x, gamma, a)
    g2, x2 = as_rows(g), as_rows(x)
    if (res := numba_kernels.layer_norm_grad(g2, x2, gamma, a)) is not None:
        return res[0].reshape(x.shape), res[1], res[2]
    n = x.dtype.type(x2.shape[1])
    dx = np.empty_like(x2)
    dgamma, dbeta = np.zeros_like(gamma), np.zeros_like(gamma)
    for r in row_blocks(*x2.shape):
        gb, out = g2[r], dx[r]
        xh, rstd = _normalized_rows(x2[r], a.epsilon)
        if a.center:
            dbeta += sum_except(1, gb)
        if a.scale:
            dgamma += sum_except(1, gb, xh)
            np.multiply(gb, gamma, out=out)
        else:
            np.copyto(out, gb)
        m1 = sum_along(out, 1)
        m1 /= n
        m2 = np.vecdot(out, xh)[:, None]
        m2 /= n
        xh *= m2  # dx = rstd (gx - m1 - xhat m2)
        xh += m1
        out -= xh
        out *= rstd
    return dx.reshape(x.shape), dgamma, dbeta


def _batch_norm_grad_numpy(g, x, gamma, a):
    """dx = k g + b xc + c per channel: the statistics and both parameter gradients by einsum, two buffers."""
    if x.dtype == np.float16:
        return _norm_grad_kernel(False)(np, g, x, gamma, a)
    axis, nd = a.axis % x.ndim, x.ndim
    n = x.dtype.type(max(x.size // max(x.shape[axis], 1), 1))
    xc = np.subtract(x, along(sum_except(axis, x) / n, nd, axis))
    rstd = 1 / np.sqrt(sum_except(axis, xc, xc) / n + a.epsilon)
    sg = sum_except(axis, g)  # d beta
    sgx = sum_except(axis, g, xc)
    k = gamma * rstd if a.scale else rstd
    xc *= along(-k * rstd * rstd * sgx / n, nd, axis)
    xc += along(-k * sg / n, nd, axis)
    out = np.multiply(g, along(k, nd, axis))
    out += xc
    dgamma = sgx * rstd if a.scale else np.zeros_like(gamma)
    dbeta = sg if a.center else np.zeros_like(gamma)
    return out, dgamma.astype(x.dtype, copy=False), dbeta.astype(x.dtype, copy=False)


def _aten_results(res, gamma, a) -> tuple:
    dx, dgamma, dbeta = res
    if a.scale and a.center:
        return dx, dgamma, dbeta
    zero = gamma.new_zeros(gamma.shape)
    return dx, dgamma if a.scale else zero, dbeta if a.center else zero


def _layer_norm_grad_torch(g, x, gamma, a):
    """ATen's native_layer_norm_backward (normalised axis last; float32/64); mean and rstd from ATen's forward."""
    import torch

    if a.axis % x.ndim != x.ndim - 1 or x.dtype not in (torch.float32, torch.float64):
        return _norm_grad_kernel(True)(array_namespace("torch"), g, x, gamma, a)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], None, None, a.epsilon)  # var_mean is 10x slower
    res = torch.ops.aten.native_layer_norm_backward(g, x, [x.shape[-1]], mean, rstd, gamma if a.scale else None,
                                                    gamma if a.center else None,  # (its values are not read)
                                                    [True, a.scale, a.center])
    return _aten_results(res, gamma, a)


def _batch_norm_grad_torch(g, x, gamma, a):
    """ATen's native_batch_norm_backward in training mode (channels on axis 1; float32/64)."""
    import torch

    if a.axis % x.ndim != 1 or x.dtype not in (torch.float32, torch.float64):
        return _norm_grad_kernel(False)(array_namespace("torch"), g, x, gamma, a)
    mean, var = torch.ops.aten.batch_norm_update_stats(x, None, None, 0.0)  # biased variance; var_mean is 5x slower
    last = torch.channels_last
    if x.ndim == 4 and x.is_contiguous(memory_format=last) != g.is_contiguous(memory_format=last):
        # one layout, NCHW: ATen's kernel for mixed ones is slower than converting one of them first (measured on
        # (32, 32, 16, 16): 1.18 ms mixed, 0.23 ms converting the channels-last one; 1.57 against 1.23 ms on
        # (32, 16, 32, 32), where converting to channels-last would gain nothing)
        g, x = g.contiguous(), x.contiguous()
    res = torch.ops.aten.native_batch_norm_backward(g, x, gamma if a.scale else None, None, None, mean,
                                                    torch.rsqrt(var + a.epsilon), True, a.epsilon,
                                                    [True, a.scale, a.center])
    return _aten_results(res, gamma, a)


def _norm_grad_grad(layer: bool):
    """Gradient of ``(dx, dgamma, dbeta)`` = ``F(g, x, gamma)`` for cotangents ``(hx, hgamma, hbeta)``.

    With xhat = (x - mean) rstd over the statistics axes S, gx = g gamma, means m1 = mean_S(gx),
    m2 = mean_S(gx xhat), a1 = mean_S(hx), a2 = mean_S(hx xhat) and P(v) = rstd (v - mean_S(v) - xhat
    mean_S(v xhat)) (the projection dx applies to gx):
    d/dg = gamma P(hx) + hgamma xhat + hbeta; d/dgamma = sum(g P(hx)); with H = hgamma g - rstd (a2 gx + m2 hx)
    (the cotangent of xhat), d/dx = P(H) - rstd^2 xhat (mean_S(hx gx) - a1 m1 - a2 m2).
    """

    def grad(call: Call, h: Expr):
        g, x, gamma = call.args
        a = call.attrs
        ndim = x.checked_type.ndim
        axis = a.axis % ndim
        stat, others = _stat_axes(layer, ndim, axis), _other_axes(ndim, axis)
        hx, hgam, hbeta = nonzero(field(h, 0)), nonzero(field(h, 1)), nonzero(field(h, 2))
        hgam = hgam if a.scale else None
        hbeta = hbeta if a.center else None
        n = count(x, stat)

        def mean(v):
            return R.sum(v, stat, True) / n

        xc, rstd = _stats(x, stat, a.epsilon)
        xhat = xc * rstd

        def project(v):
            return rstd * (v - mean(v) - xhat * mean(v * xhat))

        gam = _as_axis_vec(gamma, ndim, axis) if a.scale else None
        gx = g * gam if a.scale else g
        dg = dgamma = dx = hxhat = None
        terms = []
        if hx is not None:
            p = project(hx)
            terms.append(gam * p if a.scale else p)
            dgamma = R.sum(g * p, others) if a.scale else None
            m2, a2 = mean(gx * xhat), mean(hx * xhat)
            hxhat = E.negative(rstd * (a2 * gx + m2 * hx))
            dx = rstd * rstd * xhat * (mean(hx * gx) - mean(hx) * mean(gx) - a2 * m2)
        if hgam is not None:
            hg = _as_axis_vec(hgam, ndim, axis)
            terms.append(hg * xhat)
            hxhat = hg * g if hxhat is None else hxhat + hg * g
        if hbeta is not None:
            terms.append(T.broadcast_to_like(_as_axis_vec(hbeta, ndim, axis), x))
        for t in terms:
            dg = t if dg is None else dg + t
        if hxhat is not None:
            px = project(hxhat)
            dx = px if dx is None else px - dx
        return [dg, dx, dgamma]

    return grad


def _norm_grad_op(name: str, layer: bool, attrs_type, impls: dict, torch_name: str, doc: str):
    return defop(name, 3, _norm_grad_infer(name), kernel=_norm_grad_kernel(layer), impls=impls, attrs_type=attrs_type,
                 grad=_norm_grad_grad(layer), pattern=FusionKind.OPAQUE, flops=lambda ts, out, a: 12 * numel(ts[1].shape),
                 dtypes=FLOAT_DTYPES, torch_name=torch_name, doc=doc)


layer_norm_grad = _norm_grad_op(
    "nn.layer_norm_grad", True, LayerNormAttrs, {"numpy": _layer_norm_grad_numpy, "torch": _layer_norm_grad_torch},
    "native_layer_norm_backward",
    "Gradient of ``nn.layer_norm``: ``(out_grad, data, gamma) -> (d data, d gamma, d beta)`` in one kernel.")
batch_norm_grad = _norm_grad_op(
    "nn.batch_norm_grad", False, BatchNormGradAttrs, {"numpy": _batch_norm_grad_numpy, "torch": _batch_norm_grad_torch},
    "native_batch_norm_backward",
    "Gradient of ``nn.batch_norm(training=True)``'s output: ``(out_grad, data, gamma) -> (d data, d gamma, d beta)``.")
