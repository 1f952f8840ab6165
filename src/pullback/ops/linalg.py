"""Matrix products: ``nn.matmul`` (2-D) and ``nn.batch_matmul`` (3-D, batch dim may broadcast from 1).

Both take Relay's ``transpose_a`` / ``transpose_b`` flags (``batch_matmul``
defaults to ``transpose_b=True`` like Relay). Gradients are matmuls with
flipped flags, so second derivatives work.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.expr import Call, Expr
from ..ir.types import ALL_DTYPES, Any, TensorType
from . import layout as T
from .common import broadcast_shapes, numel, same_dtype, tensor_arg
from .elemwise import conj_if_complex
from .nn import check_bool
from .registry import FusionKind, defop, type_error


@dataclass(frozen=True)
class MatmulAttrs:
    transpose_a: bool = False
    transpose_b: bool = False

    def __post_init__(self):
        check_bool(self, "transpose_a", "transpose_b")


@dataclass(frozen=True)
class BatchMatmulAttrs(MatmulAttrs):
    transpose_b: bool = True  # Relay's default for batch_matmul


def _mk(rank: int, name: str):
    def infer(arg_types, attrs):
        a, b = tensor_arg(name, arg_types, 0), tensor_arg(name, arg_types, 1)
        same_dtype(name, arg_types)
        if a.ndim != rank or b.ndim != rank:
            raise type_error(name, arg_types, f"expects two tensors of rank {rank}, got ranks {a.ndim} and {b.ndim}")
        m, ka = (a.shape[-1], a.shape[-2]) if attrs.transpose_a else a.shape[-2:]
        kb, n = (b.shape[-1], b.shape[-2]) if attrs.transpose_b else b.shape[-2:]
        if ka is not Any and kb is not Any and ka != kb:
            raise type_error(name, arg_types, f"contraction sizes differ: {ka} (a, transpose_a={attrs.transpose_a}) vs {kb} (b, transpose_b={attrs.transpose_b})")
        batch = broadcast_shapes(name, arg_types, a.shape[:-2], b.shape[:-2])
        return TensorType(batch + (m, n), a.dtype)

    def flops(arg_types, out_type, attrs):
        a = arg_types[0]
        k = a.shape[-2] if attrs.transpose_a else a.shape[-1]
        return 2 * numel(out_type.shape) * (k if isinstance(k, int) else 0)

    return infer, flops


def _matmul(xp, a, b, attrs):
    return xp.matmul(xp.matrix_transpose(a) if attrs.transpose_a else a,
                     xp.matrix_transpose(b) if attrs.transpose_b else b)


def _matmul_grad(call: Call, g: Expr):
    """C = op(A) op(B): dA = g op(B)^T (or op(B) g^T when A is transposed), likewise dB (conjugate transposes
    for complex matrices)."""
    a, b = call.args
    ta, tb = call.attrs.transpose_a, call.attrs.transpose_b
    mm, ca, cb = call.op, conj_if_complex(a), conj_if_complex(b)
    ga = mm(cb, g, tb, True) if ta else mm(g, cb, False, not tb)
    gb = mm(g, ca, True, ta) if tb else mm(ca, g, not ta, False)
    if a.checked_type.ndim == 3:  # batch dims may broadcast
        ga, gb = T.collapse_sum_like(ga, a), T.collapse_sum_like(gb, b)
    return [ga, gb]


_mi, _mf = _mk(2, "nn.matmul")
matmul = defop("nn.matmul", 2, _mi, kernel=_matmul, attrs_type=MatmulAttrs, grad=_matmul_grad,
               pattern=FusionKind.OUT_ELEMWISE_FUSABLE, flops=_mf, torch_name="mm", dtypes=ALL_DTYPES)
_bi, _bf = _mk(3, "nn.batch_matmul")
batch_matmul = defop("nn.batch_matmul", 2, _bi, kernel=_matmul, attrs_type=BatchMatmulAttrs, grad=_matmul_grad,
                     pattern=FusionKind.OUT_ELEMWISE_FUSABLE, flops=_bf, torch_name="bmm", dtypes=ALL_DTYPES)
