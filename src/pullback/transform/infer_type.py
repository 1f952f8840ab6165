"""InferType: annotate every node with its type (cached on the nodes)."""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis import infer_module
from ..ir.module import IRModule
from .pass_infra import ModulePass, PassContext


@dataclass(frozen=True)
class InferType(ModulePass):
    """Set ``checked_type`` on every node; returns the same module object.

    Only untyped nodes are visited (a typed Function has a typed body), so a typed
    module costs one check per function."""

    name = "InferType"

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        return infer_module(mod)


__all__ = ["InferType"]
