"""More elementwise math: inverse trigonometric and hyperbolic functions, ``expm1``, ``log10``, ``trunc``,
``atan2``, and the remainders ``mod`` (truncated: Relay's ``mod``, ``torch.fmod``) and ``remainder`` (floored:
``torch.remainder``), one kernel each for every array namespace.

Gradient conventions follow PyTorch: ``trunc`` has a zero gradient; ``remainder(a, b)`` passes ``g`` to
``a`` and ``-g * floor(a / b)`` to ``b``, ``mod`` the same with ``trunc``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir.expr import Call, Expr, as_expr
from ..ir.types import DTYPES, FLOAT_DTYPES, HALF_DTYPES, TensorType, is_float, numpy_dtype
from . import layout as T
from .common import broadcast_shapes, float_arg, numel, same_dtype, tensor_arg
from .elemwise import _checked_division, binary, unbroadcast
from .kernels import accumulated, numpy_quiet
from .nn import check_float
from .registry import FusionKind, Recompute, defop, get_op

def _op(name: str):
    return get_op(name)


def _c(value: float, like: Expr) -> Expr:
    return as_expr(value, like)


def _per_elem(k: int):
    def flops(arg_types, out_type, attrs):
        return k * numel(out_type.shape)

    return flops


def _float_unary_infer(name: str):
    def infer(arg_types, attrs):
        return float_arg(name, arg_types, 0)

    return infer


def float_unary(name: str, fn_name: str, grad, flops_per_elem: int = 1, domain=None, **kw):
    """An elementwise float operator computed by ``xp.<fn_name>``; ``grad(x, out, g)`` gives d/dx; ``domain``
    the open interval of its input (see ``OpDef``)."""

    def kernel(xp, x, attrs=None):
        return getattr(xp, fn_name)(x)

    def rule(call: Call, g: Expr):
        return [grad(call.args[0], call, g)]

    return defop(name, 1, _float_unary_infer(name), kernel=kernel, grad=rule, pattern=FusionKind.ELEMWISE,
                 flops=_per_elem(flops_per_elem), torch_name=kw.pop("torch_name", name), dtypes=FLOAT_DTYPES,
                 elementwise=True, domain=(domain,) if domain else (), **kw)


def _mul(*xs: Expr) -> Expr:
    out = xs[0]
    for x in xs[1:]:
        out = _op("multiply")(out, x)
    return out


def _div(a: Expr, b: Expr) -> Expr:
    return _op("divide")(a, b)


def _one_minus_sq(x: Expr) -> Expr:
    return _op("subtract")(_c(1.0, x), _mul(x, x))


_UNIT = (-1.0, 1.0)
acos = float_unary("acos", "acos", lambda x, y, g: _op("negative")(_div(g, _op("sqrt")(_one_minus_sq(x)))), 4, _UNIT, recompute=Recompute.SPECIAL)
asin = float_unary("asin", "asin", lambda x, y, g: _div(g, _op("sqrt")(_one_minus_sq(x))), 4, _UNIT, recompute=Recompute.SPECIAL)
atan = float_unary("atan", "atan", lambda x, y, g: _div(g, _op("add")(_c(1.0, x), _mul(x, x))), 4)
sinh = float_unary("sinh", "sinh", lambda x, y, g: _mul(g, _op("cosh")(x)), 4)
cosh = float_unary("cosh", "cosh", lambda x, y, g: _mul(g, _op("sinh")(x)), 4)
asinh = float_unary("asinh", "asinh", lambda x, y, g: _div(g, _op("sqrt")(_op("add")(_mul(x, x), _c(1.0, x)))), 4,
                    recompute=Recompute.SPECIAL)
acosh = float_unary("acosh", "acosh", lambda x, y, g: _div(
    g, _op("sqrt")(_mul(_op("subtract")(x, _c(1.0, x)), _op("add")(x, _c(1.0, x))))), 4, (1.0, math.inf), recompute=Recompute.SPECIAL)
atanh = float_unary("atanh", "atanh", lambda x, y, g: _div(g, _one_minus_sq(x)), 4, _UNIT, recompute=Recompute.SPECIAL)
expm1 = float_unary("expm1", "expm1", lambda x, y, g: _mul(g, _op("add")(y, _c(1.0, y))), 2,
                    doc="``exp(x) - 1``, exact for small ``x``.")
log10 = float_unary("log10", "log10", lambda x, y, g: _div(g, scaled(x, math.log(10.0))), 2, (0.0, math.inf), recompute=Recompute.SPECIAL)


trunc = float_unary("trunc", "trunc", lambda x, y, g: T.zeros_like(g), smooth=False, doc="Round toward zero; zero gradient.")


# ------------------------------------------------------------------ binary


def _binary_infer(name: str, float_only: bool):
    def infer(arg_types, attrs):
        a = float_arg(name, arg_types, 0) if float_only else tensor_arg(name, arg_types, 0)
        b = float_arg(name, arg_types, 1) if float_only else tensor_arg(name, arg_types, 1)
        return TensorType(broadcast_shapes(name, arg_types, a.shape, b.shape), same_dtype(name, arg_types))

    return infer


def _unbroadcast(g: Expr, arg: Expr):
    return T.collapse_sum_like(g, arg) if is_float(arg.checked_type.dtype) else None


def _atan2_grad(call: Call, g: Expr):
    y, x = call.args
    r2 = _op("add")(_mul(x, x), _mul(y, y))
    return [_unbroadcast(_div(_mul(g, x), r2), y), _unbroadcast(_op("negative")(_div(_mul(g, y), r2)), x)]


atan2 = defop("atan2", 2, _binary_infer("atan2", True), kernel=lambda xp, y, x, attrs=None: xp.atan2(y, x),
              grad=_atan2_grad, pattern=FusionKind.BROADCAST, flops=_per_elem(4), torch_name="atan2",
              dtypes=FLOAT_DTYPES, elementwise=True, domain=(None, (0.0, math.inf)),  # x > 0: off the branch cut
              doc="``atan2(y, x)``: the angle of the point ``(x, y)``, in [-pi, pi].")

def _remainder_grad(quotient: str):
    """``a - b * q(a / b)``: ``g`` to ``a`` and ``-g * q(a / b)`` to ``b`` (PyTorch's rule; ``q`` is piecewise
    constant, so its jumps contribute nothing)."""

    def grad(call: Call, g: Expr):
        a, b = call.args
        return [unbroadcast(g, a), unbroadcast(_op("negative")(_mul(g, _op(quotient)(_div(a, b)))), b)]

    return grad


_DIVISOR = (None, (0.0, math.inf))  # the divisor kept away from 0 (like divide's; negative ones work too)
_NUMERIC = tuple(d for d in DTYPES if d != "bool")
mod = binary("mod", _remainder_grad("trunc"), kernel=_checked_division("mod", "fmod"), ufunc=np.fmod, dtypes=_NUMERIC, domain=_DIVISOR, smooth=False,
             flops=_per_elem(2), recompute=Recompute.SPECIAL, torch_name="fmod", doc="``a - b * trunc(a / b)``: the truncated remainder, with the sign of the dividend "
             "(Relay's ``mod``, C's ``fmod``, ``torch.fmod``).")
remainder = binary("remainder", _remainder_grad("floor"), kernel=_checked_division("remainder", "remainder"),
                   ufunc=np.remainder, dtypes=_NUMERIC, domain=_DIVISOR, smooth=False,
                   flops=_per_elem(2), recompute=Recompute.SPECIAL,
                   torch_name="remainder", doc="``a - b * floor(a / b)``: the floored remainder, with the sign of the "
                   "divisor (Python's ``%``, ``torch.remainder``, Relay's ``floor_mod``).")


# ------------------------------------------------------------------ by a Python number, as PyTorch computes it


@dataclass(frozen=True)
class ScalarAttrs:
    value: float

    def __post_init__(self):
        check_float(self, "value")


def _by_scalar(fn: str):
    """``x <fn> value`` computed in float32 for a float16/bfloat16 ``x`` and rounded once; in x's dtype for the
    others (the number rounded to it first, like a constant)."""

    def kernel(xp, x, attrs):
        w = accumulated(xp, x)
        return xp.asarray(getattr(xp, fn)(w, xp.asarray(attrs.value, dtype=w.dtype)), dtype=x.dtype)

    return kernel


def _scalar_op(name: str, fn: str, aten: str):
    def on_torch(x, attrs):
        return getattr(x, aten)(attrs.value)  # a wrapped number: ATen's reduced-float kernel keeps it in float32

    def grad(call: Call, g: Expr):  # linear in x: PyTorch's MulBackward0/DivBackward0 of a number, rounded once
        return [_op(name)(g, value=call.attrs.value)]

    verb = {"multiply": "times", "divide": "over"}[fn]
    return defop(name, 1, _float_unary_infer(name), kernel=_by_scalar(fn), attrs_type=ScalarAttrs,
                 impls={"torch": on_torch, "numpy": numpy_quiet(_by_scalar(fn))}, grad=grad,
                 pattern=FusionKind.ELEMWISE, flops=_per_elem(1), dtypes=FLOAT_DTYPES, elementwise=True,
                 example_attrs={"value": 0.7071067811865476}, torch_name=aten,
                 doc=f"``x`` {verb} the Python number ``value`` as PyTorch computes ``x.{aten}(value)``: in float32 for "
                     f"float16 and bfloat16 ``x`` (``value`` unrounded, the result rounded once), in x's dtype otherwise.")


multiply_scalar = _scalar_op("multiply_scalar", "multiply", "mul")
divide_scalar = _scalar_op("divide_scalar", "divide", "div")


def scaled(x: Expr, value: float, divide: bool = False) -> Expr:
    """``x * value`` (``x / value`` when ``divide``) for a Python number ``value``, rounded as PyTorch rounds it:
    ``multiply_scalar``/``divide_scalar`` where x is float16/bfloat16 and ``value`` is not one of its values (the
    product is then computed in float32), else the plain operator with a constant of x's dtype."""
    dtype = x.checked_type.dtype
    if dtype in HALF_DTYPES and float(np.asarray(value, dtype=numpy_dtype(dtype))) != value and math.isfinite(value):
        return (divide_scalar if divide else multiply_scalar)(x, value=float(value))
    return _op("divide" if divide else "multiply")(x, _c(value, x))


__all__ = ["acos", "asin", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "expm1", "log10", "trunc", "atan2",
           "mod", "remainder", "multiply_scalar", "divide_scalar", "scaled"]
