"""What AD needs to know before differentiating: active nodes and every problem at once.

``active_nodes``: nodes with a float leaf that depend on a differentiated
parameter. A node *needs a gradient* when it is active and feeds, through
active nodes, the result: ``greater(x, 0)`` feeding ``where`` is boolean, so
it needs none. ``scan_module`` walks the call graph reachable from the entry
function once and returns one diagnostic line per problem (operators without
a gradient rule, closures, recursion).
"""

from __future__ import annotations

from typing import Iterable

from ...ir.expr import Call, Constant, Expr, Function, GlobalVar, If, Var
from ...ir.module import IRModule
from ...ir.traversal import post_order
from ...ops.registry import OpDef
from .common import binding, closure_like, has_float_leaf


def active_nodes(order: list, params: Iterable[Var]) -> set[int]:
    """ids of nodes in ``order`` (operands first) that carry a float value depending on ``params``."""
    active = {id(p) for p in params}
    for n in order:
        if isinstance(n, (Var, Constant, GlobalVar, Function)) or id(n) in active:
            continue
        kids = (n.true_branch, n.false_branch) if isinstance(n, If) else n.children()
        if any(id(c) in active for c in kids) and has_float_leaf(n.checked_type):
            active.add(id(n))
    return active


def _no_grad_reason(op: OpDef) -> str:
    if not op.differentiable:
        return f"operator {op.name} is not differentiable ({op.nondiff_reason})" if op.nondiff_reason else f"operator {op.name} is not differentiable"
    return f"operator {op.name} has no registered gradient"


def scan_function(fn_name: str, fn: Function, params: Iterable[Var]) -> tuple[list[str], list[Function]]:
    """Problems in ``fn`` (one line each) and the primitive functions it calls.

    ``params`` are the parameters treated as differentiated (the ``wrt`` params for
    the entry function, every float parameter for callees).
    """
    order = post_order(fn.body)
    active = active_nodes(order, params)
    needed = {id(fn.body)} if id(fn.body) in active else set()
    problems: list[str] = []
    primitives: list[Function] = []
    for n in reversed(order):
        if closure_like(n):
            what = "a closure (a Function value inside the body)" if isinstance(n, Function) else "a call of a closure"
            problems.append(f"{what}: first-order AD cannot differentiate closures, {binding(fn_name, fn, n)}")
            continue
        if isinstance(n, Call) and isinstance(n.op, Function) and id(n) in needed:
            primitives.append(n.op)
        if id(n) not in needed:
            continue
        if isinstance(n, Call) and isinstance(n.op, OpDef) and (n.op.grad is None or not n.op.differentiable):
            problems.append(f"{_no_grad_reason(n.op)}, {binding(fn_name, fn, n)}")
        kids = (n.true_branch, n.false_branch) if isinstance(n, If) else n.children()
        for c in kids:
            if id(c) in active:
                needed.add(id(c))
    return problems, primitives


def call_graph(mod: IRModule, entry: str) -> tuple[list[str], list[str]]:
    """Functions reachable from ``entry``, callees first, and one line per recursive cycle."""
    order: list[str] = []
    problems: list[str] = []
    state: dict[str, int] = {}  # 1: on the DFS path, 2: done
    calls_of: dict[str, list[tuple[str, Expr]]] = {}

    def calls(name: str) -> list[tuple[str, Expr]]:
        if name not in calls_of:
            seen: dict[str, Expr] = {}
            for n in post_order(mod[name].body, into_functions=True):
                if isinstance(n, Call) and isinstance(n.op, GlobalVar) and n.op.name_hint not in seen:
                    seen[n.op.name_hint] = n
            calls_of[name] = list(seen.items())
        return calls_of[name]

    path: list[str] = []
    stack = [(entry, 0)]
    state[entry] = 1
    path.append(entry)
    while stack:
        name, k = stack[-1]
        out = calls(name)
        if k == len(out):
            stack.pop()
            path.pop()
            state[name] = 2
            order.append(name)
            continue
        stack[-1] = (name, k + 1)
        callee, site = out[k]
        if callee not in mod:
            continue  # type inference reports unknown functions
        if state.get(callee) == 1:
            cycle = path[path.index(callee):] + [callee]
            problems.append(
                f"recursion: {' -> '.join('@' + c for c in cycle)} cannot be differentiated by first-order AD, "
                f"{binding(name, mod[name], site)}"
            )
            continue
        if state.get(callee) is None:
            state[callee] = 1
            path.append(callee)
            stack.append((callee, 0))
    return order, problems
