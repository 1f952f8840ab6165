"""Test-only operators (not registered), each one kernel written against the array namespace ``xp``.

They run on every target, so the evaluator skeleton (If, calls, recursion,
input checks, profiles) is tested on every target whatever kernels the
registered operators have.
"""

from __future__ import annotations

from pullback import Call, TensorType
from pullback.ops.registry import OpDef


def _same(arg_types, attrs):
    return arg_types[0]


def _boolean(arg_types, attrs):
    return TensorType(arg_types[0].shape, "bool")


NEG = OpDef("xp.negative", 1, _same, kernel=lambda xp, x, attrs=None: xp.negative(x))
ADD = OpDef("xp.add", 2, _same, kernel=lambda xp, a, b, attrs=None: xp.add(a, b))
SUB = OpDef("xp.subtract", 2, _same, kernel=lambda xp, a, b, attrs=None: xp.subtract(a, b))
MUL = OpDef("xp.multiply", 2, _same, kernel=lambda xp, a, b, attrs=None: xp.multiply(a, b))
GREATER = OpDef("xp.greater", 2, _boolean, kernel=lambda xp, a, b, attrs=None: xp.greater(a, b))


def neg(x):
    return Call(NEG, [x])


def add(a, b):
    return Call(ADD, [a, b])


def sub(a, b):
    return Call(SUB, [a, b])


def mul(a, b):
    return Call(MUL, [a, b])


def greater(a, b):
    return Call(GREATER, [a, b])


def counting(calls: list) -> OpDef:
    """A negation that appends to ``calls`` each time its kernel runs."""

    def kernel(xp, x, attrs=None):
        calls.append(1)
        return xp.negative(x)

    return OpDef("xp.counted", 1, _same, kernel=kernel)
