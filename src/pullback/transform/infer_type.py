"""InferType: annotate every node with its type (cached on the nodes)."""

from __future__ import annotations

from ..analysis import infer_module
from ..ir.module import IRModule
from .pass_infra import ModulePass, PassContext, PassInfo, register_pass


def ensure_typed(mod: IRModule) -> IRModule:
    """``infer_module(mod)`` unless every function already has its type.

    Inference types a Function after everything it reaches, so a typed Function
    node means its whole body is typed (types are a pure function of the node).
    """
    if any(fn._checked_type is None for _, fn in mod.items()):
        infer_module(mod)
    return mod


def _infer_type(mod: IRModule, ctx: PassContext) -> IRModule:
    return ensure_typed(mod)


def InferType() -> ModulePass:
    """A pass setting ``checked_type`` on every node; returns the same module object."""
    return ModulePass(_infer_type, PassInfo("InferType", 0))


register_pass("InferType", InferType)

__all__ = ["InferType", "ensure_typed"]
