"""FoldConstant: evaluate constant subgraphs with the operators' NumPy kernels.

Rule: a Call to an operator is replaced by a Constant when every argument is
constant-valued and the result is a tensor that is not bigger than
``max(max_new_elements, largest Constant argument)`` elements. Constant-valued
means a Constant, or a tensor *creator* (``zeros``/``ones``, ``full`` with a
Constant fill) whose value is computed only when a fold consumes it.
Creators themselves are never turned into Constants: ``zeros((1024, 1024))``
is cheaper to keep than a 4 MB literal, and the size bound stops a fold from
materialising a big tensor out of small inputs (``broadcast_to(scalar, big)``).
Calls to module functions, primitive functions and tuple-valued operators
are left alone. The kernels are ``OpDef.compute`` (no runtime import).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..ir.errors import PassError
from ..ir.expr import Call, Constant, Expr
from ..ir.types import TensorType
from ..ops.registry import OpDef
from ..pattern import rewrite_module, wildcard
from .pass_infra import Pass, PassContext, PassInfo, register_pass

CREATORS = ("zeros", "ones", "full")


def _creator_value(e: Expr) -> Optional[np.ndarray]:
    if isinstance(e, Call) and isinstance(e.op, OpDef) and e.op.name in CREATORS:
        if all(isinstance(a, Constant) for a in e.args):
            return e.op.compute(*(a.data for a in e.args), e.attrs)
    return None


def _foldable(e: Expr) -> bool:
    return (
        isinstance(e, Call)
        and isinstance(e.op, OpDef)
        and len(e.args) > 0
        and e.op.name not in CREATORS
        and isinstance(e._checked_type, TensorType)
        and e._checked_type.is_static
        and all(isinstance(a, Constant) or (isinstance(a, Call) and isinstance(a.op, OpDef) and a.op.name in CREATORS) for a in e.args)
    )


def fold_rules(max_new_elements: int = 1024) -> list:
    """The rewrite table of FoldConstant."""

    def fold(node: Call, c: dict) -> Optional[Expr]:
        t: TensorType = node._checked_type
        size = int(np.prod(t.shape, dtype=np.int64))
        biggest = max((a.data.size for a in node.args if isinstance(a, Constant)), default=0)
        if size > max(max_new_elements, biggest):
            return None
        values = []
        for a in node.args:
            v = a.data if isinstance(a, Constant) else _creator_value(a)
            if v is None:
                return None
            values.append(v)
        with np.errstate(all="ignore"):
            out = node.op.compute(*values, node.attrs)
        if not isinstance(out, (np.ndarray, np.generic)):
            return None
        out = np.asarray(out, dtype=t.dtype)
        if out.shape != t.shape:
            raise PassError(f"FoldConstant: the kernel of {node.op.name} returned shape {out.shape}, its type says {t.shape}")
        return Constant(out)

    return [(wildcard().where(_foldable), fold)]


class FoldConstant(Pass):
    """Replace operator calls on constant inputs by their value (see the module docstring for the rule)."""

    def __init__(self, max_new_elements: int = 1024):
        super().__init__(PassInfo("FoldConstant", 2))
        if isinstance(max_new_elements, bool) or not isinstance(max_new_elements, int) or max_new_elements < 0:
            raise PassError(f"FoldConstant: max_new_elements must be a non-negative int, got {max_new_elements!r}")
        self.max_new_elements = max_new_elements

    def transform_module(self, mod, ctx: PassContext):
        return rewrite_module(fold_rules(self.max_new_elements), mod)


register_pass("FoldConstant", FoldConstant)

__all__ = ["FoldConstant", "fold_rules", "CREATORS"]
