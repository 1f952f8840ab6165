"""Static program statistics: operator histograms, leftovers of AD, FLOPs, memory.

Counts are static (nodes in the program, not executions), look into primitive
functions, and take either a whole IRModule, one Function, or an IRModule
restricted to ``func`` and the functions it calls. ``flops`` counts per
execution instead: a global function is counted once per call site, a
primitive function once per call, and both If branches are counted.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional, Union

import numpy as np

from ..ir.errors import PullbackError
from ..ir.expr import Call, Constant, Expr, Function, GlobalVar
from ..ir.module import IRModule
from ..ir.traversal import post_order
from ..ops.registry import OpDef, is_call_to
from .callgraph import CallGraph
from .liveness import peak_memories, resolve_function

Target = Union[IRModule, Function, Expr]

LIKE_OPS = ("zeros_like", "ones_like", "full_like", "reshape_like", "collapse_sum_like", "broadcast_to_like", "cast_like")


def _calls(target: Target, func: Optional[str] = None) -> list[Call]:
    """Operator calls of ``target``: all of a module, or ``func`` and the functions it calls
    (each function walked once, into primitive functions)."""
    if isinstance(target, Expr):
        roots = [target]
    elif isinstance(target, IRModule):
        if func is None:
            roots = [f for _, f in target.items()]
        else:
            target[func]  # raises naming the known functions
            live = CallGraph(target).reachable([func])
            roots = [f for name, f in target.items() if name in live]
    else:
        raise PullbackError(f"expected an IRModule, Function or Expr, got {type(target).__name__}")
    seen: set[int] = set()
    out: list[Call] = []
    for root in roots:
        for n in post_order(root, into_functions=True):
            if isinstance(n, Call) and isinstance(n.op, OpDef) and id(n) not in seen:
                seen.add(id(n))
                out.append(n)
    return out


def _histogram(calls: list[Call]) -> dict[str, int]:
    return dict(sorted(Counter(c.op.name for c in calls).items()))


def _count_like(calls: list[Call]) -> int:
    return sum(1 for c in calls if c.op.name in LIKE_OPS)


def op_histogram(target: Target, func: Optional[str] = None) -> dict[str, int]:
    """``{op name: number of Call nodes}``, sorted by name (primitive functions included)."""
    return _histogram(_calls(target, func))


def count_like_ops(target: Target, func: Optional[str] = None) -> int:
    """Number of calls to the ``*_like`` operators (``LIKE_OPS``) left in the program."""
    return _count_like(_calls(target, func))


_FILL_ARG = {"full": 0, "full_like": 1}
_MADE = {0: ("zeros", "zeros_like"), 1: ("ones", "ones_like")}


def _is_fill(e: Expr, value: int) -> bool:
    """``e`` is, statically, a tensor filled with ``value`` (0 or 1)."""
    if isinstance(e, Constant):
        return e.data.size > 0 and bool(np.all(e.data == value))
    if is_call_to(e, _MADE[value]):
        return True
    if is_call_to(e, tuple(_FILL_ARG)):
        fill = e.args[_FILL_ARG[e.op.name]]
        return isinstance(fill, Constant) and bool(np.all(fill.data == value))
    return False


# op -> (operand positions that may hold the identity, identity value)
_IDENTITY = {"add": ((0, 1), 0), "subtract": ((1,), 0), "multiply": ((0, 1), 1), "divide": ((1,), 1)}


def count_identity_arith(target: Target, func: Optional[str] = None) -> int:
    """Calls ``x + 0``, ``0 + x``, ``x - 0``, ``x * 1``, ``1 * x``, ``x / 1`` (zeros/ones/full and
    their ``*_like``, all-zero / all-one constants); counted, never rewritten."""
    return _count_identity(_calls(target, func))


def _count_identity(calls: list[Call]) -> int:
    return sum(1 for c in calls if (rule := _IDENTITY.get(c.op.name)) is not None
               and any(_is_fill(c.args[i], rule[1]) for i in rule[0]))


def flops(target: Union[IRModule, Function], func: str = "main") -> int:
    """FLOPs of one run of ``func``: the sum of ``op.flops(arg_types, out_type, attrs)`` over its
    calls, into primitive functions, with each call of a global function adding that
    function's FLOPs (a recursive call adds 0). Types are inferred if missing."""
    fn, mod = resolve_function(target, func)
    # own cost of every Function (inner primitive ones first: post order) + global callees
    own: dict[int, tuple[int, Counter]] = {}

    def cost_of(f: Function, nodes: Optional[list] = None) -> tuple[int, Counter]:
        total, callees = 0, Counter()
        for n in post_order(f.body) if nodes is None else nodes:
            if not isinstance(n, Call):
                continue
            if isinstance(n.op, OpDef):
                total += int(n.op.flops([a.checked_type for a in n.args], n.checked_type, n.attrs))
            elif isinstance(n.op, GlobalVar):
                callees[n.op.name_hint] += 1
            else:
                sub_total, sub_callees = own[id(n.op)]
                total += sub_total
                callees.update(sub_callees)
        return total, callees

    def own_cost(root: Function) -> tuple[int, Counter]:
        if id(root) in own:
            return own[id(root)]
        nodes = post_order(root, into_functions=True)
        inner = [n for n in nodes if isinstance(n, Function) and n is not root]
        for n in inner:
            if id(n) not in own:
                own[id(n)] = cost_of(n)
        # with no inner functions, the walk already is the body's evaluation order
        own[id(root)] = cost_of(root, None if inner else nodes)
        return own[id(root)]

    if mod is None:
        return own_cost(fn)[0]
    totals: dict[str, int] = {}
    for name in CallGraph(mod).callees_first([func]):  # a recursive call finds no total yet: it adds 0
        base, callees = own_cost(mod[name])
        totals[name] = base + sum(k * totals.get(c, 0) for c, k in callees.items())
    return totals[func]


def program_stats(target: Union[IRModule, Function], func: str = "main") -> dict:
    """``ops`` (histogram), ``like_ops``, ``identity_arith``, ``flops``, ``peak_bytes`` and
    ``peak_bytes_no_reuse`` of ``func`` and the functions it calls."""
    fn, mod = resolve_function(target, func)
    calls = _calls(mod, func) if mod is not None else _calls(fn)
    peak, peak_no_reuse = peak_memories(fn)
    return {"ops": _histogram(calls), "calls": len(calls), "like_ops": _count_like(calls),
            "identity_arith": _count_identity(calls), "flops": flops(target, func), "peak_bytes": peak,
            "peak_bytes_no_reuse": peak_no_reuse}


__all__ = ["LIKE_OPS", "op_histogram", "count_like_ops", "count_identity_arith", "flops", "program_stats"]
