"""Converters of libraries' own operators (``torch.library`` custom ops) that models reach by default, written
from the operator's documented semantics (its eager Python body), so the gradient comes from pullback's rules
rather than the library's registered backward.

- ``transformers::grouped_mm_fallback(input (S, K), weight (E, K, N), offs (E,))``: Hugging Face's
  mixture-of-experts grouped GEMM (Mixtral, Qwen2-MoE, Jamba with their default ``grouped_mm`` experts in
  float32). Rows are sorted by expert and ``offs`` holds the cumulative row counts: row ``s`` goes through
  ``weight[e]`` where ``e`` is the number of ``offs`` entries ``<= s``; rows past ``offs[-1]`` stay zero.
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import const
from .aten_table import _op, aten, cast, static


@aten("transformers.grouped_mm_fallback.default")
def _grouped_mm(cx, x, weight, offs):
    """Every row through every expert in one batched GEMM (E x S x N values: the routing is data, which static
    shapes cannot split), then each row's expert picked by a one-hot mask over the experts."""
    s, _ = static(cx, "grouped_mm_fallback", cx.shape_of(x))
    e, _, n = static(cx, "grouped_mm_fallback", cx.shape_of(weight))
    ends = _op("reshape")(cast(cx, offs, "int64"), (1, e))
    rows = const(np.arange(s, dtype="int64").reshape(s, 1))
    expert = _op("sum")(_op("cast")(_op("less_equal")(ends, rows), "int64"), (1,))  # (S,): E past the last group
    onehot = _op("equal")(const(np.arange(e, dtype="int64").reshape(e, 1, 1)), _op("reshape")(expert, (1, s, 1)))
    every = _op("nn.batch_matmul")(_op("broadcast_to")(_op("expand_dims")(x, 0), (e, s, cx.shape_of(x)[1])), weight,
                                   transpose_b=False)  # (E, S, N)
    zeros = const(np.zeros((), dtype=cx.dtype_of(x)))
    return _op("sum")(_op("where")(onehot, every, zeros), (0,))
