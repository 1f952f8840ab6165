"""ATen converters for neural-network operators: dropout and random draws, linear algebra, normalisation,
convolution (1-D, 2-D, 3-D, transposed), pooling (1-D to 3-D), attention, losses, embeddings, and the
``*_backward`` operators (through pullback's own gradient rules). Registered in ``aten_table.ATEN_TABLE``.
"""

from __future__ import annotations

import math
import warnings
from typing import Optional

import numpy as np

from ..analysis.type_infer import infer_expr
from ..ir.errors import PullbackError
from ..ir.expr import Constant, Expr, TupleGetItem, const
from ..ir.types import FLOAT_DTYPES, HALF_DTYPES, Any
from ..ops.common import broadcast_shapes
from ..ops.conv import single_tap
from ..ops.math import scaled
from ..ops.registry import is_call_to
from ..transform.eliminate_identity import uniform_value
from ..transform.recognize_ops import beside_causal, causal_mask, keeps_every_key
from .aten_table import (_isinf, _op, aten, by_number, cast, dynamic_range, expand_to, newshape, reshape_to, safe_softmax,
                         scalar, static)
from .context import size_key, static_dim

# ------------------------------------------------------------------ dropout and random draws


def _stride(cx, i: int = 0):
    """The strides of argument ``i``, or None when symbolic (contiguous; turned into ints they would be fixed)."""
    v = cx.arg_val(i)
    try:
        strides = v.stride()
    except Exception:  # noqa: BLE001 - no strides
        return None
    return None if any(static_dim(s) is Any for s in strides) else tuple(int(static_dim(s)) for s in strides)


@aten("aten.native_dropout.default")
def _native_dropout(cx, x, p, train=None):
    """``(out, mask)``: in training, ``out = nn.dropout(x, %dropout_mask_K, rate=p)``; ``train=None`` means training."""
    if train is False or p == 0.0:
        return [x, _op("ones_like")(_op("cast")(x, "bool"))]
    if p >= 1.0:
        return [_op("zeros_like")(x), _op("zeros_like")(_op("cast")(x, "bool"))]
    mask = cx.dropout_mask(cx.arg_val(0).shape, p, _stride(cx))
    return [_op("nn.dropout")(x, mask, rate=float(p)), _op("cast")(mask, "bool")]


@aten("aten.dropout.default", "aten.feature_dropout.default")
def _dropout(cx, x, p, train):
    return _native_dropout(cx, x, p, train)[0]


@aten("aten.bernoulli.p")
def _bernoulli_p(cx, x, p=0.5, generator=None):
    """``torch.empty_like(x).bernoulli_(p)`` (values of ``x`` unused): a random input drawn the same way."""
    return cx.random_input("bernoulli", cx.val.shape, cx.out_dtype, 1.0 - float(p), _stride(cx))


@aten("aten.bernoulli.default")
def _bernoulli(cx, p, generator=None):
    """``torch.bernoulli(p)`` of a tensor of probabilities, drawn as eager draws it: ``torch.rand`` of ``p``'s
    shape and dtype, below ``p`` (PyTorch's decomposition draws float32 uniforms: another stream for float64)."""
    u = cx.random_input("uniform", static(cx, "bernoulli", cx.shape_of(p)), cx.dtype_of(p))
    return cast(cx, _op("less")(u, p), cx.out_dtype)


def _random(kind: str):
    def conv(cx, *args, **kwargs):
        return cx.random_input(kind, static(cx, kind, cx.out_shape), cx.out_dtype)

    return conv


for _name, _kind in (("rand.default", "uniform"), ("rand_like.default", "uniform"), ("randn.default", "normal"),
                     ("randn_like.default", "normal"), ("randperm.default", "randperm")):
    aten(f"aten.{_name}")(_random(_kind))


@aten("aten.randint.low", "aten.randint.default", "aten.randint_like.low_dtype", "aten.randint_like.default")
def _randint(cx, *args, **kwargs):
    """``torch.randint(low=0, high, size)`` (or ``randint_like(x, low=0, high)``): a random input of integers in
    ``[low, high)``, drawn as eager draws it."""
    like = "randint_like" in str(cx.node.target)
    bounds = [static_dim(a) for a in (args[1:] if like else args) if not isinstance(a, (list, tuple))][:2]
    if Any in bounds:
        raise PullbackError(f"randint needs static bounds, got {tuple('?' if b is Any else b for b in bounds)}")
    return cx.random_input("randint", static(cx, "randint", cx.out_shape), cx.out_dtype,
                           params=(0, *bounds) if len(bounds) == 1 else tuple(bounds))


def _sampler(kind: str, *defaults: float):
    """``torch.empty_like(x).<kind>_(*params)`` (values of ``x`` unused): a random input drawn the same way."""
    def conv(cx, x, *params, generator=None):
        given = tuple(params) + defaults[len(params):]
        return cx.random_input(kind, static(cx, kind, cx.out_shape), cx.out_dtype, stride=_stride(cx), params=given)

    return conv


for _kind, _defaults in (("uniform", (0.0, 1.0)), ("exponential", (1.0,)), ("cauchy", (0.0, 1.0)),
                         ("geometric", ()), ("log_normal", (1.0, 2.0))):
    aten(f"aten.{_kind}.default")(_sampler(_kind, *_defaults))


@aten("aten.normal_functional.default")
def _normal_functional(cx, x, mean=0.0, std=1.0, generator=None):
    """``torch.empty_like(x).normal_(mean, std)`` (``Normal.rsample`` draws its ``eps`` so): a standard normal
    input, scaled."""
    return _normal(cx, scalar(mean, cx.out_dtype), scalar(std, cx.out_dtype))


@aten("aten.normal.float_float")
def _normal_sized(cx, mean, std, size, generator=None, **kwargs):
    """``torch.normal(mean, std, size)`` of two numbers: as ``torch.normal`` of tensors (below)."""
    return _normal(cx, mean, std)


@aten("aten.normal.Tensor_Tensor", "aten.normal.Tensor_float", "aten.normal.float_Tensor")
def _normal(cx, mean, std, generator=None):
    """``torch.normal(mean, std)``: ``mean + std * z`` for a standard normal input ``z`` of the result's shape
    (drawn as ATen draws it: ``normal_(0, 1)``, then scaled). As in PyTorch, no gradient reaches ``mean`` or
    ``std`` (a sample, not a reparameterization: ``Normal.rsample`` computes ``loc + eps * scale`` itself)."""
    dt = cx.out_dtype
    z = cx.random_input("normal", static(cx, "normal", cx.out_shape), dt)
    mean, std = (v if isinstance(v, Expr) else scalar(v, dt) for v in (mean, std))
    return _op("stop_gradient")(_op("add")(_op("multiply")(z, std), mean))

# ------------------------------------------------------------------ linear algebra


@aten("aten.linear.default")
def _linear(cx, x, w, b=None):
    if cx.ndim_of(w) == 1:  # a vector weight: x @ w
        y = _matmul(cx, x, w)
    elif cx.ndim_of(x) == 1:
        y = _op("squeeze")(_op("nn.dense")(_op("expand_dims")(x, 0), w), (0,))
    else:
        y = _op("nn.dense")(x, w)
    return y if b is None else _op("add")(y, b)


@aten("aten.addmm.default", "aten.addmv.default", "aten.addbmm.default")
def _addmm(cx, bias, a, b, beta=1, alpha=1):
    """``beta * bias + alpha * product``: ``a @ b`` (mm, mv) or the sum over the batch of ``a[i] @ b[i]`` (addbmm)."""
    dt = cx.out_dtype
    kind = str(cx.node.target).split(".")[1]
    if kind == "addbmm":
        y = _op("sum")(_op("nn.batch_matmul")(a, b, transpose_b=False), (0,))
    else:
        y = _matmul(cx, a, b)
    if alpha != 1:
        y = _op("multiply")(y, scalar(alpha, dt))
    if beta == 0:
        return y
    return _op("add")(_op("multiply")(bias, scalar(beta, dt)) if beta != 1 else bias, y)


@aten("aten.mm.default")
def _mm(cx, a, b):
    return _op("nn.matmul")(a, b)


@aten("aten.bmm.default")
def _bmm(cx, a, b):
    return _op("nn.batch_matmul")(a, b, transpose_b=False)


@aten("aten.matmul.default")
def _matmul(cx, a, b):
    """``torch.matmul`` for every rank: vectors get a unit dim, batch dims broadcast."""
    sa, sb = cx.shape_of(a), cx.shape_of(b)
    if 0 in sa or 0 in sb:  # an empty operand: zeros (an empty sum) of the result's shape
        return _op("zeros")(static(cx, "matmul", cx.out_shape), cx.out_dtype)
    if len(sa) == 1 and len(sb) == 1:
        return _op("sum")(_op("multiply")(a, b))
    if len(sa) == 1:
        return _op("squeeze")(_matmul(cx, _op("expand_dims")(a, 0), b), (max(2, len(sb)) - 2,))
    if len(sb) == 1:
        return _op("squeeze")(_matmul(cx, a, _op("expand_dims")(b, 1)), (len(sa) - 1,))
    if len(sa) == 2 and len(sb) == 2:
        return _op("nn.matmul")(a, b)
    ta, tb = (v.shape if len(v.shape) == len(s) else s for v, s in ((cx.arg_val(0), sa), (cx.arg_val(1), sb)))
    if len(sb) == 2:  # (..., m, k) @ (k, n): fold the leading dims
        k = static(cx, "matmul", sa[-1:])[0]
        out = _op("nn.matmul")(_op("reshape")(a, (-1, k)), b)
        return reshape_to(cx, "matmul", out, (-1, tb[1]), (*ta[:-1], tb[1]))
    batch = tuple(np.broadcast_shapes(static(cx, "matmul", sa[:-2]), static(cx, "matmul", sb[:-2])))
    a3 = _batched(cx, a, batch, ta)
    b3 = _batched(cx, b, batch, tb)
    out = _op("nn.batch_matmul")(a3, b3, transpose_b=False)
    return reshape_to(cx, "matmul", out, (math.prod(batch), ta[-2], tb[-1]), (*batch, ta[-2], tb[-1]))


def _batched(cx, x, batch: tuple, sizes: tuple) -> Expr:
    """``x`` (torch sizes ``sizes``) broadcast to ``batch + x.shape[-2:]`` and flattened to rank 3."""
    s = cx.shape_of(x)
    full = batch + tuple(s[-2:])
    if tuple(s) != full:
        x = expand_to(cx, x, full, batch + tuple(sizes[-2:]))
    return reshape_to(cx, "matmul", x, (*batch, *sizes[-2:]), (math.prod(batch), *sizes[-2:])) if len(full) != 3 else x


# ------------------------------------------------------------------ normalisation


def _vec_or(v: Optional[Expr], c: int, fill: float, dtype: str) -> Expr:
    return v if v is not None else const(np.full((c,), fill, dtype=dtype))


def _stats(cx, x, axes: tuple, eps: float) -> list:
    """``[mean, rstd]`` over ``axes`` with the axes kept (group norm's statistics, which PyTorch differentiates)."""
    mean = _op("mean")(x, axes, True)
    rstd = _op("rsqrt")(_op("add")(_op("variance")(x, axes, True), scalar(eps, cx.dtype_of(x))))
    return [mean, rstd]


def _in_params_dtype(cx, x: Expr, *params) -> tuple:
    """``(x, back)``: ATen's norms take a bfloat16 or float16 input with float32 parameters (as under
    ``torch.autocast``) and compute in the parameters' dtype, the output in the input's, the statistics in the
    parameters'; ``x`` cast to the parameters' dtype and ``back(out)`` casting the output back."""
    have = cx.dtype_of(x)
    want = next((cx.dtype_of(p) for p in params if p is not None), have)
    if want == have:
        return x, lambda out: out
    return cast(cx, x, want), lambda out: cast(cx, out, have)


def _native_layer_norm_call(cx, x, normalized_shape, weight, bias, eps) -> tuple:
    """``(out, mean, rstd)`` of PyTorch's layer norm over the trailing ``normalized_shape`` (``nn.native_layer_norm``
    over the flattened trailing dims; the statistics with those dims of size 1, as ATen's)."""
    x, back = _in_params_dtype(cx, x, weight, bias)
    out, mean, rstd = _layer_norm_stats(cx, x, normalized_shape, weight, bias, eps)
    return back(out), mean, rstd


def _layer_norm_stats(cx, x, normalized_shape, weight, bias, eps) -> tuple:
    shape, dt = cx.shape_of(x), cx.dtype_of(x)
    k = len(normalized_shape)
    n = int(np.prod(normalized_shape))
    lead = tuple(shape[:-k])
    flat = x if k == 1 else _op("reshape")(x, newshape(cx, "layer_norm", lead + (n,)))
    w = _vec_or(weight, n, 1.0, dt) if k == 1 or weight is None else _op("reshape")(weight, (n,))
    b = _vec_or(bias, n, 0.0, dt) if k == 1 or bias is None else _op("reshape")(bias, (n,))
    ln = _op("nn.native_layer_norm")(flat, w, b, axis=-1, epsilon=float(eps), scale=weight is not None,
                                     center=bias is not None)
    out, mean, rstd = ln[0], ln[1], ln[2]
    if k == 1:
        return out, mean, rstd
    return (_op("reshape")(out, newshape(cx, "layer_norm", shape)),) + tuple(
        _op("reshape")(s, newshape(cx, "layer_norm", lead + (1,) * k)) for s in (mean, rstd))


@aten("aten.layer_norm.default")
def _layer_norm(cx, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return _native_layer_norm_call(cx, x, normalized_shape, weight, bias, eps)[0]


@aten("aten.native_layer_norm.default")
def _native_layer_norm(cx, x, normalized_shape, weight, bias, eps):
    # PyTorch passes no gradient back through the statistics
    out, mean, rstd = _native_layer_norm_call(cx, x, normalized_shape, weight, bias, eps)
    return [out, _op("stop_gradient")(mean), _op("stop_gradient")(rstd)]


def _batch_norm(cx, x, weight, bias, mean, var, training, momentum, eps):
    """``([out, new moving mean, new moving var], [mean, rstd])``: in training ``nn.native_batch_norm``, whose
    statistics the gradient reads (PyTorch passes no gradient back through them), in evaluation
    ``nn.batch_norm`` and PyTorch's empty statistics."""
    x, back = _in_params_dtype(cx, x, weight, bias, mean, var)
    (out, new_mean, new_var), saved = _batch_norm_in(cx, x, weight, bias, mean, var, training, momentum, eps)
    return [back(out), new_mean, new_var], saved


def _batch_norm_in(cx, x, weight, bias, mean, var, training, momentum, eps):
    shape, dt = cx.shape_of(x), cx.dtype_of(x)
    c = shape[1]
    no_stats = mean is None or var is None
    if no_stats:  # track_running_stats=False: batch statistics, nothing to update
        mean, var, training = const(np.zeros((c,), dt)), const(np.ones((c,), dt)), True
    name = "nn.native_batch_norm" if training else "nn.batch_norm"
    bn = _op(name)(x, _vec_or(weight, c, 1.0, dt), _vec_or(bias, c, 0.0, dt), mean, var, axis=1, epsilon=float(eps),
                   scale=weight is not None, center=bias is not None, training=bool(training), momentum=float(momentum))
    if training:
        saved = [_op("stop_gradient")(bn[k]) for k in (3, 4)]
    else:  # PyTorch's saved statistics in evaluation: empty tensors
        saved = [const(np.zeros(static(cx, "batch_norm", cx.out_shapes[k]), dtype=dt)) for k in (1, 2)]
    return [bn[0], bn[1], bn[2]], saved


@aten("aten._native_batch_norm_legit_functional.default")
def _bn_functional(cx, x, weight, bias, mean, var, training, momentum, eps):
    (out, new_mean, new_var), saved = _batch_norm(cx, x, weight, bias, mean, var, training, momentum, eps)
    return [out] + saved + [new_mean, new_var]  # (out, save_mean, save_rstd, running_mean, running_var)


@aten("aten._native_batch_norm_legit.default")
def _bn_legit(cx, x, weight, bias, mean, var, training, momentum, eps):
    (out, _, _), saved = _batch_norm(cx, x, weight, bias, mean, var, training, momentum, eps)
    return [out] + saved


@aten("aten._native_batch_norm_legit.no_stats")
def _bn_no_stats(cx, x, weight, bias, training, momentum, eps):
    (out, _, _), saved = _batch_norm(cx, x, weight, bias, None, None, True, momentum, eps)
    return [out] + saved


@aten("aten._native_batch_norm_legit_no_training.default")
def _bn_no_training(cx, x, weight, bias, mean, var, momentum, eps):
    return [_batch_norm(cx, x, weight, bias, mean, var, False, momentum, eps)[0][0], None, None]


@aten("aten.native_batch_norm.default")
def _native_batch_norm(cx, x, weight, bias, mean, var, training, momentum, eps):
    (out, _, _), saved = _batch_norm(cx, x, weight, bias, mean, var, training, momentum, eps)
    return [out] + saved


@aten("aten.native_group_norm.default")
def _group_norm(cx, x, weight, bias, n, c, hxw, groups, eps):
    """``(out, mean, rstd)``: layer norm over each group's channels and positions, then the per-channel affine."""
    x, back = _in_params_dtype(cx, x, weight, bias)
    y, mean, rstd = _group_norm_in(cx, x, weight, bias, groups, eps)
    return [back(y), mean, rstd]


def _group_norm_in(cx, x, weight, bias, groups, eps) -> list:
    shape, dt = static(cx, "group_norm", cx.shape_of(x)), cx.dtype_of(x)
    n, c, groups = int(shape[0]), int(shape[1]), int(groups)
    k = int(np.prod(shape[1:])) // groups if groups else 0
    xr = _op("reshape")(x, (n, groups, k))
    y = _op("nn.layer_norm")(xr, const(np.ones((k,), dt)), const(np.zeros((k,), dt)), axis=-1, epsilon=float(eps),
                             scale=False, center=False)
    y = _op("reshape")(y, shape)
    affine = (c,) + (1,) * (len(shape) - 2)
    if weight is not None:
        y = _op("multiply")(y, _op("reshape")(weight, affine))
    if bias is not None:
        y = _op("add")(y, _op("reshape")(bias, affine))
    mean, rstd = _stats(cx, xr, (2,), float(eps))
    return [y, _op("reshape")(mean, (n, groups)), _op("reshape")(rstd, (n, groups))]


# ------------------------------------------------------------------ convolution


def _tuple(v, n: int, default=None) -> tuple:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return default if default is not None else (0,) * n
    if isinstance(v, int):
        return (v,) * n
    v = tuple(int(a) for a in v)
    return v * n if len(v) == 1 else v


def _pair(v, default=None) -> tuple:
    return _tuple(v, 2, default)


def _conv2d_call(cx, x, w, stride, padding, dilation, groups, transposed=False, output_padding=(0, 0)):
    if transposed:
        if all(o < s for o, s in zip(output_padding, stride)):
            return _op("nn.conv2d_transpose")(x, w, strides=stride, padding=padding, dilation=dilation, groups=int(groups),
                                              output_padding=output_padding)
        # PyTorch also allows output_padding < dilation: the extra rows/columns are the ones the padding would crop
        # at the end (then zeros, which no input reaches)
        end = [p - o for p, o in zip(padding, output_padding)]
        y = _op("nn.conv2d_transpose")(x, w, strides=stride, padding=tuple(padding) + tuple(max(e, 0) for e in end),
                                       dilation=dilation, groups=int(groups))
        if min(end) >= 0:
            return y
        return _op("nn.pad")(y, ((0, 0), (0, 0)) + tuple((0, max(-e, 0)) for e in end), 0.0, "constant")
    y = _op("nn.conv2d")(x, w, strides=stride, padding=padding, dilation=dilation, groups=int(groups))
    return _one_tap_dense(cx, x, w, y) or y


def _one_tap_dense(cx, x, w, conv) -> Optional[Expr]:
    """A convolution of a 1x1 map to a 1x1 map meets one kernel tap: a dense layer with that tap (the last
    stage of a ResNet on 32x32 images, where oneDNN takes milliseconds for a 0.1 ms GEMM). The slice is one
    contiguous copy, and the weight gradient one padded write (SimplifyExpr) instead of a zeroed weight."""
    xs, ws, ys = cx.shape_of(x), cx.shape_of(w), infer_expr(conv).shape
    if not all(isinstance(d, int) for d in xs + ws):
        return None
    tap = single_tap(xs[2:], ys[2:], ws[2:], conv.attrs)
    if tap is None:
        return None
    (i, j), (o, c) = tap, ws[:2]
    w_tap = _op("strided_slice")(w, (0, 0, i, j), (o, c, i + 1, j + 1), (1, 1, 1, 1), None)
    y = _op("nn.dense")(_op("reshape")(x, xs[:2]), _op("reshape")(w_tap, (o, c)))
    return _op("reshape")(y, (xs[0], o, 1, 1))


def _bias(y, b, spatial: int):
    if b is None:
        return y
    return _op("add")(y, _op("reshape")(b, (-1,) + (1,) * spatial))


def _convnd(cx, x, w, b, stride, padding, dilation, transposed=False, output_padding=0, groups=1):
    if isinstance(padding, str):
        raise PullbackError(f"convolution with padding={padding!r} is not supported (give explicit sizes)")
    nd = cx.ndim_of(w) - 2
    if nd not in (1, 2, 3):
        raise PullbackError(f"convolution with a rank-{cx.ndim_of(w)} weight is not supported (1-D, 2-D and 3-D)")
    if cx.ndim_of(x) == nd + 1:  # unbatched (C, ...): a batch of one
        return _op("squeeze")(_convnd(cx, _op("expand_dims")(x, 0), w, b, stride, padding, dilation, transposed,
                                      output_padding, groups), (0,))
    if nd == 1:  # (N, C, L) -> (N, C, 1, L)
        s, p, d, op_ = (_tuple(v, 1) for v in (stride, padding, dilation, output_padding))
        y = _conv2d_call(cx, _op("expand_dims")(x, 2), _op("expand_dims")(w, 2), (1,) + s, (0,) + p, (1,) + d, groups,
                         transposed, (0,) + op_)
        return _bias(_op("squeeze")(y, (2,)), b, 1)
    if nd == 2:
        y = _conv2d_call(cx, x, w, _pair(stride), _pair(padding), _pair(dilation), groups, transposed, _pair(output_padding))
        return _bias(y, b, 2)
    s3, p3, d3 = _tuple(stride, 3), _tuple(padding, 3), _tuple(dilation, 3)
    if transposed:
        return _bias(_conv_transpose3d(cx, x, w, s3, p3, d3, _tuple(output_padding, 3), int(groups)), b, 3)
    return _bias(_conv3d(cx, x, w, s3, p3, d3, int(groups)), b, 3)


def _conv3d(cx, x, w, stride, padding, dilation, groups):
    """A 3-D convolution as one 2-D convolution: the ``kd`` depth taps become input channels and the output
    depths join the batch (memory ``kd`` times the input)."""
    n, c, d, h, wd = static(cx, "conv3d", cx.shape_of(x))
    o, cg, kd, kh, kw = static(cx, "conv3d", cx.shape_of(w))
    sd, pd, dd = stride[0], padding[0], dilation[0]
    if pd:
        x = _op("nn.pad")(x, ((0, 0), (0, 0), (pd, pd), (0, 0), (0, 0)), 0.0, "constant")
    dp = d + 2 * pd
    do = (dp - dd * (kd - 1) - 1) // sd + 1
    taps = [_op("strided_slice")(x, (k * dd,), (k * dd + (do - 1) * sd + 1,), (sd,), (2,)) for k in range(kd)]
    s = _op("stack")(taps, 2)  # (N, C, kd, Do, H, W)
    s = _op("reshape")(s, (n, groups, cg, kd, do, h, wd))
    s = _op("transpose")(s, (0, 4, 1, 3, 2, 5, 6))  # (N, Do, G, kd, Cg, H, W)
    s = _op("reshape")(s, (n * do, groups * kd * cg, h, wd))
    w2 = _op("reshape")(_op("transpose")(w, (0, 2, 1, 3, 4)), (o, kd * cg, kh, kw))
    y = _conv2d_call(cx, s, w2, stride[1:], padding[1:], dilation[1:], groups)
    ho, wo = static(cx, "conv3d", infer_expr(y).shape[2:])
    return _op("transpose")(_op("reshape")(y, (n, do, o, ho, wo)), (0, 2, 1, 3, 4))


def _conv_transpose3d(cx, x, w, stride, padding, dilation, output_padding, groups):
    """A 3-D transposed convolution as two 2-D ones: over (H, W) with the ``kd`` depth taps as extra output
    channels (input depths in the batch), then over D, where each tap's plane lands at ``i * sd - pd + k * dd``
    (a transposed convolution of the taps with the identity kernel, every (N, C, H, W) position in the batch)."""
    n, c, d, h, wd = static(cx, "conv_transpose3d", cx.shape_of(x))
    _, og, kd, kh, kw = static(cx, "conv_transpose3d", cx.shape_of(w))
    planes = _op("reshape")(_op("transpose")(x, (0, 2, 1, 3, 4)), (n * d, c, h, wd))
    y = _conv2d_call(cx, planes, _op("reshape")(w, (c, og * kd, kh, kw)), stride[1:], padding[1:], dilation[1:], groups,
                     True, output_padding[1:])
    ho, wo = static(cx, "conv_transpose3d", infer_expr(y).shape[2:])
    o = og * groups
    taps = _op("transpose")(_op("reshape")(y, (n, d, o, kd, ho, wo)), (0, 2, 4, 5, 3, 1))  # (N, O, Ho, Wo, kd, D)
    eye = const(np.eye(kd, dtype=cx.dtype_of(x)).reshape(kd, 1, 1, kd))
    z = _conv2d_call(cx, _op("reshape")(taps, (n * o * ho * wo, kd, 1, d)), eye, (1, stride[0]), (0, padding[0]),
                     (1, dilation[0]), 1, True, (0, output_padding[0]))
    do = static(cx, "conv_transpose3d", infer_expr(z).shape)[3]
    return _op("transpose")(_op("reshape")(z, (n, o, ho, wo, do)), (0, 1, 4, 2, 3))


@aten("aten.conv2d.default")
def _conv2d(cx, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    return _convnd(cx, x, w, b, stride, padding, dilation, groups=groups)


@aten("aten.convolution.default")
def _convolution(cx, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    return _convnd(cx, x, w, b, stride, padding, dilation, bool(transposed), output_padding, groups)


@aten("aten.convolution_backward.default")
def _convolution_backward(cx, g, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                          output_mask):
    """``(grad_input, grad_weight, grad_bias)`` of a 2-D convolution, from ``nn.conv2d``'s gradient rule."""
    if cx.ndim_of(x) != 4:
        raise PullbackError("convolution_backward is supported for 2-D convolutions only")
    call = _conv2d_call(cx, x, w, _pair(stride), _pair(padding), _pair(dilation), groups, bool(transposed),
                        _pair(output_padding))
    infer_expr(call)
    gx, gw = call.op.grad(call, g)
    gb = _op("sum")(g, (0, 2, 3), False) if bias_sizes is not None else None
    return [gx if output_mask[0] else None, gw if output_mask[1] else None, gb if output_mask[2] else None]


# ------------------------------------------------------------------ pooling


def _pool_args(nd: int, kernel_size, stride, padding, dilation) -> tuple:
    k = _tuple(kernel_size, nd)
    return k, _tuple(stride, nd, k), _tuple(padding, nd), _tuple(dilation, nd, (1,) * nd)


def _pool2d(kind: str, x, k, s, p, d, ceil_mode, count_include_pad=True):
    if kind == "max":
        return _op("nn.max_pool2d")(x, pool_size=k, strides=s, padding=p, dilation=d, ceil_mode=bool(ceil_mode))
    return _op("nn.avg_pool2d")(x, pool_size=k, strides=s, padding=p, ceil_mode=bool(ceil_mode),
                                count_include_pad=bool(count_include_pad))


def _pool_nd(cx, kind: str, x, k, s, p, d, ceil_mode, count_include_pad=True):
    """1-D, 2-D and 3-D max/avg pooling through ``nn.*_pool2d``: a 1-D pool is a 2-D pool with a unit height;
    a 3-D pool is a pool over (H, W) then one over D (both are separable: windows are boxes)."""
    nd = len(k)
    if cx.ndim_of(x) == nd + 1:  # unbatched (C, ...)
        return _op("squeeze")(_pool_nd(cx, kind, _op("expand_dims")(x, 0), k, s, p, d, ceil_mode, count_include_pad), (0,))
    if nd == 2:
        return _pool2d(kind, x, k, s, p, d, ceil_mode, count_include_pad)
    if nd == 1:
        y = _pool2d(kind, _op("expand_dims")(x, 2), (1,) + k, (1,) + s, (0,) + p, (1,) + d, ceil_mode, count_include_pad)
        return _op("squeeze")(y, (2,))
    n, c, dd, h, w = static(cx, "3-D pooling", cx.shape_of(x))
    y = _pool2d(kind, _op("reshape")(x, (n, c * dd, h, w)), k[1:], s[1:], p[1:], d[1:], ceil_mode, count_include_pad)
    ho, wo = static(cx, "3-D pooling", infer_expr(y).shape[2:])
    y = _pool2d(kind, _op("reshape")(y, (n, c, dd, ho * wo)), (k[0], 1), (s[0], 1), (p[0], 0), (d[0], 1), ceil_mode,
                count_include_pad)
    do = static(cx, "3-D pooling", infer_expr(y).shape)[2]
    return _op("reshape")(y, (n, c, do, ho, wo))


def _max_pool(nd: int):
    def conv(cx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        k, s, p, d = _pool_args(nd, kernel_size, stride, padding, dilation)
        return _pool_nd(cx, "max", x, k, s, p, d, ceil_mode)

    return conv


def _with_indices(nd: int):
    """``(values, indices)``; the indices (flat positions in each channel's plane or volume, PyTorch's convention)
    read a position map at each window's first maximum (``nn.max_pool2d_gather``). A 3-D pool gathers over
    (H, W), then over D from the plane maxima: the first maximum in (d, h, w) order, as PyTorch's."""

    def conv(cx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        values = _max_pool(nd)(cx, x, kernel_size, stride, padding, dilation, ceil_mode)
        if cx.ndim_of(x) == nd + 1:  # unbatched (C, ...): a batch of one
            idx = conv(cx, _op("expand_dims")(x, 0), kernel_size, stride, padding, dilation, ceil_mode)[1]
            return [values, _op("squeeze")(idx, (0,))]
        k, s, p, d = _pool_args(nd, kernel_size, stride, padding, dilation)
        shape = static(cx, "max_pool indices", cx.shape_of(x))
        positions = np.broadcast_to(np.arange(math.prod(shape[2:]), dtype=cx.dtype_of(x)).reshape(shape[2:]), shape)
        if nd == 1:
            k, s, p, d = (1,) + k, (1,) + s, (0,) + p, (1,) + d
            x = _op("expand_dims")(x, 2)
        if nd == 3:
            x = _op("reshape")(x, (shape[0], shape[1] * shape[2]) + shape[3:])
        pos = const(positions.reshape(cx.shape_of(x)).copy())
        kw = dict(pool_size=k[-2:], strides=s[-2:], padding=p[-2:], dilation=d[-2:], ceil_mode=bool(ceil_mode))
        idx = _op("nn.max_pool2d_gather")(x, pos, **kw)
        if nd == 3:  # then over D, from the plane maxima and their positions
            ho, wo = static(cx, "max_pool indices", infer_expr(idx).shape[2:])
            planes = (shape[0], shape[1], shape[2], ho * wo)
            best = _op("reshape")(_op("nn.max_pool2d")(x, **kw), planes)
            idx = _op("nn.max_pool2d_gather")(best, _op("reshape")(idx, planes), pool_size=(k[0], 1), strides=(s[0], 1),
                                              padding=(p[0], 0), dilation=(d[0], 1), ceil_mode=bool(ceil_mode))
            idx = _op("reshape")(idx, tuple(static(cx, "max_pool indices", infer_expr(idx).shape[:3])) + (ho, wo))
        return [values, _op("cast")(_op("squeeze")(idx, (2,)) if nd == 1 else idx, "int64")]

    return conv


for _nd in (1, 2, 3):
    aten(f"aten.max_pool{_nd}d.default")(_max_pool(_nd))
    aten(f"aten.max_pool{_nd}d_with_indices.default")(_with_indices(_nd))


def _avg_pool(nd: int):
    def conv(cx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
        k, s, p, d = _pool_args(nd, kernel_size, stride, padding, 1)
        out = _pool_nd(cx, "avg", x, k, s, p, d, ceil_mode, count_include_pad or divisor_override is not None)
        if divisor_override is None:
            return out
        counts = _window_counts(static(cx, "avg_pool with divisor_override", cx.shape_of(x))[-nd:], k, s, p,
                                static(cx, "avg_pool", infer_expr(out).shape)[-nd:])
        return _op("multiply")(out, const((counts / float(divisor_override)).astype(cx.dtype_of(x))))

    return conv


def _window_counts(size, k, s, p, out) -> np.ndarray:
    """PyTorch's padded window sizes (windows clipped to the padded input) per output position."""
    counts = np.ones((), dtype="float64")
    for n, kk, ss, pp, o in zip(size, k, s, p, out):
        start = np.arange(o) * ss - pp
        axis = np.minimum(start + kk, n + pp) - start
        counts = np.multiply.outer(counts, axis.astype("float64"))
    return counts


for _nd in (1, 2, 3):
    aten(f"aten.avg_pool{_nd}d.default")(_avg_pool(_nd))


def _adaptive(nd: int):
    def conv(cx, x, output_size):
        out = _tuple(output_size, nd)
        if cx.ndim_of(x) == nd + 1:
            return _op("squeeze")(conv(cx, _op("expand_dims")(x, 0), output_size), (0,))
        if nd == 2:
            return _op("nn.adaptive_avg_pool2d")(x, output_size=out)
        if nd == 1:
            return _op("squeeze")(_op("nn.adaptive_avg_pool2d")(_op("expand_dims")(x, 2), output_size=(1,) + out), (2,))
        n, c, d, h, w = static(cx, "adaptive 3-D pooling", cx.shape_of(x))
        y = _op("nn.adaptive_avg_pool2d")(_op("reshape")(x, (n, c * d, h, w)), output_size=out[1:])
        y = _op("nn.adaptive_avg_pool2d")(_op("reshape")(y, (n, c, d, out[1] * out[2])), output_size=(out[0], out[1] * out[2]))
        return _op("reshape")(y, (n, c) + out)

    return conv


def _adaptive_windows(n: int, o: int) -> np.ndarray:
    """``(o, K)`` positions of adaptive pooling's windows ``[floor(i n / o), ceil((i + 1) n / o))`` along an axis of
    ``n``, each padded to the widest ``K`` by repeating its last position (a repeat changes no maximum)."""
    starts = [i * n // o for i in range(o)]
    ends = [-(-(i + 1) * n // o) for i in range(o)]
    k = max(e - b for b, e in zip(starts, ends))
    return np.array([[min(b + j, e - 1) for j in range(k)] for b, e in zip(starts, ends)], dtype="int64")


def _adaptive_max_windows(cx, x, size: tuple, out: tuple) -> list:
    """``(values, indices)`` of adaptive max pooling with windows of different sizes, one axis at a time from the
    last: per axis, the windows are taken, and the first maximum of each is gathered with its position (the
    first maximum in row-major window order overall, as PyTorch's). Gradients reach the gathered entries."""
    nd, rank = len(size), cx.ndim_of(x)
    cur, pos = x, {}  # pos[axis]: the input position along ``axis`` of each current entry
    for j in range(nd - 1, -1, -1):
        a = rank - nd + j
        win = _adaptive_windows(size[j], out[j])
        taken = _op("take")(cur, const(win), axis=a)  # the window axis at a + 1
        k = _op("cast")(_op("argmax")(taken, (a + 1,), True), "int64")

        def pick(v, a=a, k=k):
            return _op("squeeze")(_op("gather")(v, k, axis=a + 1), (a + 1,))

        shape = tuple(infer_expr(taken).shape)
        here = np.broadcast_to(win.reshape((1,) * a + win.shape + (1,) * (len(shape) - a - 2)), shape)
        pos = {b: pick(_op("take")(v, const(win), axis=a)) for b, v in pos.items()}
        pos[a] = pick(const(np.ascontiguousarray(here)))
        cur = pick(taken)
    flat, stride = None, 1
    for j in range(nd - 1, -1, -1):
        term = pos[rank - nd + j] if stride == 1 else _op("multiply")(pos[rank - nd + j], scalar(stride, "int64"))
        flat = term if flat is None else _op("add")(flat, term)
        stride *= size[j]
    return [cur, flat]


def _adaptive_max(nd: int):
    """``(values, indices)`` of adaptive max pooling: where each input size is a multiple of its output size, the
    windows are those of a max pool with kernel = stride = input / output (global max pooling, halvings); else
    windows of different sizes, gathered (``_adaptive_max_windows``)."""

    def conv(cx, x, output_size):
        out = _tuple(output_size, nd)
        size = static(cx, "adaptive max pooling", cx.shape_of(x)[-nd:])
        if any(o < 1 for o in out):
            raise PullbackError(f"adaptive max pooling from {size} to {out}: output sizes must be positive")
        if any(n % o for n, o in zip(size, out)):
            return _adaptive_max_windows(cx, x, size, out)
        k = tuple(n // o for n, o in zip(size, out))
        return _with_indices(nd)(cx, x, k, k)

    return conv


aten("aten.adaptive_max_pool1d.default")(_adaptive_max(1))
aten("aten.adaptive_max_pool2d.default")(_adaptive_max(2))
aten("aten.adaptive_max_pool3d.default")(_adaptive_max(3))
aten("aten.adaptive_avg_pool1d.default")(_adaptive(1))
aten("aten.adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d.default")(_adaptive(2))
aten("aten.adaptive_avg_pool3d.default", "aten._adaptive_avg_pool3d.default")(_adaptive(3))


def _grad_of(call: Expr, g: Expr) -> Expr:
    """The gradient of ``call``'s first argument for the cotangent ``g`` (its operator's rule)."""
    infer_expr(call)
    return call.op.grad(call, g)[0]


@aten("aten.avg_pool2d_backward.default")
def _avg_pool2d_backward(cx, g, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override=None):
    if divisor_override is not None:
        raise PullbackError("avg_pool2d_backward with divisor_override is not supported")
    k, s, p, d = _pool_args(2, kernel_size, stride, padding, 1)
    return _grad_of(_pool2d("avg", x, k, s, p, d, ceil_mode, count_include_pad), g)


@aten("aten.max_pool2d_with_indices_backward.default")
def _max_pool2d_backward(cx, g, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """The gradient added at the given indices (``nn.max_pool2d_with_indices_grad``: no search for the maxima
    again; the indices are those max_pool2d_with_indices gave, a position in each window); unbatched (C, H, W)
    data through a unit batch."""
    k, s, p, d = _pool_args(2, kernel_size, stride, padding, dilation)
    if cx.ndim_of(x) == 3:
        one = [_op("expand_dims")(v, 0) for v in (g, x, indices)]
        return _op("squeeze")(_max_pool2d_backward(cx, *one[:2], kernel_size, stride, padding, dilation, ceil_mode,
                                                   one[2]), (0,))
    return _op("nn.max_pool2d_with_indices_grad")(g, x, cast(cx, indices, "int64"), pool_size=k, strides=s, padding=p,
                                                  dilation=d, ceil_mode=bool(ceil_mode))


@aten("aten._adaptive_avg_pool2d_backward.default")
def _adaptive_backward(cx, g, x):
    return _grad_of(_op("nn.adaptive_avg_pool2d")(x, output_size=tuple(cx.shape_of(g)[-2:])), g)


# ------------------------------------------------------------------ bilinear resizing


def _resize_attrs(cx, what: str, x, size, align_corners, scales) -> dict:
    static(cx, what, cx.shape_of(x)[2:])
    mode = "align_corners" if align_corners else "half_pixel"
    given = None if scales is None or all(v is None for v in scales) else tuple(float(v) for v in scales)
    return dict(size=tuple(int(d) for d in size), coordinate_transformation_mode=mode, scales=given)


@aten("aten.upsample_bilinear2d.default")
def _upsample_bilinear2d(cx, x, output_size, align_corners, scales_h=None, scales_w=None):
    return _op("image.resize2d")(x, **_resize_attrs(cx, "bilinear resizing", x, output_size, align_corners, (scales_h, scales_w)))


@aten("aten.upsample_bilinear2d.vec")
def _upsample_bilinear2d_vec(cx, x, output_size, align_corners, scale_factors=None):
    hw = static(cx, "bilinear resizing", cx.shape_of(x)[2:])
    size = output_size if output_size is not None else [math.floor(n * f) for n, f in zip(hw, scale_factors)]
    return _op("image.resize2d")(x, **_resize_attrs(cx, "bilinear resizing", x, size, align_corners, scale_factors))


@aten("aten.upsample_bilinear2d_backward.default")
def _upsample_bilinear2d_backward(cx, g, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    attrs = _resize_attrs(cx, "bilinear resizing's gradient", g, output_size, align_corners, (scales_h, scales_w))
    return _op("image.resize2d_grad")(g, in_size=tuple(int(d) for d in input_size[2:]), **attrs)


# ------------------------------------------------------------------ recurrent layers


@aten("aten.mkldnn_rnn_layer.default")
def _mkldnn_rnn_layer(cx, x, w_ih, w_hh, b_ih, b_hh, h0, c0, reverse, batch_sizes, mode, hidden_size, num_layers,
                      has_biases, bidirectional, batch_first, train):
    """One ``nn.lstm`` (``decompositions.lstm`` lowers ``nn.LSTM`` to one such layer per layer and direction); the
    fourth result, oneDNN's workspace, is never read."""
    if mode != 2 or list(batch_sizes) or num_layers != 1 or bidirectional or batch_first:
        raise PullbackError(f"mkldnn_rnn_layer: one unidirectional LSTM layer (mode 2) over a (T, B, I) sequence is "
                            f"supported, got mode={mode}, num_layers={num_layers}, bidirectional={bidirectional}, "
                            f"batch_first={batch_first}, batch_sizes={list(batch_sizes)}")
    biases = (b_ih, b_hh) if has_biases else ()
    y = _op("nn.lstm")(x, h0, c0, w_ih, w_hh, *biases, reverse=bool(reverse))
    return [TupleGetItem(y, k) for k in range(3)] + [const(np.zeros(0, np.uint8))]


def _step_sizes(cx, batch_first: bool) -> tuple:
    """(T, B) of an RNN's input (torch sizes: symbolic where they vary)."""
    shape = cx.arg_val(0).shape
    return (shape[1], shape[0]) if batch_first else (shape[0], shape[1])


def _stacked_layers(op: str, **attrs):
    """The converter of ``nn.GRU`` / ``nn.RNN`` over a padded batch: one ``op`` per layer and direction (PyTorch's
    decomposition unrolls every step's cell), with the dropout between layers where eager applies it (its masks drawn
    in eager's order), ``batch_first`` as transposes."""

    def convert(cx, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
        dirs, group, dt = 2 if bidirectional else 1, 4 if has_biases else 2, cx.dtype_of(x)
        params = [cast(cx, p, dt) for p in params]  # (one dtype: an autocast region computes the layers in its dtype)
        seq, hx = _op("transpose")(x, axes=(1, 0, 2)) if batch_first else x, cast(cx, hx, dt)
        finals = []
        for layer in range(num_layers):
            outs = []
            for d in range(dirs):
                k = layer * dirs + d
                h0 = _op("squeeze")(_op("strided_slice")(hx, (k,), (k + 1,), (1,), (0,)), (0,))
                call = _op(op)(seq, h0, *params[k * group:(k + 1) * group], reverse=bool(d), **attrs)
                outs.append(TupleGetItem(call, 0))
                finals.append(TupleGetItem(call, 1))
            seq = outs[0] if dirs == 1 else _op("concatenate")(outs, axis=2)
            if dropout and train and layer < num_layers - 1:
                hidden = cx.shape_of(params[1])[1] * dirs
                mask = cx.dropout_mask((*_step_sizes(cx, batch_first), hidden), dropout)
                seq = _op("nn.dropout")(seq, mask, rate=float(dropout))
        return [_op("transpose")(seq, axes=(1, 0, 2)) if batch_first else seq, _op("stack")(finals, axis=0)]

    return convert


aten("aten.gru.input")(_stacked_layers("nn.gru"))
aten("aten.rnn_tanh.input")(_stacked_layers("nn.rnn"))
aten("aten.rnn_relu.input")(_stacked_layers("nn.rnn", nonlinearity="relu"))


# ------------------------------------------------------------------ attention


@aten("aten.scaled_dot_product_attention.default")
def _sdpa(cx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``softmax(q k^T * scale + mask) v`` over (B..., L, E) batches that broadcast; a boolean mask keeps where
    True, a float mask is added, ``is_causal`` keeps the lower triangle; rows with every position masked give 0
    (PyTorch's safe softmax); dropout gets a mask parameter. bfloat16 and float16 attention computes in float32
    and rounds its output once, as ATen's CPU kernel (flash attention) does: rounding the scores and the
    probabilities too put its output and gradients 1.3-2x further from float64's than eager's. Without dropout, over
    (B, H, L, E) batches, it is one operator (``nn.attention``, ``_fused_sdpa``), a mask its bias."""
    fused = _fused_sdpa(cx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if fused is not None:
        return fused
    dt = cx.dtype_of(q)
    if dt not in ("bfloat16", "float16"):
        return _sdpa_in(cx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    q, k, v = (cast(cx, t, "float32") for t in (q, k, v))
    if attn_mask is not None and cx.dtype_of(attn_mask) != "bool":
        attn_mask = cast(cx, attn_mask, "float32")
    return cast(cx, _sdpa_in(cx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa), dt)


def _repeated_heads(cx, k, v, sq: tuple, sk: tuple, sv: tuple) -> tuple:
    """``(k, v, k's shape, v's shape)`` with each key/value head repeated to the queries' heads (``enable_gqa``:
    axis -3); as they are when the head counts agree."""
    if sk[-3] == sq[-3]:
        return k, v, sk, sv
    rep = sq[-3] // static(cx, "scaled_dot_product_attention with enable_gqa", sk[-3:-2])[0]
    k, v = _op("repeat")(k, rep, len(sk) - 3), _op("repeat")(v, rep, len(sv) - 3)
    return k, v, sk[:-3] + (sq[-3],) + sk[-2:], sv[:-3] + (sq[-3],) + sv[-2:]


def _fused_sdpa(cx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> Optional[Expr]:
    """``nn.attention`` (ATen's flash attention on torch: eager's kernel; the probabilities recomputed in the
    backward, never saved) for attention without dropout over (B, H, L, E) queries and (B, H, S, E) keys and
    values of one float dtype ((B, Hkv, S, E) with ``enable_gqa``: the heads shared inside, as eager's kernel
    does); None otherwise, and for a float16/bfloat16 mask that depends on a trainable parameter (eager runs its
    float32 math kernel there, as ``_sdpa`` does). A mask becomes its bias: a boolean
    one 0 where True and -inf where False in the queries' dtype (as eager converts it for that kernel), a float
    one as it is (in the queries' dtype or float32), of rank 4."""
    dts = {cx.dtype_of(t) for t in (q, k, v)}
    if dropout_p or len(dts) != 1:
        return None
    dt = dts.pop()
    if dt not in FLOAT_DTYPES or attn_mask is not None and cx.learnable(attn_mask):
        return None  # a learnable bias (T5's position bias): eager's math kernel (in float32 for half precision)
    sq, sk, sv = (tuple(cx.shape_of(t)) for t in (q, k, v))
    if any(len(s) != 4 or s[3] is Any for s in (sq, sk, sv)):
        return None
    # Heads repeated by the model (repeat_kv) are shared inside instead, except in half precision under an input
    # mask, where eager's kernel runs on the repeated heads and its bits are the reference: Hugging Face calls
    # sdpa with enable_gqa without a mask and repeats the heads itself with one (a padded batch); under export it
    # materialises the causal mask from constants, which stands for "no mask" in eager.
    eager_shares = dt not in HALF_DTYPES or attn_mask is None or cx.constant(attn_mask)
    shared = [_unrepeated(cx, t) for t in (k, v)] if eager_shares else [None]
    if None not in shared and cx.shape_of(shared[0]) == cx.shape_of(shared[1]):
        k, v = shared
        sk = sv = tuple(cx.shape_of(k))
        enable_gqa = True
    grouped = enable_gqa and Any not in (sq[1], sk[1]) and sq[1] % sk[1] == 0  # nn.attention shares the heads itself
    if sk != sv or sq[0] != sk[0] or sq[1] != sk[1] and not grouped or sq[3] != sk[3]:
        return None
    lengths = (size_key(cx.arg_val(0).shape[2]), size_key(cx.arg_val(1).shape[2]))
    if attn_mask is not None and not is_causal and causal_over(cx, attn_mask) == lengths:
        attn_mask, is_causal = None, True  # the causal triangle over a dynamic length (built from two aranges)
    if attn_mask is not None and not is_causal and (rest := beside_causal(
            attn_mask, *lengths, causal=lambda part: causal_over(cx, part) == lengths)) is not None:
        attn_mask, is_causal = rest, True  # and a padding mask beside it: flash attention skips the upper blocks
    if attn_mask is not None and keeps_every_key(attn_mask):  # no mask: flash attention reads none
        attn_mask = None
    if attn_mask is not None and not is_causal:  # the causal triangle as is_causal: flash attention skips blocks
        if causal_mask(attn_mask, sq[2], sk[2]):
            attn_mask, is_causal = None, True
        elif (rest := beside_causal(attn_mask, sq[2], sk[2])) is not None:
            attn_mask, is_causal = rest, True
    bias = () if attn_mask is None else _attention_bias(cx, attn_mask, dt, (sq[0], sq[1], sq[2], sk[2]))
    if bias is None:
        return None
    scale = 1.0 / math.sqrt(sq[3]) if scale is None else float(scale)
    return TupleGetItem(_op("nn.attention")(q, k, v, *bias, scale=scale, is_causal=bool(is_causal)), 0)


def causal_over(cx, mask: Expr) -> Optional[tuple]:
    """``(query length, key length)`` (the keys of dynamic sizes) when ``mask`` is ``kv <= q`` over two aranges of
    dynamic lengths (``cx.ranges``), the keys' along the last axis and the queries' along the one before, as
    Hugging Face builds its causal mask (``kv_idx <= q_idx``), through unit axes added, broadcasts and an ``or``
    with all-False (an ``and`` with all-True); else None."""
    while True:
        if is_call_to(mask, "broadcast_to"):
            mask = mask.args[0]
        elif (is_call_to(mask, "add") or is_call_to(mask, "logical_or") or is_call_to(mask, "bitwise_or")) and \
                cx.dtype_of(mask) == "bool" and _holds(mask.args[1], False):
            mask = mask.args[0]
        elif (is_call_to(mask, "logical_and") or is_call_to(mask, "bitwise_and")) and _holds(mask.args[1], True):
            mask = mask.args[0]
        else:
            break
    if is_call_to(mask, "less_equal"):
        keys, queries = mask.args
    elif is_call_to(mask, "greater_equal"):
        queries, keys = mask.args
    else:
        return None
    kv, q = _range_axis(cx, keys), _range_axis(cx, queries)
    if kv is None or q is None or kv[1] != -1 or q[1] != -2:
        return None
    return q[0], kv[0]


def _range_axis(cx, e: Expr) -> Optional[tuple]:
    """``(size key, axis from the end)``: ``e`` is an arange over a dynamic size (``cx.ranges``), plus 0 or times 1,
    with unit axes added around it, along that axis; else None."""
    added = []
    while is_call_to(e, "expand_dims"):
        added.append(e.attrs)
        e = e.args[0]
    while e not in cx.ranges and (is_call_to(e, "add") and _holds(e.args[1], 0) or
                                  is_call_to(e, "multiply") and _holds(e.args[1], 1)):
        e = e.args[0]  # cache positions: the range plus the 0 tokens seen before
    key = cx.ranges.get(e)
    if key is None:
        return None
    at, ndim = 0, 1
    for a in reversed(added):  # innermost first: where the range's axis moves as unit axes are inserted
        where = a.axis if a.axis >= 0 else a.axis + ndim + 1
        at += a.num_newaxis if where <= at else 0
        ndim += a.num_newaxis
    return key, at - ndim


def _holds(e: Expr, value) -> bool:
    """``e`` is a constant holding ``value`` everywhere (``uniform_value``)."""
    if not isinstance(e, Constant):
        return False
    e.checked_type  # noqa: B018 - typed, as uniform_value reads it
    u = uniform_value(e)
    return u is not None and bool(u == value)


def _unrepeated(cx, x) -> Optional[Expr]:
    """The (B, Hkv, S, E) keys or values that ``x`` repeats head by head (Hugging Face's ``repeat_kv``:
    ``reshape(broadcast_to(expand_dims(t, 2), (B, Hkv, n, S, E)), (B, Hkv * n, S, E))``), or None. Attention over
    them with shared heads is the same function, with the keys' gradients added over the heads in float32 before
    rounding (eager's ``enable_gqa`` kernel) and the keys saved once per group."""
    if not is_call_to(x, "reshape") or not is_call_to(x.args[0], "broadcast_to"):
        return None
    wide, inner = x.args[0], x.args[0].args[0]
    shape = tuple(cx.shape_of(inner))
    if len(shape) != 5 or shape[2] != 1 or Any in shape[1:] or tuple(cx.shape_of(wide))[:2] != shape[:2] or \
            tuple(cx.shape_of(x)) != shape[:1] + (shape[1] * cx.shape_of(wide)[2],) + shape[3:]:
        return None
    if is_call_to(inner, "expand_dims") and inner.attrs.axis == 2 and inner.attrs.num_newaxis == 1:
        return inner.args[0]
    return _op("reshape")(inner, newshape(cx, "repeat_kv", shape[:2] + shape[3:]))


def _attention_bias(cx, mask, dt: str, full: tuple) -> Optional[tuple]:
    """``(bias,)``: an sdpa mask as ``nn.attention``'s rank-4 additive bias, or None (a dtype or shape it does
    not take)."""
    mdt, shape = cx.dtype_of(mask), tuple(cx.shape_of(mask))
    if full[1] is Any or len(shape) > 4 or any(d != 1 and d != f for d, f in zip(shape[::-1], full[::-1])):
        return None
    if mdt == "bool":
        mask = _op("where")(mask, scalar(0.0, dt), scalar(-np.inf, dt))
    elif mdt not in (dt, "float32"):
        return None
    if len(shape) < 4:
        mask = _op("expand_dims")(mask, 0, 4 - len(shape))
    return (mask,)


def _sdpa_in(cx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """The math of attention; over a static batch, the lengths may be dynamic (torch sizes ``L``, ``S``)."""
    what = "scaled_dot_product_attention"
    sq, sk, sv = (tuple(cx.shape_of(t)) for t in (q, k, v))
    static(cx, what, (sq[-1], sv[-1]))
    dt = cx.dtype_of(q)
    if enable_gqa and len(sq) >= 3:
        k, v, sk, sv = _repeated_heads(cx, k, v, sq, sk, sv)
    L, S, E, Ev = cx.arg_val(0).shape[-2], cx.arg_val(1).shape[-2], sq[-1], sv[-1]
    mshape = () if attn_mask is None else tuple(cx.shape_of(attn_mask))
    batch = broadcast_shapes(what, (), sq[:-2], sk[:-2], sv[:-2], mshape[:-2])
    if Any in batch:
        static(cx, what, (sq[-2], sk[-2]))  # a dynamic batch, static lengths
    n = -1 if Any in batch else math.prod(batch)
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)

    def rows(x, m, e):
        """``x`` broadcast to the batch, as (batch, m, e) rows of torch sizes ``m``, ``e``."""
        return reshape_to(cx, what, expand_to(cx, x, batch + (static_dim(m), e), batch + (m, e)), batch + (m, e), (n, m, e))

    q3, k3, v3 = rows(q, L, E), rows(k, S, E), rows(v, S, Ev)
    s = _op("nn.batch_matmul")(_op("multiply")(q3, scalar(scale, dt)), k3, transpose_b=True)
    s = reshape_to(cx, what, s, (n, L, S), batch + (L, S))
    keep = None
    if is_causal:
        keep = _lower_triangle(cx, L, S)
    if attn_mask is not None:
        if cx.dtype_of(attn_mask) == "bool":
            keep = attn_mask if keep is None else _op("logical_and")(keep, attn_mask)
        else:
            s = _op("add")(s, cast(cx, attn_mask, dt))
    if keep is not None:
        s = _op("where")(keep, s, scalar(-np.inf, dt))
    # a row masked everywhere (a boolean or an additive -inf mask): 0, with gradient 0, not NaN
    p = safe_softmax(cx, s, -1) if attn_mask is not None else _op("nn.softmax")(s, axis=-1)
    if dropout_p > 0.0:
        p = _op("nn.dropout")(p, cx.dropout_mask(batch + (L, S), dropout_p), rate=float(dropout_p))
    out = _op("nn.batch_matmul")(reshape_to(cx, what, p, batch + (L, S), (n, L, S)), v3, transpose_b=False)
    return reshape_to(cx, what, out, (n, L, Ev), batch + (L, Ev))


def _lower_triangle(cx, L, S) -> Expr:
    """``tril(ones(L, S))`` as booleans (key ``j`` kept for query ``i`` when ``j <= i``); of torch sizes that may be
    symbolic (read off the inputs that carry them)."""
    if static_dim(L) is not Any and static_dim(S) is not Any:
        return const(np.tril(np.ones((static_dim(L), static_dim(S)), dtype=bool)))
    i, j = (dynamic_range(cx, n, 0, 1, "int64") if static_dim(n) is Any else const(np.arange(n)) for n in (L, S))
    return _op("greater_equal")(_op("expand_dims")(i, 1), j)


# ------------------------------------------------------------------ losses and embeddings

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _class_last(cx, x, target):
    """(N*d..., C) predictions and (N*d...,) targets from (N, C, d...) / (N, d...) or (C,) / ()."""
    shape = tuple(cx.shape_of(x))
    if len(shape) > 2:
        static(cx, "nll_loss on (N, C, d...) data", shape[1:])  # a dynamic batch only
    if len(shape) == 1:
        return _op("expand_dims")(x, 0), _op("reshape")(target, (1,)), ()
    if len(shape) == 2:
        return x, target, (shape[0],)
    perm = (0,) + tuple(range(2, len(shape))) + (1,)
    flat = _op("reshape")(_op("transpose")(x, perm), (-1, shape[1]))
    return flat, _op("reshape")(target, (-1,)), (shape[0],) + tuple(shape[2:])


def _nll(cx, logp, target, weight, reduction, ignore_index):
    shape = cx.shape_of(logp)
    c = shape[1] if len(shape) > 1 else shape[0]
    w = weight if weight is not None else const(np.ones((c,), dtype=cx.dtype_of(logp)))
    p2, t1, out_shape = _class_last(cx, logp, target)
    red = _REDUCTIONS[reduction] if isinstance(reduction, int) else reduction
    loss = _op("nn.nll_loss")(p2, t1, w, reduction=red, ignore_index=int(ignore_index))
    return _op("reshape")(loss, newshape(cx, "nll_loss", out_shape)) if red == "none" and len(out_shape) != 1 else loss


@aten("aten.cross_entropy_loss.default")
def _cross_entropy(cx, x, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    axis = 1 if cx.ndim_of(x) > 1 else 0
    logp = _op("nn.log_softmax")(x, axis=axis)
    dt = cx.dtype_of(x)
    c = cx.shape_of(x)[axis]
    red = _REDUCTIONS[reduction]
    if cx.dtype_of(target) in FLOAT_DTYPES:  # class probabilities
        if label_smoothing:
            target = _op("add")(_op("multiply")(target, scalar(1 - label_smoothing, dt)), scalar(label_smoothing / c, dt))
        wl = _op("multiply")(logp, _op("reshape")(weight, (c,) + (1,) * (cx.ndim_of(x) - axis - 1))) if weight is not None else logp
        loss = _op("negative")(_op("sum")(_op("multiply")(wl, target), (axis,), False))
        if red == "none":
            return loss
        total = _op("sum")(loss)
        if red == "sum":
            return total
        shape = static(cx, "cross_entropy with probabilities", cx.shape_of(x))
        n = math.prod(shape) // c if cx.ndim_of(x) > 1 else 1  # the mean is over every (sample, position)
        return _op("divide")(total, scalar(n, dt))
    nll = _nll(cx, logp, target, weight, reduction, ignore_index)
    if not label_smoothing:
        return nll
    # PyTorch: (1 - eps) * nll + eps / C * smooth, smooth = -sum_c w_c logp_c (ignored targets give 0)
    wl = logp if weight is None else _op("multiply")(logp, _op("reshape")(weight, (c,) + (1,) * (cx.ndim_of(x) - axis - 1)))
    smooth = _op("negative")(_op("sum")(wl, (axis,), False))
    valid = _op("not_equal")(target, scalar(ignore_index, cx.dtype_of(target)))
    smooth = _op("where")(valid, smooth, scalar(0.0, dt))
    if red == "sum":
        smooth = _op("sum")(smooth)
    elif red == "mean":
        if weight is None:  # a count: ATen divides a float16/bfloat16 sum by it in float32
            denom = _op("sum")(_op("cast")(valid, "float32" if dt in HALF_DTYPES else dt))
        else:
            picked = _op("take")(weight, _op("where")(valid, target, scalar(0, cx.dtype_of(target))), axis=0)
            denom = _op("sum")(_op("where")(valid, picked, scalar(0.0, dt)))
        total = _op("sum")(smooth)
        smooth = by_number(cx, total, denom, dt, True) or _op("divide")(total, denom)
    return _op("add")(scaled(nll, 1 - label_smoothing), scaled(smooth, label_smoothing / c))


def _multilabel_margin(cx, x, target, reduction):
    """``(loss, is_target)``: per sample, sum over its targets j (the entries before the first -1) and the
    non-targets i of ``max(0, 1 - x[j] + x[i]) / C``. (PyTorch's own decomposition also sums the entries after
    the -1, read as class 0: a wrong loss.)"""
    shape = tuple(cx.shape_of(x))
    dt = cx.dtype_of(x)
    c = static(cx, "multilabel_margin_loss", shape[-1:])[0] if shape else 1  # (C,) and () are one sample
    x2, t2 = (x, target) if len(shape) == 2 else (_op("reshape")(x, (1, c)), _op("reshape")(target, (1, c)))
    t2 = _op("cast")(t2, "int64")
    idx = const(np.arange(c, dtype=np.int64))
    end = _op("min")(_op("where")(_op("equal")(t2, scalar(-1, "int64")), idx, scalar(c, "int64")), (1,), True)
    valid = _op("less")(idx, end)  # (N, J): j is a target
    picked = _op("gather")(x2, _op("where")(valid, t2, scalar(0, "int64")), axis=1)  # x[n, t[n, j]]
    hits = _op("one_hot")(_op("where")(valid, t2, scalar(-1, "int64")), scalar(1, "int64"), scalar(0, "int64"),
                          depth=c, dtype="int64")  # (N, J, I); -1 (no target) is all zeros
    is_target = _op("greater")(_op("sum")(hits, (1,), False), scalar(0, "int64"))  # (N, I)
    z = _op("add")(_op("subtract")(scalar(1.0, dt), _op("expand_dims")(picked, 2)), _op("expand_dims")(x2, 1))
    keep = _op("logical_and")(_op("expand_dims")(valid, 2), _op("expand_dims")(_op("logical_not")(is_target), 1))
    z = _op("where")(keep, _op("divide")(_op("maximum")(z, scalar(0.0, dt)), scalar(float(c), dt)), scalar(0.0, dt))
    per_sample = _op("sum")(z, (1, 2), False)
    red = _REDUCTIONS[reduction]
    loss = {"sum": lambda: _op("sum")(per_sample), "mean": lambda: _op("mean")(per_sample, None, False),
            "none": lambda: per_sample if len(shape) == 2 else _op("reshape")(per_sample, ())}[red]()
    return [loss, _op("reshape")(_op("cast")(is_target, dt), shape)]


@aten("aten.multilabel_margin_loss.default")
def _multilabel_margin_loss(cx, x, target, reduction=1):
    return _multilabel_margin(cx, x, target, reduction)[0]


@aten("aten.multilabel_margin_loss_forward.default")
def _multilabel_margin_loss_forward(cx, x, target, reduction):
    return _multilabel_margin(cx, x, target, reduction)


@aten("aten.nll_loss.default", "aten.nll_loss_nd.default", "aten.nll_loss2d.default")
def _nll_loss(cx, logp, target, weight=None, reduction=1, ignore_index=-100):
    return _nll(cx, logp, target, weight, reduction, ignore_index)


@aten("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default")
def _nll_loss_forward(cx, logp, target, weight, reduction, ignore_index):
    return [_nll(cx, logp, target, weight, reduction, ignore_index), None]


@aten("aten.binary_cross_entropy_with_logits.default")
def _bce_with_logits(cx, z, target, weight=None, pos_weight=None, reduction=1):
    """One ``nn.binary_cross_entropy_with_logits`` (ATen's kernel on torch), where PyTorch's decomposition takes
    sixteen operators forward and saves two masks for the backward; weights in the logits' dtype, a ``1``
    placeholder for an absent one."""
    dt = cx.dtype_of(z)
    one = const(np.ones((), dt))
    args = [cast(cx, v, dt) if v is not None else one for v in (target, weight, pos_weight)]
    return _op("nn.binary_cross_entropy_with_logits")(z, *args, reduction=_REDUCTIONS[reduction], weighted=weight is not None,
                                                      pos_weighted=pos_weight is not None)


def _scaled_by_frequency(cx, looked_up: Expr, w: Expr, idx: Expr) -> Expr:
    """Rows ``take(w, idx)`` whose gradient is divided by how often each index occurs in ``idx`` (PyTorch's
    ``scale_grad_by_freq``); the values are unchanged: ``stop_gradient(y) + (y - stop_gradient(y)) / count``."""
    dt, flat = cx.dtype_of(w), _int64_of(cx, _op("reshape")(idx, (-1,)))
    rows = static(cx, "embedding", cx.shape_of(w))[0]
    counts = _op("index_add")(const(np.zeros((rows,), dt)), flat, _op("ones_like")(_op("cast")(flat, dt)), axis=0)
    per_lookup = _op("expand_dims")(_op("take")(counts, idx, axis=0), cx.ndim_of(idx))
    frozen = _op("stop_gradient")(looked_up)
    return _op("add")(frozen, _op("divide")(_op("subtract")(looked_up, frozen), per_lookup))


SPARSE_EMBEDDING_WARNING = (
    "pullback: an embedding with sparse=True gets a dense weight gradient from pullback (SGD and Adagrad update "
    "with it as with eager's sparse one; SparseAdam refuses it): construct the embedding with sparse=False (and "
    "train it with Adam or AdamW)")


@aten("aten.embedding.default")
def _embedding(cx, w, idx, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """``take(w, idx, axis=0)``; rows looked up at ``padding_idx`` pass no gradient to the weight, and with
    ``scale_grad_by_freq`` each lookup's gradient is divided by how often its index occurs in ``idx`` (PyTorch's
    rules, see ``_scaled_by_frequency``). The weight's gradient adds the lookups' rows one by one (``sequential``),
    as eager's ``embedding_dense_backward`` does (in half precision, its rounding). With ``sparse`` the gradient
    is that dense one: a warning says what that changes."""
    if sparse:
        warnings.warn(SPARSE_EMBEDDING_WARNING, stacklevel=2)
    out = _op("take")(w, idx, axis=0, sequential=True)
    if scale_grad_by_freq:
        out = _scaled_by_frequency(cx, out, w, idx)
    if padding_idx is None or padding_idx < 0:
        return out
    pad = _op("expand_dims")(_op("equal")(idx, scalar(padding_idx, cx.dtype_of(idx))), cx.ndim_of(idx))
    return _op("where")(pad, _op("stop_gradient")(out), out)




@aten("aten.embedding_renorm.default", "aten.embedding_renorm_.default")
def _embedding_renorm(cx, w, idx, max_norm, norm_type):
    """The weight after ``max_norm``'s in-place renormalisation (PyTorch's ``embedding_renorm_``): each row
    looked up whose ``norm_type``-norm exceeds ``max_norm`` is scaled by ``max_norm / (norm + 1e-7)``.

    Eager renormalises the weight in place under ``no_grad`` and then looks rows up in that same tensor, so the
    lookup's gradient reaches the weight unscaled; ``torch.export`` records the update on a detached copy. The
    result is therefore the new values with the gradient of the weight itself (``w + stop_gradient(new - w)``,
    reading through the detach); the importer writes the new values back (a parameter, buffer or input
    mutation), as eager's in-place update does."""
    if getattr(getattr(w, "op", None), "name", None) == "stop_gradient":
        w = w.args[0]
    dt = cx.dtype_of(w)
    rows = static(cx, "embedding_renorm", cx.shape_of(w))[0]
    looked_up = _op("greater")(_op("index_add")(const(np.zeros((rows,), dt)), _int64_of(cx, _op("reshape")(idx, (-1,))),
                                                _op("ones_like")(_op("cast")(_op("reshape")(idx, (-1,)), dt)), axis=0),
                               scalar(0, dt))
    norm = _pnorm_last(cx, w, float(norm_type), dt)
    scale = _op("divide")(scalar(max_norm, dt), _op("add")(norm, scalar(1e-7, dt)))
    scale = _op("where")(_op("logical_and")(looked_up, _op("greater")(norm, scalar(max_norm, dt))), scale, scalar(1, dt))
    change = _op("subtract")(_op("multiply")(w, _op("expand_dims")(scale, 1)), w)
    return _op("add")(w, _op("stop_gradient")(change))


# ------------------------------------------------------------------ distances and bags of embeddings


def _zero_safe(s: Expr, fn, dt: str) -> Expr:
    """``fn(s)`` with 0 where ``s == 0`` and a zero gradient there (a norm's kink, as PyTorch's cdist backward)."""
    zero = _op("equal")(s, scalar(0, dt))
    return _op("where")(zero, scalar(0, dt), fn(_op("where")(zero, scalar(1, dt), s)))


def _pnorm_last(cx, d: Expr, p: float, dt: str) -> Expr:
    if p == 2:
        return _zero_safe(_op("sum")(_op("multiply")(d, d), (-1,), False), _op("sqrt"), dt)
    a = _op("abs")(d)
    if p == 1:
        return _op("sum")(a, (-1,), False)
    if p == math.inf:
        return _op("max")(a, (-1,), False)
    if p == 0:
        return _op("sum")(_op("cast")(_op("not_equal")(d, scalar(0, dt)), dt), (-1,), False)
    s = _op("sum")(_op("power")(a, scalar(p, dt)), (-1,), False)
    return _zero_safe(s, lambda v: _op("power")(v, scalar(1.0 / p, dt)), dt)


@aten("aten._cdist_forward.default")
def _cdist(cx, x1, x2, p, compute_mode=None):
    """``(..., P, M), (..., R, M) -> (..., P, R)`` p-norm distances."""
    d = _op("subtract")(_op("expand_dims")(x1, cx.ndim_of(x1) - 1), _op("expand_dims")(x2, cx.ndim_of(x2) - 2))
    return _pnorm_last(cx, d, float(p), cx.dtype_of(x1))


@aten("aten._pdist_forward.default")
def _pdist(cx, x, p=2.0):
    """The upper triangle (i < j, row-major) of the pairwise distances of the rows of ``x``."""
    n = static(cx, "pdist", cx.shape_of(x))[0]
    if n < 2:
        return const(np.zeros((0,), dtype=cx.dtype_of(x)))
    d = _op("subtract")(_op("expand_dims")(x, 1), _op("expand_dims")(x, 0))
    full = _op("reshape")(_pnorm_last(cx, d, float(p), cx.dtype_of(x)), (n * n,))
    pos = np.array([i * n + j for i in range(n) for j in range(i + 1, n)], dtype="int64")
    return _op("take")(full, const(pos), axis=0)


@aten("aten._embedding_bag.default", "aten._embedding_bag_forward_only.default")
def _embedding_bag(cx, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False, per_sample_weights=None,
                   include_last_offset=False, padding_idx=-1):
    """``(output, offset2bag, bag_size, max_indices)`` for ``sum``, ``mean`` and ``max`` bags (``max_indices`` is
    not converted); rows at ``padding_idx`` take no part, an empty bag gives zeros."""
    dt, it = cx.dtype_of(weight), cx.dtype_of(indices)
    n = static(cx, "embedding_bag", cx.shape_of(indices))[0]
    nb = static(cx, "embedding_bag", cx.shape_of(offsets))[0] - (1 if include_last_offset else 0)
    starts = _op("strided_slice")(_int64_of(cx, offsets), (1,), (nb,), (1,), (0,))
    positions = _op("arange")(0, n, 1, "int64")
    bag = _op("sum")(_op("cast")(_op("less_equal")(_op("expand_dims")(starts, 0), _op("expand_dims")(positions, 1)), "int64"),
                     (1,), False)
    rows = _op("take")(weight, indices, axis=0)
    if scale_grad_by_freq:
        rows = _scaled_by_frequency(cx, rows, weight, indices)
    if per_sample_weights is not None:
        rows = _op("multiply")(rows, _op("expand_dims")(per_sample_weights, 1))
    valid = _op("not_equal")(indices, scalar(padding_idx if padding_idx is not None else -1, it))
    d = static(cx, "embedding_bag", cx.shape_of(weight))[1]
    count = _op("index_add")(const(np.zeros((nb,), dtype=dt)), bag, _op("cast")(valid, dt), axis=0)
    if mode == 2:  # max: padding rows lose to every row; a bag without rows gives 0
        rows = _op("where")(_op("expand_dims")(valid, 1), rows, scalar(-np.inf, dt))
        where = _op("broadcast_to")(_op("expand_dims")(bag, 1), (n, d))
        out = _op("scatter_reduce")(const(np.zeros((nb, d), dtype=dt)), where, rows, axis=0, reduce="amax",
                                    include_self=False)
        out = _op("where")(_op("expand_dims")(_op("greater")(count, scalar(0, dt)), 1), out, scalar(0, dt))
        return [out, bag, _op("cast")(count, "int64"), None]
    rows = _op("where")(_op("expand_dims")(valid, 1), rows, scalar(0, dt))
    out = _op("index_add")(const(np.zeros((nb, d), dtype=dt)), bag, rows, axis=0)
    if mode == 1:
        out = _op("divide")(out, _op("expand_dims")(_op("maximum")(count, scalar(1, dt)), 1))
    return [out, bag, _op("cast")(count, "int64"), None]


def _int64_of(cx, x):
    return cast(cx, x, "int64")


# ------------------------------------------------------------------ fake quantization (quantization-aware training)


def _fake_quant(cx, x, scale: Expr, zero_point: Expr, qmin, qmax) -> list:
    """ATen's fake quantization (``nn.fake_quantize``: values bit for bit, the straight-through gradient) and the
    mask of the values inside the range, where its gradient passes ones (computed only if a later node reads it)."""
    through = _op("nn.fake_quantize_grad")(_op("ones_like")(x), x, scale, zero_point, qmin, qmax)
    return [_op("nn.fake_quantize")(x, scale, zero_point, qmin, qmax), _op("not_equal")(through, scalar(0, cx.dtype_of(x)))]


@aten("aten.fake_quantize_per_tensor_affine_cachemask.default")
def _fake_quantize_per_tensor(cx, x, scale, zero_point, quant_min, quant_max):
    dt = cx.dtype_of(x)
    return _fake_quant(cx, x, scalar(np.float32(scale), dt), scalar(zero_point, dt), quant_min, quant_max)


@aten("aten.fake_quantize_per_channel_affine_cachemask.default")
def _fake_quantize_per_channel(cx, x, scale, zero_point, axis, quant_min, quant_max):
    dt, ndim = cx.dtype_of(x), cx.ndim_of(x)
    shape = tuple(-1 if i == axis % ndim else 1 for i in range(ndim))
    per = [_op("reshape")(cast(cx, cast(cx, v, "float32"), dt), shape) for v in (scale, zero_point)]
    return _fake_quant(cx, x, per[0], per[1], quant_min, quant_max)


SMALL_SCALE = np.float32(6.1e-5)  # ATen's ChooseQuantizationParams raises smaller scales to this


def _choose_qparams(cx, lo: Expr, hi: Expr, qmin: int, qmax: int, symmetric: bool) -> tuple:
    """(float32 scale, int32 zero point) per element of the float32 running ``lo``/``hi``: the arithmetic of
    ATen's ``ChooseQuantizationParams``, which its fused observer calls. The range is widened to hold 0 (and, when
    ``symmetric``, to a symmetric one); the scale, rounded to float32, is 0.1 where it is 0 or its reciprocal
    overflows, and at least ``SMALL_SCALE`` (the range grows with it); the zero point, from that float32 scale in
    float64, rounds half to even (the middle of ``[qmin, qmax]`` for a symmetric range holding 0)."""
    f32, f64 = "float32", "float64"
    where, zero, span = _op("where"), scalar(0, f32), qmax - qmin
    straddles = _op("logical_and")(_op("less")(lo, zero), _op("greater")(hi, zero))
    if symmetric:
        sym_min, sym_max = -(span // 2 + 1), span // 2
        half = _op("maximum")(_op("abs")(_op("divide")(lo, scalar(sym_min, f32))),
                              _op("abs")(_op("divide")(hi, scalar(sym_max, f32))))
        lo = where(straddles, _op("multiply")(half, scalar(sym_min, f32)), lo)
        hi = where(straddles, _op("multiply")(half, scalar(sym_max, f32)), hi)
    lo, hi = _op("minimum")(lo, zero), _op("maximum")(hi, zero)
    scale = _op("cast")(_op("divide")(_op("subtract")(_op("cast")(hi, f64), _op("cast")(lo, f64)), scalar(span, f64)), f32)
    bad = _op("logical_or")(_op("equal")(scale, zero), _isinf(cx, _op("divide")(scalar(1, f32), scale)))
    scale = where(bad, scalar(0.1, f32), scale)
    floor = scalar(SMALL_SCALE, f32)
    small, grow, widest = _op("less")(scale, floor), _op("divide")(floor, scale), scalar(SMALL_SCALE * np.float32(span), f32)
    lo_zero, hi_zero = _op("equal")(lo, zero), _op("equal")(hi, zero)
    lo, hi = (where(small, where(lo_zero, lo, where(hi_zero, _op("negative")(widest), _op("multiply")(lo, grow))), lo),
              where(small, where(lo_zero, widest, where(hi_zero, hi, _op("multiply")(hi, grow))), hi))
    scale = where(small, floor, scale)
    s64 = _op("cast")(scale, f64)
    from_lo, from_hi = (_op("divide")(_op("cast")(v, f64), s64) for v in (lo, hi))
    err_lo = _op("subtract")(scalar(abs(qmin), f64), _op("abs")(from_lo))
    err_hi = _op("subtract")(scalar(abs(qmax), f64), _op("abs")(from_hi))
    zp = where(_op("less")(err_lo, err_hi), _op("subtract")(scalar(qmin, f64), from_lo),
               _op("subtract")(scalar(qmax, f64), from_hi))
    if symmetric:
        zp = where(straddles, scalar((qmin + qmax) / 2, f64), zp)
    return scale, _op("cast")(_op("clip")(_op("round")(zp), float(qmin), float(qmax)), "int32")


@aten("aten._fused_moving_avg_obs_fq_helper_functional.default")
def _fused_observer_fake_quant(cx, x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point,
                               averaging_const, quant_min, quant_max, ch_axis, per_row_fake_quant=False,
                               symmetric_quant=False):
    """``torch.ao.quantization``'s fused observer and fake quantization (``FusedMovingAvgObsFakeQuantize``, the
    default of ``get_default_qat_qconfig``), as ATen's CPU kernel: while ``observer_on``, the running min/max
    move toward the batch's (per tensor, or per channel along ``ch_axis``; an unseen running value, +-inf,
    takes the batch's); while ``fake_quant_on``, the scale and zero point are chosen from them
    (``_choose_qparams``) and ``x`` is fake-quantized with them (else passed through). A per-channel observer
    that has seen nothing yet holds empty buffers: they come out with one value per channel, as eager resizes
    them. Returns (output, mask, running min, running max, scale, zero point): the buffers' new values."""
    dt, ndim = cx.dtype_of(x), cx.ndim_of(x)
    if dt != "float32":
        raise PullbackError(f"fused_moving_avg_obs_fake_quant: ATen's kernel takes float32 data, got {dt}")
    where = _op("where")
    on = [_op("not_equal")(_op("reshape")(flag, ()), scalar(0, cx.dtype_of(flag))) for flag in (observer_on, fake_quant_on)]
    if per_row_fake_quant:
        axis = ch_axis % ndim
        channels = static(cx, "fused_moving_avg_obs_fake_quant", cx.shape_of(x))[axis]
        others = tuple(i for i in range(ndim) if i != axis)
        cur = [_op(name)(x, others, False) for name in ("min", "max")]
        if static(cx, "the observer's running min", cx.shape_of(running_min)) == (0,):  # nothing seen yet
            running_min = const(np.full((channels,), np.inf, np.float32))
            running_max = const(np.full((channels,), -np.inf, np.float32))
    else:
        cur = [_op(name)(x, None, False) for name in ("min", "max")]
    c = scalar(np.float32(averaging_const), "float32")
    moved = [where(_isinf(cx, r), v, _op("add")(r, _op("multiply")(c, _op("subtract")(v, r))))
             for r, v in zip((running_min, running_max), cur)]
    lo, hi = (where(on[0], m, r) for m, r in zip(moved, (running_min, running_max)))
    new_scale, new_zp = _choose_qparams(cx, lo, hi, quant_min, quant_max, symmetric_quant)
    shape = tuple(-1 if i == axis else 1 for i in range(ndim)) if per_row_fake_quant else ()
    quantized, mask = _fake_quant(cx, x, _op("reshape")(new_scale, shape), _op("reshape")(_op("cast")(new_zp, dt), shape),
                                  quant_min, quant_max)
    out = where(on[1], quantized, x)
    mask = _op("logical_or")(mask, _op("logical_not")(on[1]))
    return [out, mask, lo, hi, where(on[1], new_scale, scale), where(on[1], new_zp, zero_point)]
