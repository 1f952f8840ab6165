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
from .patterns import (AltPattern, AttrPattern, CallPattern, ConstantPattern, DFPattern, ExprPattern, IfPattern, OpPattern,
                       PredicatePattern, TupleGetItemPattern, TuplePattern, TypePattern, VarPattern, WildcardPattern)

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


# ---------------------------------------------------------------- compiled matchers
#
# A tree-shaped pattern without alternatives (the usual rewrite rule) is compiled
# into nested closures, one per pattern node: no work lists, no backtracking
# state. The closures check, bind and order exactly as ``match_pattern`` does
# (operator first, then operands right to left; a constrained pattern's own
# condition after its inner pattern). Other patterns use ``match_pattern``.

_MAX_COMPILED_DEPTH = 64


def _compilable(pattern: DFPattern) -> bool:
    """A tree (no shared pattern nodes), no AltPattern, distinct capture names, bounded depth."""
    seen: set[int] = set()
    names: set[str] = set()
    stack = [(pattern, 1)]
    while stack:
        p, d = stack.pop()
        if id(p) in seen or d > _MAX_COMPILED_DEPTH or type(p) not in _LEAF_TESTS and type(p) not in _INNER_KINDS:
            return False
        seen.add(id(p))
        if p.name is not None:
            if p.name in names:
                return False
            names.add(p.name)
        stack.extend((c, d + 1) for c in p.children())
    return True


def _m_leaf(p):
    """A leaf pattern: its local test (``_LEAF_TESTS``), then the binding."""
    test = _LEAF_TESTS[type(p)](p)
    if test is None:
        def m(e, b):
            b[p] = e
            return True
        return m

    def m(e, b):
        if not test(e):
            return False
        b[p] = e
        return True
    return m


_LEAF_TESTS = {
    WildcardPattern: lambda p: None,
    ExprPattern: lambda p: lambda e, x=p.expr: e is x,
    VarPattern: lambda p: lambda e, n=p.var_name: isinstance(e, Var) and (not n or e.name_hint == n),
    ConstantPattern: lambda p: lambda e: isinstance(e, Constant),
    OpPattern: lambda p: _op_test(frozenset(id(o) for o in p.ops)),
}


def _op_test(ids: frozenset):
    return lambda e: isinstance(e, Call) and id(e.op) in ids


def _m_call(p, kids):
    op = p.op
    inline = isinstance(op, OpPattern) and op.name is None
    ids = frozenset(id(o) for o in op.ops) if inline else None
    mop = None if inline else kids[0]
    margs = None if p.args is None else kids[1:][::-1]
    n = None if p.args is None else len(p.args)

    def m(e, b):
        if not isinstance(e, Call):
            return False
        args = e.args
        if n is not None and len(args) != n:
            return False
        if inline:
            if id(e.op) not in ids:
                return False
            b[p] = e
        else:
            b[p] = e
            if not mop(e, b):
                return False
        if margs is not None:
            i = n
            for sub in margs:
                i -= 1
                if not sub(args[i], b):
                    return False
        return True
    return m


def _m_tuple(p, kids):
    n = None if p.fields is None else len(p.fields)
    rev = kids[::-1]

    def m(e, b):
        if not isinstance(e, Tuple):
            return False
        fields = e.fields
        if n is not None and len(fields) != n:
            return False
        b[p] = e
        i = len(rev)
        for sub in rev:
            i -= 1
            if not sub(fields[i], b):
                return False
        return True
    return m


def _m_get(p, kids):
    index, sub = p.index, kids[0]

    def m(e, b):
        if not isinstance(e, TupleGetItem) or (index is not None and index != e.index):
            return False
        b[p] = e
        return sub(e.tuple_value, b)
    return m


def _m_if(p, kids):
    mc, mt, mf = kids

    def m(e, b):
        if not isinstance(e, If):
            return False
        b[p] = e
        return mf(e.false_branch, b) and mt(e.true_branch, b) and mc(e.cond, b)
    return m


def _m_constrained(p, kids):
    sub = kids[0]
    if type(p) is PredicatePattern:
        pred = p.pred

        def m(e, b):
            b[p] = e
            return sub(e, b) and bool(pred(e))
        return m

    def m(e, b):
        b[p] = e
        return sub(e, b) and _check(p, e)
    return m


_INNER_KINDS = {CallPattern: _m_call, TuplePattern: _m_tuple, TupleGetItemPattern: _m_get, IfPattern: _m_if,
                TypePattern: _m_constrained, AttrPattern: _m_constrained, PredicatePattern: _m_constrained}


def compile_pattern(pattern: DFPattern):
    """A function ``expr -> {pattern node: matched expr} | None`` equal to ``match_pattern(pattern, .)``.

    Tree-shaped patterns without alternatives are compiled to closures; others fall back
    to the backtracking matcher. Compile again after mutating the pattern (``named``)."""
    if not _compilable(pattern):
        return lambda e: match_pattern(pattern, e)
    built: dict[int, object] = {}
    stack = [(pattern, False)]
    while stack:  # children before parents, no recursion over the pattern
        p, done = stack.pop()
        if not done:
            stack.append((p, True))
            stack.extend((c, False) for c in p.children())
            continue
        kind = _INNER_KINDS.get(type(p))
        built[id(p)] = _m_leaf(p) if kind is None else kind(p, [built[id(c)] for c in p.children()])
    root = built[id(pattern)]

    def run(e):
        b: dict = {}
        return b if root(e, b) else None
    return run


__all__ = ["match", "match_captures", "match_pattern", "captures_of", "compile_pattern"]
