"""Documented pass pipelines.

``standard_cleanup()`` is what to run after ``FirstOrderGradient``:

    SimplifyExpr            like-ops -> explicit shapes, x+0 / x*1, shape-op identities
    FoldConstant            constant subgraphs -> Constants (creators kept)
    EliminateCommonSubexpr  merge duplicated work (scope-aware)
    DeadCodeElimination     tuple projections, constant Ifs, unreachable functions

repeated in turn until each pass in a row has returned the very module object it was
given (every pass returns its input when it changes nothing), at most ``max_rounds`` rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..ir.errors import PassError
from ..ir.module import IRModule
from .cse import EliminateCommonSubexpr
from .dead_code import DeadCodeElimination, entry_names
from .fold_constant import FoldConstant
from .pass_infra import ModulePass, Pass, PassContext, PassInfo, Sequential
from .simplify_expr import SimplifyExpr


@dataclass(frozen=True)
class FixedPoint(Pass, register=False):
    """Run the passes of ``inner`` (a Sequential) in turn until each of them in a row returns its input unchanged
    (identity), at most ``max_rounds`` rounds."""

    inner: Sequential
    name: str = "fixed_point"
    max_rounds: int = 8

    def __post_init__(self):
        if not isinstance(self.inner, Sequential):
            raise PassError(f"{self.name}: inner must be a Sequential, got {self.inner!r}")
        if isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int) or self.max_rounds < 1:
            raise PassError(f"{self.name}: max_rounds must be a positive int, got {self.max_rounds!r}")
        object.__setattr__(self, "_info", PassInfo(self.name, self.inner.info.opt_level))

    @property
    def info(self) -> PassInfo:
        return self._info

    @property
    def passes(self) -> tuple:
        return self.inner.passes

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        # cycles through the passes and stops once every pass in turn has returned the module it was given:
        # the passes after the last change run once more, those before it too, none twice without a change
        passes, ran_on = self.inner.passes, {}
        quiet = 0  # passes in a row that returned their input
        for step in range(self.max_rounds * len(passes)):
            new = self.inner.run_entry(passes[step % len(passes)], mod, ctx, ran_on)
            quiet = quiet + 1 if new is mod else 0
            mod = new
            if quiet == len(passes):
                break
        return mod


@dataclass(frozen=True)
class StandardCleanup(ModulePass):
    """SimplifyExpr, FoldConstant, EliminateCommonSubexpr, DeadCodeElimination to a fixed point
    (``self.fixed_point``: a ``FixedPoint`` of one ``Sequential`` round). ``entry`` is passed to
    DeadCodeElimination (default: functions nothing references)."""

    name = "standard_cleanup"
    max_rounds: int = 8
    entry: Optional[tuple] = None

    def __post_init__(self):
        object.__setattr__(self, "entry", entry_names(self.entry, self.name))
        inner = Sequential([SimplifyExpr(), FoldConstant(), EliminateCommonSubexpr(), DeadCodeElimination(entry=self.entry)],
                           name="standard_cleanup.round")
        object.__setattr__(self, "fixed_point", FixedPoint(inner, self.name, self.max_rounds))

    @property
    def passes(self) -> tuple:
        return self.fixed_point.passes

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        return self.fixed_point.transform_module(mod, ctx)


def standard_cleanup(max_rounds: int = 8, entry: Optional[tuple] = None) -> StandardCleanup:
    """The clean-up pipeline to run after FirstOrderGradient (see ``StandardCleanup``)."""
    return StandardCleanup(max_rounds, entry)


__all__ = ["standard_cleanup", "StandardCleanup", "FixedPoint"]
