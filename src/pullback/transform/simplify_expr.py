"""SimplifyExpr: ConcretizeLike + EliminateIdentity + shape-op simplifications, to a fixed point.

Rules (one table, applied by the pattern driver until none fires):

- shape/dtype ops that do not change the type become their input:
  ``reshape``, ``broadcast_to``, ``collapse_sum_to`` and their ``*_like`` forms
  when input and result types are equal and static (or the like-argument is
  the input itself), ``cast``/``cast_like`` to the input's dtype, ``transpose``
  with the identity permutation;
- ``reshape(reshape(x))`` -> one ``reshape``; ``transpose(transpose(x))`` -> one
  ``transpose`` (or ``x`` when the permutations cancel);
- every ConcretizeLike rule and every EliminateIdentity rule.

``x * zeros`` is *not* folded to zeros (``inf * 0`` is NaN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..ir.expr import Call, Expr
from ..ir.types import TensorType
from ..ops import layout as T
from ..pattern import is_op, wildcard
from .concretize_like import concretize_rules
from .eliminate_identity import identity_rules
from .pass_infra import RewritePass

SAME_TYPE_OPS = ("reshape", "broadcast_to", "collapse_sum_to", "reshape_like", "broadcast_to_like", "collapse_sum_like")
CAST_OPS = ("cast", "cast_like")


def _same_type(node: Expr, c: dict) -> Optional[Expr]:
    x = node.args[0]
    if len(node.args) == 2 and node.args[1] is x and (node.attrs is None or node.attrs == type(node.attrs)()):
        return x  # op_like(x, x) with default attrs: x itself, whatever the shape
    xt, rt = x._checked_type, node._checked_type
    if isinstance(xt, TensorType) and xt.is_static and xt == rt:
        return x
    return None


def _same_dtype(node: Expr, c: dict) -> Optional[Expr]:
    x = node.args[0]
    xt, rt = x._checked_type, node._checked_type
    if isinstance(xt, TensorType) and isinstance(rt, TensorType) and xt == rt:
        return x
    return None


def _perm(call: Call) -> Optional[tuple]:
    t = call.args[0]._checked_type
    if not isinstance(t, TensorType):
        return None
    n = t.ndim
    axes = call.attrs.axes
    return tuple(range(n - 1, -1, -1)) if axes is None else tuple(a % n for a in axes)


def _transpose(node: Expr, c: dict) -> Optional[Expr]:
    outer = _perm(node)
    if outer is None:
        return None
    src, perm = node.args[0], outer
    inner_call = c.get("inner")
    if inner_call is not None:
        inner = _perm(inner_call)
        if inner is None:
            return None
        src, perm = inner_call.args[0], tuple(inner[i] for i in outer)
    if perm == tuple(range(len(perm))):
        return src
    return T.transpose(src, perm) if inner_call is not None else None


def _reshape_reshape(node: Expr, c: dict) -> Optional[Expr]:
    rt = node._checked_type
    x = c["inner"].args[0]
    if isinstance(rt, TensorType) and rt.is_static:
        return T.reshape(x, rt.shape)
    if 0 not in node.attrs.newshape:  # 0 would copy a dim of the inner result, not of x
        return T.reshape(x, node.attrs.newshape)
    return None


def shape_rules() -> list:
    """The shape-op rules of SimplifyExpr (without ConcretizeLike / EliminateIdentity)."""
    inner_t = is_op("transpose")(wildcard()).named("inner")
    return [
        (is_op(*SAME_TYPE_OPS), _same_type),
        (is_op(*CAST_OPS), _same_dtype),
        (is_op("transpose")(inner_t), _transpose),
        (is_op("transpose"), _transpose),
        (is_op("reshape")(is_op("reshape")(wildcard()).named("inner")), _reshape_reshape),
    ]


def simplify_rules() -> list:
    """The whole SimplifyExpr table: shape rules first, then ConcretizeLike, then EliminateIdentity."""
    return shape_rules() + concretize_rules() + identity_rules()


@dataclass(frozen=True)
class SimplifyExpr(RewritePass):
    """ConcretizeLike, EliminateIdentity and shape-op simplifications applied together to a fixed point."""

    name = "SimplifyExpr"

    def rules(self) -> list:
        return simplify_rules()


__all__ = ["SimplifyExpr", "simplify_rules", "shape_rules"]
