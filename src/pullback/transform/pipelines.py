"""Documented pass pipelines.

``standard_cleanup()`` is what to run after ``FirstOrderGradient``:

    SimplifyExpr            like-ops -> explicit shapes, x+0 / x*1, shape-op identities
    FoldConstant            constant subgraphs -> Constants (creators kept)
    EliminateCommonSubexpr  merge duplicated work (scope-aware)
    DeadCodeElimination     tuple projections, constant Ifs, unreachable functions

repeated until a round returns the very same module object (every pass
returns its input when it changes nothing), at most ``max_rounds`` times.
"""

from __future__ import annotations

from typing import Optional

from ..ir.errors import PassError
from ..ir.module import IRModule
from .cse import EliminateCommonSubexpr
from .dead_code import DeadCodeElimination
from .fold_constant import FoldConstant
from .pass_infra import Pass, PassContext, PassInfo, Sequential, register_pass
from .simplify_expr import SimplifyExpr


class FixedPoint(Pass):
    """Run ``inner`` (a Sequential) until the module stops changing (identity), at most ``max_rounds`` times."""

    def __init__(self, inner: Sequential, name: str, max_rounds: int = 8):
        super().__init__(PassInfo(name, inner.info.opt_level))
        if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
            raise PassError(f"{name}: max_rounds must be a positive int, got {max_rounds!r}")
        self.inner = inner
        self.passes = inner.passes
        self.max_rounds = max_rounds
        self.rounds_run = 0

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        for rounds in range(1, self.max_rounds + 1):
            new = self.inner.transform_module(mod, ctx)
            self.rounds_run = rounds
            if new is mod:
                break
            mod = new
        return mod


def standard_cleanup(max_rounds: int = 8, entry: Optional[tuple] = None) -> FixedPoint:
    """SimplifyExpr, FoldConstant, EliminateCommonSubexpr, DeadCodeElimination to a fixed point.

    ``entry`` is passed to DeadCodeElimination (default: functions nothing references)."""
    inner = Sequential([SimplifyExpr(), FoldConstant(), EliminateCommonSubexpr(), DeadCodeElimination(entry=entry)],
                       name="standard_cleanup.round")
    return FixedPoint(inner, "standard_cleanup", max_rounds)


register_pass("standard_cleanup", standard_cleanup)

__all__ = ["standard_cleanup", "FixedPoint"]
