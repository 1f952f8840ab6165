"""Reference models built with pullback ops, shared by the demo, tests and benchmarks.

Each builder returns ``(mod, make_inputs)``: an IRModule whose ``@main`` maps
parameters and data to a scalar loss, and a function ``make_inputs(seed)``
giving NumPy arrays in parameter order.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import op
from ..ir.expr import Function, var
from ..ir.module import IRModule


def _normal(rng: np.random.Generator, shape, scale: float, dtype: str) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(dtype)


def mlp(batch: int = 8, sizes=(16, 32, 32, 4), dtype: str = "float32") -> tuple[IRModule, Callable]:
    """``loss = sum(tanh(dense(...tanh(dense(x, w0))..., wk)))``."""
    x = var("x", shape=(batch, sizes[0]), dtype=dtype)
    ws = [var(f"w{i}", shape=(n_out, n_in), dtype=dtype) for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:]))]
    h = x
    for w in ws:
        h = op.tanh(op.nn.dense(h, w))
    fn = Function([x, *ws], op.sum(h))

    def make_inputs(seed: int = 0):
        rng = np.random.default_rng(seed)
        arrays = [_normal(rng, (batch, sizes[0]), 1.0, dtype)]
        arrays += [_normal(rng, (n_out, n_in), 1.0 / np.sqrt(n_in), dtype) for n_in, n_out in zip(sizes[:-1], sizes[1:])]
        return arrays

    return IRModule.from_expr(fn), make_inputs


def cnn(batch: int = 4, image: int = 16, channels=(3, 8, 16), classes: int = 10, dtype: str = "float32") -> tuple[IRModule, Callable]:
    """conv-relu-maxpool twice, global average pool, dense, softmax cross-entropy.

    The benchmark size (issue 6) is ``cnn(32, 32, (3, 16, 32), 10)``.
    """
    c0, c1, c2 = channels
    x = var("x", shape=(batch, c0, image, image), dtype=dtype)
    w1 = var("conv1_w", shape=(c1, c0, 3, 3), dtype=dtype)
    w2 = var("conv2_w", shape=(c2, c1, 3, 3), dtype=dtype)
    wd = var("fc_w", shape=(classes, c2), dtype=dtype)
    bd = var("fc_b", shape=(classes,), dtype=dtype)
    y = var("y", shape=(batch, classes), dtype=dtype)  # one-hot targets
    h = op.nn.max_pool2d(op.nn.relu(op.nn.conv2d(x, w1, padding=(1, 1))), pool_size=(2, 2), strides=(2, 2))
    h = op.nn.max_pool2d(op.nn.relu(op.nn.conv2d(h, w2, padding=(1, 1))), pool_size=(2, 2), strides=(2, 2))
    h = op.nn.batch_flatten(op.nn.global_avg_pool2d(h))
    logits = op.nn.bias_add(op.nn.dense(h, wd), bd, axis=-1)
    loss = op.nn.cross_entropy_with_logits(op.nn.log_softmax(logits, axis=-1), y)
    fn = Function([x, w1, w2, wd, bd, y], loss)

    def make_inputs(seed: int = 0):
        rng = np.random.default_rng(seed)
        labels = rng.integers(0, classes, size=batch)
        return [
            _normal(rng, (batch, c0, image, image), 1.0, dtype),
            _normal(rng, (c1, c0, 3, 3), 1.0 / np.sqrt(9 * c0), dtype),
            _normal(rng, (c2, c1, 3, 3), 1.0 / np.sqrt(9 * c1), dtype),
            _normal(rng, (classes, c2), 1.0 / np.sqrt(c2), dtype),
            _normal(rng, (classes,), 0.1, dtype),
            np.eye(classes, dtype=dtype)[labels],
        ]

    return IRModule.from_expr(fn), make_inputs


def transformer_layer(batch: int = 2, seq: int = 8, d_model: int = 16, heads: int = 2, d_ff: int = 32,
                      dtype: str = "float32", loss: str = "sum") -> tuple[IRModule, Callable]:
    """A post-norm transformer encoder layer (like ``torch.nn.TransformerEncoderLayer``
    with ``batch_first=True``, GELU, no dropout). ``loss="sum"``: ``sum(out)``;
    ``loss="mse"``: ``mean((out - y) ** 2)`` with a target parameter ``y`` of shape (batch*seq, d_model).

    The benchmark size (issue 6) is ``transformer_layer(8, 128, 256, 4, 1024)``.
    """
    if d_model % heads:
        raise ValueError("d_model must be divisible by heads")
    B, S, D, H, F = batch, seq, d_model, heads, d_ff
    dh = D // H
    x = var("x", shape=(B, S, D), dtype=dtype)
    names = [("wq", (D, D)), ("bq", (D,)), ("wk", (D, D)), ("bk", (D,)), ("wv", (D, D)), ("bv", (D,)),
             ("wo", (D, D)), ("bo", (D,)), ("ln1_g", (D,)), ("ln1_b", (D,)),
             ("w1", (F, D)), ("b1", (F,)), ("w2", (D, F)), ("b2", (D,)), ("ln2_g", (D,)), ("ln2_b", (D,))]
    p = {n: var(n, shape=s, dtype=dtype) for n, s in names}
    x2 = op.reshape(x, (B * S, D))

    def linear(h, w, b):
        return op.nn.bias_add(op.nn.dense(h, p[w]), p[b], axis=-1)

    def heads_of(h):  # (B*S, D) -> (B*H, S, dh)
        return op.reshape(op.transpose(op.reshape(h, (B, S, H, dh)), (0, 2, 1, 3)), (B * H, S, dh))

    q, k, v = (heads_of(linear(x2, w, b)) for w, b in (("wq", "bq"), ("wk", "bk"), ("wv", "bv")))
    scale = np.asarray(1.0 / np.sqrt(dh), dtype=dtype)
    scores = op.multiply(op.nn.batch_matmul(q, k), scale)
    attn = op.nn.batch_matmul(op.nn.softmax(scores, axis=-1), v, transpose_b=False)
    attn = op.reshape(op.transpose(op.reshape(attn, (B, H, S, dh)), (0, 2, 1, 3)), (B * S, D))
    h1 = op.nn.layer_norm(x2 + linear(attn, "wo", "bo"), p["ln1_g"], p["ln1_b"], axis=-1)
    ff = linear(op.nn.gelu(linear(h1, "w1", "b1")), "w2", "b2")
    out = op.nn.layer_norm(h1 + ff, p["ln2_g"], p["ln2_b"], axis=-1)
    params = [x] + [p[n] for n, _ in names]
    if loss == "sum":
        fn = Function(params, op.sum(out))
    elif loss == "mse":
        y = var("y", shape=(B * S, D), dtype=dtype)
        diff = out - y
        fn = Function(params + [y], op.mean(diff * diff))
    else:
        raise ValueError(f"loss must be 'sum' or 'mse', got {loss!r}")

    def make_inputs(seed: int = 0):
        rng = np.random.default_rng(seed)
        arrays = [_normal(rng, (B, S, D), 1.0, dtype)]
        for n, s in names:
            if n.startswith("ln") and n.endswith("_g"):
                arrays.append((1.0 + 0.1 * rng.standard_normal(s)).astype(dtype))
            elif len(s) == 1:
                arrays.append(_normal(rng, s, 0.1, dtype))
            else:
                arrays.append(_normal(rng, s, 1.0 / np.sqrt(s[1]), dtype))
        if loss == "mse":
            arrays.append(_normal(rng, (B * S, D), 1.0, dtype))
        return arrays

    return IRModule.from_expr(fn), make_inputs
