"""Iterative traversals: post order, rebuilding, free variables, use counts.

Nothing here recurses on expression depth: a chain of a million nodes is fine.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from .expr import Call, Constant, Expr, Function, GlobalVar, If, Tuple, TupleGetItem, Var, set_span, set_type


def children(node: Expr, into_functions: bool = False) -> tuple:
    """Operands of ``node``; with ``into_functions`` also Function bodies and called Functions."""
    if into_functions:
        if isinstance(node, Function):
            return node.params + (node.body,)
        if isinstance(node, Call) and isinstance(node.op, Function):
            return (node.op,) + node.args
    return node.children()


_MARK = object()  # post-order marker: the node below it on the stack is finished


def post_order(root: Expr, into_functions: bool = False) -> list[Expr]:
    """Every node reachable from ``root`` once, operands before users (explicit stack)."""
    # nodes hash by identity (Expr defines no __eq__): a set of them is a set of ids without the id() calls
    visited: set[Expr] = set()
    add = visited.add
    order: list[Expr] = []
    emit = order.append
    stack: list = [root]
    push = stack.append
    pop = stack.pop
    mark = _MARK
    while stack:
        node = pop()
        if node is mark:
            emit(pop())
            continue
        if node in visited:
            continue
        add(node)
        push(node)
        push(mark)
        if into_functions and (isinstance(node, Function) or isinstance(node, Call) and isinstance(node.op, Function)):
            kids = children(node, True)
        else:
            kids = node.children()
        if len(kids) == 1:
            c = kids[0]
            if c not in visited:
                push(c)
        else:
            for i in range(len(kids) - 1, -1, -1):
                c = kids[i]
                if c not in visited:
                    push(c)
    return order


def _new_like(node: Expr, new: Expr) -> Expr:
    """``new`` (``node`` rebuilt over other operands, same kind, callee and attributes) with the span
    of ``node``, and its type when every changed operand has the type of the one it replaces: types
    are a pure function of kind, callee, attributes and operand types (not for a call to a module
    function, whose signature a pass may change)."""
    if node.span is not None:
        set_span(new, node.span)
    t = node._checked_type
    if t is None or (type(new) is Call and type(new.op) is GlobalVar):
        return new
    for a, b in zip(node.children(), new.children()):
        if a is not b:
            tb = b._checked_type
            if tb is None:
                tb = b.type_annotation if type(b) is Var else None
                if tb is None:
                    return new
            ta = a._checked_type
            if ta is not tb and ta != tb:
                return new
    set_type(new, t)
    return new


def _rebuild_call(node: Call, mapped, into_functions: bool) -> Expr:
    args = node.args
    new_args = tuple([mapped(a) for a in args])
    op = node.op
    new_op = mapped(op) if into_functions and isinstance(op, Function) else op
    if new_op is op:
        for a, b in zip(args, new_args):
            if a is not b:
                break
        else:
            return node
        return _new_like(node, Call(op, new_args, node.attrs))
    new = Call(new_op, new_args, node.attrs)
    set_span(new, node.span)
    return new


def _rebuild_tuple(node: Tuple, mapped, into_functions: bool) -> Expr:
    fields = node.fields
    new = tuple([mapped(f) for f in fields])
    for a, b in zip(fields, new):
        if a is not b:
            return _new_like(node, Tuple(new))
    return node


def _rebuild_get(node: TupleGetItem, mapped, into_functions: bool) -> Expr:
    t = mapped(node.tuple_value)
    return node if t is node.tuple_value else _new_like(node, TupleGetItem(t, node.index))


def _rebuild_if(node: If, mapped, into_functions: bool) -> Expr:
    new = node.replace(cond=mapped(node.cond), true_branch=mapped(node.true_branch), false_branch=mapped(node.false_branch))
    return node if new is node else _new_like(node, new)


def _rebuild_function(node: Function, mapped, into_functions: bool) -> Expr:
    if not into_functions:
        return node
    return node.replace(params=tuple(mapped(p) for p in node.params), body=mapped(node.body))


_REBUILD = {Call: _rebuild_call, Tuple: _rebuild_tuple, TupleGetItem: _rebuild_get, If: _rebuild_if,
            Function: _rebuild_function}
_LEAVES = (Var, Constant, GlobalVar)


def _rebuild_generic(node: Expr, mapped, into_functions: bool) -> Expr:
    """Subclasses of the node types: rebuild through ``replace`` (keeps the subclass)."""
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
        return _rebuild_if(node, mapped, into_functions)
    if isinstance(node, Function):
        return _rebuild_function(node, mapped, into_functions)
    return node


def rebuild(node: Expr, mapped: Callable[[Expr], Expr], into_functions: bool = False) -> Expr:
    """``node`` with every operand replaced by ``mapped(operand)``; ``node`` itself if none changed.

    A rebuilt node keeps the cached type of ``node`` when its operands have the same types."""
    cls = type(node)
    fn = _REBUILD.get(cls)
    if fn is None:
        return node if cls in _LEAVES else _rebuild_generic(node, mapped, into_functions)
    return fn(node, mapped, into_functions)


def transform(root: Expr, fn: Optional[Callable[[Expr, Expr], Optional[Expr]]] = None, into_functions: bool = False,
              memo: Optional[dict] = None) -> Expr:
    """Rebuild ``root`` bottom-up (an iterative ExprMutator).

    For each node, operands are rebuilt first; then ``fn(old, rebuilt)`` may
    return a replacement (or None to keep ``rebuilt``). Unchanged subgraphs keep
    their identity, and sharing is preserved.
    """
    memo = {} if memo is None else memo
    get = memo.get

    def mapped(c):
        return get(id(c), c)

    for node in post_order(root, into_functions):
        key = id(node)
        if key in memo:
            continue
        new = rebuild(node, mapped, into_functions)
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


def use_counts(root: Expr, into_functions: bool = False) -> dict[int, int]:
    """``id(node) -> number of operand slots that reference it`` (the root counts one use)."""
    counts: dict[int, int] = {id(root): 1}
    get = counts.get
    for n in post_order(root, into_functions):
        for c in (children(n, True) if into_functions else n.children()):
            k = id(c)
            counts[k] = get(k, 0) + 1
    return counts


def users(root: Expr, into_functions: bool = False) -> dict[int, list[Expr]]:
    """``id(node) -> list of nodes using it`` (one entry per use)."""
    out: dict[int, list[Expr]] = {}
    for n in post_order(root, into_functions):
        for c in (children(n, True) if into_functions else n.children()):
            lst = out.get(id(c))
            if lst is None:
                out[id(c)] = [n]
            else:
                lst.append(n)
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
