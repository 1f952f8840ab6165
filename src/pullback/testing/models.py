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
