"""What a forward/backward split keeps and redoes: ``saved_bytes`` (the size of the residuals a forward
function hands to its backward) and ``recomputed_calls`` (the work both functions do)."""

from __future__ import annotations

from collections import Counter

from ..ir.errors import PullbackError
from ..ir.expr import Call, Expr, Tuple, Var
from ..ir.module import IRModule
from ..ir.traversal import post_order
from ..ir.types import TupleType
from .liveness import type_bytes
from .type_infer import infer_module


def saved_bytes(mod: IRModule, func: str = "main_fwd", inputs: bool = True) -> int:
    """Bytes of the residual tuple (field 1 of the result) of ``@func``, made by
    ``PartitionForwardBackward``; tensors with ``Any`` dims count 0.

    ``inputs=False`` leaves out the residuals that are parameters of ``@func`` (weights and inputs
    the caller holds anyway): the memory the residuals add. With ``inputs=True`` a parameter counts
    once, as PyTorch's saved-tensor hooks count a parameter or input autograd saves (by storage).
    """
    fn = mod[func]
    if fn._checked_type is None:
        infer_module(mod)
    ret = fn.ret_type if fn.ret_type is not None else fn.body.checked_type
    if not isinstance(ret, TupleType) or len(ret.fields) != 2 or not isinstance(ret.fields[1], TupleType):
        raise PullbackError(f"saved_bytes: @{func} does not return (outputs, (residuals...)); got {ret!r}")
    body = fn.body
    if not (isinstance(body, Tuple) and len(body.fields) == 2 and isinstance(body.fields[1], Tuple)):
        return type_bytes(ret.fields[1])  # residuals not listed literally: count their types
    params = {id(p) for p in fn.params}
    seen: set[int] = set()
    total = 0
    for r, t in zip(body.fields[1].fields, ret.fields[1].fields):
        if id(r) in params and (not inputs or id(r) in seen):
            continue
        seen.add(id(r))
        total += type_bytes(t)
    return total


def _calls(body: Expr) -> Counter:
    """Calls per op name under ``body`` that depend on a parameter (calls on constants alone are not counted)."""
    on_var: set[int] = set()
    calls: Counter = Counter()
    for n in post_order(body):
        if isinstance(n, Var) or any(id(c) in on_var for c in n.children()):
            on_var.add(id(n))
            if isinstance(n, Call):
                calls[n.op_name] += 1
    return calls


def recomputed_calls(mod: IRModule, grad: str = "main_grad", fwd: str = "main_fwd", bwd: str = "main_bwd") -> Counter:
    """Per op name, how many calls ``@fwd`` and ``@bwd`` compute beyond ``@grad`` (the function they split):
    the forward work the backward does again. Calls on constants alone are left out."""
    return _calls(mod[fwd].body) + _calls(mod[bwd].body) - _calls(mod[grad].body)


__all__ = ["saved_bytes", "recomputed_calls"]
