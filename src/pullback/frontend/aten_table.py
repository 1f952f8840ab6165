"""ATen operator -> pullback converters: one table, one small function per operator.

A converter is ``fn(cx, *args, **kwargs)``: ``args`` are the FX node's
arguments with every FX node replaced by its pullback value (an ``Expr``, or a
Python list of Exprs for tuple-valued ATen ops, read by ``getitem``); plain
Python values (ints, lists, dtypes) stay as they are. ``cx`` is the importer's
context (``ConvertContext``): the node being converted, its output shape and
dtype (from ``node.meta["val"]``), and ``cx.dropout_mask(shape, rate)``, which
adds an explicit mask parameter (programs stay pure).

The table is keyed by the overload's string (``str(torch.ops.aten.relu.default)``
is ``"aten.relu.default"``), so this module never imports torch.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np

from ..ir.errors import PullbackError
from ..ir.expr import Expr, const
from ..ops.registry import get_op

ATEN_TABLE: dict[str, Callable] = {}


def _op(name: str):
    return get_op(name)


def aten(*names: str):
    """Register the decorated converter for the ATen overloads ``names``."""

    def deco(fn):
        for n in names:
            ATEN_TABLE[n] = fn
        return fn

    return deco


def scalar(v, like_dtype: str) -> Expr:
    return const(np.asarray(v, dtype=like_dtype))


def operand(cx, v, like: Expr) -> Expr:
    """``v`` as an expression; Python numbers take the dtype of ``like`` (weak typing, as in PyTorch)."""
    return v if isinstance(v, Expr) else scalar(v, cx.dtype_of(like))


def _binary(cx, name: str, x, y):
    like = x if isinstance(x, Expr) else y
    return _op(name)(operand(cx, x, like), operand(cx, y, like))


def _norm_axis(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


# ------------------------------------------------------------------ elementwise


_UNARY = {
    "relu": "nn.relu", "tanh": "tanh", "sigmoid": "sigmoid", "exp": "exp", "log": "log", "sqrt": "sqrt",
    "rsqrt": "rsqrt", "neg": "negative", "abs": "abs", "erf": "erf", "sin": "sin", "cos": "cos",
    "silu": "nn.silu", "reciprocal": "reciprocal", "log1p": "log1p", "square": "square",
}
for _aten_name, _pb_name in _UNARY.items():
    ATEN_TABLE[f"aten.{_aten_name}.default"] = (lambda pb: lambda cx, x: _op(pb)(x))(_pb_name)


@aten("aten.gelu.default")
def _gelu(cx, x, approximate="none"):
    return _op("nn.gelu")(x, approximate=approximate)


@aten("aten.leaky_relu.default")
def _leaky_relu(cx, x, negative_slope=0.01):
    return _op("nn.leaky_relu")(x, alpha=float(negative_slope))


@aten("aten.hardtanh.default", "aten.clamp.default")
def _clamp(cx, x, lo=-1.0, hi=1.0):
    return _op("clip")(x, -math.inf if lo is None else float(lo), math.inf if hi is None else float(hi))


@aten("aten.add.Tensor", "aten.add.Scalar")
def _add(cx, x, y, alpha=1):
    return _binary(cx, "add", x, y if alpha == 1 else _binary(cx, "multiply", y, alpha))


@aten("aten.sub.Tensor", "aten.sub.Scalar")
def _sub(cx, x, y, alpha=1):
    return _binary(cx, "subtract", x, y if alpha == 1 else _binary(cx, "multiply", y, alpha))


@aten("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(cx, x, y, alpha=1):
    return _binary(cx, "subtract", y, x if alpha == 1 else _binary(cx, "multiply", x, alpha))


for _aten_name, _pb_name in (("mul", "multiply"), ("div", "divide"), ("pow", "power"), ("maximum", "maximum"),
                             ("minimum", "minimum"), ("eq", "equal"), ("ne", "not_equal"), ("gt", "greater"),
                             ("ge", "greater_equal"), ("lt", "less"), ("le", "less_equal")):
    for _ov in ("Tensor", "Scalar", "Tensor_Scalar", "Tensor_Tensor", "default"):
        ATEN_TABLE[f"aten.{_aten_name}.{_ov}"] = (lambda pb: lambda cx, x, y: _binary(cx, pb, x, y))(_pb_name)


@aten("aten.logical_not.default")
def _logical_not(cx, x):
    return _op("logical_not")(x)


@aten("aten.where.self")
def _where(cx, c, x, y):
    like = x if isinstance(x, Expr) else y
    return _op("where")(c, operand(cx, x, like), operand(cx, y, like))


@aten("aten._to_copy.default", "aten.to.dtype", "aten.type_as.default")
def _to_copy(cx, x, *args, **kwargs):
    return _op("cast")(x, cx.out_dtype) if cx.dtype_of(x) != cx.out_dtype else x


@aten("aten.clone.default", "aten.contiguous.default", "aten.alias.default", "aten.detach.default",
      "aten.lift_fresh_copy.default")
def _identity(cx, x, *args, **kwargs):
    return x


# ------------------------------------------------------------------ dropout


@aten("aten.native_dropout.default")
def _native_dropout(cx, x, p, train):
    """``(out, mask)``: in training, ``out = nn.dropout(x, %dropout_mask_k, rate=p)``."""
    if not train or p == 0.0:
        return [x, None]
    return [_op("nn.dropout")(x, cx.dropout_mask(cx.shape_of(x), p), rate=float(p)), None]


@aten("aten.dropout.default", "aten.feature_dropout.default")
def _dropout(cx, x, p, train):
    return _native_dropout(cx, x, p, train)[0]


# ------------------------------------------------------------------ linear algebra


@aten("aten.linear.default")
def _linear(cx, x, w, b=None):
    y = _op("nn.dense")(x, w)
    return y if b is None else _op("add")(y, b)


@aten("aten.addmm.default")
def _addmm(cx, bias, a, b, beta=1, alpha=1):
    y = _op("nn.matmul")(a, b)
    if alpha != 1:
        y = _binary(cx, "multiply", y, alpha)
    return _op("add")(_binary(cx, "multiply", bias, beta) if beta != 1 else bias, y)


@aten("aten.mm.default")
def _mm(cx, a, b):
    return _op("nn.matmul")(a, b)


@aten("aten.bmm.default")
def _bmm(cx, a, b):
    return _op("nn.batch_matmul")(a, b, transpose_b=False)


@aten("aten.matmul.default")
def _matmul(cx, a, b):
    sa, sb = cx.shape_of(a), cx.shape_of(b)
    if len(sa) == 2 and len(sb) == 2:
        return _op("nn.matmul")(a, b)
    if len(sb) == 2:  # (..., k) @ (k, n): fold the leading dims
        flat = _op("reshape")(a, (-1, sa[-1]))
        return _op("reshape")(_op("nn.matmul")(flat, b), cx.out_shape)
    if len(sa) >= 3 and len(sb) >= 3 and sa[:-2] == sb[:-2]:
        a3 = _op("reshape")(a, (-1,) + tuple(sa[-2:]))
        b3 = _op("reshape")(b, (-1,) + tuple(sb[-2:]))
        return _op("reshape")(_op("nn.batch_matmul")(a3, b3, transpose_b=False), cx.out_shape)
    raise PullbackError(f"aten.matmul with shapes {sa} and {sb} is not supported (batch dims must match)")


# ------------------------------------------------------------------ shapes


@aten("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.flatten.using_ints",
      "aten.unflatten.int", "aten.view_as.default", "aten.reshape_as.default")
def _reshape(cx, x, *args):
    return x if cx.shape_of(x) == cx.out_shape else _op("reshape")(x, cx.out_shape)


@aten("aten.permute.default")
def _permute(cx, x, dims):
    n = len(cx.shape_of(x))
    return _op("transpose")(x, tuple(_norm_axis(d, n) for d in dims))


@aten("aten.transpose.int")
def _transpose(cx, x, d0, d1):
    n = len(cx.shape_of(x))
    perm = list(range(n))
    d0, d1 = _norm_axis(d0, n), _norm_axis(d1, n)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return _op("transpose")(x, tuple(perm))


@aten("aten.t.default", "aten.numpy_T.default")
def _t(cx, x):
    return _op("transpose")(x, (1, 0)) if len(cx.shape_of(x)) == 2 else x


@aten("aten.unsqueeze.default")
def _unsqueeze(cx, x, dim):
    return _op("expand_dims")(x, _norm_axis(dim, len(cx.shape_of(x)) + 1))


@aten("aten.squeeze.dims", "aten.squeeze.dim", "aten.squeeze.default")
def _squeeze(cx, x, dims=None):
    shape = cx.shape_of(x)
    dims = range(len(shape)) if dims is None else [dims] if isinstance(dims, int) else dims
    axes = tuple(sorted({_norm_axis(d, len(shape)) for d in dims if shape[d] == 1}))
    return _op("squeeze")(x, axes) if axes else x


@aten("aten.expand.default", "aten.expand_as.default")
def _expand(cx, x, *args):
    return x if cx.shape_of(x) == cx.out_shape else _op("broadcast_to")(x, cx.out_shape)


@aten("aten.select.int")
def _select(cx, x, dim, index):
    n = len(cx.shape_of(x))
    dim = _norm_axis(dim, n)
    size = cx.shape_of(x)[dim]
    index = index + size if index < 0 else index
    part = _op("strided_slice")(x, (index,), (index + 1,), (1,), (dim,))
    return _op("squeeze")(part, (dim,))


@aten("aten.slice.Tensor")
def _slice(cx, x, dim=0, start=None, end=None, step=1):
    size = cx.shape_of(x)[dim]
    start = 0 if start is None else start
    end = size if end is None or end > size else end
    if start == 0 and end == size and step == 1:
        return x
    return _op("strided_slice")(x, (start,), (end,), (step,), (_norm_axis(dim, len(cx.shape_of(x))),))


@aten("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default", "aten.unbind.int")
def _split(cx, x, sizes=None, dim=0):
    """Every piece is a strided_slice (chunk/split/unbind); the sizes come from the node's outputs."""
    n = len(cx.shape_of(x))
    dim = _norm_axis(dim, n)
    out, start = [], 0
    for shape in cx.out_shapes:
        stop = start + (shape[dim] if len(shape) == n else 1)
        piece = _op("strided_slice")(x, (start,), (stop,), (1,), (dim,))
        out.append(piece if len(shape) == n else _op("squeeze")(piece, (dim,)))
        start = stop
    return out


@aten("aten.cat.default")
def _cat(cx, xs, dim=0):
    return _op("concatenate")(list(xs), _norm_axis(dim, len(cx.out_shape)))


# ------------------------------------------------------------------ reductions and softmax


def _reduce(name):
    def conv(cx, x, dims=None, keepdim=False, dtype=None):
        ndim = len(cx.shape_of(x))
        axis = None if dims is None or dims == [] else tuple(_norm_axis(d, ndim) for d in ([dims] if isinstance(dims, int) else dims))
        return _op(name)(x, axis, bool(keepdim))

    return conv


for _aten_name, _pb_name in (("sum", "sum"), ("mean", "mean"), ("amax", "max"), ("amin", "min")):
    for _ov in ("dim_IntList", "dim", "default"):
        ATEN_TABLE[f"aten.{_aten_name}.{_ov}"] = _reduce(_pb_name)


@aten("aten._softmax.default", "aten.softmax.int")
def _softmax(cx, x, dim, *rest):
    return _op("nn.softmax")(x, axis=dim)


@aten("aten._log_softmax.default", "aten.log_softmax.int")
def _log_softmax(cx, x, dim, *rest):
    return _op("nn.log_softmax")(x, axis=dim)


# ------------------------------------------------------------------ losses and embeddings


_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _nll(cx, logp, shape, target, weight, reduction, ignore_index):
    c = shape[1] if len(shape) > 1 else shape[0]
    w = weight if weight is not None else const(np.ones((c,), dtype=cx.dtype_of(logp)))
    return _op("nn.nll_loss")(logp, target, w, reduction=_REDUCTIONS[reduction], ignore_index=int(ignore_index))


@aten("aten.cross_entropy_loss.default")
def _cross_entropy(cx, x, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    if label_smoothing != 0.0:
        raise PullbackError("cross_entropy with label_smoothing is not supported")
    if cx.dtype_of(target).startswith("float"):
        raise PullbackError("cross_entropy with probability targets is not supported (use class indices)")
    axis = 1 if len(cx.shape_of(x)) > 1 else 0
    return _nll(cx, _op("nn.log_softmax")(x, axis=axis), cx.shape_of(x), target, weight, reduction, ignore_index)


@aten("aten.nll_loss.default", "aten.nll_loss_nd.default", "aten.nll_loss2d.default")
def _nll_loss(cx, logp, target, weight=None, reduction=1, ignore_index=-100):
    return _nll(cx, logp, cx.shape_of(logp), target, weight, reduction, ignore_index)


@aten("aten.nll_loss_forward.default")
def _nll_loss_forward(cx, logp, target, weight, reduction, ignore_index):
    return [_nll(cx, logp, cx.shape_of(logp), target, weight, reduction, ignore_index), None]


@aten("aten.embedding.default")
def _embedding(cx, w, idx, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if scale_grad_by_freq:
        raise PullbackError("embedding with scale_grad_by_freq=True is not supported")
    return _op("take")(w, idx, axis=0)


@aten("aten.gather.default")
def _gather(cx, x, dim, index, sparse_grad=False):
    return _op("gather")(x, index, axis=_norm_axis(dim, len(cx.shape_of(x))))


# ------------------------------------------------------------------ normalisation


def _vec_or(v: Optional[Expr], c: int, fill: float, dtype: str) -> Expr:
    return v if v is not None else const(np.full((c,), fill, dtype=dtype))


@aten("aten.layer_norm.default")
def _layer_norm(cx, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    shape, dt = cx.shape_of(x), cx.dtype_of(x)
    k = len(normalized_shape)
    n = int(np.prod(normalized_shape))
    flat = x if k == 1 else _op("reshape")(x, tuple(shape[:-k]) + (n,))
    w = _vec_or(weight, n, 1.0, dt) if k == 1 or weight is None else _op("reshape")(weight, (n,))
    b = _vec_or(bias, n, 0.0, dt) if k == 1 or bias is None else _op("reshape")(bias, (n,))
    y = _op("nn.layer_norm")(flat, w, b, axis=-1, epsilon=float(eps), scale=weight is not None, center=bias is not None)
    return y if k == 1 else _op("reshape")(y, tuple(shape))


@aten("aten.native_layer_norm.default")
def _native_layer_norm(cx, x, normalized_shape, weight, bias, eps):
    return [_layer_norm(cx, x, normalized_shape, weight, bias, eps), None, None]


def _batch_norm(cx, x, weight, bias, mean, var, training, momentum, eps):
    c, dt = cx.shape_of(x)[1], cx.dtype_of(x)
    if mean is None or var is None:
        raise PullbackError("batch_norm without running statistics (track_running_stats=False) is not supported")
    bn = _op("nn.batch_norm")(x, _vec_or(weight, c, 1.0, dt), _vec_or(bias, c, 0.0, dt), mean, var, axis=1,
                              epsilon=float(eps), scale=weight is not None, center=bias is not None,
                              training=bool(training), momentum=float(momentum))
    return [bn[0], bn[1], bn[2]]


@aten("aten._native_batch_norm_legit_functional.default")
def _bn_functional(cx, x, weight, bias, mean, var, training, momentum, eps):
    out, new_mean, new_var = _batch_norm(cx, x, weight, bias, mean, var, training, momentum, eps)
    return [out, None, None, new_mean, new_var]  # (out, save_mean, save_rstd, running_mean, running_var)


@aten("aten._native_batch_norm_legit_no_training.default")
def _bn_no_training(cx, x, weight, bias, mean, var, momentum, eps):
    return [_batch_norm(cx, x, weight, bias, mean, var, False, momentum, eps)[0], None, None]


# ------------------------------------------------------------------ convolution and pooling


def _pair(v, default=None) -> tuple:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return default
    if isinstance(v, int):
        return (v, v)
    return (int(v[0]), int(v[-1])) if len(v) in (1, 2) else tuple(v)


def _conv(cx, x, w, b, stride, padding, dilation, groups):
    if isinstance(padding, str):
        raise PullbackError(f"conv2d with padding={padding!r} is not supported (give explicit sizes)")
    if len(cx.shape_of(x)) != 4:
        raise PullbackError(f"only 2-D convolution on NCHW data is supported, got input shape {cx.shape_of(x)}")
    y = _op("nn.conv2d")(x, w, strides=_pair(stride), padding=_pair(padding), dilation=_pair(dilation), groups=int(groups))
    return y if b is None else _op("nn.bias_add")(y, b, axis=1)


@aten("aten.conv2d.default")
def _conv2d(cx, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv(cx, x, w, b, stride, padding, dilation, groups)


@aten("aten.convolution.default")
def _convolution(cx, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        raise PullbackError("transposed convolution is not supported by the importer")
    return _conv(cx, x, w, b, stride, padding, dilation, groups)


@aten("aten.max_pool2d.default")
def _max_pool2d(cx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    k = _pair(kernel_size)
    return _op("nn.max_pool2d")(x, pool_size=k, strides=_pair(stride, k), padding=_pair(padding),
                                dilation=_pair(dilation), ceil_mode=bool(ceil_mode))


@aten("aten.max_pool2d_with_indices.default")
def _max_pool2d_with_indices(cx, *args):
    return [_max_pool2d(cx, *args), None]


@aten("aten.avg_pool2d.default")
def _avg_pool2d(cx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    if divisor_override is not None:
        raise PullbackError("avg_pool2d with divisor_override is not supported")
    k = _pair(kernel_size)
    return _op("nn.avg_pool2d")(x, pool_size=k, strides=_pair(stride, k), padding=_pair(padding),
                                ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad))


@aten("aten.adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(cx, x, output_size):
    return _op("nn.adaptive_avg_pool2d")(x, output_size=_pair(output_size))


# ------------------------------------------------------------------ attention


@aten("aten.scaled_dot_product_attention.default")
def _sdpa(cx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """softmax(q k^T * scale + mask) v on (B*, L, E) batches; dropout gets a mask parameter."""
    sq, sk, sv = cx.shape_of(q), cx.shape_of(k), cx.shape_of(v)
    if sq[:-2] != sk[:-2] or sk[:-2] != sv[:-2]:
        raise PullbackError(f"scaled_dot_product_attention with broadcast batch dims {sq}, {sk}, {sv} is not supported")
    dt = cx.dtype_of(q)
    L, S, E = sq[-2], sk[-2], sq[-1]
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    q3 = _op("reshape")(q, (-1, L, E))
    k3 = _op("reshape")(k, (-1, S, E))
    v3 = _op("reshape")(v, (-1, S, sv[-1]))
    s = _op("nn.batch_matmul")(_op("multiply")(q3, scalar(scale, dt)), k3, transpose_b=True)
    if is_causal:
        causal = np.where(np.tril(np.ones((L, S), dtype=bool)), 0.0, -np.inf).astype(dt)
        s = _op("add")(s, const(causal))
    if attn_mask is not None:
        m = _op("reshape")(attn_mask, (-1, L, S)) if len(cx.shape_of(attn_mask)) > 2 else attn_mask
        if cx.dtype_of(attn_mask) == "bool":
            s = _op("where")(m, s, scalar(-np.inf, dt))
        else:
            s = _op("add")(s, m)
    p = _op("nn.softmax")(s, axis=-1)
    if dropout_p > 0.0:
        mask = _op("reshape")(cx.dropout_mask(tuple(sq[:-2]) + (L, S), dropout_p), (-1, L, S))
        p = _op("nn.dropout")(p, mask, rate=float(dropout_p))
    return _op("reshape")(_op("nn.batch_matmul")(p, v3, transpose_b=False), cx.out_shape)


# ------------------------------------------------------------------ creation


@aten("aten.scalar_tensor.default")
def _scalar_tensor(cx, value, **kwargs):
    return scalar(value, cx.out_dtype)


@aten("aten.full.default")
def _full(cx, size, value, **kwargs):
    return const(np.full(tuple(size), value, dtype=cx.out_dtype))


@aten("aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default")
def _like(cx, x, *args, **kwargs):
    fill = {"zeros_like": 0.0, "ones_like": 1.0}.get(str(cx.node.target).split(".")[1])
    if fill is None:
        fill = args[0]
    return const(np.full(cx.out_shape, fill, dtype=cx.out_dtype))


__all__ = ["ATEN_TABLE", "aten"]
