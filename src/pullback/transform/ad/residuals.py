"""Residuals of an If: the branch-local forward values its backward branch needs.

The reverse sweep differentiates ``r = If(c, T, E)`` into a gradient If on the
same condition. Forward nodes of a branch that the backward branch references
(the *residuals*) are not shared between the two Ifs (scope analysis would then
hoist them out of the branch and evaluate both branches unconditionally);
instead the forward If is widened, JAX-style, into

    F = If(c, (T, resT..., zeros for resE...), (E, zeros for resT..., resE...))

the backward branches read ``F.i``, and every use of ``r`` becomes ``F.0``
(``substitute``, once, at the end of the sweep). Helpers here are iterative and
touch only the nodes built by the branch sweep (``Expr._uid`` is a creation
counter: nodes built since the branch sweep started have a uid >= its start).
"""

from __future__ import annotations

from typing import Callable, Optional

from ...ir.expr import Constant, Expr, TupleGetItem, Var
from ...ir.scope import Scope
from ...ir.traversal import rebuild
from ...ir.types import TensorType, TupleType, Type

ReadFn = Callable[[Expr], Optional[tuple]]  # a forward read: (key of the value, its scope), else None


def fresh_uid() -> int:
    """A uid no existing node has: every node built from now on has a uid >= it."""
    return Expr()._uid


def within(s: Scope, outer: Scope) -> bool:
    """``s`` is ``outer`` or nested inside it."""
    while s.depth > outer.depth:
        s = s.parent
    return s is outer


def static_type(ty: Type) -> bool:
    """Every leaf of ``ty`` is a tensor of static shape (zeros can be built without a value)."""
    stack = [ty]
    while stack:
        t = stack.pop()
        if isinstance(t, TupleType):
            stack.extend(t.fields)
        elif not (isinstance(t, TensorType) and t.is_static):
            return False
    return True


def find_residuals(root: Expr, branch: Scope, start: int, read: ReadFn) -> dict:
    """The forward values of ``branch`` (or scopes nested in it) that the backward expression
    ``root`` reads directly: ``{key: [nodes reading it]}`` in first-seen order. Walks only
    nodes built since ``start`` (the backward branch); forward reads (``read(n)`` not None)
    are leaves."""
    out: dict = {}
    seen: set[int] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        r = read(n)
        if r is not None:
            key, s = r
            if not isinstance(n, (Var, Constant)) and within(s, branch):
                out.setdefault(key, []).append(n)
            continue
        if n._uid >= start:
            stack.extend(n.children())
    return out


def rebind(root: Expr, memo: dict[int, Expr], start: int, read: ReadFn) -> Expr:
    """``root`` with the nodes keyed in ``memo`` replaced, rebuilding only nodes built since
    ``start`` that are not forward reads (types copied: replacements keep the type)."""
    order: list[Expr] = []
    visited: set[int] = set()
    stack: list = [(root, False)]
    while stack:
        n, expanded = stack.pop()
        if expanded:
            order.append(n)
            continue
        if id(n) in visited or id(n) in memo or n._uid < start or read(n) is not None:
            continue
        visited.add(id(n))
        stack.append((n, True))
        stack.extend((c, False) for c in n.children())
    get = memo.get
    for n in order:
        new = rebuild(n, lambda c: get(id(c), c))
        if new is not n:
            new._checked_type = n._checked_type
            memo[id(n)] = new
    return get(id(root), root)


def substitute(root: Expr, table: dict[int, Expr]) -> Expr:
    """``root`` with every If keyed in ``table`` replaced by ``table[id(r)].0`` (its widened
    If), rebuilt once bottom-up; the widened Ifs are rebuilt too (nested Ifs)."""
    if not table:
        return root
    memo: dict[int, Expr] = {}
    visited: set[int] = set()
    stack: list = [(root, False)]
    while stack:
        n, expanded = stack.pop()
        if expanded:
            wide = table.get(id(n))
            if wide is not None:
                new = TupleGetItem(memo[id(wide)], 0)
            else:
                new = rebuild(n, lambda c: memo[id(c)])
            if new is not n:
                new._checked_type = n._checked_type
            memo[id(n)] = new
            continue
        if id(n) in visited:
            continue
        visited.add(id(n))
        stack.append((n, True))
        wide = table.get(id(n))
        kids = (wide,) if wide is not None else n.children()
        stack.extend((c, False) for c in kids if id(c) not in visited)
    return memo[id(root)]
