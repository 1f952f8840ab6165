"""Elementwise operators: unary math, broadcasting binaries, comparisons, where.

Gradient conventions (as in PyTorch): piecewise-constant ops (sign, floor, ceil,
round) have a zero gradient; ``abs`` uses ``sign(x)`` (0 at 0); ``clip`` passes
the gradient where ``a_min <= x <= a_max``; ``maximum``/``minimum`` split the
gradient evenly between the two inputs where they tie; ``power`` gives the
exponent a zero gradient where the base is not positive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir.errors import AttrError
from ..ir.expr import Call, Expr, as_expr
from ..ir.types import TensorType, is_float
from . import layout as T
from .common import broadcast_shapes, float_arg, numel, same_dtype, tensor_arg
from . import special
from .registry import FusionKind, defop, type_error

# ------------------------------------------------------------------ helpers


def scalar_like(value: float, like: Expr) -> Expr:
    """A rank-0 constant with the dtype of ``like`` (whose type must be known)."""
    return as_expr(value, like)


def unbroadcast(grad: Expr, arg: Expr) -> Expr:
    """Sum ``grad`` back to the shape of ``arg`` (a no-op that SimplifyExpr removes when shapes match)."""
    return T.collapse_sum_like(grad, arg)


def is_float_expr(e: Expr) -> bool:
    t = e.checked_type
    return isinstance(t, TensorType) and is_float(t.dtype)


def _flops_per_elem(k: int):
    def flops(arg_types, out_type, attrs):
        return k * numel(out_type.shape)

    return flops


def _float_grads(rule):
    """Wrap a gradient rule so integer/bool arguments get None."""

    def grad(call: Call, g: Expr):
        return [r if r is not None and is_float_expr(a) else None for r, a in zip(rule(call, g), call.args)]

    return grad


# ------------------------------------------------------------------ unary

def _unary_infer(name: str, kind: str, out_dtype):
    def infer(arg_types, attrs):
        t = float_arg(name, arg_types, 0) if kind == "float" else tensor_arg(name, arg_types, 0)
        if kind == "bool" and t.dtype != "bool":
            raise type_error(name, arg_types, f"argument 0 must be a bool tensor, got {t.dtype}")
        return TensorType(t.shape, out_dtype) if out_dtype else t

    return infer


def unary(name: str, fn, grad=None, *, float_only: bool = True, kind: str = "", out_dtype=None,
          flops_per_elem: int = 1, attrs_type=None, **kw):
    """Define an elementwise unary operator from a NumPy function ``fn(x)`` (or ``fn(x, attrs)``)."""
    kind = kind or ("float" if float_only else "any")

    def compute(x, attrs=None):
        out = fn(x) if attrs_type is None else fn(x, attrs)
        return np.asarray(out).astype(out_dtype or x.dtype, copy=False)

    if grad is not None and kind != "float":
        grad = _float_grads(grad)
    return defop(name, 1, _unary_infer(name, kind, out_dtype), compute, grad=grad, attrs_type=attrs_type,
                 pattern=kw.pop("pattern", FusionKind.ELEMWISE), flops=_flops_per_elem(flops_per_elem), **kw)


def _zero_grad(c: Call, g: Expr):
    return [T.zeros_like(g)]


_erf = special.erf


_NO_GRAD_BOOL = "the result is boolean: it carries no gradient"
_LN2 = math.log(2.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _cl(v, c):  # a scalar constant with the dtype of call/arg ``c``
    return scalar_like(v, c)


negative = unary("negative", np.negative, lambda c, g: [negative(g)], float_only=False, torch_name="neg")
abs = unary("abs", np.abs, lambda c, g: [multiply(g, sign(c.args[0]))], float_only=False, torch_name="abs")  # noqa: A001
sign = unary("sign", np.sign, _zero_grad, float_only=False, torch_name="sign")
exp = unary("exp", np.exp, lambda c, g: [multiply(g, c)], torch_name="exp")
log = unary("log", np.log, lambda c, g: [divide(g, c.args[0])], torch_name="log")
log2 = unary("log2", np.log2, lambda c, g: [divide(g, multiply(c.args[0], _cl(_LN2, c)))], torch_name="log2")
log1p = unary("log1p", np.log1p, lambda c, g: [divide(g, add(c.args[0], _cl(1.0, c)))], torch_name="log1p")
sqrt = unary("sqrt", np.sqrt, lambda c, g: [divide(multiply(g, _cl(0.5, c)), c)], torch_name="sqrt")
rsqrt = unary("rsqrt", lambda x: 1 / np.sqrt(x),
              lambda c, g: [multiply(g, multiply(_cl(-0.5, c), multiply(c, multiply(c, c))))], flops_per_elem=2,
              torch_name="rsqrt")
square = unary("square", np.square, lambda c, g: [multiply(g, multiply(c.args[0], _cl(2.0, c)))], float_only=False,
               torch_name="square")
reciprocal = unary("reciprocal", np.reciprocal, lambda c, g: [negative(multiply(g, multiply(c, c)))],
                   torch_name="reciprocal")
sin = unary("sin", np.sin, lambda c, g: [multiply(g, cos(c.args[0]))], torch_name="sin")
cos = unary("cos", np.cos, lambda c, g: [negative(multiply(g, sin(c.args[0])))], torch_name="cos")
tan = unary("tan", np.tan, lambda c, g: [multiply(g, add(_cl(1.0, c), multiply(c, c)))], torch_name="tan")
tanh = unary("tanh", np.tanh, lambda c, g: [multiply(g, subtract(_cl(1.0, c), multiply(c, c)))], flops_per_elem=4,
             torch_name="tanh")


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x))))


sigmoid = unary("sigmoid", _sigmoid, lambda c, g: [multiply(g, multiply(c, subtract(_cl(1.0, c), c)))],
                flops_per_elem=4, torch_name="sigmoid")
erf = unary("erf", _erf, lambda c, g: [multiply(g, multiply(_cl(_TWO_OVER_SQRT_PI, c),
                                                                exp(negative(square(c.args[0])))))],
            flops_per_elem=8, torch_name="erf")
floor = unary("floor", np.floor, _zero_grad, torch_name="floor")
ceil = unary("ceil", np.ceil, _zero_grad, torch_name="ceil")
round = unary("round", np.round, _zero_grad, torch_name="round", doc="Round half to even (NumPy/PyTorch); zero gradient.")  # noqa: A001
copy = unary("copy", np.copy, lambda c, g: [g], float_only=False, flops_per_elem=0, torch_name="clone")
logical_not = unary("logical_not", np.logical_not, kind="bool", differentiable=False, nondiff_reason=_NO_GRAD_BOOL,
                    torch_name="logical_not")
isnan = unary("isnan", np.isnan, out_dtype="bool", differentiable=False, nondiff_reason=_NO_GRAD_BOOL, torch_name="isnan")
isfinite = unary("isfinite", np.isfinite, out_dtype="bool", differentiable=False, nondiff_reason=_NO_GRAD_BOOL,
                 torch_name="isfinite")


@dataclass(frozen=True)
class ClipAttrs:
    a_min: float
    a_max: float

    def __post_init__(self):
        for f in ("a_min", "a_max"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise AttrError(f"attribute {f} must be a number, got {v!r}")
            object.__setattr__(self, f, float(v))
        if self.a_min > self.a_max:
            raise AttrError(f"attribute a_min ({self.a_min}) must not exceed attribute a_max ({self.a_max})")


def _clip_grad(c: Call, g: Expr):
    x = c.args[0]
    inside = logical_and(greater_equal(x, _cl(c.attrs.a_min, x)), less_equal(x, _cl(c.attrs.a_max, x)))
    return [where(inside, g, T.zeros_like(g))]


clip = unary("clip", lambda x, a: np.clip(x, a.a_min, a.a_max), _clip_grad, float_only=False, attrs_type=ClipAttrs,
             flops_per_elem=2, torch_name="clamp",
             doc="Clamp to [a_min, a_max]; the gradient passes where a_min <= x <= a_max (PyTorch's rule).")

# ------------------------------------------------------------------ binary


def _infer_binary(name, out_dtype=None, need_bool=False):
    def infer(arg_types, attrs):
        a = tensor_arg(name, arg_types, 0)
        b = tensor_arg(name, arg_types, 1)
        dtype = same_dtype(name, arg_types)
        if need_bool and dtype != "bool":
            raise type_error(name, arg_types, f"arguments must be bool tensors, got {dtype}")
        return TensorType(broadcast_shapes(name, arg_types, a.shape, b.shape), out_dtype or dtype)

    return infer


def binary(name: str, fn, grad=None, *, out_dtype=None, need_bool=False, **kw):
    """Define a broadcasting binary operator from a NumPy ufunc (integer/bool args get no gradient)."""

    def compute(a, b, attrs=None):
        with np.errstate(divide="ignore", invalid="ignore"):
            out = fn(a, b)
        return np.asarray(out).astype(out_dtype or a.dtype, copy=False)

    pattern = kw.pop("pattern", FusionKind.BROADCAST)
    return defop(name, 2, _infer_binary(name, out_dtype, need_bool), compute,
                 grad=_float_grads(grad) if grad is not None else None, pattern=pattern, **kw)


add = binary("add", np.add, lambda c, g: [unbroadcast(g, c.args[0]), unbroadcast(g, c.args[1])], torch_name="add")
subtract = binary(
    "subtract", np.subtract, lambda c, g: [unbroadcast(g, c.args[0]), unbroadcast(negative(g), c.args[1])], torch_name="sub"
)
multiply = binary(
    "multiply",
    np.multiply,
    lambda c, g: [unbroadcast(multiply(g, c.args[1]), c.args[0]), unbroadcast(multiply(g, c.args[0]), c.args[1])],
    torch_name="mul",
)


def _divide_grad(call: Call, g: Expr):
    a, b = call.args
    ga = divide(g, b)
    return [unbroadcast(ga, a), unbroadcast(negative(multiply(ga, call)), b)]


def _divide_np(a, b):
    return np.floor_divide(a, b) if np.issubdtype(a.dtype, np.integer) else np.divide(a, b)


divide = binary("divide", _divide_np, _divide_grad, torch_name="div",
                doc="a / b; integer division floors (like floor_divide).")


def _power_grad(call: Call, g: Expr):
    a, b = call.args
    ga = multiply(g, multiply(b, power(a, subtract(b, _cl(1.0, b)))))
    pos = greater(a, _cl(0.0, a))
    safe_a = where(pos, a, T.ones_like(a))  # log(1) = 0: no exponent gradient where a <= 0
    gb = multiply(g, multiply(call, log(safe_a)))
    return [unbroadcast(ga, a), unbroadcast(gb, b)]


power = binary("power", np.power, _power_grad, flops=_flops_per_elem(4), torch_name="pow",
               doc="a ** b; the exponent gets a zero gradient where a <= 0.")


def _minmax_grad(pick):
    def grad(call: Call, g: Expr):
        a, b = call.args
        wins = where(pick(a, b), _cl(1.0, a), where(equal(a, b), _cl(0.5, a), _cl(0.0, a)))
        return [unbroadcast(multiply(g, wins), a), unbroadcast(multiply(g, subtract(_cl(1.0, a), wins)), b)]

    return grad


maximum = binary("maximum", np.maximum, _minmax_grad(lambda a, b: greater(a, b)), torch_name="maximum",
                 doc="Elementwise max; ties split the gradient evenly (PyTorch's rule).")
minimum = binary("minimum", np.minimum, _minmax_grad(lambda a, b: less(a, b)), torch_name="minimum",
                 doc="Elementwise min; ties split the gradient evenly (PyTorch's rule).")

_NO_GRAD_STEP = "piecewise constant in its inputs; the gradient is zero or undefined"
floor_divide = binary("floor_divide", np.floor_divide, differentiable=False, nondiff_reason=_NO_GRAD_STEP,
                      torch_name="floor_divide")
mod = binary("mod", np.fmod, differentiable=False, nondiff_reason=_NO_GRAD_STEP, torch_name="fmod",
             doc="Truncated remainder (sign of the dividend), like Relay's mod and torch.fmod.")

_CMP = {"equal": (np.equal, "eq"), "not_equal": (np.not_equal, "ne"), "less": (np.less, "lt"),
        "less_equal": (np.less_equal, "le"), "greater": (np.greater, "gt"), "greater_equal": (np.greater_equal, "ge")}
for _name, (_fn, _tn) in _CMP.items():
    globals()[_name] = binary(_name, _fn, out_dtype="bool", differentiable=False, nondiff_reason=_NO_GRAD_BOOL,
                              torch_name=_tn)
equal, not_equal, less, less_equal, greater, greater_equal = (globals()[n] for n in _CMP)
logical_and = binary("logical_and", np.logical_and, need_bool=True, differentiable=False, nondiff_reason=_NO_GRAD_BOOL,
                     torch_name="logical_and")
logical_or = binary("logical_or", np.logical_or, need_bool=True, differentiable=False, nondiff_reason=_NO_GRAD_BOOL,
                    torch_name="logical_or")

# ------------------------------------------------------------------ where


def _infer_where(arg_types, attrs):
    c = tensor_arg("where", arg_types, 0)
    x = tensor_arg("where", arg_types, 1)
    y = tensor_arg("where", arg_types, 2)
    if c.dtype != "bool":
        raise type_error("where", arg_types, f"the condition must be bool, got {c.dtype}")
    if x.dtype != y.dtype:
        raise type_error("where", arg_types, f"branches have different dtypes {x.dtype} and {y.dtype}")
    return TensorType(broadcast_shapes("where", arg_types, c.shape, x.shape, y.shape), x.dtype)


def _where_grad(call: Call, g: Expr):
    c, x, y = call.args
    zero = T.zeros_like(g)
    return [None, unbroadcast(where(c, g, zero), x), unbroadcast(where(c, zero, g), y)]


_UINT_OF = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _bits_zero(a) -> bool:
    """True when every element of float array ``a`` is +0.0 (bit pattern 0; the first element is checked first)."""
    bits = a.view(_UINT_OF[a.dtype.itemsize])
    return bits.size > 0 and not bits.flat[0] and not bits.any()


def select_or_zero(cond: np.ndarray, value: np.ndarray, out=None) -> np.ndarray:
    """``np.where(cond, value, +0.0)`` for a float ``value`` as a bitwise AND (same bits, NaN/inf included).

    ``cond`` (bool) and ``value`` must broadcast to ``out``'s shape when ``out`` is given, else to ``cond``'s."""
    ut = _UINT_OF[value.dtype.itemsize]
    mask = cond.astype(ut)
    np.negative(mask, out=mask)  # all ones where cond
    if out is None:
        return np.bitwise_and(value.view(ut), mask, out=mask).view(value.dtype)
    np.bitwise_and(value.view(ut), mask, out=out.view(ut))
    return out


def _where_compute(c, x, y, attrs=None):
    """``np.where``; where one branch is +0.0 everywhere (a relu/clip/where gradient), a bitwise AND with the
    condition as a mask: the same bits as ``np.where`` (NaN and inf included), an order of magnitude faster."""
    if (type(x) is np.ndarray and type(y) is np.ndarray and type(c) is np.ndarray and x.dtype == y.dtype
            and x.dtype.kind == "f" and x.dtype.itemsize in _UINT_OF and c.dtype == np.bool_):
        keep, zero_on_false = (x, True) if _bits_zero(y) else (y, False) if _bits_zero(x) else (None, None)
        shape = np.broadcast_shapes(c.shape, x.shape, y.shape)
        if keep is not None and np.broadcast_shapes(c.shape, keep.shape) == shape:
            ut = _UINT_OF[x.dtype.itemsize]
            mask = c.astype(ut)  # 1 / 0
            if zero_on_false:
                np.negative(mask, out=mask)  # all ones where c
            else:
                np.subtract(mask, ut(1), out=mask)  # all ones where not c
            if mask.shape == shape:
                return np.bitwise_and(keep.view(ut), mask, out=mask).view(x.dtype)
            return np.bitwise_and(keep.view(ut), mask).view(x.dtype)
    return np.asarray(np.where(c, x, y)).astype(x.dtype, copy=False)


where = defop(
    "where",
    3,
    _infer_where,
    _where_compute,
    grad=lambda c, g: [r if r is None or is_float_expr(a) else None for r, a in zip(_where_grad(c, g), c.args)],
    pattern=FusionKind.BROADCAST,
    torch_name="where",
)

