"""Iterative traversals: post order, rebuilding, free variables, use counts.

Nothing here recurses on expression depth: a chain of a million nodes is fine.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from .expr import Call, Constant, Expr, Function, GlobalVar, If, Tuple, TupleGetItem, Var


def children(node: Expr, into_functions: bool = False) -> tuple:
    """Operands of ``node``; with ``into_functions`` also Function bodies and called Functions."""
    if into_functions:
        if isinstance(node, Function):
            return node.params + (node.body,)
        if isinstance(node, Call) and isinstance(node.op, Function):
            return (node.op,) + node.args
    return node.children()


def post_order(root: Expr, into_functions: bool = False) -> list[Expr]:
    """Every node reachable from ``root`` once, operands before users (explicit stack)."""
    visited: set[int] = set()
    order: list[Expr] = []
    stack: list = [(root, False)]
    push = stack.append
    pop = stack.pop
    while stack:
        node, expanded = pop()
        if expanded:
            order.append(node)
            continue
        nid = id(node)
        if nid in visited:
            continue
        visited.add(nid)
        push((node, True))
        kids = children(node, into_functions)
        for i in range(len(kids) - 1, -1, -1):
            c = kids[i]
            if id(c) not in visited:
                push((c, False))
    return order


def rebuild(node: Expr, mapped: Callable[[Expr], Expr], into_functions: bool = False) -> Expr:
    """``node`` with every operand replaced by ``mapped(operand)``; ``node`` itself if none changed."""
    if isinstance(node, Call):
        op = node.op
        if into_functions and isinstance(op, Function):
            op = mapped(op)
        return node.replace(op=op, args=tuple(mapped(a) for a in node.args))
    if isinstance(node, Tuple):
        return node.replace(fields=tuple(mapped(f) for f in node.fields))
    if isinstance(node, TupleGetItem):
        return node.replace(tuple_value=mapped(node.tuple_value))
    if isinstance(node, If):
        return node.replace(cond=mapped(node.cond), true_branch=mapped(node.true_branch), false_branch=mapped(node.false_branch))
    if isinstance(node, Function) and into_functions:
        return node.replace(params=tuple(mapped(p) for p in node.params), body=mapped(node.body))
    return node



def transform(
    root: Expr,
    fn: Optional[Callable[[Expr, Expr], Optional[Expr]]] = None,
    into_functions: bool = False,
    memo: Optional[dict] = None,
) -> Expr:
    """Rebuild ``root`` bottom-up (an iterative ExprMutator).

    For each node, operands are rebuilt first; then ``fn(old, rebuilt)`` may
    return a replacement (or None to keep ``rebuilt``). Unchanged subgraphs keep
    their identity, and sharing is preserved.
    """
    memo = {} if memo is None else memo
    get = memo.get
    for node in post_order(root, into_functions):
        key = id(node)
        if key in memo:
            continue
        new = rebuild(node, lambda c: get(id(c), c), into_functions)
        if fn is not None:
            out = fn(node, new)
            if out is not None:
                new = out
        memo[key] = new
    return memo.get(id(root), root)


def free_vars(expr: Expr) -> list[Var]:
    """Vars used in ``expr`` and not bound by a Function inside it, in first-use order."""
    bound: set[int] = set()
    seen: list[Var] = []
    for n in post_order(expr, into_functions=True):
        if isinstance(n, Function):
            bound.update(id(p) for p in n.params)
        elif isinstance(n, Var):
            seen.append(n)
    return [v for v in seen if id(v) not in bound]


def all_vars(expr: Expr) -> list[Var]:
    return [n for n in post_order(expr, into_functions=True) if isinstance(n, Var)]


def global_calls(expr: Expr) -> list[GlobalVar]:
    """GlobalVars referenced by ``expr`` (as callees or values), in first-use order."""
    out: list[GlobalVar] = []
    seen: set[int] = set()
    for n in post_order(expr, into_functions=True):
        g = n.op if isinstance(n, Call) and isinstance(n.op, GlobalVar) else (n if isinstance(n, GlobalVar) else None)
        if g is not None and id(g) not in seen:
            seen.add(id(g))
            out.append(g)
    return out


def use_counts(root: Expr, into_functions: bool = False) -> dict[int, int]:
    """``id(node) -> number of operand slots that reference it`` (the root counts one use)."""
    counts: dict[int, int] = {id(root): 1}
    for n in post_order(root, into_functions):
        for c in children(n, into_functions):
            counts[id(c)] = counts.get(id(c), 0) + 1
    return counts


def users(root: Expr, into_functions: bool = False) -> dict[int, list[Expr]]:
    """``id(node) -> list of nodes using it`` (one entry per use)."""
    out: dict[int, list[Expr]] = {}
    for n in post_order(root, into_functions):
        for c in children(n, into_functions):
            out.setdefault(id(c), []).append(n)
    return out


def count_calls(root: Expr, names: Optional[Iterable[str]] = None, into_functions: bool = True) -> int:
    """Number of Call nodes (optionally only to operators named in ``names``)."""
    wanted = set(names) if names is not None else None
    n = 0
    for node in post_order(root, into_functions):
        if isinstance(node, Call) and not isinstance(node.op, (GlobalVar, Function)):
            if wanted is None or node.op.name in wanted:
                n += 1
    return n


def is_leaf(node: Expr) -> bool:
    return isinstance(node, (Var, Constant, GlobalVar))
