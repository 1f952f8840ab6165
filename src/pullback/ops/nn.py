"""Neural-network operators (``pullback.op.nn.*``)."""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, Expr
from ..ir.types import TensorType
from . import elemwise as E
from . import transform as T
from .common import float_arg, numel, same_dtype, tensor_arg
from .registry import OpPattern, defop, type_error


def _relu_grad(call: Call, g: Expr):
    x = call.args[0]
    return [E.where(E.greater(x, E.scalar_like(0.0, x)), g, T.zeros_like(g))]


relu = defop(
    "nn.relu",
    1,
    lambda ts, attrs: float_arg("nn.relu", ts, 0),
    lambda x, attrs=None: np.maximum(x, np.zeros((), x.dtype)),
    grad=_relu_grad,
    pattern=OpPattern.ELEMWISE,
    torch_name="relu",
)


def _dense_infer(arg_types, attrs):
    x = tensor_arg("nn.dense", arg_types, 0)
    w = tensor_arg("nn.dense", arg_types, 1)
    same_dtype("nn.dense", arg_types)
    if x.ndim < 1 or w.ndim != 2:
        raise type_error("nn.dense", arg_types, "expects data of rank >= 1 and a weight of rank 2 (units, in_features)")
    k, kw = x.shape[-1], w.shape[1]
    if isinstance(k, int) and isinstance(kw, int) and k != kw:
        raise type_error("nn.dense", arg_types, f"in_features differ: data has {k}, weight has {kw}")
    return TensorType(x.shape[:-1] + (w.shape[0],), x.dtype)


def _dense_grad(call: Call, g: Expr):
    x, w = call.args
    xt = x.checked_type
    gx = dense(g, T.transpose(w, (1, 0)))
    if xt.ndim == 2:
        g2, x2 = g, x
    else:
        g2 = T.reshape(g, (-1, w.checked_type.shape[0]))
        x2 = T.reshape(x, (-1, xt.shape[-1]))
    gw = dense(T.transpose(g2, (1, 0)), T.transpose(x2, (1, 0)))
    return [gx, gw]


def _dense_flops(arg_types, out_type, attrs):
    return 2 * numel(out_type.shape) * (arg_types[0].shape[-1] if isinstance(arg_types[0].shape[-1], int) else 0)


dense = defop(
    "nn.dense",
    2,
    _dense_infer,
    lambda x, w, attrs=None: np.matmul(x, w.T),
    grad=_dense_grad,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    flops=_dense_flops,
    torch_name="linear",
)
