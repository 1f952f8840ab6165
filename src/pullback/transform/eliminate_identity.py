"""EliminateIdentity: ``x + 0``, ``0 + x``, ``x - 0``, ``x * 1``, ``1 * x``, ``x / 1``, ``x ** 1`` become ``x``; so do
``x & True``, ``x | False`` (bitwise or logical) of booleans.

A zero or one is a uniform tensor: ``zeros``/``ones``/``full`` with a constant
fill, ``zeros_like``/``ones_like``/``full_like``, or a Constant whose every
element is that value. The rewrite fires only when ``x`` already has the
result type, and never when broadcasting against the other operand could
change the shape at run time (an ``Any`` dimension the other operand does not
hold as 1, unless the other operand is ``zeros_like(x)``-style of ``x`` itself).
When the identity only broadcasts ``x`` to a static result shape of the same
dtype (``x(3,) * ones((2, 3))``), it becomes ``broadcast_to(x, (2, 3))``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..ir.expr import Call, Constant, Expr
from ..ir.types import Any, TensorType
from ..ops.registry import OpDef
from ..ops.layout import broadcast_to
from ..pattern import is_op, wildcard
from .pass_infra import RewritePass

_FILL_FROM_ATTRS = {"zeros": 0, "ones": 1, "zeros_like": 0, "ones_like": 1}
_FILL_ARG = {"full": 0, "full_like": 1}
_LIKE_OF = ("zeros_like", "ones_like", "full_like")


def uniform_value(e: Expr) -> Optional[np.ndarray]:
    """The single value every element of ``e`` holds, as a 0-d array of ``e``'s dtype, when evident."""
    t = e._checked_type
    if not isinstance(t, TensorType):
        return None
    if isinstance(e, Constant):
        d = e.data
        if d.size <= 1:
            return d.reshape(()) if d.size else None
        first = d.reshape(-1)[0]
        return np.asarray(first) if np.all(d == first) else None
    if isinstance(e, Call) and isinstance(e.op, OpDef):
        name = e.op.name
        if name in _FILL_FROM_ATTRS:
            return _fill(_FILL_FROM_ATTRS[name], t.dtype)
        if name in _FILL_ARG:
            fill = e.args[_FILL_ARG[name]]
            if isinstance(fill, Constant) and fill.data.ndim == 0:
                return np.asarray(fill.data.astype(t.dtype))
    return None


@functools.lru_cache(maxsize=None)
def _fill(value: int, dtype: str) -> np.ndarray:
    """``value`` as a read-only 0-d array of ``dtype`` (made once per pair)."""
    a = np.asarray(value, dtype=dtype)
    a.flags.writeable = False
    return a


def _is_value(v) -> Callable[[Expr], bool]:
    def pred(e: Expr) -> bool:
        u = uniform_value(e)
        return u is not None and u.item() == v and (u.dtype == np.bool_) == isinstance(v, bool)

    return pred


def keeps_type(x: Expr, other: Expr, out: Expr) -> bool:
    """``x`` has the type of ``out`` = ``op(x, other)``, and broadcasting ``other`` cannot change it."""
    xt, ot, rt = x._checked_type, other._checked_type, out._checked_type
    if not (isinstance(xt, TensorType) and isinstance(ot, TensorType) and isinstance(rt, TensorType)):
        return False
    if xt != rt or ot.ndim > xt.ndim:
        return False
    if isinstance(other, Call) and isinstance(other.op, OpDef) and other.op.name in _LIKE_OF and other.args[0] is x:
        return True
    for od, xd in zip(ot.shape[::-1], xt.shape[::-1]):
        if od != 1 and (od is Any or xd is Any):
            return False
    return True


# (operator, position of x, identity value): x op k == x, or k op x == x; a bool value: on booleans only (for
# integers x & 1 is not x); an all-True mask and-ed with a causal mask (Hugging Face's mask functions) is the mask
IDENTITIES: tuple = (("add", 0, 0), ("add", 1, 0), ("subtract", 0, 0), ("multiply", 0, 1), ("multiply", 1, 1), ("divide", 0, 1),
                     ("power", 0, 1), *((name, pos, value) for name, value in (("bitwise_and", True), ("logical_and", True),
                                                                               ("bitwise_or", False), ("logical_or", False))
                                        for pos in (0, 1)))


def _identity_rule(op_name: str, pos: int, value):
    x = wildcard().named("x")
    k = wildcard().where(_is_value(value)).named("k")
    pattern = is_op(op_name)(*((x, k) if pos == 0 else (k, x)))

    def callback(node: Expr, c: dict) -> Optional[Expr]:
        x = c["x"]
        if isinstance(value, bool) and getattr(node._checked_type, "dtype", None) != "bool":
            return None
        if keeps_type(x, c["k"], node):
            return x
        xt, rt = x._checked_type, node._checked_type
        if isinstance(xt, TensorType) and isinstance(rt, TensorType) and rt.is_static and xt.dtype == rt.dtype:
            return broadcast_to(x, rt.shape)  # the identity only broadcasts x: say so
        return None

    return pattern, callback


def identity_rules() -> list:
    """The rewrite table of EliminateIdentity (one rule per ``IDENTITIES`` entry)."""
    return [_identity_rule(*entry) for entry in IDENTITIES]


@dataclass(frozen=True)
class EliminateIdentity(RewritePass):
    """Remove ``x + 0``, ``0 + x``, ``x - 0``, ``x * 1``, ``1 * x``, ``x / 1``, ``x ** 1``, and ``x & True``,
    ``x | False`` of booleans, where ``x`` has the result type."""

    name = "EliminateIdentity"

    def rules(self) -> list:
        return identity_rules()


__all__ = ["EliminateIdentity", "IDENTITIES", "identity_rules", "keeps_type", "uniform_value"]
