"""Residuals of an If: the branch-local forward values its backward branch needs.

The reverse sweep differentiates ``r = If(c, T, E)`` into a gradient If on the
same condition. Forward nodes of a branch that the backward branch reads (the
*residuals*) must not be shared between the two Ifs: scope analysis would hoist
them out of the branch and evaluate both branches unconditionally. Instead the
forward If is widened, JAX-style, into

    F = If(c, (T, resT..., zeros for resE...), (E, zeros for resT..., resE...))

every use of ``r`` becomes ``F.0`` and the backward reads ``F.i``. A residual
that is the branch result is read from ``r`` itself (no field needed).

Nested Ifs: a residual of an inner If ``r2`` (in a branch of ``r``) is read by
the backward from the outermost widened If: ``F`` carries ``F2.j`` as one of its
own fields (tuples stay flat however deep Ifs nest). ``Residuals`` records, per
If, how each residual is reached from the If's enclosing scope (``expose``); the
backward reads of residuals under a top-level If are resolved in one final
rebuild (``finish``) that also replaces the uses of every widened If.

Only residuals whose type is fully static are passed (``zeros(shape)`` fills
the other side; a ``zeros_like`` of another value could have a different shape
at run time, which ``lax.cond`` rejects). A residual of dynamic shape stays
shared, so scope analysis evaluates it (and what it depends on) in the
enclosing scope, as before.

Everything here is iterative; the walks touch only nodes the branch sweep built
(``Expr._uid`` is a creation counter: they have a uid >= the sweep's start).
"""

from __future__ import annotations

from typing import Optional

from ...ir.expr import Constant, Expr, If, Tuple, TupleGetItem, Var
from ...ir.scope import Scope, ScopeInfo
from ...ir.traversal import rebuild
from ...ir.types import TensorType, TupleType, Type
from .common import build_struct, fill_like, typed


def fresh_uid() -> int:
    """A uid no existing node has: every node built from now on has a uid >= it."""
    return Expr()._uid


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


def _intervals(scopes: ScopeInfo) -> dict[int, tuple[int, int]]:
    """Euler-tour interval of every scope: ``s`` lies in ``b`` iff ``b``'s interval holds ``s``'s."""
    kids: dict[int, list[Scope]] = {}
    for pair in scopes.branches.values():
        for s in pair:
            kids.setdefault(id(s.parent), []).append(s)
    span: dict[int, tuple[int, int]] = {}
    clock = 0
    stack: list = [(scopes.root, False)]
    while stack:
        s, done = stack.pop()
        if done:
            span[id(s)] = (span[id(s)][0], clock)
            continue
        span[id(s)] = (clock, -1)
        clock += 1
        stack.append((s, True))
        stack.extend((k, False) for k in kids.get(id(s), ()))
    return span


class Residuals:
    """Widening of the forward Ifs of one body, built while the sweep finishes each If."""

    def __init__(self, scopes: ScopeInfo):
        self.scopes = scopes
        self.widened: dict[int, Expr] = {}  # id(forward If r) -> F
        self.expose: dict[int, dict[int, Expr]] = {}  # id(r) -> id(residual) -> its value in r's enclosing scope
        self.reads: dict[int, Expr] = {}  # id(residual under a top-level If) -> what the backward reads
        self.built: set[int] = set()  # ids of the nodes of the widened Ifs (forward nodes, not backward)
        self.exposer: dict[int, If] = {}  # id(residual) -> the outermost If exposing it so far
        self.span = _intervals(scopes)

    def find(self, root: Expr, branch: Scope, start: int) -> list[Expr]:
        """Forward nodes of ``branch`` or scopes nested in it that the backward expression
        ``root`` reads, in first-seen order. Walks only nodes built since ``start``."""
        scope_of, span = self.scopes.scope_of, self.span
        lo, hi = span[id(branch)]
        out: list[Expr] = []
        seen: set[int] = set()
        stack = [root]
        while stack:
            n = stack.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            s = scope_of.get(id(n))
            if s is not None:
                if lo <= span[id(s)][0] < hi and not isinstance(n, (Var, Constant)):
                    out.append(n)
                continue
            if n._uid >= start:
                stack.extend(n.children())
        return out

    def _value_in(self, v: Expr, branch: Scope) -> Optional[Expr]:
        """``v``'s value as a node of ``branch`` scope: itself, or a field of the inner widened If
        directly in ``branch`` that exposes it (None if there is none: ``v`` stays shared)."""
        scope_of = self.scopes.scope_of
        if scope_of[id(v)] is branch:
            return v
        inner = self.exposer.get(id(v))
        if inner is None or scope_of[id(inner)] is not branch:
            return None
        return self.expose[id(inner)][id(v)]

    def widen(self, node: If, sides: list, start: int, top_level: bool) -> None:
        """Record the residuals of ``node`` read by its backward branches ``sides`` and, when
        some are not branch results, the widened If (see the module docstring)."""
        results = (node.true_branch, node.false_branch)
        expose: dict[int, Expr] = {}
        fields: list[list[tuple[Expr, Expr]]] = [[], []]  # per side: (residual, value in the branch)
        for b, (side, branch) in enumerate(zip(sides, self.scopes.branch_scopes(node))):
            for v in self.find(side, branch, start):
                if v is results[b]:
                    expose[id(v)] = node
                elif static_type(v.checked_type):
                    value = self._value_in(v, branch)
                    if value is not None:
                        fields[b].append((v, value))
        if fields[0] or fields[1]:
            before = fresh_uid()
            values = [list({id(x): x for _, x in fs}.values()) for fs in fields]  # one field per value
            zeros_of: dict = {}  # one zeros node per tensor type
            fill = lambda p, t: zeros_of.get(t) or zeros_of.setdefault(t, fill_like(0.0, t, None))  # noqa: E731
            zeros = [[build_struct(x.checked_type, fill) for x in xs] for xs in values]
            then = typed(Tuple([results[0], *values[0], *zeros[1]]))
            other = typed(Tuple([results[1], *zeros[0], *values[1]]))
            wide = typed(If(node.cond, then, other))
            self.widened[id(node)] = wide
            index = {id(x): typed(TupleGetItem(wide, 1 + k)) for k, x in enumerate(values[0] + values[1])}
            for fs in fields:
                expose.update((id(v), index[id(x)]) for v, x in fs)
            self.built.update(id(n) for n in _new_nodes(wide, before))
            self.built.update(id(e) for e in expose.values() if e is not node)
        self.expose[id(node)] = expose
        self.exposer.update((k, node) for k in expose)
        if top_level:
            self.reads.update(expose)

    def finish(self, out: Expr) -> Expr:
        """``out`` rebuilt once: uses of a widened If ``r`` become ``F.0``; backward nodes read
        residuals through the fields recorded in ``reads``."""
        if not self.widened and not self.reads:
            return out
        widened, reads, built, scope_of = self.widened, self.reads, self.built, self.scopes.scope_of

        def kids(n: Expr) -> tuple:
            w = widened.get(id(n))
            if w is not None:
                return (w,)
            if id(n) in scope_of or id(n) in built:  # forward
                return n.children()
            return tuple(reads.get(id(c), c) for c in n.children())

        memo: dict[int, Expr] = {}
        visited: set[int] = set()
        stack: list = [(out, False)]
        while stack:
            n, expanded = stack.pop()
            if not expanded:
                if id(n) in visited:
                    continue
                visited.add(id(n))
                stack.append((n, True))
                stack.extend((c, False) for c in kids(n) if id(c) not in visited)
                continue
            w = widened.get(id(n))
            if w is not None:
                new = TupleGetItem(memo[id(w)], 0)
            elif id(n) in scope_of or id(n) in built:
                new = rebuild(n, lambda c: memo[id(c)])
            else:
                new = rebuild(n, lambda c: memo[id(reads.get(id(c), c))])
            if new is not n:
                typed(new)  # operands may now be less static than before (an If's joined type)
            memo[id(n)] = new
        return memo[id(out)]


def _new_nodes(root: Expr, start: int) -> list[Expr]:
    """Nodes under ``root`` built since ``start``."""
    out: list[Expr] = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in seen or n._uid < start:
            continue
        seen.add(id(n))
        out.append(n)
        stack.extend(n.children())
    return out
