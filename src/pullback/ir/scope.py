"""If scopes: a node belongs to the innermost If branch that holds all its uses.

A node reachable only through one branch is evaluated only when that branch
runs; a node also used outside is evaluated outside, once. The printer, the
executor and scope-aware passes (CSE, AD) share this analysis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .expr import Expr, If
from .traversal import post_order


@dataclass(eq=False)
class Scope:
    """The function body (``if_node is None``) or one branch of an If."""

    parent: Optional["Scope"]
    if_node: Optional[If] = None
    branch: int = 0  # 0: true branch, 1: false branch
    depth: int = 0
    nodes: list = field(default_factory=list)  # nodes evaluated here, operands first
    up: Optional["Scope"] = field(default=None, repr=False)  # ``jump`` below the root (None at the root)

    def __post_init__(self):
        p = self.parent
        if p is not None:
            self.up = p.jump.jump if p.depth - p.jump.depth == p.jump.depth - p.jump.jump.depth else p

    @property
    def jump(self) -> "Scope":
        """The skew-binary ancestor pointer (``_lca``); the root's is itself, without a stored
        self-reference: a reference cycle would keep the scope's nodes alive until the cyclic GC."""
        return self if self.up is None else self.up

    def __repr__(self) -> str:
        if self.if_node is None:
            return "Scope(root)"
        return f"Scope({'then' if self.branch == 0 else 'else'} of If#{self.if_node._uid}, depth={self.depth})"


def ancestor_at(s: Scope, depth: int) -> Scope:
    """The scope holding ``s`` at nesting ``depth`` (``s`` itself if it is not deeper): O(log depth)
    through the jump pointers (skew-binary ancestors)."""
    while s.depth > depth:
        s = s.jump if s.jump.depth >= depth else s.parent
    return s


def _lca(a: Scope, b: Scope) -> Scope:
    """The innermost scope holding both ``a`` and ``b``: O(log depth) through the jump pointers,
    so deeply nested Ifs stay linear overall."""
    if a.depth < b.depth:
        a, b = b, a
    a = ancestor_at(a, b.depth)
    while a is not b:
        if a.jump is not b.jump:
            a, b = a.jump, b.jump
        else:
            a, b = a.parent, b.parent
    return a


class ScopeInfo:
    """Scopes of every node under ``root``.

    ``scope_of[id(node)]`` is the node's Scope; ``root.nodes`` lists the nodes
    evaluated unconditionally, and ``branches[id(if_node)]`` gives the two branch
    scopes of each If, each with its own ``nodes`` in evaluation order.
    """

    def __init__(self, body: Expr, order: Optional[list] = None):
        order = post_order(body) if order is None else order
        self.order = order
        self.root = Scope(None)
        self.branches: dict[int, tuple[Scope, Scope]] = {}
        scope_of: dict[int, Scope] = {id(body): self.root}
        for n in reversed(order):
            s = scope_of.get(id(n))
            if s is None:  # unreachable from body: cannot happen for post_order(body)
                s = scope_of[id(n)] = self.root
            if isinstance(n, If):
                then_s = Scope(s, n, 0, s.depth + 1)
                else_s = Scope(s, n, 1, s.depth + 1)
                self.branches[id(n)] = (then_s, else_s)
                uses = ((n.cond, s), (n.true_branch, then_s), (n.false_branch, else_s))
            else:
                uses = tuple((c, s) for c in n.children())
            for c, us in uses:
                prev = scope_of.get(id(c))
                scope_of[id(c)] = us if prev is None else _lca(prev, us)
        self.scope_of = scope_of
        for n in order:
            scope_of[id(n)].nodes.append(n)

    def branch_scopes(self, if_node: If) -> tuple[Scope, Scope]:
        return self.branches[id(if_node)]
