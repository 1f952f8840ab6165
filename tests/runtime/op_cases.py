"""Programs using every registered operator, grouped by family: ``case() -> (Function, inputs)``.

Each case's body is a Tuple of calls; the target tests run a case whole (jax) or
output by output (torch). ``test_jax_target`` checks that they cover every op.
"""

from __future__ import annotations

import numpy as np

import pullback as pb
from pullback import Function, Tuple, op, var

R = np.random.default_rng(0)


def f32(*shape, lo=-2.0, hi=2.0):
    return R.uniform(lo, hi, shape).astype("float32")


def case_unary():
    x = var("x", shape=(3, 4))
    p = var("p", shape=(3, 4))  # positive
    outs = [getattr(op, n)(x) for n in ("negative", "abs", "sign", "exp", "sin", "cos", "tan", "tanh", "sigmoid",
                                          "erf", "floor", "ceil", "round", "copy", "square", "isnan", "isfinite",
                                          "zeros_like", "ones_like")]
    outs += [getattr(op, n)(p) for n in ("log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal")]
    outs += [op.clip(x, -0.5, 0.7), op.cast(x, "int32"), op.cast_like(x, pb.const(1, "int32")),
             op.full_like(x, pb.const(2.5)), op.nn.relu(x), op.nn.silu(x), op.nn.leaky_relu(x, 0.1),
             op.nn.gelu(x), op.nn.gelu(x, "tanh"), op.nn.softplus(x, 2.0, 1.0), op.nn.softmax(x),
             op.nn.log_softmax(x, axis=0), op.logical_not(op.greater(x, p))]
    return Function([x, p], Tuple(outs)), [f32(3, 4), f32(3, 4, lo=0.1)]


def case_binary():
    a, b, c = var("a", shape=(3, 4)), var("b", shape=(4,)), var("c", shape=(3, 1))
    i, j = var("i", shape=(3, 4), dtype="int32"), var("j", shape=(4,), dtype="int32")
    m = var("m", shape=(3, 4))
    outs = [op.add(a, b), op.subtract(a, c), op.multiply(a, b), op.divide(a, c), op.power(op.abs(a), b),
            op.maximum(a, b), op.minimum(a, c), op.floor_divide(a, b), op.mod(a, c), op.divide(i, j),
            op.mod(i, j), op.floor_divide(i, j)]
    outs += [getattr(op, n)(a, b) for n in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")]
    outs += [op.logical_and(op.less(a, b), op.greater(a, c)), op.logical_or(op.less(a, b), op.greater(a, c)),
             op.where(op.less(a, b), a, c), op.nn.bias_add(a, b, axis=1), op.nn.dropout(a, m, 0.25)]
    return (Function([a, b, c, i, j, m], Tuple(outs)),
            [f32(3, 4), f32(4, lo=0.5), f32(3, 1, lo=0.5), R.integers(-9, 9, (3, 4)).astype("int32"),
             np.array([1, 2, -3, 4], "int32"), (R.uniform(size=(3, 4)) > 0.3).astype("float32")])


def case_reduce():
    x = var("x", shape=(2, 3, 4))
    outs = [op.sum(x), op.sum(x, axis=1, keepdims=True), op.mean(x, axis=(0, 2)), op.max(x, axis=-1),
            op.min(x, axis=0, exclude=True), op.prod(x, axis=2), op.variance(x, axis=1, unbiased=True),
            op.std(x, axis=(1, 2)), op.logsumexp(x, axis=2, keepdims=True), op.argmax(x, axis=1),
            op.argmin(x, axis=(1, 2)), op.argmax(op.round(x), axis=2, select_last_index=True)]
    return Function([x], Tuple(outs)), [f32(2, 3, 4)]


def case_shape():
    x, y = var("x", shape=(2, 3, 4)), var("y", shape=(3, 1))
    outs = [op.reshape(x, (0, -1)), op.transpose(x), op.transpose(x, (1, 0, 2)), op.expand_dims(x, 1, 2),
            op.squeeze(op.expand_dims(x, 0)), op.broadcast_to(y, (2, 3, 4)), op.broadcast_to_like(y, x),
            op.collapse_sum_to(x, (3, 1)), op.collapse_sum_like(x, y), op.reshape_like(x, op.zeros((6, 2, 2))),
            op.concatenate([x, x], axis=2), op.stack([x, x], axis=1), op.split(x, 2, axis=2),
            op.split(x, (1, 2), axis=1), op.repeat(x, 2, 1), op.tile(y, (2, 2)), op.flip(x, (0, 2)),
            op.arange(1.0, 4.0, 0.5), op.ones((2, 2), "int32"), op.full(pb.const(3.0), (2,), "float32"),
            op.nn.batch_flatten(x), op.nn.pad(x, ((0, 0), (1, -1), (2, 1))),
            op.nn.pad(x, ((0, 0), (1, 1), (2, 1)), 0.0, "edge"), op.nn.pad(x, ((1, 0), (1, 1), (2, 1)), 0.0, "reflect"),
            op.nn.pad_backward(x, ((0, 0), (1, 0), (1, 1)), 0.0, "reflect"),
            op.nn.pad_backward(x, ((0, 0), (0, 1), (1, 1)), 0.0, "edge")]
    return Function([x, y], Tuple(outs)), [f32(2, 3, 4), f32(3, 1)]


def case_indexing():
    x, v = var("x", shape=(5, 4)), var("v", shape=(2, 4))
    i = var("i", shape=(3,), dtype="int32")
    g = var("g", shape=(5, 2), dtype="int32")
    u = var("u", shape=(3, 4))
    outs = [op.strided_slice(x, (1, 0), (5, 4), (2, 1)), op.strided_slice(x, (-1,), (0,), (-2,), (1,)),
            op.strided_set(x, v, (1,), (5,), (2,), (0,)), op.take(x, i, 0), op.take(x, i, None, "wrap"),
            op.take(x, i, 1, "fast"), op.index_add(x, i, u, 0, "clip"), op.gather(x, 1, g),
            op.scatter_add(x, g, op.ones((5, 2)), 1),
            op.one_hot(i, pb.const(1.0), pb.const(0.0), 6, 0, "float32")]
    return (Function([x, v, i, g, u], Tuple(outs)),
            [f32(5, 4), f32(2, 4), np.array([0, 3, -1], "int32"), R.integers(0, 4, (5, 2)).astype("int32"), f32(3, 4)])


def case_nn():
    x, w = var("x", shape=(2, 4, 7, 7)), var("w", shape=(6, 2, 3, 3))
    d, dw = var("d", shape=(3, 5)), var("dw", shape=(4, 5))
    bm = var("bm", shape=(2, 3, 5))
    gy = var("gy", shape=(2, 6, 4, 4))
    gamma, beta = var("gamma", shape=(4,)), var("beta", shape=(4,))
    conv_kw = dict(strides=(2, 2), padding=(1, 2, 1, 1), dilation=(1, 1), groups=2)
    pool = dict(pool_size=(3, 2), strides=(2, 2), padding=(1, 0, 1, 1), ceil_mode=True)
    pooled = op.nn.max_pool2d(x, **pool)
    outs = [op.nn.dense(d, dw), op.nn.matmul(d, dw, False, True), op.nn.batch_matmul(bm, bm),
            op.nn.batch_matmul(bm, bm, True, False), op.nn.conv2d(x, w, **conv_kw),
            op.nn.conv2d(x, op.concatenate([w, w], 1), dilation=(2, 1)),
            op.nn.conv2d_transpose(gy, op.transpose(w, (0, 1, 2, 3)), output_padding=(1, 0), **conv_kw),
            op.nn.conv2d_backward_weight(gy, x, kernel_size=(3, 3), **conv_kw),
            pooled, op.nn.max_pool2d_grad(op.ones_like(pooled), x, **pool),
            op.nn.max_pool2d_gather(x, op.negative(x), **pool),
            op.nn.avg_pool2d(x, (2, 2), (2, 2), padding=(1, 1), count_include_pad=True),
            op.nn.avg_pool2d_grad(op.ones((2, 4, 4, 4)), x, (2, 2), (2, 2), padding=(1, 1)),
            op.nn.global_avg_pool2d(x), op.nn.adaptive_avg_pool2d(x, (3, 2)),
            op.nn.adaptive_avg_pool2d_grad(op.ones((2, 4, 3, 2)), x, (3, 2)),
            op.nn.layer_norm(op.transpose(x, (0, 2, 3, 1)), gamma, beta),
            op.nn.batch_norm(x, gamma, beta, beta, op.abs(gamma), training=True),
            op.nn.batch_norm(x, gamma, beta, beta, op.abs(gamma))]
    return (Function([x, w, d, dw, bm, gy, gamma, beta], Tuple(outs)),
            [f32(2, 4, 7, 7), f32(6, 2, 3, 3), f32(3, 5), f32(4, 5), f32(2, 3, 5), f32(2, 6, 4, 4), f32(4), f32(4)])


def case_loss():
    lp, t = var("lp", shape=(4, 3)), var("t", shape=(4, 3))
    tgt, wt = var("tgt", shape=(4,), dtype="int32"), var("wt", shape=(3,))
    ls = op.nn.log_softmax(lp)
    outs = [op.nn.cross_entropy(op.nn.softmax(lp), t), op.nn.cross_entropy_with_logits(ls, t),
            op.nn.nll_loss(ls, tgt, wt), op.nn.nll_loss(ls, tgt, wt, "none", 2), op.nn.nll_loss(ls, tgt, wt, "sum"),
            op.nn.nll_loss_grad(pb.const(1.0), ls, tgt, wt), op.nn.nll_loss_grad(op.ones((4,)), ls, tgt, wt, "none", 2)]
    return (Function([lp, t, tgt, wt], Tuple(outs)),
            [f32(4, 3), np.eye(3, dtype="float32")[[0, 2, 1, 1]], np.array([0, 2, 1, 2], "int32"), f32(3, lo=0.5)])


CASES = [case_unary, case_binary, case_reduce, case_shape, case_indexing, case_nn, case_loss]
