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

from typing import Optional

from ..ir.expr import Call, Constant, Expr, Function, GlobalVar, If, Tuple, TupleGetItem
from ..ir.scope import ScopeInfo
from ..ir.traversal import post_order, rebuild
from .pass_infra import FunctionPass, PassInfo, register_pass


def _attrs_key(attrs):
    try:
        hash(attrs)
    except TypeError:
        return None
    return (type(attrs), attrs)


def _key(node: Expr) -> Optional[tuple]:
    """A hashable description of ``node`` over the ids of its operands, or None (never merged)."""
    if isinstance(node, Constant):
        d = node.data
        return ("const", d.dtype.str, d.shape, d.tobytes())
    if isinstance(node, Call):
        op = node.op
        callee = ("global", op.name_hint) if isinstance(op, GlobalVar) else ("op", id(op))
        ak = _attrs_key(node.attrs)
        if ak is None:
            return None
        return ("call", callee, ak, tuple(id(a) for a in node.args))
    if isinstance(node, Tuple):
        return ("tuple", tuple(id(f) for f in node.fields))
    if isinstance(node, TupleGetItem):
        return ("get", node.index, id(node.tuple_value))
    if isinstance(node, If):
        return ("if", id(node.cond), id(node.true_branch), id(node.false_branch))
    return None  # Var, GlobalVar, Function


def cse_expr(body: Expr) -> Expr:
    """``body`` with structurally equal computations merged (scope-aware); ``body`` itself if none."""
    order = post_order(body)
    scopes = ScopeInfo(body, order).scope_of
    memo: dict[int, Expr] = {}
    tables: dict[int, dict] = {}  # id(scope) -> {key: representative}
    get = memo.get
    for node in order:
        new = rebuild(node, lambda c: get(id(c), c))
        key = _key(new)
        if key is not None:
            scope = scopes[id(node)]
            s = scope
            found = None
            while s is not None and found is None:
                found = tables.get(id(s), {}).get(key)
                s = s.parent
            if found is not None:
                new = found
            else:
                tables.setdefault(id(scope), {})[key] = new
        memo[id(node)] = new
    return memo[id(body)]


def _cse(fn: Function, mod, ctx) -> Function:
    return fn.replace(body=cse_expr(fn.body))


def EliminateCommonSubexpr() -> FunctionPass:
    """Merge structurally equal computations within each function (respecting If scopes)."""
    return FunctionPass(_cse, PassInfo("EliminateCommonSubexpr", 2))


register_pass("EliminateCommonSubexpr", EliminateCommonSubexpr)

__all__ = ["EliminateCommonSubexpr", "cse_expr"]
