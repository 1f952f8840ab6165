"""More elementwise math: inverse trigonometric and hyperbolic functions, ``expm1``, ``log10``, ``trunc``,
``atan2`` and ``remainder`` (floor or truncated), one kernel each for every array namespace.

Gradient conventions follow PyTorch: ``trunc`` has a zero gradient; ``remainder(a, b)`` passes ``g`` to
``a`` and ``-g * floor(a / b)`` (``trunc`` for ``mode="trunc"``, i.e. ``fmod``) to ``b``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.errors import AttrError
from ..ir.expr import Call, Expr, as_expr
from ..ir.types import TensorType, is_float
from . import layout as T
from .common import broadcast_shapes, float_arg, numel, same_dtype, tensor_arg
from .kernels import check_divisor
from .registry import FusionKind, Recompute, defop, get_op

_NO_GRAD_STEP = "piecewise constant in its input: the gradient is zero"


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


def float_unary(name: str, fn_name: str, grad, flops_per_elem: int = 1, **kw):
    """An elementwise float operator computed by ``xp.<fn_name>``; ``grad(x, out, g)`` gives d/dx."""

    def kernel(xp, x, attrs=None):
        return getattr(xp, fn_name)(x)

    def rule(call: Call, g: Expr):
        return [grad(call.args[0], call, g)]

    return defop(name, 1, _float_unary_infer(name), kernel=kernel, grad=rule, pattern=FusionKind.ELEMWISE,
                 flops=_per_elem(flops_per_elem), torch_name=kw.pop("torch_name", name), **kw)


def _mul(*xs: Expr) -> Expr:
    out = xs[0]
    for x in xs[1:]:
        out = _op("multiply")(out, x)
    return out


def _div(a: Expr, b: Expr) -> Expr:
    return _op("divide")(a, b)


def _one_minus_sq(x: Expr) -> Expr:
    return _op("subtract")(_c(1.0, x), _mul(x, x))


acos = float_unary("acos", "acos", lambda x, y, g: _op("negative")(_div(g, _op("sqrt")(_one_minus_sq(x)))), 4, recompute=Recompute.SPECIAL)
asin = float_unary("asin", "asin", lambda x, y, g: _div(g, _op("sqrt")(_one_minus_sq(x))), 4, recompute=Recompute.SPECIAL)
atan = float_unary("atan", "atan", lambda x, y, g: _div(g, _op("add")(_c(1.0, x), _mul(x, x))), 4)
sinh = float_unary("sinh", "sinh", lambda x, y, g: _mul(g, _op("cosh")(x)), 4)
cosh = float_unary("cosh", "cosh", lambda x, y, g: _mul(g, _op("sinh")(x)), 4)
asinh = float_unary("asinh", "asinh", lambda x, y, g: _div(g, _op("sqrt")(_op("add")(_mul(x, x), _c(1.0, x)))), 4,
                    recompute=Recompute.SPECIAL)
acosh = float_unary("acosh", "acosh", lambda x, y, g: _div(
    g, _op("sqrt")(_mul(_op("subtract")(x, _c(1.0, x)), _op("add")(x, _c(1.0, x))))), 4, recompute=Recompute.SPECIAL)
atanh = float_unary("atanh", "atanh", lambda x, y, g: _div(g, _one_minus_sq(x)), 4, recompute=Recompute.SPECIAL)
expm1 = float_unary("expm1", "expm1", lambda x, y, g: _mul(g, _op("add")(y, _c(1.0, y))), 2,
                    doc="``exp(x) - 1``, exact for small ``x``.")
log10 = float_unary("log10", "log10", lambda x, y, g: _div(g, _mul(x, _c(math.log(10.0), x))), 2, recompute=Recompute.SPECIAL)


trunc = float_unary("trunc", "trunc", lambda x, y, g: T.zeros_like(g), doc="Round toward zero; zero gradient.")


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
              doc="``atan2(y, x)``: the angle of the point ``(x, y)``, in [-pi, pi].")

REMAINDER_MODES = ("floor", "trunc")


@dataclass(frozen=True)
class RemainderAttrs:
    """``floor``: the sign of the divisor (Python's ``%``, ``torch.remainder``); ``trunc``: the sign of the
    dividend (C's ``fmod``, ``torch.fmod``)."""

    mode: str = "floor"

    def __post_init__(self):
        if self.mode not in REMAINDER_MODES:
            raise AttrError(f"attribute mode must be one of {', '.join(REMAINDER_MODES)}, got {self.mode!r}")


def _remainder_kernel(xp, a, b, attrs):
    check_divisor(xp, "remainder", b)  # integers: an error on every target (PyTorch's rule)
    return xp.remainder(a, b) if attrs.mode == "floor" else xp.fmod(a, b)


def _remainder_grad(call: Call, g: Expr):
    a, b = call.args
    if not is_float(a.checked_type.dtype):
        return [None, None]
    q = _op("floor" if call.attrs.mode == "floor" else "trunc")(_div(a, b))
    return [_unbroadcast(g, a), _unbroadcast(_op("negative")(_mul(g, q)), b)]


remainder = defop("remainder", 2, _binary_infer("remainder", False), kernel=_remainder_kernel, attrs_type=RemainderAttrs,
                  grad=_remainder_grad, pattern=FusionKind.BROADCAST, flops=_per_elem(2), torch_name="remainder",
                  doc="``a - b * floor(a / b)`` (``mode='floor'``) or ``a - b * trunc(a / b)`` (``mode='trunc'``).",
                  recompute=Recompute.SPECIAL)

__all__ = ["acos", "asin", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "expm1", "log10", "trunc", "atan2",
           "remainder", "RemainderAttrs"]
