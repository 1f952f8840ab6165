"""Scaled dot-product attention as one operator: ``nn.attention(q, k, v[, bias], scale, is_causal)`` gives
``softmax(q k^T * scale + bias) v`` (the lower triangle kept when ``is_causal``, as PyTorch's) and each row's
log-sum-exp, over (B, H, L, E) queries and (B, Hkv, S, E) keys and values. ``Hkv`` divides ``H``: query head ``h``
reads key/value head ``h // (H / Hkv)`` (grouped-query attention, PyTorch's ``enable_gqa``), and the keys' and
values' gradients add up over the heads sharing them before rounding, as ATen's kernel does. The optional bias is
a float mask (``-inf`` where a key is masked) of rank 4 that broadcasts to (B, H, L, S), in the queries' dtype or
float32, as ATen's kernel takes it; a row masked everywhere gives 0 and a log-sum-exp of 0 (ATen's). A row that a
huge finite fill (the dtype's least value) covers whole is spread over its keys, as eager's softmax spreads it, and
so are its gradients (``LOST_ROW_LSE``: ATen's flash backward, eager's own sdpa, gets them wrong).

One kernel for every namespace (the definition, in float32 for float16/bfloat16 inputs, the log-sum-exp then
float32); on torch (CPU) ATen's flash attention, the kernel eager's ``scaled_dot_product_attention`` runs, so
its output is eager's bit for bit. Its gradient is ``nn.attention_grad`` (ATen's flash backward on torch) from
q, k, v, the output and the log-sum-exp: the probabilities are recomputed, so a training step keeps no (L, S)
matrix between its forward and backward. ``nn.attention_grad``'s own gradient is written in pullback
operators, so second derivatives work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

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
from .shape import repeat


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


def _parts(rest: tuple) -> tuple:
    """``(bias or None, attrs)`` from a kernel's operands after q, k and v."""
    return (rest[0] if len(rest) == 2 else None), rest[-1]


def _check_bias(name: str, arg_types, i: int, q: TensorType, k: TensorType) -> None:
    bias = tensor_arg(name, arg_types, i)
    if bias.dtype not in (q.dtype, "float32"):
        raise type_error(name, arg_types, f"expects a bias in the queries' dtype {q.dtype} or float32, got {bias.dtype}")
    heads, length, keys = q.shape[1], q.shape[2], k.shape[2]
    if heads is Any:
        raise type_error(name, arg_types, "with a bias, expects a static number of heads")
    full = (q.shape[0], heads, length, keys)
    if bias.ndim != 4 or any(d != 1 and _differ(d, f) for d, f in zip(bias.shape, full)):
        raise type_error(name, arg_types, f"bias of shape {bias.shape} does not broadcast to (B, H, L, S) = {full}")


def _infer(arg_types, attrs):
    name = "nn.attention"
    if len(arg_types) not in (3, 4):
        raise type_error(name, arg_types, f"expects q, k, v and an optional bias, got {len(arg_types)} operands")
    q, k, v = (tensor_arg(name, arg_types, i) for i in range(3))
    dt = same_dtype(name, arg_types)
    if dt not in FLOAT_DTYPES:
        raise type_error(name, arg_types, f"expects floating-point tensors, got {dt}")
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise type_error(name, arg_types, "expects (B, H, L, E) queries and (B, Hkv, S, E) keys and values")
    heads, kv_heads = q.shape[1], k.shape[1]
    grouped = _differ(heads, kv_heads) and Any not in (heads, kv_heads) and heads % kv_heads == 0
    if any(_differ(a, b) for a, b in zip((q.shape[0], q.shape[3]), (k.shape[0], k.shape[3]))) or \
            _differ(heads, kv_heads) and not grouped or any(_differ(a, b) for a, b in zip(k.shape, v.shape)):
        raise type_error(name, arg_types, f"shapes {q.shape}, {k.shape}, {v.shape} are not (B, H, L, E), (B, Hkv, S, E), "
                                          "(B, Hkv, S, E) with Hkv dividing H")
    if len(arg_types) == 4:
        _check_bias(name, arg_types, 3, q, k)
    return TupleType([TensorType(q.shape, dt), TensorType(q.shape[:3], lse_dtype(dt))])


def _causal(length: int, keys: int) -> np.ndarray:
    return np.tril(np.ones((length, keys), dtype=bool))


def _shared(xp, x, heads: int):
    """Keys or values with each head repeated to the queries' ``heads`` (grouped-query attention)."""
    return x if x.shape[1] == heads else xp.repeat(x, heads // x.shape[1], axis=1)


def _folded(xp, d, kv_heads: int):
    """A (B, H, S, E) gradient summed over the query heads that share each key/value head."""
    if d.shape[1] == kv_heads:
        return d
    b, h = d.shape[:2]
    return xp.sum(xp.reshape(d, (b, kv_heads, h // kv_heads) + tuple(d.shape[2:])), axis=2)


def _scores(xp, q, k, bias, a):
    """``q k^T * scale + bias``, -inf above the diagonal when causal."""
    s = xp.matmul(q, xp.permute_dims(k, (0, 1, 3, 2))) * a.scale
    if bias is not None:
        s = s + xp.astype(bias, s.dtype)
    return xp.where(xp.asarray(_causal(*s.shape[-2:])), s, -np.inf) if a.is_causal else s


def _kernel(xp, q, k, v, *rest):
    bias, a = _parts(rest)
    wq, wk, wv = (_shared(xp, accumulated(xp, t), q.shape[1]) for t in (q, k, v))
    s = _scores(xp, wq, wk, bias, a)
    m = xp.max(s, axis=-1, keepdims=True)
    if bias is not None:  # a row masked everywhere: its exponentials 0, its output 0, its log-sum-exp 0 (ATen's)
        m = xp.where(xp.isinf(m), 0.0, m)
    e = xp.exp(s - m)
    z = xp.sum(e, axis=-1, keepdims=True)
    if bias is None:
        out, lse = xp.matmul(e / z, wv), m + xp.log(z)
    else:
        live = z != 0  # a NaN row keeps its NaN log-sum-exp, as ATen's
        z = xp.where(live, z, 1.0)
        out, lse = xp.matmul(e / z, wv), xp.where(live, m + xp.log(z), 0.0)
    return xp.asarray(out, dtype=q.dtype), xp.asarray(lse[..., 0], dtype=dtype(xp, lse_dtype(dtype_name(q))))


def _unit_rows(*ts) -> list:
    """Each tensor with its last axis contiguous (stride 1), copied where it is not: ATen's CPU flash attention
    kernels read rows of queries, keys, values and gradients as contiguous memory whatever the strides say
    (eager's ``scaled_dot_product_attention`` copies such operands before calling them); a transposed
    ``(..., E, L)`` layout gave wrong outputs, silently."""
    return [t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous() for t in ts]


def _torch(q, k, v, *rest):
    """ATen's CPU flash attention (eager's kernel); the shared kernel elsewhere (another device, a dtype ATen's
    CPU kernel lacks)."""
    import torch

    bias, a = _parts(rest)
    if q.device.type == "cpu":
        try:
            return tuple(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                *_unit_rows(q, k, v), 0.0, a.is_causal, attn_mask=bias, scale=a.scale))
        except RuntimeError:
            pass
    return _kernel(array_namespace("torch"), q, k, v, *rest)


class _Heads:
    """Expressions over (B*H, n, E) rows (in float32 for float16/bfloat16) for the gradient rules: the probabilities
    ``P = exp(q k^T * scale - lse)`` recomputed, products and the way back to (B, H, n, E)."""

    def __init__(self, q: Expr, k: Expr, lse: Expr, a: AttentionAttrs, bias: Optional[Expr] = None):
        self.heads, self.length, self.keys = q.checked_type.shape[1], q.checked_type.shape[2], k.checked_type.shape[2]
        self.wide = q.checked_type.dtype in HALF_DTYPES
        self.a = a
        self.q, self.k = self.rows(q), self.rows(self.shared(k))
        s = self.scaled(batch_matmul(self.q, self.k, transpose_b=True))
        if bias is not None:
            if bias.checked_type.dtype != s.checked_type.dtype:
                bias = T.cast(bias, s.checked_type.dtype)
            s = T.reshape(E.add(self.full(s), bias), (-1, self.length, self.keys))
        if a.is_causal:
            s = E.where(const(_causal(self.length, self.keys)), s, scalar(-np.inf, s))
        lse = T.reshape(lse, (-1, self.length, 1))
        self.p = E.exp(E.subtract(s, T.cast(lse, s.checked_type.dtype) if lse.checked_type.dtype != s.checked_type.dtype else lse))

    def shared(self, x: Expr) -> Expr:
        """Keys or values with their heads repeated to the queries' (grouped-query attention)."""
        kv = x.checked_type.shape[1]
        return x if kv == self.heads else repeat(x, self.heads // kv, 1)

    def rows(self, x: Expr) -> Expr:
        x = T.reshape(x, (-1,) + tuple(x.checked_type.shape[2:]))
        return T.cast(x, "float32") if self.wide else x

    def scaled(self, x: Expr) -> Expr:
        return E.multiply(x, scalar(self.a.scale, x))

    def mm(self, x: Expr, y: Expr, ta: bool = False, tb: bool = False) -> Expr:
        return batch_matmul(x, y, transpose_a=ta, transpose_b=tb)

    def back(self, d: Expr, like: Expr) -> Expr:
        """(B*H, n, E) rows back to ``like``'s shape and dtype, summed over the heads sharing a key/value head."""
        kv = like.checked_type.shape[1]
        if kv != self.heads:
            d = R.sum(T.reshape(d, (-1, kv, self.heads // kv) + tuple(d.checked_type.shape[1:])), (2,))
        return T.reshape_like(T.cast(d, like.checked_type.dtype) if self.wide else d, like)

    def full(self, scores: Expr) -> Expr:
        """(B*H, L, S) rows as (B, H, L, S)."""
        return T.reshape(scores, (-1, self.heads, self.length, self.keys))

    def to_bias(self, ds: Expr, bias: Expr) -> Expr:
        """A cotangent of the (B*H, L, S) scores summed to the bias's shape, in its dtype."""
        d = T.collapse_sum_like(self.full(ds), bias)
        return T.cast(d, bias.checked_type.dtype) if d.checked_type.dtype != bias.checked_type.dtype else d

    def row_sum(self, x: Expr) -> Expr:
        return R.sum(x, (-1,), True)

    def centred(self, g3: Expr, v3: Expr, o3: Expr) -> Expr:
        """``g v^T - rowsum(g * out)`` over rows: the scores' cotangent is ``P`` times it."""
        return E.subtract(self.mm(g3, v3, tb=True), self.row_sum(E.multiply(g3, o3)))


def _grad(call: Call, g: Expr, wanted: Optional[tuple] = None):
    """``nn.attention_grad`` for the output's cotangent, and a bias's as the scores' cotangent ``dS`` summed to
    its shape; a log-sum-exp cotangent (second derivatives only) adds ``dS = P * g_lse``, ``dq = dS k scale``,
    ``dk = dS^T q scale``. Where AD wants the bias's gradient (``wanted``: a learnt bias, Swin's and LeViT's
    relative positions), ``dS`` gives the others too, ``dq = dS k scale``, ``dk = dS^T q scale``, ``dv = P^T g``
    (eager's math backward): flash attention's backward would recompute ``P`` and ``g v^T`` a second time (Swin-T's
    step spent 16 ms in flash attention and 20 more batched GEMMs for the bias)."""
    q, k, v = call.args[:3]
    bias = call.args[3] if len(call.args) == 4 else None
    a = call.attrs
    out, lse = TupleGetItem(call, 0), TupleGetItem(call, 1)
    go, glse = nonzero(field(g, 0)), nonzero(field(g, 1))
    grads = [None] * len(call.args)
    bias_wanted = bias is not None and (wanted is None or wanted[3])
    # (the bias's gradient and the log-sum-exp's need the probabilities as rows of static lengths; a mask's gradient
    # AD does not want does not: attention under a padded batch's mask over dynamic lengths)
    h = _Heads(q, k, lse, a, bias) if glse is not None or bias_wanted else None
    if go is not None and bias is not None and wanted is not None and wanted[3]:
        g3 = h.rows(go)
        ds = E.multiply(h.p, h.centred(g3, h.rows(h.shared(v)), h.rows(out)))
        grads[:4] = [h.back(h.scaled(h.mm(ds, h.k)), q), h.back(h.scaled(h.mm(ds, h.q, ta=True)), k),
                     h.back(h.mm(h.p, g3, ta=True), v), h.to_bias(ds, bias)]
    elif go is not None:
        d = attention_grad(go, q, k, v, out, lse, *call.args[3:], scale=a.scale, is_causal=a.is_causal)
        grads[:3] = [TupleGetItem(d, i) for i in range(3)]
        if bias_wanted:
            grads[3] = h.to_bias(E.multiply(h.p, h.centred(h.rows(go), h.rows(h.shared(v)), h.rows(out))), bias)
    if glse is not None:
        ds = E.multiply(h.p, T.reshape(T.cast(glse, "float32") if h.wide else glse, (-1, h.length, 1)))
        extra = {0: h.back(h.scaled(h.mm(ds, h.k)), q), 1: h.back(h.scaled(h.mm(ds, h.q, ta=True)), k)}
        if bias is not None:
            extra[3] = h.to_bias(ds, bias)
        for i, e in extra.items():
            grads[i] = e if grads[i] is None else E.add(grads[i], e)
    return grads


# ------------------------------------------------------------------ attention_grad


def _grad_infer(arg_types, attrs):
    name = "nn.attention_grad"
    if len(arg_types) not in (6, 7):
        raise type_error(name, arg_types, f"expects (out_grad, q, k, v, out, lse) and an optional bias, got "
                                          f"{len(arg_types)} operands")
    g, q, k, v, out, lse = (tensor_arg(name, arg_types, i) for i in range(6))
    _infer([q, k, v] + list(arg_types[6:]), attrs)
    if g.shape != q.shape or out.shape != q.shape or g.dtype != q.dtype or out.dtype != q.dtype or \
            lse.shape != q.shape[:3] or lse.dtype not in (lse_dtype(q.dtype), q.dtype):
        raise type_error(name, arg_types, "expects (out_grad, q, k, v, out, lse) of nn.attention's types")
    return TupleType([q, k, v])


# A row whose log-sum-exp lies under this is masked from end to end by a huge finite fill (the dtype's least value,
# -1e9: Hugging Face's eager masks over a left-padded batch). Eager's softmax spreads such a row over its keys; but
# the sum's logarithm is lost in the log-sum-exp's rounding, and ``exp(s - lse)`` would make every probability 1.
LOST_ROW_LSE = -1e4


def _lost_rows(xp, lse):
    """The (B, H, L) rows whose finite log-sum-exp lies under ``LOST_ROW_LSE``."""
    return (lse < LOST_ROW_LSE) & xp.isfinite(lse)


def _none_lost(xp, lse) -> bool:
    """Whether no row is lost (``_lost_rows``); False when that is known only when the program runs (jax.jit)."""
    try:
        return not bool(xp.any(_lost_rows(xp, lse)))
    except Exception:  # noqa: BLE001 - a traced array cannot be read now
        return False


def _probabilities(xp, s, lse, bias):
    """``exp(s - lse)``, the softmax of the scores ``s`` again in lost rows (``_lost_rows``)."""
    p = xp.exp(s - xp.astype(lse, s.dtype)[..., None])
    if bias is None or _none_lost(xp, lse):
        return p
    e = xp.exp(s - xp.max(s, axis=-1, keepdims=True))  # (NaN in a row masked everywhere by -inf: not lost)
    return xp.where(_lost_rows(xp, lse)[..., None], e / xp.sum(e, axis=-1, keepdims=True), p)


def _grad_kernel(xp, g, q, k, v, out, lse, *rest):
    """dq, dk, dv from the recomputed probabilities (flash attention's backward)."""
    bias, a = _parts(rest)
    wg, wq, wk, wv, wo = (_shared(xp, accumulated(xp, t), q.shape[1]) for t in (g, q, k, v, out))
    p = _probabilities(xp, _scores(xp, wq, wk, bias, a), lse, bias)
    dv = xp.matmul(xp.permute_dims(p, (0, 1, 3, 2)), wg)
    dp = xp.matmul(wg, xp.permute_dims(wv, (0, 1, 3, 2)))
    ds = p * (dp - xp.sum(wg * wo, axis=-1, keepdims=True))
    dq = xp.matmul(ds, wk) * a.scale
    dk = xp.matmul(xp.permute_dims(ds, (0, 1, 3, 2)), wq) * a.scale
    dk, dv = _folded(xp, dk, k.shape[1]), _folded(xp, dv, k.shape[1])
    return tuple(xp.asarray(d, dtype=q.dtype) for d in (dq, dk, dv))


def _grad_torch(g, q, k, v, out, lse, *rest):
    """ATen's CPU flash attention backward (eager's kernel); the shared kernel elsewhere. Lost rows
    (``_lost_rows``: a left-padded query under a mask of the dtype's least value) leave it with no cotangent, and
    their own gradients come from their scores again (``_lost_row_grads``)."""
    import torch

    bias, a = _parts(rest)
    lost = None if bias is None or not lse.numel() or float(lse.min()) >= LOST_ROW_LSE else _lost_rows(torch, lse)
    lost = lost if lost is not None and bool(lost.any()) else None
    # (in half precision, lost rows take the shared kernel: its gradients, accumulated in float32, are rounded once)
    if q.device.type == "cpu" and (lost is None or q.dtype not in (torch.float16, torch.bfloat16)):
        try:
            dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                *_unit_rows(g if lost is None else g.masked_fill(lost[..., None], 0), q, k, v, out), lse, 0.0,
                a.is_causal, attn_mask=bias, scale=a.scale)
        except RuntimeError:
            pass
        else:
            if lost is not None:
                _lost_row_grads(g, q, k, v, out, bias, a, lost, dq, dk, dv)
            return dq, dk, dv
    return _grad_kernel(array_namespace("torch"), g, q, k, v, out, lse, *rest)


def _lost_row_grads(g, q, k, v, out, bias, a, lost, dq, dk, dv) -> None:
    """The lost rows' (``lost``: (B, H, L)) gradients written into ``dq`` and added into ``dk``, ``dv``, from their
    probabilities as eager's softmax gives them (torch tensors of float32 or float64): one sample at a time, over
    the query positions lost in any head (a padded prefix), the other heads' rows given no cotangent."""
    import torch

    xp = array_namespace("torch")
    full_bias = bias.expand(*q.shape[:3], k.shape[2])
    for n in lost.any(2).any(1).nonzero()[:, 0].tolist():
        rows = lost[n].any(0).nonzero()[:, 0]
        sel = lost[n:n + 1, :, rows, None]  # (1, H, r, 1)
        wq, wg, wo = (t[n:n + 1, :, rows] for t in (q, g, out))
        wk, wv = (_shared(xp, t[n:n + 1], q.shape[1]) for t in (k, v))
        s = wq @ wk.transpose(-1, -2) * a.scale + full_bias[n:n + 1, :, rows].to(wq.dtype)
        if a.is_causal:
            s = s.masked_fill(torch.arange(k.shape[2], device=s.device) > rows[:, None], float("-inf"))
        p = torch.softmax(s, -1)
        wg = wg * sel
        ds = p * (wg @ wv.transpose(-1, -2) - (wg * wo).sum(-1, keepdim=True))
        dq[n:n + 1, :, rows] = torch.where(sel, ds @ wk * a.scale, dq[n:n + 1, :, rows])
        dk[n:n + 1] += _folded(xp, ds.transpose(-1, -2) @ wq * a.scale, k.shape[1])
        dv[n:n + 1] += _folded(xp, p.transpose(-1, -2) @ wg, k.shape[1])


def _grad_grad(call: Call, h: Expr):
    """The cotangents of ``(g, q, k, v, out, lse[, bias])`` given those of ``(dq, dk, dv)``: the reverse of the
    backward's ``S = q k^T c + bias``, ``P = exp(S - lse)``, ``dv = P^T g``, ``dS = P * (g v^T - rowsum(g * out))``,
    ``dq = dS k c``, ``dk = dS^T q c``."""
    g, q, k, v, out, lse = call.args[:6]
    bias = call.args[6] if len(call.args) == 7 else None
    hq, hk, hv = (nonzero(field(h, i)) for i in range(3))
    if hq is None and hk is None and hv is None:
        return [None] * len(call.args)
    x = _Heads(q, k, lse, call.attrs, bias)
    g3, v3, o3 = x.rows(g), x.rows(x.shared(v)), x.rows(out)
    hq3 = None if hq is None else x.rows(hq)
    hk3, hv3 = (None if t is None else x.rows(x.shared(t)) for t in (hk, hv))  # a fold's adjoint repeats
    m = x.centred(g3, v3, o3)
    ds = E.multiply(x.p, m)
    terms = [x.mm(hq3, x.k, tb=True) if hq3 is not None else None, x.mm(x.q, hk3, tb=True) if hk3 is not None else None]
    h_ds = _total([x.scaled(t) for t in terms if t is not None])
    h_q = x.scaled(x.mm(ds, hk3)) if hk3 is not None else None
    h_k = x.scaled(x.mm(ds, hq3, ta=True)) if hq3 is not None else None
    h_p = _total(([E.multiply(h_ds, m)] if h_ds is not None else []) + ([x.mm(g3, hv3, tb=True)] if hv3 is not None else []))
    h_g = [x.mm(x.p, hv3)] if hv3 is not None else []
    h_v = h_o = None
    if h_ds is not None:
        h_m = E.multiply(h_ds, x.p)
        h_delta = E.negative(x.row_sum(h_m))
        h_g += [x.mm(h_m, v3), E.multiply(h_delta, o3)]
        h_v = x.mm(h_m, g3, ta=True)
        h_o = E.multiply(h_delta, g3)
    h_s = E.multiply(h_p, x.p)
    h_lse = E.negative(T.reshape_like(x.row_sum(h_s), lse))
    h_q = _total([t for t in (h_q, x.scaled(x.mm(h_s, x.k))) if t is not None])
    h_k = _total([t for t in (h_k, x.scaled(x.mm(h_s, x.q, ta=True))) if t is not None])
    back = [(_total(h_g), g), (h_q, q), (h_k, k), (h_v, v), (h_o, out)]
    return [None if d is None else x.back(d, like) for d, like in back] + [
        T.cast(h_lse, lse.checked_type.dtype) if x.wide else h_lse] + ([x.to_bias(h_s, bias)] if bias is not None else [])


def _total(terms: list):
    out = None
    for t in terms:
        out = t if out is None else E.add(out, t)
    return out


def _flops(arg_types, out_type, attrs):
    b, h, length, e = (1 if d is Any else d for d in arg_types[0].shape)
    return 4 * b * h * length * (1 if arg_types[1].shape[2] is Any else arg_types[1].shape[2]) * e


attention = defop("nn.attention", 3, _infer, optional_inputs=1, kernel=_kernel, impls={"numpy": numpy_quiet(_kernel), "torch": _torch},
                  attrs_type=AttentionAttrs, grad=_grad, grad_sees_wanted=True, flops=_flops, dtypes=FLOAT_DTYPES,
                  example_attrs={"scale": 0.35}, torch_name="_scaled_dot_product_flash_attention_for_cpu",
                  doc="``(softmax(q k^T * scale + bias) v, logsumexp)`` over (B, H, L, E) q and (B, Hkv, S, E) k, v (Hkv "
                      "dividing H: grouped-query attention), an "
                      "optional rank-4 bias (an additive mask) broadcasting to (B, H, L, S); ``is_causal`` keeps the lower "
                      "triangle (``scaled_dot_product_attention`` without dropout).")
attention_grad = defop("nn.attention_grad", 6, _grad_infer, optional_inputs=1, kernel=_grad_kernel,
                       impls={"numpy": numpy_quiet(_grad_kernel), "torch": _grad_torch}, attrs_type=AttentionAttrs,
                       grad=_grad_grad, flops=lambda ts, out, a: 2 * _flops(ts[1:4], out, a), dtypes=FLOAT_DTYPES,
                       example_attrs={"scale": 0.35}, torch_name="_scaled_dot_product_flash_attention_for_cpu_backward",
                       doc="Gradient of ``nn.attention``: ``(out_grad, q, k, v, out, lse[, bias]) -> (dq, dk, dv)``, the "
                           "probabilities recomputed from q, k and lse (flash attention's backward).")

__all__ = ["attention", "attention_grad", "AttentionAttrs", "lse_dtype"]
