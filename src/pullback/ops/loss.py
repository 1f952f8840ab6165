"""Losses: ``nn.cross_entropy``, ``nn.cross_entropy_with_logits`` (Relay semantics), ``nn.nll_loss`` and
``nn.binary_cross_entropy_with_logits`` (PyTorch's).

- ``cross_entropy(p, t) = -sum(log(p) * t) / p.shape[0]`` (p are probabilities);
- ``cross_entropy_with_logits(lp, t) = -sum(lp * t) / lp.shape[0]`` (lp are log-probabilities);
- ``nll_loss(lp, targets, weights, reduction="mean", ignore_index=-100)``: lp is
  ``(N, C, d...)``, targets integer ``(N, d...)``; ``mean`` divides by the sum of
  the picked weights. Its gradient is ``nn.nll_loss_grad``, whose gradient is
  ``nn.nll_loss`` again. ``weights`` are constants (no gradient, as in PyTorch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir.errors import ExecutionError
from ..ir.expr import Call, Expr
from ..ir.types import Any, TensorType, is_float
from . import elemwise as E
from .common import broadcast_shapes, float_arg, numel, same_dtype, tensor_arg
from .kernels import accumulated, check, is_traced, numpy_quiet
from . import reduce as R
from .nn import as_dtype, check_bool, check_choice, check_int, count, is_torch, numel_flops, on_device, scalar
from .registry import FusionKind, array_namespace, defop, type_error

def _fits(shape: tuple, want: tuple) -> bool:
    """``shape`` may be ``want`` (same rank; an ``Any`` dimension matches any size)."""
    return len(shape) == len(want) and all(a is Any or b is Any or a == b for a, b in zip(shape, want))


# ------------------------------------------------------------------ cross entropy


def _ce_infer(op):
    def infer(arg_types, attrs):
        p = float_arg(op, arg_types, 0)
        t = tensor_arg(op, arg_types, 1)
        same_dtype(op, arg_types)
        if p.ndim < 1 or not _fits(t.shape, p.shape):
            raise type_error(op, arg_types, "predictions and targets must have the same shape (rank >= 1)")
        return TensorType((), p.dtype)

    return infer


def _ce_grad(logits: bool):
    def grad(call: Call, g: Expr):
        p, t = call.args
        s = -g / count(p, (0,))
        return [s * t if logits else s * t / p, s * (p if logits else E.log(p))]

    return grad


def _ce_kernel(xp, x, y, attrs=None):
    return as_dtype(xp, -xp.sum(xp.log(x) * y) / x.shape[0], x.dtype)


def _ce_logits_kernel(xp, x, y, attrs=None):
    return as_dtype(xp, -xp.sum(x * y) / x.shape[0], x.dtype)


cross_entropy = defop("nn.cross_entropy", 2, _ce_infer("nn.cross_entropy"), kernel=_ce_kernel, grad=_ce_grad(False),
                      pattern=FusionKind.OPAQUE, flops=lambda ts, out, a: 3 * numel(ts[0].shape))
cross_entropy_with_logits = defop("nn.cross_entropy_with_logits", 2, _ce_infer("nn.cross_entropy_with_logits"),
                                  kernel=_ce_logits_kernel, grad=_ce_grad(True), pattern=FusionKind.OPAQUE,
                                  flops=lambda ts, out, a: 2 * numel(ts[0].shape))

# ------------------------------------------------------------------ nll_loss


@dataclass(frozen=True)
class NLLLossAttrs:
    reduction: str = "mean"
    ignore_index: int = -100

    def __post_init__(self):
        check_choice(self, "reduction", ("mean", "sum", "none"))
        check_int(self, "ignore_index")


def _nll_check(op, arg_types, attrs, pred_i: int):
    p = float_arg(op, arg_types, pred_i)
    t = tensor_arg(op, arg_types, pred_i + 1)
    w = tensor_arg(op, arg_types, pred_i + 2)
    same_dtype(op, [p, w])
    if is_float(t.dtype) or t.dtype == "bool":
        raise type_error(op, arg_types, f"targets must be an integer tensor, got {t.dtype}")
    if p.ndim < 2:
        raise type_error(op, arg_types, f"predictions must be (N, C, d...), got rank {p.ndim}")
    want = (p.shape[0],) + p.shape[2:]
    if not _fits(t.shape, want):
        raise type_error(op, arg_types, f"targets must have shape {want}, got {t.shape}")
    if w.ndim != 1 or (w.shape[0] is not Any and p.shape[1] is not Any and w.shape[0] != p.shape[1]):
        raise type_error(op, arg_types, f"weights must have shape ({p.shape[1]},), got {w.shape}")
    return p, t


def _nll_infer(arg_types, attrs):
    p, t = _nll_check("nn.nll_loss", arg_types, attrs, 0)
    return TensorType(t.shape if attrs.reduction == "none" else (), p.dtype)


def _nll_pick(xp, p, t, w, a):
    """(valid targets clamped to 0, picked weights (0 where ignored), divisor of the reduction)."""
    valid = t != a.ignore_index
    tc = xp.where(valid, t, 0)
    c = p.shape[1]
    out_of_range = (tc < 0) | (tc >= c)  # an error on every target (jax: checked after the call, see ops.kernels.check)
    if is_traced(out_of_range):  # also constant targets inside jax.jit (staged out: tracers)
        check(out_of_range, f"nn.nll_loss: a target is out of range [0, {c}) (ignore_index={a.ignore_index})")
    elif bool(xp.any(out_of_range)):
        bad = t[valid & out_of_range]
        raise ExecutionError(f"nn.nll_loss: target {int(bad[0])} is out of range [0, {c}) (ignore_index={a.ignore_index})")
    if is_torch(xp):
        tc = xp.astype(tc, xp.int64)  # torch gathers with int64 indices only
    wt = xp.where(valid, w[tc], 0.0)
    div = xp.sum(wt) if a.reduction == "mean" else 1.0
    return tc, wt, div


def _nll_kernel(xp, p, t, w, a):
    tc, wt, div = _nll_pick(xp, p, t, w, a)
    loss = -wt * xp.take_along_axis(p, xp.expand_dims(tc, axis=1), axis=1)[:, 0]
    out = loss if a.reduction == "none" else xp.sum(loss) / div
    return as_dtype(xp, out, p.dtype)


def _nll_grad_infer(arg_types, attrs):
    op = "nn.nll_loss_grad"
    p, t = _nll_check(op, arg_types, attrs, 1)
    g = float_arg(op, arg_types, 0)
    want = t.shape if attrs.reduction == "none" else ()
    if not _fits(g.shape, want):
        raise type_error(op, arg_types, f"the output gradient must have shape {want}, got {g.shape}")
    return p


def _nll_grad_kernel(xp, g, p, t, w, a):
    """The coefficient of each target's log-probability, at the target's class (zero elsewhere)."""
    tc, coef = _nll_grad_coef(xp, g, p, t, w, a)
    classes = xp.reshape(xp.arange(p.shape[1], dtype=tc.dtype, **on_device(xp, p)), (1, -1) + (1,) * (p.ndim - 2))
    return xp.where(xp.expand_dims(tc, axis=1) == classes, xp.expand_dims(coef, axis=1), 0.0)


def _nll_grad_coef(xp, g, p, t, w, a):
    tc, wt, div = _nll_pick(xp, p, t, w, a)
    return tc, as_dtype(xp, -wt * (g if a.reduction == "none" else g / div), p.dtype)


def _nll_grad_numpy(g, p, t, w, a):
    """Writes the N coefficients into zeros (no class comparison)."""
    tc, coef = _nll_grad_coef(np, g, p, t, w, a)
    out = np.zeros_like(p)
    np.put_along_axis(out, tc[:, None], coef[:, None], axis=1)
    return out


def _torch_or_shared(fast, shared):
    """The torch kernel ``fast(*args)``; where ATen rejects a target (out of range), ``shared`` (the shared
    kernel on torch) runs and raises the error every target gives."""

    def run(*args):
        try:
            return fast(*args)
        except (IndexError, RuntimeError):
            return shared(array_namespace("torch"), *args)

    return run


def _nll_pick_torch(t, w, a) -> tuple:
    """``_nll_pick`` without its range check: ATen's ``gather`` and ``scatter_`` reject a bad index (the shared kernel
    with the check off would not: array-api-compat's ``take_along_axis`` wraps negative indices, as the array API
    allows)."""
    import torch

    t = t.long()
    valid = t != a.ignore_index
    tc = torch.where(valid, t, 0)
    return tc, torch.where(valid, w[tc], 0.0)


_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _nll_fast(p, t, w, a):
    """ATen's ``nll_loss``: eager's own kernel and sums (one call; the shared formula in ATen calls took ten, each
    one 15-40 us in a training step)."""
    import torch.nn.functional as F

    return F.nll_loss(p, t.long(), w, ignore_index=a.ignore_index, reduction=a.reduction)


def _nll_grad_fast(g, p, t, w, a):
    """ATen's ``nll_loss_backward`` for (N, C) predictions (a mean's total weight from ``nll_loss_forward``); other ranks
    ``_nll_grad_numpy`` with ATen's ``scatter_`` (an LM head's 1024 x 1024 gradient: 1.2 -> 0.2 ms)."""
    import torch

    if p.ndim == 2:
        t, r = t.long(), _REDUCTIONS[a.reduction]
        # the total weight divides only a mean's gradient
        total = torch.ops.aten.nll_loss_forward(p, t, w, r, a.ignore_index)[1] if r == 1 else p.new_ones(())
        return torch.ops.aten.nll_loss_backward(g, p, t, w, r, a.ignore_index, total)
    tc, wt = _nll_pick_torch(t, w, a)
    coef = -wt * (g if a.reduction == "none" else g / wt.sum() if a.reduction == "mean" else g)
    return torch.zeros(p.shape, dtype=p.dtype, device=p.device).scatter_(1, tc.unsqueeze(1), coef.unsqueeze(1).to(p.dtype))


nll_loss = defop("nn.nll_loss", 3, _nll_infer, kernel=_nll_kernel, impls={"torch": _torch_or_shared(_nll_fast, _nll_kernel)}, attrs_type=NLLLossAttrs,
                 grad=lambda c, g: [nll_loss_grad(g, *c.args, c.attrs.reduction, c.attrs.ignore_index), None, None],
                 pattern=FusionKind.OPAQUE, flops=numel_flops(2), torch_name="nll_loss")
nll_loss_grad = defop(
    "nn.nll_loss_grad", 4, _nll_grad_infer, kernel=_nll_grad_kernel, impls={"numpy": _nll_grad_numpy, "torch": _torch_or_shared(_nll_grad_fast, _nll_grad_kernel)},
    attrs_type=NLLLossAttrs,
    grad=lambda c, gg: [nll_loss(gg, c.args[2], c.args[3], c.attrs.reduction, c.attrs.ignore_index), None, None, None],
    pattern=FusionKind.OPAQUE, flops=lambda ts, out, a: numel(out.shape), torch_name="nll_loss_backward",
    doc="Gradient of ``nn.nll_loss``: ``(out_grad, predictions, targets, weights) -> predictions-shaped``.")


# ------------------------------------------------------------------ binary cross-entropy with logits


@dataclass(frozen=True)
class BCEWithLogitsAttrs:
    """``weighted`` / ``pos_weighted``: whether the third / fourth operand is a weight (else a placeholder, e.g.
    ``const(1.0)``, that is not read)."""

    reduction: str = "mean"
    weighted: bool = False
    pos_weighted: bool = False

    def __post_init__(self):
        check_choice(self, "reduction", ("mean", "sum", "none"))
        check_bool(self, "weighted", "pos_weighted")


def _bce_check(op: str, arg_types, first: int) -> TensorType:
    z = float_arg(op, arg_types, first)
    y, w, pw = (tensor_arg(op, arg_types, first + i) for i in (1, 2, 3))
    same_dtype(op, [z, y, w, pw])
    if not _fits(y.shape, z.shape):
        raise type_error(op, arg_types, f"targets must have the logits' shape {z.shape}, got {y.shape}")
    for name, t in (("weight", w), ("pos_weight", pw)):
        out = broadcast_shapes(op, arg_types, t.shape, z.shape)
        if not _fits(out, z.shape):
            raise type_error(op, arg_types, f"{name} of shape {t.shape} does not broadcast to the logits' {z.shape}")
    return z


def _bce_infer(arg_types, attrs):
    z = _bce_check("nn.binary_cross_entropy_with_logits", arg_types, 0)
    return TensorType(z.shape if attrs.reduction == "none" else (), z.dtype)


def _bce_grad_infer(arg_types, attrs):
    op = "nn.binary_cross_entropy_with_logits_grad"
    z = _bce_check(op, arg_types, 1)
    g = float_arg(op, arg_types, 0)
    want = z.shape if attrs.reduction == "none" else ()
    if not _fits(g.shape, want):
        raise type_error(op, arg_types, f"the output gradient must have shape {want}, got {g.shape}")
    return z


def _log_sigmoid(xp, z):
    """``log(sigmoid(z)) = min(z, 0) - log1p(exp(-|z|))``, without overflow."""
    return xp.minimum(z, 0.0) - xp.log1p(xp.exp(-xp.abs(z)))


def _bce_kernel(xp, z0, y, w, pw, a):
    """ATen's formula: ``(1 - y) z - lw log_sigmoid(z)``, ``lw = (pos_weight - 1) y + 1``, times the weight; float16
    and bfloat16 in float32, rounded once."""
    z, y, w, pw = (accumulated(xp, v) for v in (z0, y, w, pw))
    ls = _log_sigmoid(xp, z)
    if a.pos_weighted:
        ls = ls * ((pw - 1.0) * y + 1.0)
    loss = (1.0 - y) * z - ls
    if a.weighted:
        loss = loss * w
    out = loss if a.reduction == "none" else xp.sum(loss) / (math.prod(loss.shape) if a.reduction == "mean" else 1)
    return as_dtype(xp, out, z0.dtype)


def _bce_grad_kernel(xp, g, z0, y, w, pw, a):
    """``(sigmoid(z) - y) w g'``, with a pos_weight ``((pw y + 1 - y) sigmoid(z) - pw y) w g'`` (ATen's), ``g'`` the
    output gradient over the mean's count; float16 and bfloat16 in float32, rounded once."""
    g, z, y, w, pw = (accumulated(xp, v) for v in (g, z0, y, w, pw))
    s = E.sigmoid_kernel(xp, z)
    if a.pos_weighted:
        t = pw * y
        d = (t + 1.0 - y) * s - t
    else:
        d = s - y
    if a.weighted:
        d = d * w
    d = d * (g / math.prod(z.shape) if a.reduction == "mean" else g)
    return as_dtype(xp, xp.broadcast_to(d, z.shape) if tuple(d.shape) != tuple(z.shape) else d, z0.dtype)


def _bce_torch(z, y, w, pw, a):
    """ATen's ``binary_cross_entropy_with_logits``: eager's kernel (float16 and bfloat16 in float32, rounded once:
    ATen's composite rounds each of its steps, a few bits off for bfloat16; autocast runs it in float32 anyway)."""
    import torch

    z0, (z, y, w, pw) = z, (v.float() if v.dtype in (torch.float16, torch.bfloat16) else v for v in (z, y, w, pw))
    out = torch.ops.aten.binary_cross_entropy_with_logits(z, y, w if a.weighted else None, pw if a.pos_weighted else None,
                                                          _REDUCTIONS[a.reduction])
    return out.to(z0.dtype)


def _count_all(z: Expr) -> Expr:
    """The number of entries of ``z`` (a mean's divisor), as a scalar of its dtype."""
    return count(z, tuple(range(len(z.checked_type.shape))))


def _bce_scale(a: BCEWithLogitsAttrs, g: Expr, z: Expr, w: Expr) -> Expr:
    """The output gradient as each logit's factor: ``g`` (none, sum) or ``g / n`` (mean), times the weight."""
    if a.reduction == "mean":
        g = g / _count_all(z)
    return g * w if a.weighted else g


def _log_sigmoid_expr(v: Expr) -> Expr:
    return E.minimum(v, scalar(0.0, v)) - E.log1p(E.exp(-E.abs(v)))


def _bce_grad(c: Call, g: Expr):
    """d/dz: ``nn.binary_cross_entropy_with_logits_grad``; d/dy (float targets, PyTorch's): ``-z``, with a pos_weight
    ``log_sigmoid(-z) - pw log_sigmoid(z)``; the weights get none (as in PyTorch)."""
    z, y, w, pw = c.args
    a = c.attrs
    dz = binary_cross_entropy_with_logits_grad(g, z, y, w, pw, a.reduction, a.weighted, a.pos_weighted)
    if not is_float(y.checked_type.dtype):
        return [dz, None, None, None]
    dy = _log_sigmoid_expr(-z) - _log_sigmoid_expr(z) * pw if a.pos_weighted else -z
    return [dz, dy * _bce_scale(a, g, z, w), None, None]


def _bce_grad_grad(c: Call, h: Expr):
    """Of ``dz = coef(z, y) g'``, ``coef = (p s - t)`` with ``t = pw y``, ``p = t + 1 - y`` (``s - y`` without a
    pos_weight), ``s = sigmoid(z)``: d/dg sums ``h coef`` (over the mean's count), d/dz = ``h p s (1 - s) g'``,
    d/dy = ``h ((pw - 1) s - pw) g'``."""
    g, z, y, w, pw = c.args
    a = c.attrs
    one = scalar(1.0, z)
    s = E.sigmoid(z)
    scale = _bce_scale(a, g, z, w)
    if a.pos_weighted:
        t = pw * y
        slope, coef, dy = t + one - y, (t + one - y) * s - t, (pw - one) * s - pw
    else:
        slope, coef, dy = one, s - y, -one
    dg = h * coef * w if a.weighted else h * coef
    if a.reduction != "none":
        dg = R.sum(dg)
        if a.reduction == "mean":
            dg = dg / _count_all(z)
    return [dg, h * slope * s * (one - s) * scale, h * dy * scale if is_float(y.checked_type.dtype) else None, None, None]


binary_cross_entropy_with_logits = defop(
    "nn.binary_cross_entropy_with_logits", 4, _bce_infer, kernel=_bce_kernel,
    impls={"torch": _bce_torch}, attrs_type=BCEWithLogitsAttrs,
    grad=_bce_grad, pattern=FusionKind.OPAQUE, flops=numel_flops(8), torch_name="binary_cross_entropy_with_logits",
    doc="``(logits, targets, weight, pos_weight)``: PyTorch's ``F.binary_cross_entropy_with_logits`` (``weighted`` / "
        "``pos_weighted`` say which of the last two are read); targets of the logits' shape, weights broadcast.")
binary_cross_entropy_with_logits_grad = defop(
    "nn.binary_cross_entropy_with_logits_grad", 5, _bce_grad_infer, kernel=_bce_grad_kernel,
    impls={"numpy": numpy_quiet(_bce_grad_kernel, over="ignore")}, attrs_type=BCEWithLogitsAttrs, grad=_bce_grad_grad,
    pattern=FusionKind.OPAQUE, flops=numel_flops(6),
    doc="Gradient of ``nn.binary_cross_entropy_with_logits`` w.r.t. the logits: "
        "``(out_grad, logits, targets, weight, pos_weight) -> logits-shaped``.")
