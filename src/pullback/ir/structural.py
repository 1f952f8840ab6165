"""Structural equality and hashing of expressions, functions, modules and types.

Two programs are structurally equal when one maps onto the other by a node
bijection that preserves node kinds, local fields (operators, attrs, constant
bytes, annotations, indices) and ordered operands. Consequences:

- Function parameters map positionally (alpha-equivalence, also for inner
  Functions); free variables must be the same object unless
  ``map_free_vars=True``, then they map by first occurrence.
- DAG sharing is structure: ``f(y, y)`` with one shared ``y = x * 2`` differs
  from ``f(x * 2, x * 2)`` built twice.
- Operators compare by identity, ``GlobalVar``\\ s by name, attrs with ``==`` (NaN equal to NaN),
  constants by dtype, shape and bytes (NaN equals the same NaN bits).

``structural_equal(a, b)`` implies ``structural_hash(a) == structural_hash(b)``.
Both walk an explicit stack: a chain of a million nodes is fine.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Union

import numpy as np

from .expr import Call, Constant, Expr, Function, GlobalVar, If, Op, Tuple, TupleGetItem, Var, attr_key, same_attr_value, to_text
from .module import IRModule
from .types import Type

Structural = Union[Expr, IRModule, Type]

# ---------------------------------------------------------------- local fields


def _same_value(a, b) -> bool:
    """``a == b`` for attrs that may hold arrays or NaN (NaN equals NaN of the same bits; never raises)."""
    return same_attr_value(a, b)


def _const_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _op_label(op) -> str:
    if isinstance(op, Op):
        return op.name
    if isinstance(op, GlobalVar):
        return "@" + op.name_hint
    return "a primitive function"


def _same_callee(x, y) -> Optional[str]:
    """None if the callees match (Function callees are compared as operands)."""
    if isinstance(x, Function) and isinstance(y, Function):
        return None
    if isinstance(x, GlobalVar) and isinstance(y, GlobalVar):
        return None if x.name_hint == y.name_hint else f"different callees @{x.name_hint} and @{y.name_hint}"
    if x is y:
        return None
    return f"different operators {_op_label(x)} and {_op_label(y)}"


def _operands(x: Expr) -> tuple:
    """Operands compared pairwise (a Function's params are handled by the bijection)."""
    if isinstance(x, Call):
        return ((x.op,) if isinstance(x.op, Function) else ()) + x.args
    if isinstance(x, Function):
        return (x.body,)
    return x.children()


def _local_diff(x: Expr, y: Expr) -> Optional[str]:
    """Why ``x`` and ``y`` differ locally (ignoring operands), or None."""
    if type(x) is not type(y):
        return f"different node kinds {type(x).__name__} and {type(y).__name__}"
    if isinstance(x, Call):
        why = _same_callee(x.op, y.op)
        if why:
            return why
        if len(x.args) != len(y.args):
            return f"{_op_label(x.op)} has {len(x.args)} arguments on the left and {len(y.args)} on the right"
        if not _same_value(x.attrs, y.attrs):
            return f"different attributes of {_op_label(x.op)}: {x.attrs!r} and {y.attrs!r}"
    elif isinstance(x, Var):
        if x.type_annotation != y.type_annotation:
            return f"different annotations of %{x.name_hint} and %{y.name_hint}: {x.type_annotation!r} and {y.type_annotation!r}"
    elif isinstance(x, Constant):
        if not _const_equal(x.data, y.data):
            return f"different constants: {x.data.dtype}{x.data.shape} and {y.data.dtype}{y.data.shape}" + (
                " with different values" if x.data.dtype == y.data.dtype and x.data.shape == y.data.shape else ""
            )
    elif isinstance(x, GlobalVar):
        if x.name_hint != y.name_hint:
            return f"different globals @{x.name_hint} and @{y.name_hint}"
    elif isinstance(x, Tuple):
        if len(x.fields) != len(y.fields):
            return f"tuples of {len(x.fields)} and {len(y.fields)} fields"
    elif isinstance(x, TupleGetItem):
        if x.index != y.index:
            return f"different tuple indices .{x.index} and .{y.index}"
    elif isinstance(x, Function):
        if len(x.params) != len(y.params):
            return f"functions of {len(x.params)} and {len(y.params)} parameters"
        if x.ret_type != y.ret_type:
            return f"different return types {x.ret_type!r} and {y.ret_type!r}"
        if not _same_value(x.attrs, y.attrs):
            return f"different function attributes {dict(x.attrs)!r} and {dict(y.attrs)!r}"
    return None


# ---------------------------------------------------------------- paths


def _slot_label(parent: Expr, slot: int) -> str:
    if isinstance(parent, Call):
        if isinstance(parent.op, Function):
            return "the primitive function called" if slot == 0 else f"argument {slot - 1} of a primitive call"
        return f"argument {slot} of {_op_label(parent.op)}"
    if isinstance(parent, Tuple):
        return f"field {slot} of a tuple"
    if isinstance(parent, TupleGetItem):
        return f"the tuple of .{parent.index}"
    if isinstance(parent, If):
        return ("the condition of an if", "the then branch of an if", "the else branch of an if")[slot]
    if isinstance(parent, Function):
        if slot < 0:
            return f"parameter {-slot - 1} of a function"
        return "the body of a function"
    return f"operand {slot} of {type(parent).__name__}"


def _render_path(where, prefix: str) -> str:
    """``where`` is a linked list ``(parent_where, parent_node, slot)``; outermost first."""
    steps = []
    while where is not None:
        where, parent, slot = where
        steps.append((parent, slot))
    steps.reverse()
    if prefix and steps and isinstance(steps[0][0], Function) and steps[0][1] >= 0:
        steps = steps[1:]  # "in @main" already says we are in the function's body
    labels = [_slot_label(parent, slot) for parent, slot in steps]
    if prefix:
        return ", ".join([prefix] + labels)
    return "in " + ", ".join(labels) if labels else "at the root"


class Mismatch(NamedTuple):
    """The first differing pair found by ``structural_equal``."""

    lhs: object
    rhs: object
    reason: str
    path: str


# ---------------------------------------------------------------- equality


def _compare_expr(a: Expr, b: Expr, map_free_vars: bool, prefix: str, track: bool) -> Optional[Mismatch]:
    amap: dict[Expr, Expr] = {}  # nodes hash by identity
    bmap: dict[Expr, Expr] = {}
    stack: list = [(a, b, None)]
    pop, push = stack.pop, stack.append

    def fail(x, y, reason, where):
        return Mismatch(x, y, reason, _render_path(where, prefix) if track else prefix)

    while stack:
        x, y, where = pop()
        mx = amap.get(x)
        if mx is not None:
            if mx is not y:
                return fail(x, y, "sharing differs: the left node is already matched to another right node", where)
            continue
        if y in bmap:
            return fail(x, y, "sharing differs: the right node is already matched to another left node", where)
        why = _local_diff(x, y)
        if why is not None:
            return fail(x, y, why, where)
        if isinstance(x, GlobalVar):  # globals compare by name, outside the bijection
            continue
        if isinstance(x, Var) and not map_free_vars and x is not y:
            return fail(x, y, f"free variables %{x.name_hint} and %{y.name_hint} are different objects "
                        "(pass map_free_vars=True to map free variables)", where)
        amap[x] = y
        bmap[y] = x
        if isinstance(x, Function):
            for i, (p, q) in enumerate(zip(x.params, y.params)):
                pwhere = (where, x, -i - 1) if track else None
                mp = amap.get(p)
                if mp is not None or q in bmap:
                    if mp is not q:
                        return fail(p, q, "a parameter is bound twice or used before its function", pwhere)
                    continue
                if p.type_annotation != q.type_annotation:
                    return fail(p, q, f"different annotations of parameter {i}: {p.type_annotation!r} and {q.type_annotation!r}", pwhere)
                amap[p] = q
                bmap[q] = p
        xs, ys = _operands(x), _operands(y)
        for i in range(len(xs) - 1, -1, -1):
            push((xs[i], ys[i], (where, x, i) if track else None))
    return None


def _compare(a, b, map_free_vars: bool, track: bool) -> Optional[Mismatch]:
    if isinstance(a, IRModule) or isinstance(b, IRModule):
        if not (isinstance(a, IRModule) and isinstance(b, IRModule)):
            return Mismatch(a, b, f"cannot compare {type(a).__name__} with {type(b).__name__}", "at the root")
        if set(a) != set(b):
            only_a = sorted(set(a) - set(b))
            only_b = sorted(set(b) - set(a))
            return Mismatch(a, b, f"different functions: only on the left {only_a}, only on the right {only_b}", "in the module")
        for name in a:
            m = _compare_expr(a[name], b[name], map_free_vars, f"in @{name}", track)
            if m is not None:
                return m
        return None
    if isinstance(a, Type) or isinstance(b, Type):
        return None if a == b else Mismatch(a, b, f"different types {a!r} and {b!r}", "at the root")
    if not isinstance(a, Expr) or not isinstance(b, Expr):
        return Mismatch(a, b, f"cannot compare {type(a).__name__} with {type(b).__name__}", "at the root")
    return _compare_expr(a, b, map_free_vars, "", track)


def structural_equal(a: Structural, b: Structural, map_free_vars: bool = False) -> bool:
    """True if ``a`` and ``b`` (Exprs, Functions, IRModules or Types) are equal up to
    renaming of bound variables, with the same sharing (see the module docstring)."""
    return _compare(a, b, map_free_vars, track=False) is None


def first_mismatch(a: Structural, b: Structural, map_free_vars: bool = False) -> Optional[Mismatch]:
    """The first differing node pair (pre-order, operands left to right), or None."""
    return _compare(a, b, map_free_vars, track=True)


_MAX_TEXT = 1500


def _show(node) -> str:
    """Text of ``node`` with the printer when it exists, else a short description."""
    text = to_text(node) if isinstance(node, (Expr, IRModule)) else None
    if text is None:
        text = describe_node(node)
    if len(text) > _MAX_TEXT:
        text = text[:_MAX_TEXT] + f"\n... ({len(text) - _MAX_TEXT} more characters)"
    return text


def describe_node(node) -> str:
    """A one-line description of ``node`` (no operands printed)."""
    if isinstance(node, Var):
        return f"%{node.name_hint}: {node.type_annotation!r}"
    if isinstance(node, Call):
        return f"{_op_label(node.op)}(<{len(node.args)} args>, attrs={node.attrs!r})"
    if isinstance(node, Constant):
        return f"constant {node.data.dtype}{node.data.shape} {np.array2string(node.data, threshold=20)}"
    if isinstance(node, GlobalVar):
        return "@" + node.name_hint
    if isinstance(node, TupleGetItem):
        return f"<tuple>.{node.index}"
    if isinstance(node, Tuple):
        return f"(<{len(node.fields)} fields>)"
    if isinstance(node, Function):
        return f"fn({', '.join('%' + p.name_hint for p in node.params)}) attrs={dict(node.attrs)!r}"
    return repr(node) if not isinstance(node, Expr) else type(node).__name__


def assert_structural_equal(a: Structural, b: Structural, map_free_vars: bool = False) -> None:
    """Raise ``AssertionError`` showing the first differing node pair and where it is."""
    m = first_mismatch(a, b, map_free_vars)
    if m is None:
        return
    raise AssertionError(
        f"structural mismatch {m.path}: {m.reason}\n"
        f"--- left:\n{_show(m.lhs)}\n"
        f"--- right:\n{_show(m.rhs)}"
    )


# ---------------------------------------------------------------- hashing


def _hash_attrs(attrs) -> int:
    """Consistent with ``_same_value``: attrs holding a NaN float hash by its bits (``attr_key``)."""
    try:
        fields = getattr(attrs, "__dict__", None)
        if fields and any(type(v) is float and v != v for v in fields.values()):
            return hash(attr_key(attrs))
        return hash(attrs)
    except TypeError:
        return hash(type(attrs).__name__)


def _local_token(x: Expr):
    """A hashable summary of ``x``'s local fields, consistent with ``_local_diff``."""
    if isinstance(x, Call):
        op = x.op
        callee = ("op", op.name, id(op)) if isinstance(op, Op) else ("gv", op.name_hint) if isinstance(op, GlobalVar) else ("fn",)
        return ("call", callee, len(x.args), _hash_attrs(x.attrs))
    if isinstance(x, Var):
        return ("var", x.type_annotation)
    if isinstance(x, Constant):
        d = x.data
        return ("const", d.dtype.str, d.shape, hash(d.tobytes()))
    if isinstance(x, Tuple):
        return ("tuple", len(x.fields))
    if isinstance(x, TupleGetItem):
        return ("getitem", x.index)
    if isinstance(x, If):
        return ("if",)
    if isinstance(x, Function):
        return ("fn", len(x.params), x.ret_type, _hash_attrs(x.attrs), tuple(p.type_annotation for p in x.params))
    return (type(x).__name__,)


def _hash_expr(root: Expr) -> int:
    """Pre-order token stream; a node seen before contributes its first-visit index,
    so the hash depends on sharing but not on names or object identities."""
    index: dict[Expr, int] = {}  # nodes hash by identity
    h = hash("pullback.expr")
    stack = [root]
    pop, push = stack.pop, stack.append
    while stack:
        x = pop()
        if isinstance(x, GlobalVar):
            h = hash((h, "gv", x.name_hint))
            continue
        k = index.get(x)
        if k is not None:
            h = hash((h, "ref", k))
            continue
        index[x] = len(index)
        h = hash((h, _local_token(x)))
        if isinstance(x, Function):
            for p in x.params:
                pk = index.get(p)
                if pk is None:
                    index[p] = len(index)
                else:
                    h = hash((h, "ref", pk))
        ops = _operands(x)
        for i in range(len(ops) - 1, -1, -1):
            push(ops[i])
    return h


def structural_hash(x: Structural) -> int:
    """A hash consistent with ``structural_equal`` (independent of variable names)."""
    if isinstance(x, IRModule):
        return hash(("pullback.module", tuple(sorted((name, _hash_expr(x[name])) for name in x))))
    if isinstance(x, Type):
        return hash(("pullback.type", x))
    if isinstance(x, Expr):
        return _hash_expr(x)
    raise TypeError(f"structural_hash: expected an Expr, Function, IRModule or Type, got {type(x).__name__}")


__all__ = ["describe_node", "structural_equal", "structural_hash", "assert_structural_equal", "first_mismatch", "Mismatch"]
