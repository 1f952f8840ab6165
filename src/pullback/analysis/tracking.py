"""What autograd tracks a value through: the one rule the PyTorch integration (which outputs require grad,
which parameters get zeros rather than None) and RecognizeOps (whether an attention mask may be learnt) share."""

from __future__ import annotations

from typing import Sequence

from ..ir.expr import Call, Expr, Function
from ..ir.traversal import free_vars
from ..ir.types import TensorType, is_inexact
from ..ops.registry import OpDef, value_args


def tracked_children(node: Expr) -> Sequence[Expr]:
    """The operands autograd tracks ``node``'s value through, as eager's graph joins them: every one for an
    operator with a floating result, whether or not its gradient is zero (``round``), none for ``stop_gradient`` or
    an integer or boolean result (a comparison), not a like-operator's template (``zeros_like(x)``), and the free
    variables a local function reads (conservatively)."""
    t = node.checked_type
    if isinstance(t, TensorType) and not is_inexact(t.dtype):
        return ()
    if isinstance(node, Function):
        return free_vars(node)
    if isinstance(node, Call) and isinstance(node.op, OpDef):
        if node.op.name == "stop_gradient":
            return ()
        return value_args(node)
    return node.children()


__all__ = ["tracked_children"]
