"""ConcretizeLike: ``*_like`` operators become their explicit-shape twins.

``zeros_like(x)`` only needs ``x`` for its shape and dtype; once types are
known and static, ``zeros(shape, dtype)`` says the same without keeping ``x``
alive or tying the backward pass to a forward value. The shape and dtype are
taken from the call's *result* type (so ``reshape_like`` with
``lhs_begin``/``rhs_begin`` is right), and each entry of ``LIKE_OPS`` carries its
own applicability check: every entry but ``cast_like`` and ``reshape_like`` needs a fully static
result shape; ``reshape_like`` a non-empty one (``reshape``'s 0 copies a dim) with at most one dynamic
dimension (``reshape``'s -1); ``cast_like -> cast`` only needs the dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..ir.expr import Call, Expr
from ..ir.types import TensorType
from ..ops.registry import get_op
from ..pattern import is_op
from .pass_infra import RewritePass


def static_result(t) -> bool:
    """The result is a tensor whose every dimension is a known int."""
    return isinstance(t, TensorType) and t.is_static


def one_unknown_nonempty_result(t) -> bool:
    """A result with at most one dynamic dimension and no 0 size: ``reshape`` infers that dimension (-1) at run
    time, so a reshape's gradient over a dynamic sequence length stops reading the forward value for its shape."""
    return isinstance(t, TensorType) and sum(not isinstance(d, int) for d in t.shape) <= 1 and 0 not in t.shape


def _inferred_shape(t: TensorType) -> tuple:
    return (tuple(d if isinstance(d, int) else -1 for d in t.shape),)


def tensor_result(t) -> bool:
    """The result is a tensor (any shape): enough when only the dtype is taken."""
    return isinstance(t, TensorType)


@dataclass(frozen=True)
class LikeRule:
    """One like-operator: ``like(args...) -> target(args[keep]..., *attrs(result_type))`` when ``applies``."""

    like: str
    target: str
    keep: tuple  # positions of the like-call's arguments passed on to the target
    attrs: Callable[[TensorType], tuple]
    applies: Callable[[object], bool] = static_result

    def rewrite(self, call: Call) -> Optional[Expr]:
        """The explicit form of ``call`` (which must be typed), or None when this entry does not apply."""
        t = call._checked_type
        if not self.applies(t):
            return None
        return get_op(self.target)(*(call.args[i] for i in self.keep), *self.attrs(t))


def _shape_dtype(t: TensorType) -> tuple:
    return (t.shape, t.dtype)


def _shape(t: TensorType) -> tuple:
    return (t.shape,)


def _dtype(t: TensorType) -> tuple:
    return (t.dtype,)


LIKE_OPS: tuple[LikeRule, ...] = (
    LikeRule("zeros_like", "zeros", (), _shape_dtype),
    LikeRule("ones_like", "ones", (), _shape_dtype),
    LikeRule("full_like", "full", (1,), _shape_dtype),
    LikeRule("reshape_like", "reshape", (0,), _inferred_shape, one_unknown_nonempty_result),
    LikeRule("collapse_sum_like", "collapse_sum_to", (0,), _shape),
    LikeRule("broadcast_to_like", "broadcast_to", (0,), _shape),
    LikeRule("cast_like", "cast", (0,), _dtype, tensor_result),
)
"""The like-operators ConcretizeLike knows, with their explicit forms and when they apply."""

LIKE_OP_NAMES = frozenset(r.like for r in LIKE_OPS)


def _callback(entry: LikeRule):
    return lambda node, captures: entry.rewrite(node)


def concretize_rules() -> list:
    """The rewrite table of ConcretizeLike: one ``(is_op(like), callback)`` per ``LIKE_OPS`` entry."""
    return [(is_op(entry.like), _callback(entry)) for entry in LIKE_OPS]


@dataclass(frozen=True)
class ConcretizeLike(RewritePass):
    """Replace ``*_like`` operators by explicit-shape operators where the result shape is static
    (``cast_like`` always). Infers types first if they are missing."""

    name = "ConcretizeLike"

    def rules(self) -> list:
        return concretize_rules()


__all__ = ["ConcretizeLike", "LIKE_OPS", "LIKE_OP_NAMES", "LikeRule", "concretize_rules"]
