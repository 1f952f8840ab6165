"""EliminateCommonSubexpr: structural CSE that respects If scopes.

Two nodes are the same computation when they have the same kind, the same
callee (operator object, GlobalVar name or primitive Function object), equal
attributes and the same (already deduplicated) operands; Constants are equal
by dtype, shape and bytes. Vars and Functions are never merged.

Scopes: a node evaluated in an If branch may only be merged into an equal node
of the same scope or of an enclosing one (which is evaluated whenever the
branch runs); a node of an outer scope is never replaced by one inside a
branch. Work is linear in the number of nodes (one post-order walk, a dict per
scope).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..ir.expr import Call, Constant, Expr, Function, GlobalVar, If, Tuple, TupleGetItem
from ..ir.module import IRModule
from ..ir.scope import ScopeInfo
from ..ir.traversal import post_order, rebuild
from .pass_infra import FunctionPass, PassContext


def _call_key(node: Call, args: tuple) -> Optional[tuple]:
    op = node.op
    callee = ("global", op.name_hint) if isinstance(op, GlobalVar) else op  # operators, primitive Functions: by identity
    attrs = node.attrs
    try:
        hash(attrs)
    except TypeError:
        return None
    return ("call", callee, type(attrs), attrs, args)


def _key(node: Expr) -> Optional[tuple]:
    """A hashable description of ``node`` over its operands (nodes hash and compare by identity), or None
    (never merged)."""
    cls = type(node)
    if cls is Call or isinstance(node, Call):
        return _call_key(node, node.args)
    if isinstance(node, Constant):
        d = node.data
        return ("const", d.dtype.str, d.shape, d.tobytes())
    if isinstance(node, Tuple):
        return ("tuple", node.fields)
    if isinstance(node, TupleGetItem):
        return ("get", node.index, node.tuple_value)
    if isinstance(node, If):
        return ("if", node.cond, node.true_branch, node.false_branch)
    return None  # Var, GlobalVar, Function


def cse_expr(body: Expr) -> Expr:
    """``body`` with structurally equal computations merged (scope-aware); ``body`` itself if none.

    Rebuilt nodes keep the type of the node they replace (``ir.traversal.rebuild``)."""
    order = post_order(body)
    scopes = None
    for node in order:
        if isinstance(node, If):
            scopes = ScopeInfo(body, order).scope_of
            break
    memo: dict[Expr, Expr] = {}  # node -> what replaces it (only nodes that changed)
    get = memo.get

    def mapped(c):
        return get(c, c)

    table: dict = {}  # the only table when there is no If
    tables: dict[int, dict] = {}  # id(scope) -> {key: representative}
    for node in order:
        new = node
        if memo:
            for c in node.children():
                if c in memo:
                    new = rebuild(node, mapped)
                    break
        key = _key(new)
        if key is None:
            if new is not node:
                memo[node] = new
            continue
        if scopes is None:
            found = table.setdefault(key, new)
        else:
            scope = scopes[id(node)]
            s = scope
            found = None
            while s is not None and found is None:
                found = tables.get(id(s), {}).get(key)
                s = s.parent
            if found is None:
                tables.setdefault(id(scope), {})[key] = found = new
        if found is not node:
            memo[node] = found
    return memo.get(body, body)


@dataclass(frozen=True)
class EliminateCommonSubexpr(FunctionPass):
    """Merge structurally equal computations within each function (respecting If scopes)."""

    name = "EliminateCommonSubexpr"
    opt_level = 2

    def transform_function(self, func: Function, mod: IRModule, ctx: PassContext) -> Function:
        return func.replace(body=cse_expr(func.body))


__all__ = ["EliminateCommonSubexpr", "cse_expr"]
