"""The JAX/XLA target: ``build(mod, target="jax", devices=None, batch_axis=None)``.

Every registered operator has a lowering in ``JAX_LOWERINGS`` (op name ->
``lower(*args, attrs)`` on ``jax.numpy`` / ``jax.lax`` values). A function is
evaluated in topological order (``ir.scope.ScopeInfo``) inside a function that
``jax.jit`` compiles once per entry point: ``If`` becomes ``jax.lax.cond`` whose
branches are closures over the values they need; calls to module functions and
to primitive Functions (FuseOps groups) are inlined (XLA fuses by itself), so
recursive module functions are rejected. Results are NumPy arrays, nested in
tuples as on the numpy target.

jax is imported on first build only (``import pullback`` does not import it).
64-bit types: ``jax_enable_x64`` is switched on (process-wide) when a built
module uses float64 or int64 anywhere, since JAX would otherwise compute them
in 32 bits; modules without 64-bit types leave the setting alone.

Several devices (data parallelism through XLA): ``devices`` is a count or a list
of jax devices, ``batch_axis`` maps parameter names to the axis sharded over a
1-D mesh (``NamedSharding``); other inputs are replicated and XLA inserts the
reductions (e.g. of parameter gradients). Not checked inside jit: out-of-range
indices (``take`` with ``mode="fast"``, ``gather``, ``scatter_add``,
``nn.nll_loss`` targets) are clamped by XLA instead of raising as on NumPy.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import numpy as np

from ..analysis import infer_module
from ..ir.errors import ExecutionError, PullbackError
from ..ir.expr import Call, Constant, Expr, Function, GlobalVar, If, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.scope import ScopeInfo
from ..ir.traversal import global_calls, post_order
from ..ops.norm import batch_norm_math, layer_norm_math
from ..ir.types import TensorType, TupleType, Type
from ..ops.registry import OpDef, list_ops
from .values import convert_input, to_output

jax = jnp = lax = None  # set by _load_jax()


def _load_jax():
    global jax, jnp, lax
    if jax is None:
        try:
            import jax as _jax
            import jax.numpy as _jnp
            from jax import lax as _lax
        except ImportError as e:  # pragma: no cover - jax is a test dependency
            raise PullbackError(f"target 'jax' needs the jax package: {e}") from None
        jax, jnp, lax = _jax, _jnp, _lax
    return jax


# ---------------------------------------------------------------- lowerings

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


def missing_lowerings() -> list[str]:
    """Registered operators without a JAX lowering (empty when the table is complete)."""
    return [o.name for o in list_ops() if o.name not in JAX_LOWERINGS]


# ---------------------------------------------------------------- evaluation


def _uses_64bit(mod: IRModule) -> bool:
    stack: list[Type] = []
    for _, fn in mod.items():
        for n in post_order(fn, into_functions=True):
            if n._checked_type is not None:
                stack.append(n._checked_type)
    while stack:
        t = stack.pop()
        if isinstance(t, TensorType):
            if t.dtype in ("float64", "int64"):
                return True
        elif isinstance(t, TupleType):
            stack.extend(t.fields)
    return False


def _check_no_recursion(mod: IRModule, name: str) -> None:
    """Calls are inlined: a cycle of module functions reachable from ``name`` cannot be."""
    state: dict[str, int] = {}
    stack = [(name, False)]
    while stack:
        f, done = stack.pop()
        if done:
            state[f] = 2
            continue
        if state.get(f) == 2:
            continue
        state[f] = 1
        stack.append((f, True))
        for g in global_calls(mod[f]):
            if g.name_hint not in mod:
                raise ExecutionError(f"@{f} references @{g.name_hint}, which is not in the module")
            s = state.get(g.name_hint)
            if s == 1:  # entered and not finished: on the current path
                raise ExecutionError(f"target 'jax': @{g.name_hint} is recursive (through @{f}); the jax target "
                                     "inlines module functions and cannot run recursion")
            if s is None:
                stack.append((g.name_hint, False))


class _Evaluator:
    """Evaluates module functions on JAX values (called while ``jax.jit`` traces)."""

    def __init__(self, mod: IRModule):
        self.mod = mod
        self._scopes: dict[int, object] = {}

    def scopes(self, fn: Function):
        s = self._scopes.get(id(fn))
        if s is None:
            s = self._scopes[id(fn)] = (fn, ScopeInfo(fn.body))
        return s[1]

    def call(self, fn: Function, args: Sequence):
        info = self.scopes(fn)
        env = {id(p): a for p, a in zip(fn.params, args)}
        return self.run_scope(info, info.root, env, fn.body)

    def run_scope(self, info, scope, env: dict, result: Expr):
        for n in scope.nodes:
            key = id(n)
            if key in env:
                continue
            env[key] = self.node(n, env, info)
        return env[id(result)]

    def node(self, n: Expr, env: dict, info):
        if isinstance(n, Call):
            args = [env[id(a)] for a in n.args]
            op = n.op
            if isinstance(op, OpDef):
                lower = JAX_LOWERINGS.get(op.name)
                if lower is None:
                    raise ExecutionError(f"target 'jax': operator {op.name} has no JAX lowering")
                out = lower(*args, n.attrs)
                t = n._checked_type
                if isinstance(t, TensorType) and out.dtype != t.dtype:
                    out = out.astype(t.dtype)
                return out
            callee = self.mod[op.name_hint] if isinstance(op, GlobalVar) else op
            return self.call(callee, args)
        if isinstance(n, Constant):
            return jnp.asarray(n.data)
        if isinstance(n, Tuple):
            return tuple(env[id(f)] for f in n.fields)
        if isinstance(n, TupleGetItem):
            return env[id(n.tuple_value)][n.index]
        if isinstance(n, If):
            then_s, else_s = info.branch_scopes(n)
            return lax.cond(env[id(n.cond)],
                            lambda: self.run_scope(info, then_s, dict(env), n.true_branch),
                            lambda: self.run_scope(info, else_s, dict(env), n.false_branch))
        if isinstance(n, Var):
            raise ExecutionError(f"target 'jax': variable %{n.name_hint} is not bound")
        raise ExecutionError(f"target 'jax': cannot evaluate a {type(n).__name__} value (first-order programs only)")


def _leaves_to_numpy(value):
    return to_output(jax.tree_util.tree_map(np.asarray, value))


class JaxFunction:
    """``exe["name"]``: a jitted entry point taking and returning NumPy arrays."""

    def __init__(self, exe: "JaxExecutable", name: str):
        self._exe = exe
        self.name = name
        self.func = exe.mod[name]
        self.params = self.func.params
        ev = exe._evaluator
        fn = self.func
        self._jitted = jax.jit(lambda *args: ev.call(fn, args), **exe._jit_options(fn, name))

    def __call__(self, *inputs):
        params = self.params
        if len(inputs) != len(params):
            names = ", ".join("%" + p.name_hint for p in params) or "none"
            raise ExecutionError(f"@{self.name} takes {len(params)} input{'s' if len(params) != 1 else ''} ({names}), got {len(inputs)}")
        args = [convert_input(v, p.checked_type, p.name_hint, self.name) for v, p in zip(inputs, params)]
        self._exe._check_batch(self, args)
        return _leaves_to_numpy(self._jitted(*args))

    def lower_text(self, *inputs) -> str:
        """The StableHLO text jax produces for these inputs (for inspection)."""
        args = [convert_input(v, p.checked_type, p.name_hint, self.name) for v, p in zip(inputs, self.params)]
        return self._jitted.lower(*args).as_text()

    def __repr__(self) -> str:
        return f"<JaxFunction @{self.name}>"


class JaxExecutable:
    """A module compiled for XLA through ``jax.jit``; ``exe["main"](*arrays)`` runs a function."""

    target = "jax"

    def __init__(self, mod: IRModule, check_outputs: bool = False,
                 devices: Union[None, int, Sequence] = None, batch_axis: Optional[dict] = None):
        _load_jax()
        if not all(f._checked_type is not None for _, f in mod.items()):
            infer_module(mod)
        missing = sorted({n.op.name for _, f in mod.items() for n in post_order(f, into_functions=True)
                          if isinstance(n, Call) and isinstance(n.op, OpDef) and n.op.name not in JAX_LOWERINGS})
        if missing:
            raise ExecutionError(f"target 'jax': no JAX lowering for {', '.join(missing)}")
        if _uses_64bit(mod) and not jax.config.jax_enable_x64:
            jax.config.update("jax_enable_x64", True)
        self.mod = mod
        self.check_outputs = check_outputs
        self._evaluator = _Evaluator(mod)
        self._entries: dict[str, JaxFunction] = {}
        self.mesh = None
        self.batch_axis = dict(batch_axis or {})
        if devices is not None or batch_axis:
            self._setup_mesh(devices)

    # -- sharding
    def _setup_mesh(self, devices) -> None:
        from jax.sharding import Mesh

        available = jax.devices()
        if devices is None:
            devs = available
        elif isinstance(devices, int) and not isinstance(devices, bool):
            if not 1 <= devices <= len(available):
                raise ExecutionError(f"target 'jax': devices={devices}, but jax sees {len(available)} device(s) "
                                     f"({available[0].platform}); on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N "
                                     "before jax is imported")
            devs = available[:devices]
        else:
            devs = list(devices)
            if not devs:
                raise ExecutionError("target 'jax': devices is an empty list")
        for k, v in self.batch_axis.items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int):
                raise ExecutionError(f"target 'jax': batch_axis maps parameter names to int axes, got {k!r}: {v!r}")
        self.devices = devs
        self.mesh = Mesh(np.array(devs), ("batch",))

    def _jit_options(self, fn: Function, name: str) -> dict:
        if self.mesh is None:
            return {}
        from jax.sharding import NamedSharding, PartitionSpec

        names = {p.name_hint: p for p in fn.params}
        for k in self.batch_axis:
            if k not in names:
                raise ExecutionError(f"target 'jax': batch_axis names %{k}, which is not a parameter of @{name} "
                                     f"(parameters: {', '.join('%' + n for n in names)})")
        shardings = []
        for p in fn.params:
            axis = self.batch_axis.get(p.name_hint)
            t = p.checked_type
            if axis is None:
                shardings.append(NamedSharding(self.mesh, PartitionSpec()))
                continue
            if not isinstance(t, TensorType) or not -t.ndim <= axis < t.ndim:
                raise ExecutionError(f"target 'jax': batch axis {axis} of %{p.name_hint} does not fit its type {t!r}")
            axis %= t.ndim
            shardings.append(NamedSharding(self.mesh, PartitionSpec(*([None] * axis + ["batch"]))))
        return {"in_shardings": tuple(shardings)}

    def _check_batch(self, entry: JaxFunction, args: list) -> None:
        if self.mesh is None:
            return
        n = len(self.devices)
        for p, a in zip(entry.params, args):
            axis = self.batch_axis.get(p.name_hint)
            if axis is not None and a.shape[axis] % n:
                raise ExecutionError(f"@{entry.name}: parameter %{p.name_hint} has {a.shape[axis]} entries along its "
                                     f"batch axis {axis}, not divisible by the {n} devices")

    # -- entry points
    @property
    def functions(self) -> list[str]:
        return list(self.mod)

    def __getitem__(self, name: str) -> JaxFunction:
        f = self._entries.get(name)
        if f is None:
            if name not in self.mod:
                raise ExecutionError(f"the module has no function @{name} (functions: {', '.join('@' + k for k in self.mod)})")
            _check_no_recursion(self.mod, name)
            f = self._entries[name] = JaxFunction(self, name)
        return f

    def __contains__(self, name: str) -> bool:
        return name in self.mod

    def __repr__(self) -> str:
        devs = f" devices={len(self.devices)}" if self.mesh is not None else ""
        return f"<JaxExecutable functions={self.functions}{devs}>"


__all__ = ["JAX_LOWERINGS", "JaxExecutable", "JaxFunction", "lowering", "missing_lowerings"]
