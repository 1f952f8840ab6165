"""Scaled dot-product attention as one operator: ``nn.attention(q, k, v, scale, is_causal)`` gives
``softmax(q k^T * scale) v`` (the lower triangle kept when ``is_causal``, as PyTorch's) and each row's
log-sum-exp, over (B, H, L, E) queries and (B, H, S, E) keys and values.

One kernel for every namespace (the definition, in float32 for float16/bfloat16 inputs, the log-sum-exp then
float32); on torch (CPU) ATen's flash attention, the kernel eager's ``scaled_dot_product_attention`` runs, so
its output is eager's bit for bit. The gradient is written in pullback operators from q, k, v, the output and
the log-sum-exp: the probabilities are recomputed (one GEMM), as flash attention's backward does, so a training
step keeps no (L, S) matrix between its forward and backward, and second derivatives work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.expr import Call, Expr, TupleGetItem, const
from ..ir.types import FLOAT_DTYPES, HALF_DTYPES, Any, TensorType, TupleType
from . import elemwise as E
from . import layout as T
from . import reduce as R
from .common import same_dtype, tensor_arg
from .kernels import accumulated, dtype, dtype_name, numpy_quiet
from .linalg import batch_matmul
from .nn import check_bool, check_float, field, nonzero, scalar
from .registry import array_namespace, defop, type_error


@dataclass(frozen=True)
class AttentionAttrs:
    scale: float = 1.0
    is_causal: bool = False

    def __post_init__(self):
        check_float(self, "scale")
        check_bool(self, "is_causal")


def lse_dtype(dt: str) -> str:
    """The log-sum-exp's dtype: float32 for float16/bfloat16 attention (ATen's), the inputs' otherwise."""
    return "float32" if dt in HALF_DTYPES else dt


def _differ(a, b) -> bool:
    return a is not Any and b is not Any and a != b


def _infer(arg_types, attrs):
    name = "nn.attention"
    q, k, v = (tensor_arg(name, arg_types, i) for i in range(3))
    dt = same_dtype(name, arg_types)
    if dt not in FLOAT_DTYPES:
        raise type_error(name, arg_types, f"expects floating-point tensors, got {dt}")
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise type_error(name, arg_types, "expects (B, H, L, E) queries and (B, H, S, E) keys and values")
    if any(_differ(a, b) for a, b in zip(q.shape[:2] + (q.shape[3],), k.shape[:2] + (k.shape[3],))) or \
            any(_differ(a, b) for a, b in zip(k.shape, v.shape)):
        raise type_error(name, arg_types, f"shapes {q.shape}, {k.shape}, {v.shape} are not (B, H, L, E), (B, H, S, E), "
                                          "(B, H, S, E)")
    return TupleType([TensorType(q.shape, dt), TensorType(q.shape[:3], lse_dtype(dt))])


def _causal(length: int, keys: int) -> np.ndarray:
    return np.tril(np.ones((length, keys), dtype=bool))


def _kernel(xp, q, k, v, a):
    wq, wk, wv = (accumulated(xp, t) for t in (q, k, v))
    s = xp.matmul(wq, xp.permute_dims(wk, (0, 1, 3, 2))) * a.scale
    if a.is_causal:
        s = xp.where(xp.asarray(_causal(*s.shape[-2:])), s, -np.inf)
    m = xp.max(s, axis=-1, keepdims=True)
    e = xp.exp(s - m)
    z = xp.sum(e, axis=-1, keepdims=True)
    out = xp.matmul(e / z, wv)
    lse = (m + xp.log(z))[..., 0]
    return xp.asarray(out, dtype=q.dtype), xp.asarray(lse, dtype=dtype(xp, lse_dtype(dtype_name(q))))


def _torch(q, k, v, a):
    """ATen's CPU flash attention (eager's kernel); the shared kernel elsewhere (another device, a dtype ATen's
    CPU kernel lacks)."""
    import torch

    if q.device.type == "cpu":
        try:
            return tuple(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, a.is_causal, attn_mask=None, scale=a.scale))
        except RuntimeError:
            pass
    return _kernel(array_namespace("torch"), q, k, v, a)


def _grad(call: Call, g: Expr):
    """``dS = P * (g v^T - rowsum(g * out) + g_lse)``, ``P = exp(S - lse)`` recomputed from q and k; ``dq = dS k
    scale``, ``dk = dS^T q scale``, ``dv = P^T g``; in float32 for float16/bfloat16."""
    q, k, v = call.args
    a = call.attrs
    go, glse = nonzero(field(g, 0)), nonzero(field(g, 1))
    if go is None and glse is None:
        return [None, None, None]
    length = q.checked_type.shape[2]
    keys = k.checked_type.shape[2]
    wide = q.checked_type.dtype in HALF_DTYPES

    def rows(x, n):  # (B, H, n, E) -> (B*H, n, E), in float32 for half floats
        x = T.reshape(x, (-1, n, x.checked_type.shape[-1]))
        return T.cast(x, "float32") if wide else x

    q3, k3, v3 = rows(q, length), rows(k, keys), rows(v, keys)
    s = E.multiply(batch_matmul(q3, k3, transpose_b=True), scalar(a.scale, q3))
    if a.is_causal:
        s = E.where(const(_causal(length, keys)), s, scalar(-np.inf, s))
    lse = T.reshape(TupleGetItem(call, 1), (-1, length, 1))
    p = E.exp(E.subtract(s, lse))
    inner = dv = None
    if go is not None:
        g3, o3 = rows(go, length), rows(TupleGetItem(call, 0), length)
        dv = batch_matmul(p, g3, transpose_a=True, transpose_b=False)
        delta = R.sum(E.multiply(g3, o3), (-1,), True)
        inner = E.subtract(batch_matmul(g3, v3, transpose_b=True), delta)
    if glse is not None:
        gl = T.reshape(glse, (-1, length, 1))
        inner = gl if inner is None else E.add(inner, gl)
    ds = E.multiply(p, inner)
    dq = E.multiply(batch_matmul(ds, k3, transpose_b=False), scalar(a.scale, ds))
    dk = E.multiply(batch_matmul(ds, q3, transpose_a=True, transpose_b=False), scalar(a.scale, ds))

    def back(d, like):
        return T.reshape_like(T.cast(d, like.checked_type.dtype) if wide else d, like)

    return [back(dq, q), back(dk, k), None if dv is None else back(dv, v)]


def _flops(arg_types, out_type, attrs):
    b, h, length, e = (1 if d is Any else d for d in arg_types[0].shape)
    return 4 * b * h * length * (1 if arg_types[1].shape[2] is Any else arg_types[1].shape[2]) * e


attention = defop("nn.attention", 3, _infer, kernel=_kernel, impls={"numpy": numpy_quiet(_kernel), "torch": _torch},
                  attrs_type=AttentionAttrs, grad=_grad, flops=_flops, dtypes=FLOAT_DTYPES,
                  example_attrs={"scale": 0.35}, torch_name="_scaled_dot_product_flash_attention_for_cpu",
                  doc="``(softmax(q k^T * scale) v, logsumexp)`` over (B, H, L, E) q and (B, H, S, E) k, v; ``is_causal`` "
                      "keeps the lower triangle (``scaled_dot_product_attention`` without a mask or dropout).")

__all__ = ["attention", "AttentionAttrs", "lse_dtype"]
