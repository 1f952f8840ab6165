"""Converters of libraries' own operators (``torch.library`` custom ops) that models reach by default, written
from the operator's documented semantics (its eager Python body), so the gradient comes from pullback's rules
rather than the library's registered backward; and ATen's grouped GEMM, which the same models call directly.

- ``transformers::grouped_mm_fallback(input (S, K), weight (E, K, N), offs (E,))``: Hugging Face's
  mixture-of-experts grouped GEMM (Mixtral, Qwen2-MoE, OLMoE, gpt-oss, Jamba with their default ``grouped_mm``
  experts, float32 under export). Rows are sorted by expert and ``offs`` holds the cumulative row counts.
- ``aten._grouped_mm(a, b, offs)``: the same product, which those experts call in bfloat16 and float16 (and in
  eager for float32).

Both become ``nn.grouped_matmul`` (one GEMM per expert's rows, ATen's kernel on torch).
"""

from __future__ import annotations

from ..ir.errors import PullbackError
from .aten_table import _op, aten, cast
from .context import torch_dtype_name


@aten("transformers.grouped_mm_fallback.default")
def _grouped_mm_fallback(cx, x, weight, offs):
    return _op("nn.grouped_matmul")(x, weight, offs)


@aten("aten._grouped_mm.default")
def _grouped_mm(cx, a, b, offs=None, bias=None, out_dtype=None):
    """(S, K) x (E, K, N) with offs over the rows: ``nn.grouped_matmul``; (K, S) x (S, N) with offs over the
    contraction: ``nn.grouped_transpose_matmul`` (the weight gradient); (E, M, K) x (E, K, N) without offs: a
    batched GEMM. ``out_dtype`` (half inputs, float32 result): the product of the inputs cast to it, exact."""
    ranks = (cx.ndim_of(a), cx.ndim_of(b))
    if bias is not None:
        raise PullbackError("_grouped_mm with a bias is not supported (ATen's CPU kernel takes none)")
    if out_dtype is not None:
        a, b = cast(cx, a, torch_dtype_name(out_dtype)), cast(cx, b, torch_dtype_name(out_dtype))
    if offs is None and ranks == (3, 3):
        return _op("nn.batch_matmul")(a, b, transpose_b=False)
    if offs is not None and ranks == (2, 3):
        return _op("nn.grouped_matmul")(a, b, offs)
    if offs is not None and ranks == (2, 2):
        return _op("nn.grouped_transpose_matmul")(_op("transpose")(a, (1, 0)), b, offs)
    raise PullbackError(f"_grouped_mm of ranks {ranks} {'with' if offs is not None else 'without'} offs is not supported "
                        "(2-D x 3-D and 2-D x 2-D with offs, 3-D x 3-D without)")
