"""Dataflow patterns in Relay's vocabulary.

``is_op("add")(wildcard(), is_constant())``, ``p1 | p2``, ``p.has_shape(...)``,
``p.has_dtype(...)``, ``p.has_attr({...})``, ``p.has_type(...)``; ``p.named("x")``
(or ``name=`` on a builder) captures the matched node under that name. Patterns
are small trees; the matcher (``pattern.matcher``) walks them with an explicit
stack and never looks deeper into an expression than the pattern reaches.
"""

from __future__ import annotations

from typing import Any as _Any
from typing import Callable, Mapping, Optional, Sequence

from ..ir.errors import PullbackError
from ..ir.expr import Expr
from ..ir.types import Any, Type
from ..ops.registry import OpDef, get_op


class DFPattern:
    """Base of dataflow patterns; compared and hashed by identity."""

    name: Optional[str] = None

    def children(self) -> tuple:
        return ()

    # -- combinators, as in Relay
    def __call__(self, *args: "DFPattern") -> "CallPattern":
        return CallPattern(self, [_as_pattern(a) for a in args])

    def __or__(self, other: "DFPattern") -> "AltPattern":
        return AltPattern(self, _as_pattern(other))

    def named(self, name: str) -> "DFPattern":
        """Capture the node this pattern matches as ``captures[name]`` (returns ``self``)."""
        if not isinstance(name, str) or not name:
            raise PullbackError(f"pattern capture name must be a non-empty string, got {name!r}")
        self.name = name
        return self

    def has_type(self, ty: Type) -> "TypePattern":
        """Match only nodes whose type equals ``ty``."""
        if not isinstance(ty, Type):
            raise PullbackError(f"has_type expects a Type, got {ty!r}")
        return TypePattern(self, ty=ty)

    def has_shape(self, shape: Sequence) -> "TypePattern":
        """Match only tensors of ``shape`` (an ``Any`` in ``shape`` matches any size)."""
        return TypePattern(self, shape=tuple(shape))

    def has_dtype(self, dtype: str) -> "TypePattern":
        """Match only tensors of ``dtype``."""
        return TypePattern(self, dtype=dtype)

    def has_attr(self, attrs: Mapping[str, _Any]) -> "AttrPattern":
        """Match only Calls (or Functions) whose attributes hold these values."""
        if not isinstance(attrs, Mapping):
            raise PullbackError(f"has_attr expects a mapping, got {attrs!r}")
        return AttrPattern(self, dict(attrs))

    def where(self, pred: Callable[[Expr], bool]) -> "PredicatePattern":
        """Match only nodes for which ``pred(node)`` is true."""
        if not callable(pred):
            raise PullbackError(f"where expects a callable, got {pred!r}")
        return PredicatePattern(self, pred)

    def match(self, expr: Expr) -> bool:
        from .matcher import match

        return match(self, expr)

    def __repr__(self) -> str:
        return _show(self)


class WildcardPattern(DFPattern):
    """Matches any expression."""


class ExprPattern(DFPattern):
    """Matches one given expression object."""

    def __init__(self, expr: Expr):
        if not isinstance(expr, Expr):
            raise PullbackError(f"is_expr expects an expression, got {expr!r}")
        self.expr = expr


class VarPattern(DFPattern):
    """Matches a Var (with ``name_hint == var_name`` when given)."""

    def __init__(self, var_name: str = ""):
        self.var_name = var_name


class ConstantPattern(DFPattern):
    """Matches a Constant."""


class OpPattern(DFPattern):
    """Matches a Call to one of the operators ``ops`` (any arguments); call it to constrain the arguments."""

    def __init__(self, ops: Sequence[OpDef]):
        self.ops = tuple(ops)


class CallPattern(DFPattern):
    """Matches ``op(args...)``; ``args=None`` matches any arguments."""

    def __init__(self, op: DFPattern, args: Optional[Sequence[DFPattern]]):
        self.op = op
        self.args = None if args is None else tuple(args)

    def children(self) -> tuple:
        return (self.op,) + (self.args or ())


class TuplePattern(DFPattern):
    """Matches a Tuple whose fields match ``fields`` (``None``: any fields)."""

    def __init__(self, fields: Optional[Sequence[DFPattern]]):
        self.fields = None if fields is None else tuple(fields)

    def children(self) -> tuple:
        return self.fields or ()


class TupleGetItemPattern(DFPattern):
    """Matches ``tuple[index]`` (``index=None``: any index)."""

    def __init__(self, tuple_value: DFPattern, index: Optional[int]):
        self.tuple_value = tuple_value
        self.index = index

    def children(self) -> tuple:
        return (self.tuple_value,)


class IfPattern(DFPattern):
    """Matches ``if (cond) {true_branch} else {false_branch}``."""

    def __init__(self, cond: DFPattern, true_branch: DFPattern, false_branch: DFPattern):
        self.cond, self.true_branch, self.false_branch = cond, true_branch, false_branch

    def children(self) -> tuple:
        return (self.cond, self.true_branch, self.false_branch)


class AltPattern(DFPattern):
    """Matches ``left`` or, failing that, ``right``."""

    def __init__(self, left: DFPattern, right: DFPattern):
        self.left, self.right = left, right

    def children(self) -> tuple:
        return (self.left, self.right)


class _Constrained(DFPattern):
    """A pattern with an extra condition on the matched node."""

    def __init__(self, pattern: DFPattern):
        self.pattern = pattern

    def children(self) -> tuple:
        return (self.pattern,)


class TypePattern(_Constrained):
    """``pattern`` restricted by type, shape and/or dtype."""

    def __init__(self, pattern: DFPattern, ty: Optional[Type] = None, shape: Optional[tuple] = None, dtype: Optional[str] = None):
        super().__init__(pattern)
        self.ty, self.shape, self.dtype = ty, shape, dtype


class AttrPattern(_Constrained):
    """``pattern`` restricted to nodes whose attributes hold ``attrs``."""

    def __init__(self, pattern: DFPattern, attrs: dict):
        super().__init__(pattern)
        self.attrs = attrs


class PredicatePattern(_Constrained):
    """``pattern`` restricted to nodes satisfying ``pred``."""

    def __init__(self, pattern: DFPattern, pred: Callable[[Expr], bool]):
        super().__init__(pattern)
        self.pred = pred


# ---------------------------------------------------------------- builders


def _as_pattern(p) -> DFPattern:
    if isinstance(p, DFPattern):
        return p
    if isinstance(p, Expr):
        return ExprPattern(p)
    raise PullbackError(f"expected a pattern or an expression, got {p!r}")


def _named(p: DFPattern, name: Optional[str]) -> DFPattern:
    return p.named(name) if name is not None else p


def wildcard(name: Optional[str] = None) -> WildcardPattern:
    """A pattern matching anything."""
    return _named(WildcardPattern(), name)


def is_expr(expr: Expr, name: Optional[str] = None) -> ExprPattern:
    """A pattern matching exactly ``expr`` (by identity)."""
    return _named(ExprPattern(expr), name)


def is_var(var_name: str = "", name: Optional[str] = None) -> VarPattern:
    """A pattern matching a Var (named ``var_name`` when given)."""
    return _named(VarPattern(var_name), name)


def is_constant(name: Optional[str] = None) -> ConstantPattern:
    """A pattern matching a Constant."""
    return _named(ConstantPattern(), name)


def is_op(*op_names: str, name: Optional[str] = None) -> OpPattern:
    """A pattern for calls to the operator ``op_name`` (or any of several names).

    ``is_op("add")(p1, p2)`` constrains the arguments; ``is_op("add")`` alone matches
    any call to ``add``."""
    if not op_names:
        raise PullbackError("is_op needs at least one operator name")
    ops = []
    for n in op_names:
        if isinstance(n, OpDef):
            ops.append(n)
        elif isinstance(n, str):
            ops.append(get_op(n))
        else:
            raise PullbackError(f"is_op expects operator names, got {n!r}")
    return _named(OpPattern(ops), name)


def is_tuple(fields: Optional[Sequence] = None, name: Optional[str] = None) -> TuplePattern:
    """A pattern matching a Tuple with fields matching ``fields`` (None: any)."""
    return _named(TuplePattern(None if fields is None else [_as_pattern(f) for f in fields]), name)


def is_tuple_get_item(tuple_value, index: Optional[int] = None, name: Optional[str] = None) -> TupleGetItemPattern:
    """A pattern matching ``tuple_value[index]`` (any index when None)."""
    if index is not None and (isinstance(index, bool) or not isinstance(index, int) or index < 0):
        raise PullbackError(f"is_tuple_get_item: index must be a non-negative int or None, got {index!r}")
    return _named(TupleGetItemPattern(_as_pattern(tuple_value), index), name)


def is_if(cond, true_branch, false_branch, name: Optional[str] = None) -> IfPattern:
    """A pattern matching an If node."""
    return _named(IfPattern(_as_pattern(cond), _as_pattern(true_branch), _as_pattern(false_branch)), name)


def has_type(ty: Type, pattern: Optional[DFPattern] = None) -> TypePattern:
    return (pattern or wildcard()).has_type(ty)


def has_shape(shape: Sequence, pattern: Optional[DFPattern] = None) -> TypePattern:
    return (pattern or wildcard()).has_shape(shape)


def has_dtype(dtype: str, pattern: Optional[DFPattern] = None) -> TypePattern:
    return (pattern or wildcard()).has_dtype(dtype)


def has_attr(attrs: Mapping, pattern: Optional[DFPattern] = None) -> AttrPattern:
    return (pattern or wildcard()).has_attr(attrs)


# ---------------------------------------------------------------- printing


def _local_label(p: DFPattern) -> str:
    if isinstance(p, WildcardPattern):
        return "*"
    if isinstance(p, ExprPattern):
        return f"expr#{p.expr._uid}"
    if isinstance(p, VarPattern):
        return f"var({p.var_name})" if p.var_name else "var"
    if isinstance(p, ConstantPattern):
        return "const"
    if isinstance(p, OpPattern):
        return "|".join(o.name for o in p.ops)
    return type(p).__name__


def _show(root: DFPattern) -> str:
    """Text of a pattern (iterative: patterns may be built programmatically)."""
    out: dict[int, str] = {}
    stack = [(root, False)]
    while stack:
        p, done = stack.pop()
        if not done:
            stack.append((p, True))
            stack.extend((c, False) for c in p.children() if id(c) not in out)
            continue
        kids = [out[id(c)] for c in p.children()]
        if isinstance(p, CallPattern):
            s = f"{kids[0]}({', '.join(kids[1:])})" if p.args is not None else f"{kids[0]}(...)"
        elif isinstance(p, TuplePattern):
            s = f"({', '.join(kids)})" if p.fields is not None else "(...)"
        elif isinstance(p, TupleGetItemPattern):
            s = f"{kids[0]}.{'*' if p.index is None else p.index}"
        elif isinstance(p, IfPattern):
            s = f"if({', '.join(kids)})"
        elif isinstance(p, AltPattern):
            s = f"({kids[0]} | {kids[1]})"
        elif isinstance(p, TypePattern):
            parts = [f"type={p.ty!r}"] * (p.ty is not None) + [f"shape={p.shape}"] * (p.shape is not None) + [f"dtype={p.dtype}"] * (p.dtype is not None)
            s = f"{kids[0]}.has({', '.join(parts)})"
        elif isinstance(p, AttrPattern):
            s = f"{kids[0]}.has_attr({p.attrs})"
        elif isinstance(p, PredicatePattern):
            s = f"{kids[0]}.where(...)"
        else:
            s = _local_label(p)
        out[id(p)] = s + (f" as {p.name}" if p.name else "")
    return out[id(root)]


__all__ = [
    "DFPattern", "WildcardPattern", "ExprPattern", "VarPattern", "ConstantPattern", "OpPattern", "CallPattern",
    "TuplePattern", "TupleGetItemPattern", "IfPattern", "AltPattern", "TypePattern", "AttrPattern", "PredicatePattern",
    "wildcard", "is_expr", "is_var", "is_constant", "is_op", "is_tuple", "is_tuple_get_item", "is_if",
    "has_type", "has_shape", "has_dtype", "has_attr", "Any",
]
