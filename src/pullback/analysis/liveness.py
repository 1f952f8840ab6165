"""Static liveness and peak-memory estimates over a function's evaluation order.

The evaluation order is ``post_order(func.body)`` (operands before users), the
order the NumPy executor runs. Tuples, TupleGetItems and Ifs allocate nothing:
they alias their operands, so they keep those operands alive as long as they
are live themselves. Every Call allocates its result (views such as reshape,
broadcast_to, expand_dims and transpose are counted as allocations too); a call
to a primitive Function is one allocation of its result. Both branches of an
If are counted as if both ran (an upper bound). Sizes are static: a tensor with
an ``Any`` dimension counts 0 bytes.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional, Union

import numpy as np

from ..ir.errors import PullbackError
from ..ir.expr import Call, Constant, Expr, Function, If, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.traversal import post_order
from ..ir.types import TensorType, TupleType, Type
from .type_infer import infer_module

_ALIASES = (Tuple, TupleGetItem, If)


class Live(NamedTuple):
    """``node`` is defined at step ``first_def`` and last read at step ``last_use``.

    Steps index ``post_order(func.body)``; the function's result has
    ``last_use == len(order)`` (it outlives the body: the caller reads it).
    """

    node: Expr
    first_def: int
    last_use: int


@functools.lru_cache(maxsize=4096)  # types are immutable and hashable; a program has few distinct ones
def type_bytes(ty: Type) -> int:
    """Bytes of a tensor or (nested) tuple type; a tensor with an ``Any`` dim counts 0."""
    total = 0
    stack = [ty]
    while stack:
        t = stack.pop()
        if isinstance(t, TupleType):
            stack.extend(t.fields)
        elif isinstance(t, TensorType) and t.is_static:
            total += math.prod(t.shape) * np.dtype(t.dtype).itemsize
    return total  # function types (closures, globals) own no tensor memory


def resolve_function(target: Union[IRModule, Function], func: str) -> tuple[Function, Optional[IRModule]]:
    """``(function, module or None)`` for ``target[func]`` or a bare Function, with types inferred."""
    if isinstance(target, IRModule):
        fn = target[func]
        infer_module(target)
        return fn, target
    if isinstance(target, Function):
        _ = target.checked_type
        return target, None
    raise PullbackError(f"expected an IRModule or a Function, got {type(target).__name__}")


def _alias_operands(n: Expr) -> tuple:
    """Operands whose memory ``n`` aliases (If's condition is a plain use)."""
    if isinstance(n, If):
        return (n.true_branch, n.false_branch)
    return n.children()


def liveness(func: Function, order: Optional[list] = None) -> list[Live]:
    """``Live(node, first_def, last_use)`` for every node of ``post_order(func.body)``.

    Uses through Tuples, TupleGetItems and If results extend the life of what
    they alias. Parameters are listed with their actual uses (the caller owns
    them; ``peak_memory`` keeps them live throughout). A node nothing reads
    (only the result, in a well-formed body) has ``last_use == len(order)``.
    """
    if not isinstance(func, Function):
        raise PullbackError(f"liveness expects a Function, got {type(func).__name__}")
    order = post_order(func.body) if order is None else order
    index = {n: i for i, n in enumerate(order)}  # nodes hash by identity (Expr defines no __eq__)
    end = len(order)
    last = [-1] * end
    last[index[func.body]] = end
    for i in range(end - 1, -1, -1):
        n = order[i]
        if isinstance(n, If):
            c = index[n.cond]
            last[c] = max(last[c], i)
        if isinstance(n, _ALIASES):
            reach = last[i]
            for c in _alias_operands(n):
                k = index[c]
                last[k] = max(last[k], reach)
        else:
            for c in n.children():
                k = index[c]
                last[k] = max(last[k], i)
    return [Live(n, i, last[i] if last[i] >= 0 else end) for i, n in enumerate(order)]


def peak_memory(target: Union[IRModule, Function], func: str = "main", reuse: bool = True) -> int:
    """Peak bytes of live values while running ``func`` once, statically.

    Parameters and constants are live throughout (owned by the caller / the
    program). An intermediate (a Call result) is live from its step until its
    last use (``reuse=True``, as the executor frees it), or until the end
    (``reuse=False``). At a step, the inputs and the output of the running call
    are live together. Views count as allocations; ``Any`` dims count 0 bytes;
    both If branches are counted; primitive functions are single allocations.
    """
    fn, _ = resolve_function(target, func)
    with_reuse, without_reuse = peak_memories(fn)
    return with_reuse if reuse else without_reuse


def peak_memories(fn: Function) -> tuple[int, int]:
    """``(peak bytes with reuse, peak bytes without)`` of a typed Function (see ``peak_memory``)."""
    order = post_order(fn.body)
    params = set(fn.params)
    resident = sum(type_bytes(p.checked_type) for p in fn.params)
    resident += sum(type_bytes(n.checked_type) for n in order
                    if isinstance(n, Constant) or isinstance(n, Var) and n not in params)
    steps = len(order)
    delta = [0] * (steps + 2)  # +bytes at first_def, -bytes after last_use
    allocated = 0
    for node, first, last in liveness(fn, order):
        if isinstance(node, Call):
            b = type_bytes(node.checked_type)
            allocated += b
            delta[first] += b
            delta[min(last, steps) + 1] -= b
    peak = live = 0
    for i in range(steps + 1):
        live += delta[i]
        peak = max(peak, live)
    return resident + peak, resident + allocated


__all__ = ["Live", "liveness", "peak_memory", "peak_memories", "resolve_function", "type_bytes"]
