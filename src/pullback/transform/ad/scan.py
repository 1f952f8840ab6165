"""What AD needs to know before differentiating: active nodes and every problem at once.

``active_nodes``: nodes with a float leaf that depend on a differentiated
parameter. A node *needs a gradient* when it is active and feeds, through
active nodes, the result: ``greater(x, 0)`` feeding ``where`` is boolean, so
it needs none. ``scan_module`` scans every function reachable from the entry function once and returns one diagnostic line per problem (operators without
a gradient rule, closures, recursion).
"""

from __future__ import annotations

from typing import Iterable

from ...analysis.callgraph import CallGraph
from ...ir.expr import Call, Constant, Expr, Function, GlobalVar, If, Var
from ...ir.module import IRModule
from ...ir.types import TensorType, is_inexact
from ...ir.traversal import post_order
from ...ops.registry import OpDef
from .common import binding, closure_like, has_float_leaf


def active_nodes(order: list, params: Iterable[Var]) -> set:
    """The nodes of ``order`` (operands first) that carry a float value depending on ``params`` (a set of
    nodes: they hash by identity)."""
    active = set(params)
    skip = (Var, Constant, GlobalVar, Function)
    for n in order:
        if isinstance(n, skip):
            continue
        kids = (n.true_branch, n.false_branch) if type(n) is If else n.children()
        for c in kids:
            if c in active:
                t = n.checked_type
                if is_inexact(t.dtype) if type(t) is TensorType else has_float_leaf(t):
                    active.add(n)
                break
    return active


def differentiable(op: OpDef) -> bool:
    """AD can differentiate calls of ``op``: by its rule, or through its expansion (``OpDef.expand``)."""
    return op.differentiable and (op.grad is not None or op.expand is not None)


def expanded(call: Expr) -> bool:
    """``call`` is differentiated through its operator's expansion (no rule of its own)."""
    return type(call) is Call and isinstance(call.op, OpDef) and call.op.grad is None and call.op.expand is not None


def _no_grad_reason(op: OpDef) -> str:
    if not op.differentiable:
        return f"operator {op.name} is not differentiable ({op.nondiff_reason})" if op.nondiff_reason else f"operator {op.name} is not differentiable"
    return f"operator {op.name} has no registered gradient"


class FunctionScan:
    """One function's post order, active nodes, problems, callees and called primitive functions."""

    def __init__(self, fn_name: str, fn: Function, params: Iterable[Var]):
        self.fn_name = fn_name
        self.fn = fn
        self.order = order = post_order(fn.body)
        self.active = active = active_nodes(order, params)
        self.problems: list[str] = []
        self.callees: list[tuple[str, Call]] = []  # (callee name, first call site)
        self.primitives: list[Function] = []
        self.expansions = False  # a call AD differentiates through its operator's expansion
        needed = {fn.body} if fn.body in active else set()
        seen_callees: set[str] = set()
        for n in reversed(order):
            if closure_like(n):
                what = "a closure (a Function value inside the body)" if isinstance(n, Function) else "a call of a closure"
                self.problems.append(f"{what}: first-order AD cannot differentiate closures, {binding(fn_name, fn, n)}")
                continue
            if type(n) is Call:
                op = n.op
                if isinstance(op, GlobalVar):
                    if op.name_hint not in seen_callees:
                        seen_callees.add(op.name_hint)
                        self.callees.append((op.name_hint, n))
                elif isinstance(op, Function):
                    self.primitives.append(op)
            if n not in needed:
                continue
            self.expansions = self.expansions or expanded(n)
            if type(n) is Call and isinstance(n.op, OpDef) and not differentiable(n.op):
                self.problems.append(f"{_no_grad_reason(n.op)}, {binding(fn_name, fn, n)}")
            kids = (n.true_branch, n.false_branch) if type(n) is If else n.children()
            for c in kids:
                if c in active:
                    needed.add(c)

    @property
    def has_calls(self) -> bool:
        return bool(self.callees or self.primitives)


def float_params(fn: Function) -> list[Var]:
    return [p for p in fn.params if has_float_leaf(p.type_annotation)]


def scan_module(mod: IRModule, entry: str, params: list[Var]) -> tuple[dict[str, FunctionScan], list[str], list[str]]:
    """Scan every function reachable from ``entry`` (callees: every float parameter counts as
    differentiated) and primitive function bodies. Returns the scans, the reachable function
    names callees first, and every problem (one line each, recursion included)."""
    scans: dict[str, FunctionScan] = {}
    todo = [entry]
    while todo:
        name = todo.pop()
        if name in scans or name not in mod:  # type inference reports unknown functions
            continue
        fn = mod[name]
        scans[name] = sc = FunctionScan(name, fn, params if name == entry else float_params(fn))
        for c, site in sc.callees:
            vjp = mod[c].custom_vjp if c in mod else None
            if vjp is None:
                todo.append(c)
            elif vjp not in mod:  # else AD calls the vjp, not differentiating @c
                sc.problems.append(f"@{c}'s custom_vjp @{vjp} is not a function of the module, {binding(name, fn, site)}")
    problems: list[str] = []
    done_prims: set[int] = set()
    for name, sc in scans.items():
        problems += sc.problems
        prims = list(sc.primitives)
        while prims:
            pf = prims.pop()
            if id(pf) in done_prims:
                continue
            done_prims.add(id(pf))
            psc = FunctionScan(f"{name} (fused function)", pf, float_params(pf))
            problems += psc.problems
            prims += psc.primitives
    graph = CallGraph(mod)
    order = [n for n in graph.callees_first([entry]) if n in scans]
    for path in graph.cycles([entry]):
        callee, caller = path[-1], path[-2]
        if caller not in scans or callee not in scans:
            continue
        cycle = path[path.index(callee):]
        problems.append(
            f"recursion: {' -> '.join('@' + c for c in cycle)} cannot be differentiated by first-order AD, "
            f"{binding(caller, scans[caller].fn, graph.site(caller, callee))}"
        )
    return scans, order, problems
