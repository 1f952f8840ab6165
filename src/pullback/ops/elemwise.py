"""Elementwise operators: unary math, broadcasting binaries, comparisons, where."""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, Expr, as_expr
from ..ir.types import TensorType, is_float
from . import transform as T
from .common import broadcast_shapes, float_arg, same_dtype, tensor_arg
from .registry import OpPattern, defop, type_error

# ------------------------------------------------------------------ helpers


def scalar_like(value: float, like: Expr) -> Expr:
    """A rank-0 constant with the dtype of ``like`` (whose type must be known)."""
    return as_expr(value, like)


def unbroadcast(grad: Expr, arg: Expr) -> Expr:
    """Sum ``grad`` back to the shape of ``arg`` (a no-op that SimplifyExpr removes when shapes match)."""
    return T.collapse_sum_like(grad, arg)


# ------------------------------------------------------------------ unary


def _infer_unary_float(name):
    def infer(arg_types, attrs):
        return float_arg(name, arg_types, 0)

    return infer


def _infer_unary_any(name):
    def infer(arg_types, attrs):
        return tensor_arg(name, arg_types, 0)

    return infer


def unary(name: str, fn, grad=None, *, float_only: bool = True, flops_per_elem: int = 1, **kw):
    """Define an elementwise unary operator from a NumPy function."""

    def compute(x, attrs=None):
        return np.asarray(fn(x), dtype=x.dtype)

    def flops(arg_types, out_type, attrs):
        from .common import numel

        return flops_per_elem * numel(out_type.shape)

    infer = _infer_unary_float(name) if float_only else _infer_unary_any(name)
    return defop(name, 1, infer, compute, grad=grad, pattern=OpPattern.ELEMWISE, flops=flops, **kw)


negative = unary("negative", np.negative, lambda c, g: [negative(g)], float_only=False, torch_name="neg")
exp = unary("exp", np.exp, lambda c, g: [multiply(g, c)], torch_name="exp")
log = unary("log", np.log, lambda c, g: [divide(g, c.args[0])], torch_name="log")


def _tanh_grad(call: Call, g: Expr):
    one = scalar_like(1.0, call)
    return [multiply(g, subtract(one, multiply(call, call)))]


tanh = unary("tanh", np.tanh, _tanh_grad, flops_per_elem=4, torch_name="tanh")

# ------------------------------------------------------------------ binary


def _infer_binary(name, out_dtype=None):
    def infer(arg_types, attrs):
        a = tensor_arg(name, arg_types, 0)
        b = tensor_arg(name, arg_types, 1)
        dtype = same_dtype(name, arg_types)
        return TensorType(broadcast_shapes(name, arg_types, a.shape, b.shape), out_dtype or dtype)

    return infer


def binary(name: str, fn, grad=None, *, out_dtype=None, **kw):
    """Define a broadcasting binary operator from a NumPy ufunc."""

    def compute(a, b, attrs=None):
        out = fn(a, b)
        return np.asarray(out, dtype=out_dtype or a.dtype)

    pattern = kw.pop("pattern", OpPattern.BROADCAST)
    return defop(name, 2, _infer_binary(name, out_dtype), compute, grad=grad, pattern=pattern, **kw)


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


def _divide_compute(a, b, attrs=None):
    if np.issubdtype(a.dtype, np.integer):
        return np.asarray(np.floor_divide(a, b), dtype=a.dtype)
    return np.asarray(np.divide(a, b), dtype=a.dtype)


divide = defop("divide", 2, _infer_binary("divide"), _divide_compute, grad=_divide_grad, pattern=OpPattern.BROADCAST, torch_name="div")

_NO_GRAD_BOOL = "the result is boolean: it carries no gradient"
greater = binary("greater", np.greater, out_dtype="bool", differentiable=False, nondiff_reason=_NO_GRAD_BOOL, torch_name="gt")


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


where = defop(
    "where",
    3,
    _infer_where,
    lambda c, x, y, attrs=None: np.where(c, x, y).astype(x.dtype, copy=False),
    grad=_where_grad,
    pattern=OpPattern.BROADCAST,
    torch_name="where",
)


def is_float_expr(e: Expr) -> bool:
    t = e.checked_type
    return isinstance(t, TensorType) and is_float(t.dtype)
