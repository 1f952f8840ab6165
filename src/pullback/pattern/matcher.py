"""Matching a pattern against an expression, with an explicit stack and backtracking.

The matcher pairs pattern nodes with expression nodes; it only looks as deep
into the expression as the pattern goes. ``p1 | p2`` tries ``p1`` first and
backtracks to ``p2``. A capture name used twice must bind the same node.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..ir.expr import Call, Constant, Expr, Function, If, Tuple, TupleGetItem, Var, known_type
from ..ir.types import Any, TensorType
from .patterns import (
    AltPattern,
    AttrPattern,
    CallPattern,
    ConstantPattern,
    DFPattern,
    ExprPattern,
    IfPattern,
    OpPattern,
    PredicatePattern,
    TupleGetItemPattern,
    TuplePattern,
    TypePattern,
    VarPattern,
    WildcardPattern,
)

_MISSING = object()


def _attr_value(node: Expr, key: str):
    if isinstance(node, Call):
        attrs = node.attrs
        if attrs is None or not dataclasses.is_dataclass(attrs):
            return _MISSING
        return getattr(attrs, key, _MISSING)
    if isinstance(node, Function):
        return node.attrs.get(key, _MISSING)
    return _MISSING


def _same_attr(have, want) -> bool:
    if isinstance(have, tuple) and isinstance(want, (list, tuple)):
        return have == tuple(want)
    try:
        return bool(have == want)
    except Exception:  # noqa: BLE001 - e.g. arrays compared elementwise: not equal as attributes
        return False


def _type_ok(p: TypePattern, e: Expr) -> bool:
    t = known_type(e)
    if t is None:
        return False
    if p.ty is not None and t != p.ty:
        return False
    if p.shape is not None or p.dtype is not None:
        if not isinstance(t, TensorType):
            return False
        if p.dtype is not None and t.dtype != p.dtype:
            return False
        if p.shape is not None:
            if len(p.shape) != t.ndim:
                return False
            if any(w is not Any and w != d for w, d in zip(p.shape, t.shape)):
                return False
    return True


def _expand(p: DFPattern, e: Expr, todo: list) -> bool:
    """Check ``p`` locally against ``e`` and queue the sub-pairs; False on mismatch."""
    if isinstance(p, WildcardPattern):
        return True
    if isinstance(p, ExprPattern):
        return p.expr is e
    if isinstance(p, VarPattern):
        return isinstance(e, Var) and (not p.var_name or e.name_hint == p.var_name)
    if isinstance(p, ConstantPattern):
        return isinstance(e, Constant)
    if isinstance(p, OpPattern):
        return isinstance(e, Call) and any(e.op is o for o in p.ops)
    if isinstance(p, CallPattern):
        if not isinstance(e, Call):
            return False
        if p.args is not None:
            if len(p.args) != len(e.args):
                return False
            todo.extend(zip(p.args, e.args))
        op = p.op
        if isinstance(op, OpPattern) and op.name is None:  # checked here: an op pattern may be reused
            return any(e.op is o for o in op.ops)
        todo.append((op, e))  # the op pattern sees the call itself
        return True
    if isinstance(p, TuplePattern):
        if not isinstance(e, Tuple):
            return False
        if p.fields is not None:
            if len(p.fields) != len(e.fields):
                return False
            todo.extend(zip(p.fields, e.fields))
        return True
    if isinstance(p, TupleGetItemPattern):
        if not isinstance(e, TupleGetItem) or (p.index is not None and p.index != e.index):
            return False
        todo.append((p.tuple_value, e.tuple_value))
        return True
    if isinstance(p, IfPattern):
        if not isinstance(e, If):
            return False
        todo.extend(((p.cond, e.cond), (p.true_branch, e.true_branch), (p.false_branch, e.false_branch)))
        return True
    if isinstance(p, (TypePattern, AttrPattern, PredicatePattern)):
        todo.append((_Check(p), e))  # checked once the inner pattern (pushed last, popped first) matched
        todo.append((p.pattern, e))
        return True
    return False


class _Check:
    """A queued condition of a constrained pattern."""

    __slots__ = ("p",)

    def __init__(self, p):
        self.p = p


def _check(p, e: Expr) -> bool:
    if isinstance(p, TypePattern):
        return _type_ok(p, e)
    if isinstance(p, AttrPattern):
        return all(_same_attr(_attr_value(e, k), v) for k, v in p.attrs.items())
    return bool(p.pred(e))


def match_pattern(pattern: DFPattern, expr: Expr) -> Optional[dict]:
    """``{pattern node: matched expr}`` for a match of ``pattern`` at ``expr``, else None."""
    choices: list = [([(pattern, expr)], {})]
    while choices:
        todo, bound = choices.pop()
        ok = True
        while todo:
            p, e = todo.pop()
            if isinstance(p, _Check):
                if not _check(p.p, e):
                    ok = False
                    break
                continue
            prev = bound.get(p)
            if prev is not None:
                if prev is not e:
                    ok = False
                    break
                continue
            if isinstance(p, AltPattern):
                bound[p] = e
                choices.append((todo + [(p.right, e)], dict(bound)))
                todo.append((p.left, e))
                continue
            if not _expand(p, e, todo):
                ok = False
                break
            bound[p] = e
        if ok and _names_consistent(bound):
            return bound
    return None


def _names_consistent(bound: dict) -> bool:
    seen: dict = {}
    for p, e in bound.items():
        if p.name is not None:
            if seen.setdefault(p.name, e) is not e:
                return False
    return True


def captures_of(bound: dict) -> dict:
    """``{name: expr}`` for the named patterns in a match."""
    return {p.name: e for p, e in bound.items() if p.name is not None}


def match(pattern: DFPattern, expr: Expr) -> bool:
    """Whether ``pattern`` matches ``expr``."""
    return match_pattern(pattern, expr) is not None


def match_captures(pattern: DFPattern, expr: Expr) -> Optional[dict]:
    """The named captures ``{name: expr}`` of a match of ``pattern`` at ``expr``, or None."""
    bound = match_pattern(pattern, expr)
    return None if bound is None else captures_of(bound)


__all__ = ["match", "match_captures", "match_pattern", "captures_of"]
