"""RecognizeOps: rewrite the decomposed formula of an operator back into the operator.

An importer sees what a model's Python computed. Hugging Face's ``gelu_new`` (``NewGELUActivation``:
GPT-2, GPT-Neo, T5 v1.1, ...) is ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` in eight
elementwise calls, which an op-by-op executor runs as eight passes over memory forward and about twenty
in the backward. The rule turns it into ``nn.gelu(x, approximate="tanh")``: one kernel forward and one
``nn.gelu_grad`` backward. Each commutative call may take its operands in either order, ``x^3`` may be
``power(x, 3)`` or ``x * x * x``, and each constant is matched to float32 precision (a scalar or any
tensor holding that one value); the match must have ``x``'s type. The frontend runs it on every imported
program (``frontend.import_exported``), before differentiation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ..ir.expr import Call, Expr
from ..ops.activation import gelu
from ..ops.registry import is_call_to
from ..pattern import is_op, wildcard
from .eliminate_identity import uniform_value
from .pass_infra import RewritePass

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _is_value(e: Expr, value: float) -> bool:
    u = uniform_value(e)
    return u is not None and abs(float(u) - value) <= 1e-6 * abs(value)


def _with_constant(e: Expr, name: str, value: float) -> Optional[Expr]:
    """``y`` when ``e`` is ``name(y, value)`` or ``name(value, y)``, else None."""
    if not is_call_to(e, name) or len(e.args) != 2:
        return None
    a, b = e.args
    return a if _is_value(b, value) else (b if _is_value(a, value) else None)


def _is_cube_of(e: Expr, x: Expr) -> bool:
    """``e`` is ``power(x, 3)`` or ``x * x * x`` (either grouping)."""
    if is_call_to(e, "power"):
        return e.args[0] is x and _is_value(e.args[1], 3.0)
    if not is_call_to(e, "multiply"):
        return False
    a, b = e.args
    square = b if a is x else (a if b is x else None)
    return is_call_to(square, "multiply") and square.args[0] is x and square.args[1] is x


def _tanh_gelu_input(node: Call) -> Optional[Expr]:
    """``x`` when ``node`` computes ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, else None."""
    for half, rest in (node.args, node.args[::-1]):
        x = _with_constant(half, "multiply", 0.5)
        t = _with_constant(rest, "add", 1.0) if x is not None else None  # rest = t + 1, t = tanh(...)
        s = _with_constant(t.args[0], "multiply", _SQRT_2_OVER_PI) if is_call_to(t, "tanh") else None
        inner = s if is_call_to(s, "add") else None
        if inner is None or not (inner.args[0] is x or inner.args[1] is x):
            continue
        cube = _with_constant(inner.args[1] if inner.args[0] is x else inner.args[0], "multiply", 0.044715)
        if cube is not None and _is_cube_of(cube, x):
            return x
    return None


def _tanh_gelu(node: Call, c: dict) -> Optional[Expr]:
    x = _tanh_gelu_input(node)
    if x is None or x._checked_type is None or x._checked_type != node._checked_type:
        return None
    return gelu(x, approximate="tanh")


def recognize_rules() -> list:
    """The rewrite table of RecognizeOps."""
    return [(is_op("multiply")(wildcard(), wildcard()), _tanh_gelu)]


@dataclass(frozen=True)
class RecognizeOps(RewritePass):
    """Decomposed formulas of operators back into the operators (the tanh form of GELU)."""

    name = "RecognizeOps"

    def rules(self) -> list:
        return recognize_rules()


__all__ = ["RecognizeOps", "recognize_rules"]
