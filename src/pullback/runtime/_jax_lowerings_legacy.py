"""TEMPORARY: the JAX target's per-op lowering table from before the kernels moved onto the OpDefs.

``runtime.jax_target`` uses an entry only when ``op.impl("jax")`` raises (the
operator has no namespace kernel yet). Delete this module once every operator
has its kernel (the ``kernels-core`` and ``kernels-nn`` branches).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..ops.norm import batch_norm_math, layer_norm_math

JAX_LOWERINGS: dict[str, Callable] = {}


def lowering(*names: str):
    """Register a lowering ``lower(*args, attrs)`` for each op in ``names``."""

    def deco(fn):
        for n in names:
            JAX_LOWERINGS[n] = fn
        return fn

    return deco


def _unary(name: str, fn: Callable) -> None:
    JAX_LOWERINGS[name] = lambda x, attrs=None: fn()(x)


for _name, _fn in {
    "negative": lambda: jnp.negative, "abs": lambda: jnp.abs, "sign": lambda: jnp.sign, "exp": lambda: jnp.exp,
    "log": lambda: jnp.log, "log2": lambda: jnp.log2, "log1p": lambda: jnp.log1p, "sqrt": lambda: jnp.sqrt,
    "rsqrt": lambda: lax.rsqrt, "square": lambda: jnp.square, "reciprocal": lambda: jnp.reciprocal,
    "sin": lambda: jnp.sin, "cos": lambda: jnp.cos, "tan": lambda: jnp.tan, "tanh": lambda: jnp.tanh,
    "sigmoid": lambda: jax.nn.sigmoid, "erf": lambda: jax.scipy.special.erf, "floor": lambda: jnp.floor,
    "ceil": lambda: jnp.ceil, "round": lambda: jnp.round, "copy": lambda: (lambda x: x),
    "logical_not": lambda: jnp.logical_not, "isnan": lambda: jnp.isnan, "isfinite": lambda: jnp.isfinite,
    "nn.relu": lambda: jax.nn.relu, "nn.silu": lambda: jax.nn.silu,
}.items():
    _unary(_name, _fn)

for _name, _fn in {
    "add": lambda: jnp.add, "subtract": lambda: jnp.subtract, "multiply": lambda: jnp.multiply,
    "power": lambda: jnp.power, "maximum": lambda: jnp.maximum, "minimum": lambda: jnp.minimum,
    "floor_divide": lambda: jnp.floor_divide, "mod": lambda: jnp.fmod, "equal": lambda: jnp.equal,
    "not_equal": lambda: jnp.not_equal, "less": lambda: jnp.less, "less_equal": lambda: jnp.less_equal,
    "greater": lambda: jnp.greater, "greater_equal": lambda: jnp.greater_equal,
    "logical_and": lambda: jnp.logical_and, "logical_or": lambda: jnp.logical_or,
}.items():
    JAX_LOWERINGS[_name] = (lambda f: lambda a, b, attrs=None: f()(a, b))(_fn)


@lowering("divide")
def _divide(a, b, attrs=None):
    return jnp.floor_divide(a, b) if jnp.issubdtype(a.dtype, jnp.integer) else jnp.divide(a, b)


@lowering("clip")
def _clip(x, a):
    return jnp.clip(x, a.a_min, a.a_max)


@lowering("where")
def _where(c, x, y, attrs=None):
    return jnp.where(c, x, y)


@lowering("cast")
def _cast(x, a):
    return x.astype(a.dtype)


@lowering("cast_like")
def _cast_like(x, like, attrs=None):
    return x.astype(like.dtype)


# -- reductions


def _axes(x, a) -> tuple:
    from ..ops.reduce import np_axes

    return np_axes(x, a)


def _reduction(fn):
    return lambda x, a: fn(x, _axes(x, a), a.keepdims, a)


JAX_LOWERINGS.update({
    "sum": _reduction(lambda x, ax, kd, a: jnp.sum(x, axis=ax, keepdims=kd, dtype=x.dtype)),
    "mean": _reduction(lambda x, ax, kd, a: jnp.mean(x, axis=ax, keepdims=kd)),
    "max": _reduction(lambda x, ax, kd, a: jnp.max(x, axis=ax, keepdims=kd)),
    "min": _reduction(lambda x, ax, kd, a: jnp.min(x, axis=ax, keepdims=kd)),
    "prod": _reduction(lambda x, ax, kd, a: jnp.prod(x, axis=ax, keepdims=kd, dtype=x.dtype)),
    "variance": _reduction(lambda x, ax, kd, a: jnp.var(x, axis=ax, keepdims=kd, ddof=int(a.unbiased))),
    "std": _reduction(lambda x, ax, kd, a: jnp.std(x, axis=ax, keepdims=kd, ddof=int(a.unbiased))),
    "logsumexp": _reduction(lambda x, ax, kd, a: jax.scipy.special.logsumexp(x, axis=ax, keepdims=kd)),
})


def _arg_reduce(fn_name: str):
    def lower(x, a):
        from ..ops.reduce import reduce_shape

        ax = _axes(x, a)
        keep = [i for i in range(x.ndim) if i not in ax]
        flat = jnp.transpose(x, keep + list(ax)).reshape([x.shape[i] for i in keep] + [-1])
        fn = getattr(jnp, fn_name)
        if a.select_last_index:
            idx = flat.shape[-1] - 1 - fn(flat[..., ::-1], axis=-1)
        else:
            idx = fn(flat, axis=-1)
        return jnp.reshape(idx, reduce_shape(x.shape, ax, a.keepdims)).astype("int32")

    return lower


JAX_LOWERINGS["argmax"] = _arg_reduce("argmax")
JAX_LOWERINGS["argmin"] = _arg_reduce("argmin")

# -- shapes and the like-family


@lowering("reshape")
def _reshape(x, a):
    return jnp.reshape(x, [x.shape[i] if d == 0 else d for i, d in enumerate(a.newshape)])


@lowering("transpose")
def _transpose(x, a):
    return jnp.transpose(x, a.axes)


@lowering("expand_dims")
def _expand_dims(x, a):
    ax = a.axis % (x.ndim + 1) if a.axis < 0 else a.axis
    return jnp.reshape(x, x.shape[:ax] + (1,) * a.num_newaxis + x.shape[ax:])


@lowering("squeeze")
def _squeeze(x, a):
    from ..ops.shape import _squeeze_axes

    drop = _squeeze_axes((), a, x.shape)
    return jnp.reshape(x, [d for i, d in enumerate(x.shape) if i not in drop])


def _collapse_sum(x, shape: tuple):
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
    out = jnp.sum(x, axis=axes, keepdims=True, dtype=x.dtype) if axes else x
    return jnp.reshape(out, shape)


JAX_LOWERINGS.update({
    "broadcast_to": lambda x, a: jnp.broadcast_to(x, a.shape),
    "broadcast_to_like": lambda x, like, a=None: jnp.broadcast_to(x, like.shape),
    "collapse_sum_to": lambda x, a: _collapse_sum(x, a.shape),
    "collapse_sum_like": lambda x, like, a=None: _collapse_sum(x, like.shape),
    "zeros": lambda a: jnp.zeros(a.shape, a.dtype),
    "ones": lambda a: jnp.ones(a.shape, a.dtype),
    "full": lambda f, a: jnp.full(a.shape, f, a.dtype),
    "zeros_like": lambda x, a=None: jnp.zeros_like(x),
    "ones_like": lambda x, a=None: jnp.ones_like(x),
    "full_like": lambda x, f, a=None: jnp.full(x.shape, f, x.dtype),
})


@lowering("reshape_like")
def _reshape_like(x, like, a):
    from ..ops.layout import reshape_like_shape

    return jnp.reshape(x, reshape_like_shape((), tuple(x.shape), tuple(like.shape), a))


@lowering("concatenate")
def _concatenate(*xs):
    return jnp.concatenate(xs[:-1], axis=xs[-1].axis)


@lowering("stack")
def _stack(*xs):
    return jnp.stack(xs[:-1], axis=xs[-1].axis)


@lowering("split")
def _split(x, a):
    v = a.indices_or_sections
    return tuple(jnp.split(x, v if isinstance(v, int) else list(v), axis=a.axis))


JAX_LOWERINGS.update({
    "repeat": lambda x, a: jnp.repeat(x, a.repeats, axis=a.axis),
    "tile": lambda x, a: jnp.tile(x, a.reps),
    "flip": lambda x, a: jnp.flip(x, axis=a.axis),
})


@lowering("arange")
def _arange(a):
    from ..ops.registry import get_op

    return jnp.asarray(get_op("arange").compute(a))  # attributes only: a constant


# -- indexing


@lowering("strided_slice")
def _strided_slice(x, a):
    return x[a.np_index(x.shape)]


@lowering("strided_set")
def _strided_set(x, v, a):
    return x.at[a.np_index(x.shape)].set(v)


def _take_indices(idx, n: int, mode: str):
    if mode == "clip":
        return jnp.clip(idx, 0, max(n - 1, 0))
    if mode == "wrap":
        return jnp.mod(idx, n) if n else idx
    return jnp.where(idx < 0, idx + n, idx)


def _flat(x, a):
    return (x.reshape(-1), 0) if a.axis is None else (x, a.axis % x.ndim)


@lowering("take")
def _take(x, idx, a):
    src, ax = _flat(x, a)
    return jnp.take(src, _take_indices(idx, src.shape[ax], a.mode), axis=ax, mode="clip")


@lowering("index_add")
def _index_add(x, idx, u, a):
    dst, ax = _flat(x, a)
    where = (slice(None),) * ax + (_take_indices(idx, dst.shape[ax], a.mode),)
    return dst.at[where].add(u).reshape(x.shape)


def _gather_index(shape, idx, ax: int) -> tuple:
    grid = list(np.indices(idx.shape, sparse=True))
    grid[ax] = idx
    return tuple(grid)


@lowering("gather")
def _gather(x, idx, a):
    return x[_gather_index(x.shape, idx, a.axis % x.ndim)]


@lowering("scatter_add")
def _scatter_add(x, idx, u, a):
    return x.at[_gather_index(x.shape, idx, a.axis % x.ndim)].add(u)


@lowering("one_hot")
def _one_hot(idx, on, off, a):
    from ..ops.indexing import _one_hot_axis

    mask = idx[..., None] == jnp.arange(a.depth)
    mask = jnp.moveaxis(mask, -1, _one_hot_axis("one_hot", (), a.axis, idx.ndim))
    return jnp.where(mask, on, off).astype(a.dtype)


# -- nn


@lowering("nn.dense")
def _dense(x, w, attrs=None):
    return jnp.matmul(x, w.T)


def _matmul(a, b, attrs):
    a = jnp.swapaxes(a, -1, -2) if attrs.transpose_a else a
    b = jnp.swapaxes(b, -1, -2) if attrs.transpose_b else b
    return jnp.matmul(a, b)


JAX_LOWERINGS["nn.matmul"] = _matmul
JAX_LOWERINGS["nn.batch_matmul"] = _matmul


@lowering("nn.bias_add")
def _bias_add(x, b, a):
    axis = a.axis % x.ndim
    return x + b.reshape((-1,) + (1,) * (x.ndim - axis - 1))


JAX_LOWERINGS["nn.batch_flatten"] = lambda x, a=None: jnp.reshape(x, (x.shape[0], -1))
JAX_LOWERINGS["nn.dropout"] = lambda x, m, a: x * m * jnp.asarray(1.0 / (1.0 - a.rate), x.dtype)


@lowering("nn.pad")
def _pad(x, a):
    crop = tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(a.pad_width))
    widths = [(max(b, 0), max(e, 0)) for b, e in a.pad_width]
    x = x[crop]
    if a.pad_mode == "constant":
        return jnp.pad(x, widths, mode="constant", constant_values=jnp.asarray(a.pad_value, x.dtype))
    return jnp.pad(x, widths, mode=a.pad_mode)


@lowering("nn.pad_backward")
def _pad_backward(g, a):
    out = g
    for axis, (b, e) in enumerate(a.pad_width):
        n = out.shape[axis] - b - e
        moved = jnp.moveaxis(out, axis, 0)
        core = moved[b:b + n]
        for k in range(b):
            core = core.at[b - k if a.pad_mode == "reflect" else 0].add(moved[k])
        for k in range(e):
            core = core.at[n - 2 - k if a.pad_mode == "reflect" else n - 1].add(moved[b + n + k])
        out = jnp.moveaxis(core, 0, axis)
    return out


@lowering("nn.leaky_relu")
def _leaky_relu(x, a):
    return jnp.where(x > 0, x, x * jnp.asarray(a.alpha, x.dtype))


@lowering("nn.gelu")
def _gelu(x, a):
    return jax.nn.gelu(x, approximate=a.approximate == "tanh")


@lowering("nn.softplus")
def _softplus(x, a):
    beta = jnp.asarray(a.beta, x.dtype)
    bx = x * beta
    return jnp.where(bx > a.threshold, x, jnp.logaddexp(jnp.zeros((), x.dtype), bx) / beta)


JAX_LOWERINGS["nn.softmax"] = lambda x, a: jax.nn.softmax(x, axis=a.axis)
JAX_LOWERINGS["nn.log_softmax"] = lambda x, a: jax.nn.log_softmax(x, axis=a.axis)
JAX_LOWERINGS["nn.cross_entropy"] = lambda p, t, a=None: -jnp.sum(jnp.log(p) * t) / p.shape[0]
JAX_LOWERINGS["nn.cross_entropy_with_logits"] = lambda p, t, a=None: -jnp.sum(p * t) / p.shape[0]


def _nll_pick(p, t, w, a):
    valid = t != a.ignore_index
    tc = jnp.where(valid, t, 0)
    wt = jnp.where(valid, w[tc], jnp.zeros((), w.dtype))
    div = jnp.sum(wt) if a.reduction == "mean" else jnp.ones((), w.dtype)
    return tc, wt, div


@lowering("nn.nll_loss")
def _nll_loss(p, t, w, a):
    tc, wt, div = _nll_pick(p, t, w, a)
    loss = -wt * jnp.take_along_axis(p, tc[:, None], axis=1)[:, 0]
    return loss if a.reduction == "none" else jnp.sum(loss) / div


@lowering("nn.nll_loss_grad")
def _nll_loss_grad(g, p, t, w, a):
    tc, wt, div = _nll_pick(p, t, w, a)
    coef = (-wt * (g if a.reduction == "none" else g / div)).astype(p.dtype)
    onehot = jnp.moveaxis(jax.nn.one_hot(tc, p.shape[1], dtype=p.dtype), -1, 1)
    return onehot * jnp.expand_dims(coef, 1)


@lowering("nn.layer_norm")
def _layer_norm(x, gamma, beta, a):
    return layer_norm_math(jnp, x, gamma, beta, a)


@lowering("nn.batch_norm")
def _batch_norm(x, gamma, beta, mm, mv, a):
    return tuple(v.astype(x.dtype) for v in batch_norm_math(jnp, x, gamma, beta, mm, mv, a))


# -- convolution and pooling (NCHW / OIHW)


def _conv(x, w, a):
    top, left, bottom, right = a.padding
    return lax.conv_general_dilated(x, w, window_strides=a.strides, padding=[(top, bottom), (left, right)],
                                    rhs_dilation=a.dilation, dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                    feature_group_count=a.groups)


JAX_LOWERINGS["nn.conv2d"] = _conv


@lowering("nn.conv2d_transpose")
def _conv2d_transpose(x, w, a):
    from ..ops.conv import _convT_out_hw

    n, _, h, wd = x.shape
    _, og, kh, kw = w.shape
    out_shape = (n, og * a.groups) + tuple(_convT_out_hw(a, (h, wd), (kh, kw)))
    _, vjp = jax.vjp(lambda z: _conv(z, w, a), jnp.zeros(out_shape, x.dtype))  # the adjoint of conv2d
    return vjp(x)[0]


@lowering("nn.conv2d_backward_weight")
def _conv2d_backward_weight(gy, x, a):
    o, c = gy.shape[1], x.shape[1]
    w_shape = (o, c // a.groups) + tuple(a.kernel_size)
    _, vjp = jax.vjp(lambda w: _conv(x, w, a), jnp.zeros(w_shape, x.dtype))
    return vjp(gy)[0]


def _pool_geometry(x, a):
    """(output size, padding pairs incl. the extra room of ceil mode) of a pooling op."""
    from ..ops.conv import eff
    from ..ops.pool import _out_hw

    out = _out_hw(a, x.shape[2:])
    pads = []
    for i in range(2):
        pb, pa = a.padding[i], a.padding[i + 2]
        extra = max(0, (out[i] - 1) * a.strides[i] + eff(a.pool_size[i], a.dilation[i]) - (x.shape[2 + i] + pb + pa))
        pads.append((pb, pa + extra))
    return out, pads


def _window_slices(xp, a, out) -> list:
    """The pool_size[0] * pool_size[1] strided views (N, C, OH, OW) of padded ``xp``, row-major."""
    (kh, kw), (sh, sw), (dh, dw) = a.pool_size, a.strides, a.dilation
    return [xp[:, :, i * dh: i * dh + (out[0] - 1) * sh + 1: sh, j * dw: j * dw + (out[1] - 1) * sw + 1: sw]
            for i in range(kh) for j in range(kw)]


def _padded(x, pads, value):
    return jnp.pad(x, [(0, 0), (0, 0)] + pads, constant_values=jnp.asarray(value, x.dtype))


def _reduce_window(x, a, init, op, pads, out):
    y = lax.reduce_window(_padded(x, pads, init), jnp.asarray(init, x.dtype), op, (1, 1) + tuple(a.pool_size),
                          (1, 1) + tuple(a.strides), "VALID", window_dilation=(1, 1) + tuple(a.dilation))
    return y[:, :, : out[0], : out[1]]


@lowering("nn.max_pool2d")
def _max_pool2d(x, a):
    out, pads = _pool_geometry(x, a)
    return _reduce_window(x, a, -jnp.inf, lax.max, pads, out)


def _first_max(x, a):
    out, pads = _pool_geometry(x, a)
    wins = jnp.stack(_window_slices(_padded(x, pads, -jnp.inf), a, out), axis=-1)
    return jnp.argmax(wins, axis=-1), out, pads


def _scatter_windows(parts, x_shape, a, out, pads, dtype):
    """Adjoint of ``_window_slices``: add each part into a padded buffer, then crop."""
    (kh, kw), (sh, sw), (dh, dw) = a.pool_size, a.strides, a.dilation
    full = jnp.zeros(tuple(x_shape[:2]) + tuple(x_shape[2 + i] + pads[i][0] + pads[i][1] for i in range(2)), dtype)
    for i in range(kh):
        for j in range(kw):
            full = full.at[:, :, i * dh: i * dh + (out[0] - 1) * sh + 1: sh,
                           j * dw: j * dw + (out[1] - 1) * sw + 1: sw].add(parts(i, j))
    return full[:, :, pads[0][0]: pads[0][0] + x_shape[2], pads[1][0]: pads[1][0] + x_shape[3]]


@lowering("nn.max_pool2d_grad")
def _max_pool2d_grad(g, x, a):
    idx, out, pads = _first_max(x, a)
    kw = a.pool_size[1]
    zero = jnp.zeros((), g.dtype)
    return _scatter_windows(lambda i, j: jnp.where(idx == i * kw + j, g, zero), x.shape, a, out, pads, g.dtype)


@lowering("nn.max_pool2d_gather")
def _max_pool2d_gather(x, src, a):
    idx, out, pads = _first_max(x, a)
    wins = jnp.stack(_window_slices(_padded(src, pads, 0), a, out), axis=-1)
    return jnp.take_along_axis(wins, idx[..., None], axis=-1)[..., 0]


@lowering("nn.avg_pool2d")
def _avg_pool2d(x, a):
    from ..ops.pool import _divisor

    out, pads = _pool_geometry(x, a)
    s = _reduce_window(x, a, 0, lax.add, pads, out)
    return s / jnp.asarray(_divisor(a, x.shape[2:], out), x.dtype)


@lowering("nn.avg_pool2d_grad")
def _avg_pool2d_grad(g, x, a):
    from ..ops.pool import _divisor

    out, pads = _pool_geometry(x, a)
    q = g / jnp.asarray(_divisor(a, x.shape[2:], out), g.dtype)
    return _scatter_windows(lambda i, j: q, x.shape, a, out, pads, g.dtype)


JAX_LOWERINGS["nn.global_avg_pool2d"] = lambda x, a: jnp.mean(x, axis=(2, 3), keepdims=True)


@lowering("nn.adaptive_avg_pool2d")
def _adaptive_avg_pool2d(x, a):
    from ..ops.pool import _adaptive_hw, _adaptive_matrix

    oh, ow = _adaptive_hw(a, x.shape[2:])
    mh, mw = _adaptive_matrix(x.shape[2], oh, x.dtype), _adaptive_matrix(x.shape[3], ow, x.dtype)
    return jnp.einsum("ih,nchw,jw->ncij", mh, x, mw)


@lowering("nn.adaptive_avg_pool2d_grad")
def _adaptive_avg_pool2d_grad(g, x, a):
    from ..ops.pool import _adaptive_matrix

    mh, mw = _adaptive_matrix(x.shape[2], g.shape[2], g.dtype), _adaptive_matrix(x.shape[3], g.shape[3], g.dtype)
    return jnp.einsum("ih,ncij,jw->nchw", mh, g, mw)


__all__ = ["JAX_LOWERINGS"]
