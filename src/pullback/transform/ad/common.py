"""Helpers shared by the AD modules: tuple-type paths, ones, sums, diagnostics.

A *path* is a tuple of field indices into a (nested) tuple type; ``()`` is the
value itself. Cotangents of tuple values are kept per tensor leaf path, so no
tuple of zeros is ever built just to add into it.

New nodes are typed lazily (``Expr.checked_type``); ``typed_as`` records a type
already known where inferring it would compare deep tuple types again.
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional

from ...ir.types import types_compatible  # noqa: F401 (re-exported for ad.rules)
from ...ir.errors import PullbackError, TypeInferenceError
from ...ir.expr import Call, Expr, Function, If, Tuple, TupleGetItem, Var, set_type
from ...ir.types import TensorType, TupleType, Type, is_inexact
from ...ops.registry import get_op

Path = tuple

_ones, _ones_like, _add = (get_op(n) for n in ("ones", "ones_like", "add"))


def typed_as(node: Expr, ty: Type) -> Expr:
    """``node`` given the type ``ty`` it is known to have (the If of a nested residual bundle:
    inferring it would compare both branches' whole type trees, quadratic in nesting depth)."""
    set_type(node, ty)
    return node


def type_leaves(ty: Type) -> Iterator[Type]:
    """The non-tuple types at the leaves of ``ty`` (``ty`` itself if it is not a tuple)."""
    stack = [ty]
    while stack:
        t = stack.pop()
        if isinstance(t, TupleType):
            stack.extend(t.fields)
        else:
            yield t


def _float_tensor(t: Type) -> bool:
    return isinstance(t, TensorType) and is_inexact(t.dtype)


def has_float_leaf(ty: Type) -> bool:
    """``ty`` is a float tensor or a tuple with at least one float tensor leaf."""
    return any(_float_tensor(t) for t in type_leaves(ty))


def all_float_leaves(ty: Type) -> bool:
    """``ty`` is a float tensor or a (nested) tuple whose leaves are all float tensors (at least one)."""
    seen = False
    for t in type_leaves(ty):
        if not _float_tensor(t):
            return False
        seen = True
    return seen


def static_type(ty: Type) -> bool:
    """Every leaf of ``ty`` is a tensor of static shape (zeros can be built without a value)."""
    return all(isinstance(t, TensorType) and t.is_static for t in type_leaves(ty))


def type_at(ty: Type, path: Path) -> Type:
    for i in path:
        ty = ty.fields[i]
    return ty


def leaf_paths(ty: Type) -> list[tuple[Path, TensorType]]:
    """``(path, tensor type)`` of every tensor leaf of ``ty``, left to right."""
    out = []
    stack = [((), ty)]
    while stack:
        path, t = stack.pop()
        if isinstance(t, TupleType):
            for i in range(len(t.fields) - 1, -1, -1):
                stack.append((path + (i,), t.fields[i]))
        else:
            out.append((path, t))
    return out


def get_item(value: Expr, index: int) -> Expr:
    """Field ``index`` of a tuple-valued expression (a Tuple's field directly), typed."""
    if isinstance(value, Tuple):
        return value.fields[index]
    return TupleGetItem(value, index)


def at_path(value: Expr, path: Path) -> Expr:
    for i in path:
        value = get_item(value, i)
    return value


def build_struct(ty: Type, leaf: Callable[[Path, TensorType], Expr], pack: Callable = Tuple) -> Expr:
    """The expression of type ``ty`` whose tensor leaves are ``leaf(path, type)``, called left to right
    (nested Tuples; ``pack=tuple`` builds a value of nested Python tuples)."""
    out: dict = {}
    stack = [((), ty, False)]
    while stack:
        path, t, done = stack.pop()
        if not isinstance(t, TupleType):
            out[path] = leaf(path, t)
        elif done:
            out[path] = pack([out.pop(path + (i,)) for i in range(len(t.fields))])
        else:
            stack.append((path, t, True))
            for i in range(len(t.fields) - 1, -1, -1):
                stack.append((path + (i,), t.fields[i], False))
    return out[()]


def ones(ty: TensorType, like: Optional[Expr]) -> Expr:
    """Ones of tensor type ``ty``: ``ones(shape, dtype)`` when static, ``ones_like(like)`` otherwise."""
    if ty.is_static:
        return _ones(ty.shape, ty.dtype)
    return _ones_like(like)


def sum_terms(terms: list) -> Expr:
    """One sum of every contribution (a left fold of ``add``), typed."""
    acc = terms[0]
    for t in terms[1:]:
        acc = Call(_add, (acc, t))
    return acc


def closure_like(node: Expr) -> bool:
    """A Function value in a body, or a call of a non-primitive Function: a closure."""
    if isinstance(node, Function):
        return True
    return isinstance(node, Call) and isinstance(node.op, Function) and not node.op.is_primitive


def binding(fn_name: str, fn: Optional[Function], node: Expr) -> str:
    """``in @main: %7 = nn.foo(%5, %6)`` (printer text when available)."""
    text = None
    if fn is not None:
        try:
            from ...text.printer import binding_text

            text = binding_text(fn, node)
        except (ImportError, PullbackError):
            text = None
    if text is None:
        text = _short(node)
    span = f" (at {node.span})" if getattr(node, "span", None) else ""
    return f"in @{fn_name}: {text}{span}"


def _short(node: Expr) -> str:
    if isinstance(node, Call):
        return f"{node.op_name}(...)"
    if isinstance(node, Var):
        return f"%{node.name_hint}"
    if isinstance(node, Function):
        return f"fn ({', '.join('%' + p.name_hint for p in node.params)}) {{ ... }}"
    if isinstance(node, If):
        return "if (...) { ... } else { ... }"
    return type(node).__name__


def rule_type_error(op_name: str, index: int, want: Type, got: Type, where: str) -> TypeInferenceError:
    return TypeInferenceError(
        f"the gradient rule of {op_name} returned a value of type {got!r} for argument {index} of type {want!r} {where}"
    )
