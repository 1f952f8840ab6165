"""bfloat16 operators computed in float32, as PyTorch's CPU kernels compute them ("opmath").

An operator on bfloat16 values rounds once, its result: its kernel sees its bfloat16 operands widened to
float32 (exactly) and its bfloat16 results are rounded back. NumPy has no bfloat16 arithmetic of its own
(ml_dtypes gives the dtype), and a torch kernel written as several torch calls would round after each.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..ir.expr import Call
from ..ir.types import TensorType, TupleType


def has_bfloat16(t) -> bool:
    """Does the type ``t`` hold a bfloat16 tensor (in nested tuples)?"""
    stack = [t]
    while stack:
        t = stack.pop()
        if isinstance(t, TupleType):
            stack.extend(t.fields)
        elif isinstance(t, TensorType) and t.dtype == "bfloat16":
            return True
    return False


def involves_bfloat16(call: Call) -> bool:
    """Is a bfloat16 tensor among the call's operands or results?"""
    return has_bfloat16(call.checked_type) or any(has_bfloat16(a.checked_type) for a in call.args)


def _map(v, t, fn):
    """``fn(leaf, leaf type)`` over the leaves of ``v`` (nested tuples; ``t`` None: types unknown)."""
    if isinstance(v, (tuple, list)):
        fields = t.fields if isinstance(t, TupleType) else [None] * len(v)
        return tuple(_map(x, f, fn) for x, f in zip(v, fields))
    return fn(v, t)


def in_float32(kernel: Callable, call: Call, widen: Callable, narrow: Callable) -> Callable:
    """``kernel`` (``fn(*arrays, attrs)``) with its bfloat16 operands ``widen``-ed to float32 and its results
    whose type is bfloat16 ``narrow``-ed back (``widen(leaf)`` and ``narrow(leaf)`` act on bfloat16 leaves
    and on the results that should be, and return other leaves unchanged)."""
    out = call.checked_type
    rounded = lambda v, t: narrow(v) if isinstance(t, TensorType) and t.dtype == "bfloat16" else v  # noqa: E731
    wide = lambda v, t: widen(v)  # noqa: E731

    def run(*args):
        return _map(kernel(*[_map(a, None, wide) for a in args[:-1]], args[-1]), out, rounded)

    run.__name__ = getattr(kernel, "__name__", "kernel")
    return run


def native_or(native: Callable, wide: Callable) -> Callable:
    """``native`` (an ATen kernel) until ATen says it has no bfloat16 kernel for it (``ndtri``, ``i0e``...), then
    ``wide`` (the same kernel in float32) from that call on."""
    chosen = [native]

    def run(*args):
        try:
            return chosen[0](*args)
        except (NotImplementedError, RuntimeError) as e:
            if chosen[0] is wide or "BFloat16" not in str(e):
                raise
            chosen[0] = wide
            return wide(*args)

    return run


def numpy_widen(v):
    return v.astype(np.float32) if getattr(getattr(v, "dtype", None), "name", None) == "bfloat16" else v


def numpy_narrow(v):
    v = np.asarray(v)
    return v if v.dtype.name == "bfloat16" else v.astype("bfloat16")


def torch_widen(v):
    return v.float() if str(getattr(v, "dtype", "")) == "torch.bfloat16" else v


def torch_narrow(v):
    import torch

    return v if v.dtype == torch.bfloat16 else v.to(torch.bfloat16)


__all__ = ["has_bfloat16", "involves_bfloat16", "in_float32", "native_or", "numpy_widen", "numpy_narrow", "torch_widen",
           "torch_narrow"]
