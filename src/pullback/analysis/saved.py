"""``saved_bytes``: the size of the residuals a forward function hands to its backward."""

from __future__ import annotations

from ..ir.errors import PullbackError
from ..ir.module import IRModule
from ..ir.types import TupleType
from .liveness import type_bytes
from .type_infer import infer_module


def saved_bytes(mod: IRModule, func: str = "main_fwd") -> int:
    """Bytes of the residual tuple (field 1 of the result) of ``@func``, made by
    ``PartitionForwardBackward``; tensors with ``Any`` dims count 0."""
    fn = mod[func]
    if fn._checked_type is None:
        infer_module(mod)
    ret = fn.ret_type if fn.ret_type is not None else fn.body.checked_type
    if not isinstance(ret, TupleType) or len(ret.fields) != 2 or not isinstance(ret.fields[1], TupleType):
        raise PullbackError(f"saved_bytes: @{func} does not return (outputs, (residuals...)); got {ret!r}")
    return type_bytes(ret.fields[1])


__all__ = ["saved_bytes"]
