"""Normalisation: ``nn.layer_norm`` and ``nn.batch_norm``, and PyTorch's ``native_*`` forms that keep their statistics.

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
in-place passes on NumPy). ``nn.native_layer_norm`` / ``nn.native_batch_norm``
also return the statistics they normalised with (mean and rstd), and their
gradients ``nn.native_*_norm_grad`` read them instead (what the PyTorch importer
emits: the backward does not recompute what the forward computed; on ATen a
layer norm's gradient 0.27 -> 0.08 ms, a batch norm's 0.73 -> 0.17 ms on
(32, 16, 32, 32)). Their own gradients, the inference-mode gradient of
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
from .registry import FusionKind, OpDef, array_namespace, defop, type_error

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


def _stats_type(layer: bool, x: TensorType, axis: int) -> TensorType:
    """The type of the statistics a normalisation keeps: layer norm's keep the data's rank (the normalised
    axis of size 1), batch norm's are per-channel vectors."""
    if layer:
        return TensorType(x.shape[:axis] + (1,) + x.shape[axis + 1:], x.dtype)
    return TensorType((x.shape[axis],), x.dtype)


def _layer_norm_infer(op: str, native: bool = False):
    def infer(arg_types, attrs):
        x = float_arg(op, arg_types, 0)
        same_dtype(op, arg_types)
        axis = normalize_axis(op, attrs.axis, x.ndim, arg_types)
        for i in (1, 2):
            _vec_arg(op, arg_types, i, x, axis)
        if not native:
            return x
        s = _stats_type(True, x, axis)
        return TupleType((x, s, s))

    return infer


def _moments(xp, x, axes: tuple, eps: float) -> tuple:
    """``(mean, rstd)`` over ``axes`` (kept), the biased variance about the mean."""
    mean = xp.mean(x, axis=axes, keepdims=True)
    xc = x - mean
    return mean, 1.0 / xp.sqrt(xp.mean(xc * xc, axis=axes, keepdims=True) + eps)


def _affine(out, gamma, beta, a, ndim: int, axis: int):
    if a.scale:
        out = out * _vec(gamma, ndim, axis)
    return out + _vec(beta, ndim, axis) if a.center else out


def _native_layer_norm_kernel(xp, x, gamma, beta, a):
    """Layer norm written once for any array namespace ``xp``: (out, mean, rstd), the statistics kept."""
    axis = a.axis % x.ndim
    xw = widen16(xp, x)
    mean, rstd = _moments(xp, xw, (axis,), a.epsilon)
    out = _affine((xw - mean) * rstd, gamma, beta, a, x.ndim, axis)
    return tuple(as_dtype(xp, v, x.dtype) for v in (out, mean, rstd))


def _layer_norm_kernel(xp, x, gamma, beta, a):
    return _native_layer_norm_kernel(xp, x, gamma, beta, a)[0]


def _rows_ok(x, a) -> bool:
    """The NumPy row-block kernels apply: normalised axis last, float32/64."""
    return x.ndim > 0 and a.axis % x.ndim == x.ndim - 1 and x.dtype in (np.float32, np.float64)


def _normalized_rows(x, eps: float, out=None) -> tuple:
    """(xhat (in ``out`` if given), mean (rows, 1), rstd (rows, 1)) of a block of rows."""
    n = x.dtype.type(x.shape[1])
    mean = sum_along(x, 1) / n
    xh = np.subtract(x, mean, out=out)
    rstd = np.vecdot(xh, xh)[:, None]
    rstd /= n
    rstd += x.dtype.type(eps)
    np.sqrt(rstd, out=rstd)
    np.reciprocal(rstd, out=rstd)
    xh *= rstd
    return xh, mean, rstd


def _native_layer_norm_numpy(x, gamma, beta, a):
    """Row blocks (normalised axis last, float32/64), in place in the result; the rows' statistics kept."""
    if not _rows_ok(x, a):
        return _native_layer_norm_kernel(np, x, gamma, beta, a)
    x2 = as_rows(x)
    stats_shape = x.shape[:-1] + (1,)
    res = numba_kernels.layer_norm(x2, gamma, beta, a)
    if res is not None:
        return res[0].reshape(x.shape), res[1].reshape(stats_shape), res[2].reshape(stats_shape)
    out = np.empty_like(x2)
    mean, rstd = np.empty((x2.shape[0], 1), x.dtype), np.empty((x2.shape[0], 1), x.dtype)
    for r in row_blocks(*x2.shape):
        ob = out[r]
        _, mean[r], rstd[r] = _normalized_rows(x2[r], a.epsilon, out=ob)
        if a.scale:
            ob *= gamma
        if a.center:
            ob += beta
    return out.reshape(x.shape), mean.reshape(stats_shape), rstd.reshape(stats_shape)


def _layer_norm_numpy(x, gamma, beta, a):
    return _native_layer_norm_numpy(x, gamma, beta, a)[0]


def _aten_layer_norm(x, a) -> bool:
    """ATen's fused layer norm applies: normalised axis last, float32/64 or bfloat16 (computed in float32)."""
    import torch

    return a.axis % x.ndim == x.ndim - 1 and x.dtype in (torch.float32, torch.float64, torch.bfloat16)


def _on_torch(kernel, *args):
    """``kernel(xp, *args)`` on the torch namespace; bfloat16 tensors computed in float32 and the results rounded
    back, as ATen's kernels compute them (the shared kernel is several torch calls: each would round)."""
    import torch

    xp = array_namespace("torch")
    if not any(isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 for t in args):
        return kernel(xp, *args)
    out = kernel(xp, *[t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 else t for t in args])
    return tuple(o.bfloat16() for o in out) if isinstance(out, tuple) else out.bfloat16()


def _layer_norm_torch(x, gamma, beta, a):
    """ATen's fused kernel when the normalised axis is the last one."""
    if a.axis % x.ndim != x.ndim - 1:
        return _on_torch(_layer_norm_kernel, x, gamma, beta, a)
    import torch.nn.functional as F

    return F.layer_norm(x, (x.shape[-1],), gamma if a.scale else None, beta if a.center else None, a.epsilon)


def _native_layer_norm_torch(x, gamma, beta, a):
    """ATen's ``native_layer_norm``: the output, the rows' mean and rstd."""
    if not _aten_layer_norm(x, a):
        return _on_torch(_native_layer_norm_kernel, x, gamma, beta, a)
    import torch

    return tuple(torch.ops.aten.native_layer_norm(x, [x.shape[-1]], gamma if a.scale else None,
                                                  beta if a.center else None, a.epsilon))


def _fields_of(t: Expr, a) -> list:
    """``[dx, dgamma or None, dbeta or None]`` of a ``(dx, dgamma, dbeta)`` gradient call (None: no scale/center)."""
    return [TupleGetItem(t, 0), TupleGetItem(t, 1) if a.scale else None, TupleGetItem(t, 2) if a.center else None]


def _layer_norm_grad(call: Call, g: Expr):
    x, gamma, beta = call.args
    a = call.attrs
    return _fields_of(layer_norm_grad(g, x, gamma, a.axis, a.epsilon, a.center, a.scale), a)


layer_norm = defop("nn.layer_norm", 3, _layer_norm_infer("nn.layer_norm"), kernel=_layer_norm_kernel,
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


def _batch_norm_infer(op: str, native: bool = False):
    def infer(arg_types, attrs):
        x = float_arg(op, arg_types, 0)
        same_dtype(op, arg_types)
        axis = normalize_axis(op, attrs.axis, x.ndim, arg_types)
        for i in range(1, 5):
            _vec_arg(op, arg_types, i, x, axis)
        v = _stats_type(False, x, axis)
        return TupleType((x, v, v, v, v) if native else (x, v, v))

    return infer


def batch_norm_math(xp, x, gamma, beta, mm, mv, a):
    """Batch norm written once for any array namespace ``xp``: (out, new moving mean, new moving var, mean,
    rstd), the last two the statistics it normalised with (the batch's in training, the moving ones else)."""
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
    rstd = 1.0 / xp.sqrt(var + a.epsilon)
    out = _affine((x - _vec(mean, x.ndim, axis)) * _vec(rstd, x.ndim, axis), gamma, beta, a, x.ndim, axis)
    return out, new_mm, new_mv, mean, rstd


def _per_channel(x, axis: int) -> int:
    """Number of entries per channel (the batch statistics' sample size)."""
    return math.prod(x.shape) // max(x.shape[axis], 1)


def _native_batch_norm_kernel(xp, x, gamma, beta, mm, mv, a):
    return tuple(as_dtype(xp, v, x.dtype) for v in batch_norm_math(xp, widen16(xp, x), gamma, beta, mm, mv, a))


def _batch_norm_kernel(xp, x, gamma, beta, mm, mv, a):
    return _native_batch_norm_kernel(xp, x, gamma, beta, mm, mv, a)[:3]


def _native_batch_norm_numpy(x, gamma, beta, mm, mv, a):
    """Statistics by einsum, then ``x * k + c`` per channel in the result's buffer (float32/64)."""
    if x.dtype not in (np.float32, np.float64) or x.size == 0:
        return _native_batch_norm_kernel(np, x, gamma, beta, mm, mv, a)
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
    rstd = 1 / np.sqrt(var + a.epsilon)
    k = rstd * gamma if a.scale else rstd
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
    return (out,) + tuple(np.asarray(v, x.dtype) for v in (new_mm, new_mv, mean, rstd))


def _batch_norm_numpy(x, gamma, beta, mm, mv, a):
    return _native_batch_norm_numpy(x, gamma, beta, mm, mv, a)[:3]


def _native_batch_norm_torch(x, gamma, beta, mm, mv, a, stats: bool = True):
    """ATen's ``native_batch_norm`` for channels on axis 1 (it updates the moving statistics in place: of
    copies); ``stats=False``: ``nn.batch_norm``'s three results."""
    axis = a.axis % x.ndim
    if axis != 1 or (a.training and _per_channel(x, axis) < 2):  # ATen rejects one value per channel
        res = _on_torch(_native_batch_norm_kernel, x, gamma, beta, mm, mv, a)
        return res if stats else res[:3]
    import torch

    if a.training:
        mm, mv = mm.clone(), mv.clone()
    out, mean, rstd = torch.ops.aten.native_batch_norm(x, gamma if a.scale else None, beta if a.center else None, mm, mv,
                                                       a.training, a.momentum, a.epsilon)
    if not stats:
        return out, mm, mv
    if not a.training:  # ATen keeps no statistics in evaluation
        mean, rstd = mm, torch.rsqrt(mv + a.epsilon)
    return out, mm, mv, mean, rstd


def _batch_norm_torch(x, gamma, beta, mm, mv, a):
    return _native_batch_norm_torch(x, gamma, beta, mm, mv, a, stats=False)


def _add(a, b):
    """``a + b`` where None stands for zero."""
    return b if a is None else a if b is None else a + b


def _stats_terms(x: Expr, layer: bool, axis: int, mean: Expr, rstd: Expr, gm, gr):
    """The data's cotangent from cotangents ``gm``, ``gr`` (None: zero) of the statistics a normalisation
    kept: mean = mean_S(x), rstd = (mean_S((x - mean)^2) + eps)^(-1/2) over the statistics axes S."""
    ndim = x.checked_type.ndim
    vec = (lambda v: v) if layer else (lambda v: _as_axis_vec(v, ndim, axis))
    n = count(x, _stat_axes(layer, ndim, axis))
    term = None if gm is None else T.broadcast_to_like(vec(gm) / n, x)
    if gr is not None:
        r = vec(rstd)
        term = _add(term, E.negative(vec(gr) * r * r * r * (x - vec(mean)) / n))
    return term


def _native_layer_norm_grad(call: Call, g: Expr):
    x, gamma, _ = call.args
    a = call.attrs
    gy, gm, gr = (nonzero(field(g, i)) for i in range(3))
    mean, rstd = TupleGetItem(call, 1), TupleGetItem(call, 2)
    out = [None] * 3
    if gy is not None:
        out = _fields_of(native_layer_norm_grad(gy, x, gamma, mean, rstd, a.axis, a.epsilon, a.center, a.scale), a)
    out[0] = _add(out[0], _stats_terms(x, True, a.axis % x.checked_type.ndim, mean, rstd, gm, gr))
    return out


def _batch_norm_grad(call: Call, g: Expr):
    gy, gmm, gmv = field(g, 0), field(g, 1), field(g, 2)
    if call.attrs.training:
        return _batch_norm_training_grad(call, nonzero(gy), nonzero(gmm), nonzero(gmv))
    return _batch_norm_eval_grad(call, gy, gmm, gmv)


def _native_batch_norm_grad(call: Call, g: Expr):
    """``nn.batch_norm``'s gradient, the statistics it kept read by the training-mode gradient, and their own
    cotangents' terms (the batch's statistics in training; in evaluation the moving mean and
    ``(moving var + eps)^(-1/2)``)."""
    x = call.args[0]
    a = call.attrs
    gy, gmm, gmv, gm, gr = (field(g, i) for i in range(5))
    gm, gr = nonzero(gm), nonzero(gr)
    mean, rstd = TupleGetItem(call, 3), TupleGetItem(call, 4)
    if a.training:
        out = _batch_norm_training_grad(call, nonzero(gy), nonzero(gmm), nonzero(gmv), (mean, rstd))
        out[0] = _add(out[0], _stats_terms(x, False, a.axis % x.checked_type.ndim, mean, rstd, gm, gr))
        return out
    out = _batch_norm_eval_grad(call, gy, gmm, gmv)
    out[3] = _add(out[3], gm)
    if gr is not None:
        out[4] = _add(out[4], E.negative(gr * rstd * rstd * rstd * scalar(0.5, x)))
    return out


def _batch_norm_eval_grad(call: Call, gy, gmm, gmv) -> list:
    """Evaluation mode: normalised with the moving statistics, which pass through unchanged."""
    x, gamma, beta, mm, mv = call.args[:5]
    a = call.attrs
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


def _batch_norm_training_grad(call: Call, gy, gmm, gmv, saved=None) -> list:
    """Training mode: ``nn.batch_norm_grad`` for the normalised output (``nn.native_batch_norm_grad`` with the
    ``saved`` statistics ``(mean, rstd)`` when given); the moving statistics ``(1-m) moving + m batch``
    (unbiased batch variance) add their own terms where their cotangents are not zeros."""
    x, gamma = call.args[:2]
    a = call.attrs
    ndim = x.checked_type.ndim
    axis = a.axis % ndim
    out = [None] * 5
    if gy is not None:
        grad = (batch_norm_grad(gy, x, gamma, a.axis, a.epsilon, a.center, a.scale) if saved is None else
                native_batch_norm_grad(gy, x, gamma, *saved, a.axis, a.epsilon, a.center, a.scale))
        out[:3] = _fields_of(grad, a)
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


batch_norm = defop("nn.batch_norm", 5, _batch_norm_infer("nn.batch_norm"), kernel=_batch_norm_kernel,
                   impls={"numpy": _batch_norm_numpy, "torch": _batch_norm_torch},
                   attrs_type=BatchNormAttrs,
                   grad=_batch_norm_grad, pattern=FusionKind.OPAQUE,
                   flops=lambda ts, out, a: 8 * numel(ts[0].shape), torch_name="batch_norm")

# ------------------------------------------------------------------ statistics kept for the backward
# PyTorch's native_layer_norm / native_batch_norm: the normalisation also returns the statistics it normalised with
# (mean and rstd = (biased variance + eps)^(-1/2); layer norm's keep the data's rank with the normalised axis of
# size 1, batch norm's are per-channel vectors), and the gradient reads them instead of recomputing them from the
# data (``nn.native_layer_norm_grad`` / ``nn.native_batch_norm_grad``, ATen's native_*_backward). The importer maps
# PyTorch's layer and batch norms (training) to them, so a training step's backward reads what its forward computed.

def _native_op(layer: bool, kernel, impls: dict, grad, doc: str):
    name, n = ("nn.native_layer_norm", 3) if layer else ("nn.native_batch_norm", 5)
    infer = (_layer_norm_infer if layer else _batch_norm_infer)(name, native=True)
    return defop(name, n, infer, kernel=kernel, impls=impls, attrs_type=LayerNormAttrs if layer else BatchNormAttrs,
                 grad=grad, pattern=FusionKind.OPAQUE, flops=lambda ts, out, a: 8 * numel(ts[0].shape),
                 torch_name=name[3:], doc=doc)


native_layer_norm = _native_op(
    True, _native_layer_norm_kernel, {"numpy": _native_layer_norm_numpy, "torch": _native_layer_norm_torch},
    _native_layer_norm_grad,
    "``nn.layer_norm`` that also returns the statistics it normalised with: ``(out, mean, rstd)``, both of the "
    "data's shape with ``axis`` of size 1; its gradient reads them (``nn.native_layer_norm_grad``).")
native_batch_norm = _native_op(
    False, _native_batch_norm_kernel, {"numpy": _native_batch_norm_numpy, "torch": _native_batch_norm_torch},
    _native_batch_norm_grad,
    "``nn.batch_norm`` that also returns the per-channel statistics it normalised with: ``(out, new_moving_mean, "
    "new_moving_var, mean, rstd)`` (the batch's in training, the moving ones else); in training its gradient "
    "reads them (``nn.native_batch_norm_grad``).")

# (mean, rstd) fields of each native normalisation
_STATISTICS = {native_layer_norm: (1, 2), native_batch_norm: (3, 4)}


def output_from_statistics(node: Expr, operand=None):
    """``(x - mean) * rstd * gamma + beta``, elementwise from the statistics the call returned, for the output
    ``node`` (field 0) of a float32/64 ``nn.native_layer_norm`` or ``nn.native_batch_norm``; else None.
    ``operand(arg)``: the expression to read for each of the call's ``x``, ``gamma``, ``beta`` (default: itself).
    The forward-backward partitioner recomputes normalised outputs so in the backward instead of saving them."""
    if not (isinstance(node, TupleGetItem) and node.index == 0 and isinstance(node.tuple_value, Call)):
        return None
    call = node.tuple_value
    fields = _STATISTICS.get(call.op) if isinstance(call.op, OpDef) else None
    if fields is None:
        return None
    x, gamma, beta = (arg if operand is None else operand(arg) for arg in call.args[:3])
    t = x.checked_type
    if not isinstance(t, TensorType) or t.dtype not in ("float32", "float64"):
        return None
    a, ndim = call.attrs, t.ndim
    axis = a.axis % ndim
    mean, rstd = (TupleGetItem(call, i) for i in fields)
    if call.op is native_batch_norm:  # per channel ``x * k + c``, as ATen's kernel and the NumPy one: two passes
        k = rstd * gamma if a.scale else rstd
        c = beta - mean * k if a.center else E.negative(mean * k)
        return x * _as_axis_vec(k, ndim, axis) + _as_axis_vec(c, ndim, axis)
    out = (x - mean) * rstd  # per row (the statistics keep the data's rank)
    if a.scale:
        out = out * _as_axis_vec(gamma, ndim, axis)
    return out + _as_axis_vec(beta, ndim, axis) if a.center else out


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


def _norm_grad_infer(op: str, layer: bool, saved: bool):
    def infer(arg_types, attrs):
        g, x = float_arg(op, arg_types, 0), float_arg(op, arg_types, 1)
        same_dtype(op, arg_types)
        if not same_shape(g, x):
            raise type_error(op, arg_types, f"the output gradient must have the data's shape {x.shape}, got {g.shape}")
        axis = normalize_axis(op, attrs.axis, x.ndim, arg_types)
        _vec_arg(op, arg_types, 2, x, axis)
        if saved:
            s = _stats_type(layer, x, axis)
            for i, what in ((3, "mean"), (4, "rstd")):
                t = float_arg(op, arg_types, i)
                if not same_shape(t, s):
                    raise type_error(op, arg_types, f"the {what} (argument {i}) must have shape {s.shape}, got {t.shape}")
        v = TensorType((x.shape[axis],), x.dtype)
        return TupleType((x, v, v))

    return infer


def _saved_grad_kernel(layer: bool):
    def kernel(xp, g, x, gamma, mean, rstd, a):
        dt = x.dtype
        g, x, gamma, mean, rstd = (widen16(xp, v) for v in (g, x, gamma, mean, rstd))
        axis = a.axis % x.ndim
        stat, others = _stat_axes(layer, x.ndim, axis), _other_axes(x.ndim, axis)
        if not layer:
            mean, rstd = _vec(mean, x.ndim, axis), _vec(rstd, x.ndim, axis)
        xhat = (x - mean) * rstd
        gx = g * _vec(gamma, x.ndim, axis) if a.scale else g
        dx = rstd * (gx - xp.mean(gx, axis=stat, keepdims=True) - xhat * xp.mean(gx * xhat, axis=stat, keepdims=True))
        dgamma = xp.sum(g * xhat, axis=others) if a.scale else xp.zeros_like(gamma)
        dbeta = xp.sum(g, axis=others) if a.center else xp.zeros_like(gamma)
        return tuple(as_dtype(xp, v, dt) for v in (dx, dgamma, dbeta))

    return kernel


def _norm_grad_kernel(layer: bool):
    return lambda xp, g, x, gamma, a: _shared_grad(layer, xp, g, x, gamma, a, None, None)


def _recomputed(xp, layer: bool, x, a) -> tuple:
    """The statistics a normalisation kept (``nn.native_*_norm``), recomputed from the data."""
    axis = a.axis % x.ndim
    mean, rstd = _moments(xp, widen16(xp, x), _stat_axes(layer, x.ndim, axis), a.epsilon)
    return (mean, rstd) if layer else (xp.reshape(mean, (-1,)), xp.reshape(rstd, (-1,)))


def _shared_grad(layer: bool, xp, g, x, gamma, a, mean, rstd) -> tuple:
    """The shared kernel of the gradient, the statistics recomputed (``mean`` None) or given: where a target's
    own kernel does not apply (another axis, another dtype)."""
    if mean is None:
        mean, rstd = _recomputed(xp, layer, x, a)
    return _saved_grad_kernel(layer)(xp, g, x, gamma, mean, rstd, a)


def _layer_norm_grad_numpy(g, x, gamma, a, mean=None, rstd=None):
    """Row blocks (normalised axis last, float32/64): about a dozen in-cache passes in two buffers; the rows'
    statistics recomputed, or given (``mean``, ``rstd``: ``nn.native_layer_norm_grad``)."""
    if not _rows_ok(x, a):
        return _shared_grad(True, np, g, x, gamma, a, mean, rstd)
    g2, x2 = as_rows(g), as_rows(x)
    if mean is not None:
        mean, rstd = mean.reshape(-1, 1), rstd.reshape(-1, 1)
    if (res := numba_kernels.layer_norm_grad(g2, x2, gamma, a, mean, rstd)) is not None:
        return res[0].reshape(x.shape), res[1], res[2]
    n = x.dtype.type(x2.shape[1])
    dx = np.empty_like(x2)
    dgamma, dbeta = np.zeros_like(gamma), np.zeros_like(gamma)
    for r in row_blocks(*x2.shape):
        gb, out = g2[r], dx[r]
        if mean is None:
            xh, _, rs = _normalized_rows(x2[r], a.epsilon)
        else:
            rs = rstd[r].astype(x.dtype, copy=False)
            xh = (x2[r] - mean[r]) * rs
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
        out *= rs
    return dx.reshape(x.shape), dgamma, dbeta


def _batch_norm_grad_numpy(g, x, gamma, a, mean=None, rstd=None):
    """dx = k g + b xc + c per channel: the statistics (recomputed, or given: ``nn.native_batch_norm_grad``) and
    both parameter gradients by einsum, two buffers."""
    if x.dtype == np.float16:
        return _shared_grad(False, np, g, x, gamma, a, mean, rstd)
    axis, nd = a.axis % x.ndim, x.ndim
    n = x.dtype.type(max(x.size // max(x.shape[axis], 1), 1))
    xc = np.subtract(x, along(sum_except(axis, x) / n if mean is None else mean.astype(x.dtype, copy=False), nd, axis))
    if rstd is None:
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


def _layer_norm_grad_torch(g, x, gamma, a, mean=None, rstd=None):
    """ATen's native_layer_norm_backward (normalised axis last; float32/64, bfloat16); mean and rstd given, or from
    ATen's forward."""
    import torch

    if not _aten_layer_norm(x, a):
        return _on_torch(lambda xp, *t: _shared_grad(True, xp, *t), g, x, gamma, a, mean, rstd)
    if mean is None:
        _, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], None, None, a.epsilon)  # var_mean: 10x slower
    else:  # ATen reads the statistics as contiguous memory whatever their strides (a strided view: wrong gradients)
        mean, rstd = mean.contiguous(), rstd.contiguous()
    res = torch.ops.aten.native_layer_norm_backward(g, x, [x.shape[-1]], mean, rstd, gamma if a.scale else None,
                                                    gamma if a.center else None,  # (its values are not read)
                                                    [True, a.scale, a.center])
    return _aten_results(res, gamma, a)


def _batch_norm_grad_torch(g, x, gamma, a, mean=None, rstd=None):
    """ATen's native_batch_norm_backward in training mode (channels on axis 1; float32/64, bfloat16); mean and rstd
    given, or recomputed. An empty batch takes the shared kernel: ATen's divides by the element count, a
    floating-point exception that ends the process (eager's autograd never calls it there)."""
    import torch

    if a.axis % x.ndim != 1 or x.dtype not in (torch.float32, torch.float64, torch.bfloat16) or not x.numel():
        return _on_torch(lambda xp, *t: _shared_grad(False, xp, *t), g, x, gamma, a, mean, rstd)
    wide = mean is None and x.dtype == torch.bfloat16
    if mean is None:
        # biased variance (var_mean: 5x slower); of bfloat16 data in float32 (ATen gives statistics in the dtype of
        # the running ones: float32 dummies, left as they are by a momentum of 0), then with a float32 gamma: ATen's
        # mixed-type kernel, whose input gradient then rounds once, as the numpy target's (from bfloat16 statistics
        # it was up to 3x further from float64's)
        c = x.shape[1]
        running = (x.new_zeros(c, dtype=torch.float32), x.new_ones(c, dtype=torch.float32)) if wide else (None, None)
        mean, var = torch.ops.aten.batch_norm_update_stats(x, *running, 0.0)
        rstd = torch.rsqrt(var + a.epsilon)
    last = torch.channels_last
    if x.ndim == 4 and x.is_contiguous(memory_format=last) != g.is_contiguous(memory_format=last):
        # one layout, NCHW: ATen's kernel for mixed ones is slower than converting one of them first (measured on
        # (32, 32, 16, 16): 1.18 ms mixed, 0.23 ms converting the channels-last one; 1.57 against 1.23 ms on
        # (32, 16, 32, 32), where converting to channels-last would gain nothing)
        g, x = g.contiguous(), x.contiguous()
    weight = (gamma.float() if wide else gamma) if a.scale else None
    dx, dgamma, dbeta = torch.ops.aten.native_batch_norm_backward(g, x, weight, None, None, mean, rstd, True, a.epsilon,
                                                                  [True, a.scale, a.center])
    if wide:
        dgamma, dbeta = (t if t is None else t.to(gamma.dtype) for t in (dgamma, dbeta))
    return _aten_results((dx, dgamma, dbeta), gamma, a)


def _with_stats(fn):
    """``fn(g, x, gamma, a, mean, rstd)`` as the kernel of a gradient taking the statistics as operands."""
    return lambda g, x, gamma, mean, rstd, a: fn(g, x, gamma, a, mean, rstd)


def _grad_grad_setting(layer: bool, x: Expr, a, h: Expr) -> tuple:
    """``(ndim, axis, statistics axes, other axes, count over the statistics axes, (hx, hgamma, hbeta))`` for the
    gradient of a normalisation's gradient (a cotangent None where it is zero, or its parameter is off)."""
    ndim = x.checked_type.ndim
    axis = a.axis % ndim
    stat = _stat_axes(layer, ndim, axis)
    hx, hgam, hbeta = nonzero(field(h, 0)), nonzero(field(h, 1)), nonzero(field(h, 2))
    cts = (hx, hgam if a.scale else None, hbeta if a.center else None)
    return ndim, axis, stat, _other_axes(ndim, axis), count(x, stat), cts


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
        ndim, axis, stat, others, n, (hx, hgam, hbeta) = _grad_grad_setting(layer, x, a, h)

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


def _saved_grad_grad(layer: bool):
    """Gradient of ``(dx, dgamma, dbeta) = F(g, x, gamma, mean, rstd)``, the statistics being operands like the
    others: with xhat = (x - mean) rstd, gx = g gamma, B = mean_S(gx xhat), dx = rstd (gx - mean_S(gx) - xhat B).
    For cotangents ``(hx, hgamma, hbeta)`` and u = rstd hx, c = mean_S(u xhat): d/dgx = u - mean_S(u) - xhat c,
    d/dxhat = hgamma g - (u B + gx c), d/drstd = sum_S(hx dx / rstd) + sum_S(d/dxhat (x - mean)); then through
    xhat and gx (d/dx = rstd d/dxhat, d/dmean = -sum_S(rstd d/dxhat))."""

    def grad(call: Call, h: Expr):
        g, x, gamma, mean, rstd = call.args
        a = call.attrs
        ndim, axis, stat, others, n, (hx, hgam, hbeta) = _grad_grad_setting(layer, x, a, h)

        def mean_s(v):
            return R.sum(v, stat, True) / n

        def to_stat(v):  # summed to a statistic's shape
            return R.sum(v, stat, layer)

        vec = (lambda v: v) if layer else (lambda v: _as_axis_vec(v, ndim, axis))
        xc = x - vec(mean)
        r = vec(rstd)
        xhat = xc * r
        gam = _as_axis_vec(gamma, ndim, axis) if a.scale else None
        gx = g * gam if a.scale else g
        dg = dgamma = xhat_bar = r_bar = None
        if hx is not None:
            u = r * hx
            c = mean_s(u * xhat)
            gx_bar = u - mean_s(u) - xhat * c
            dg = gx_bar * gam if a.scale else gx_bar
            dgamma = R.sum(gx_bar * g, others) if a.scale else None
            b = mean_s(gx * xhat)
            xhat_bar = E.negative(u * b + gx * c)
            r_bar = to_stat(hx * (gx - mean_s(gx) - xhat * b))
        if hgam is not None:
            hg = _as_axis_vec(hgam, ndim, axis)
            dg = _add(dg, hg * xhat)
            xhat_bar = _add(xhat_bar, hg * g)
        if hbeta is not None:
            dg = _add(dg, T.broadcast_to_like(_as_axis_vec(hbeta, ndim, axis), x))
        dx = dmean = None
        if xhat_bar is not None:
            dx = xhat_bar * r
            dmean = E.negative(to_stat(dx))
            r_bar = _add(r_bar, to_stat(xhat_bar * xc))
        return [dg, dx, dgamma, dmean, r_bar]

    return grad


def _norm_grad_op(layer: bool, saved: bool, doc: str):
    """``nn.{layer,batch}_norm_grad`` (statistics recomputed) or ``nn.native_{layer,batch}_norm_grad`` (given)."""
    kind = "layer" if layer else "batch"
    name = f"nn.{'native_' if saved else ''}{kind}_norm_grad"
    impls = {"numpy": _layer_norm_grad_numpy, "torch": _layer_norm_grad_torch} if layer else {
        "numpy": _batch_norm_grad_numpy, "torch": _batch_norm_grad_torch}
    if saved:
        impls = {k: _with_stats(f) for k, f in impls.items()}
    return defop(name, 5 if saved else 3, _norm_grad_infer(name, layer, saved),
                 kernel=_saved_grad_kernel(layer) if saved else _norm_grad_kernel(layer), impls=impls,
                 attrs_type=LayerNormAttrs if layer else BatchNormGradAttrs,
                 grad=_saved_grad_grad(layer) if saved else _norm_grad_grad(layer), pattern=FusionKind.OPAQUE,
                 flops=lambda ts, out, a: 12 * numel(ts[1].shape), dtypes=FLOAT_DTYPES,
                 torch_name=f"native_{kind}_norm_backward", doc=doc)


layer_norm_grad = _norm_grad_op(
    True, False, "Gradient of ``nn.layer_norm``: ``(out_grad, data, gamma) -> (d data, d gamma, d beta)`` in one kernel.")
batch_norm_grad = _norm_grad_op(
    False, False,
    "Gradient of ``nn.batch_norm(training=True)``'s output: ``(out_grad, data, gamma) -> (d data, d gamma, d beta)``.")
native_layer_norm_grad = _norm_grad_op(
    True, True, "``nn.layer_norm_grad`` with the statistics ``nn.native_layer_norm`` kept: ``(out_grad, data, gamma, "
    "mean, rstd) -> (d data, d gamma, d beta)``.")
native_batch_norm_grad = _norm_grad_op(
    False, True, "``nn.batch_norm_grad`` with the statistics ``nn.native_batch_norm`` kept: ``(out_grad, data, gamma, "
    "mean, rstd) -> (d data, d gamma, d beta)``.")
