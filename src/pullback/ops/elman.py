"""``nn.rnn``: one direction of one Elman RNN layer (``nn.RNN``) over a whole sequence, and ``nn.rnn_grad``, its
gradient (backpropagation through time).

``nn.rnn(x, h0, w_ih, w_hh[, b_ih, b_hh], nonlinearity="tanh", reverse=False)`` takes a (T, B, I) sequence, the
(B, H) initial hidden state and PyTorch's weights (``w_ih`` (H, I), ``w_hh`` (H, H), the biases (H,)), and gives
``(y, h_T)``; each step is ``h = act(x_t w_ih^T + b_ih + h w_hh^T + b_hh)``, ``act`` tanh or relu. On torch it runs
eager's kernel (ATen's ``rnn_tanh`` / ``rnn_relu``), its graph kept for the gradient (``rnn``); elsewhere one ``xp``
kernel loops over the steps. Its gradient needs only ``y``: the derivative of tanh is ``1 - y^2``, relu's ``y > 0``.
``nn.rnn_grad`` has no rule of its own: AD differentiates its step-by-step expansion (second derivatives).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.errors import PullbackError
from ..ir.expr import Call, Expr, Tuple
from ..ir.types import Any
from . import elemwise as E
from . import layout as T
from . import reduce as R
from .kernels import accumulated
from .linalg import matmul
from .nn import check_choice
from .rnn import (RNNAttrs, Layer, aten_runner, bias_sum, define_layer, eager_dtype, input_gates, parts, per_step,
                  previous, rounded, steps)
from .shape import concatenate, stack

STATES = ("h0",)
NONLINEARITIES = ("tanh", "relu")


@dataclass(frozen=True)
class ElmanAttrs(RNNAttrs):
    """``nonlinearity``: ``"tanh"`` or ``"relu"``; ``reverse`` as every recurrent layer's."""

    nonlinearity: str = "tanh"

    def __post_init__(self):
        super().__post_init__()
        check_choice(self, "nonlinearity", NONLINEARITIES)


def _act(xp, v, nonlinearity: str):
    return xp.tanh(v) if nonlinearity == "tanh" else xp.maximum(v, 0.0)


def _slope(y, nonlinearity: str):
    """The activation's derivative from its output."""
    return 1.0 - y * y if nonlinearity == "tanh" else (y > 0) * 1.0


def _rnn_kernel(xp, x, h0, w_ih, w_hh, *rest):
    """One step at a time (float16/bfloat16 in float32)."""
    b_ih, b_hh, a = parts(rest)
    wx, h, wi, wh = (accumulated(xp, t) for t in (x, h0, w_ih, w_hh))
    pre = input_gates(xp, wx, wi, bias_sum(xp, b_ih, b_hh))
    whT, ys = xp.permute_dims(wh, (1, 0)), [None] * x.shape[0]
    for t in steps(x.shape[0], a.reverse):
        h = ys[t] = _act(xp, pre[t] + xp.matmul(h, whT), a.nonlinearity)
    y = xp.stack(ys, axis=0) if ys else xp.zeros(x.shape[:2] + (h.shape[1],), dtype=h.dtype)
    return rounded(xp, (y, h), x)


def _rnn_grad_kernel(xp, gy, gh, x, h0, w_ih, w_hh, y, *rest):
    """Backpropagation through time from the hidden states ``y`` (the activation's slope is read from them)."""
    b_ih, b_hh, a = parts(rest)
    wgy, dh, wx, wh0, wi, wh, wy = (accumulated(xp, t) for t in (gy, gh, x, h0, w_ih, w_hh, y))
    n, hidden = x.shape[0], h0.shape[1]
    order = steps(n, a.reverse)
    h_prev = xp.stack(previous(order, wh0, wy), axis=0) if n else xp.zeros(wy.shape, dtype=wy.dtype)
    slope, dpre = _slope(wy, a.nonlinearity), [None] * n
    for t in reversed(order):
        dpre[t] = (wgy[t] + dh) * slope[t]
        dh = xp.matmul(dpre[t], wh)
    d = xp.stack(dpre, axis=0) if n else xp.zeros(x.shape[:2] + (hidden,), dtype=wx.dtype)
    rows = d.shape[0] * d.shape[1]
    d2 = xp.reshape(d, (rows, hidden))
    dw_ih = xp.matmul(xp.permute_dims(d2, (1, 0)), xp.reshape(wx, (rows, x.shape[2])))
    dw_hh = xp.matmul(xp.permute_dims(d2, (1, 0)), xp.reshape(h_prev, (rows, hidden)))
    grads = [xp.matmul(d, wi), dh, dw_ih, dw_hh] + ([] if b_ih is None else [xp.sum(d2, axis=0)])
    return rounded(xp, grads, x)


# ------------------------------------------------------------------ torch: eager's kernel


_ATEN = {"tanh": aten_runner("rnn_tanh", 1), "relu": aten_runner("rnn_relu", 1)}


def _runner(x, attrs):
    """ATen's RNN where eager runs it; else None (the shared kernel)."""
    return _ATEN[attrs.nonlinearity] if eager_dtype(x) else None


# ------------------------------------------------------------------ AD


def _rnn_grad_expanded(call: Call) -> Expr:
    """``nn.rnn_grad`` step by step in differentiable operators (the shared kernel's arithmetic, the activation's
    slope read from ``y``): what AD differentiates for second derivatives."""
    gy, gh, x, h0, w_ih, w_hh, y = call.args[:7]
    n, a = x.checked_type.shape[0], call.attrs
    if n is Any:
        raise PullbackError("second derivatives of nn.rnn need a static sequence length (its steps are unrolled)")
    xs, ys, gys = (per_step(v, n) for v in (x, y, gy))
    order = steps(n, a.reverse)
    prev = previous(order, h0, ys)
    # (relu's slope is a step: no second derivative through it, as in eager)
    slope = [1.0 - h * h if a.nonlinearity == "tanh" else T.cast_like(E.greater(h, 0.0), h) for h in ys]
    dh, dpre = gh, {}
    for t in reversed(order):
        dpre[t] = (gys[t] + dh) * slope[t]
        dh = matmul(dpre[t], w_hh)
    rows = concatenate([dpre[t] for t in range(n)], axis=0)  # (T B, H)
    grads = [stack([matmul(dpre[t], w_ih) for t in range(n)], axis=0), dh,
             matmul(rows, concatenate(xs, axis=0), True), matmul(rows, concatenate(prev, axis=0), True)]
    return Tuple(grads + ([R.sum(rows, (0,))] if len(call.args) == 9 else []))


rnn, rnn_grad = define_layer("nn.rnn", Layer(
    STATES, 1, 1, _rnn_kernel, _rnn_grad_kernel, _runner, _rnn_grad_expanded, ("rnn_tanh", "rnn_tanh_backward"),
    ("``nn.rnn(x, h0, w_ih, w_hh[, b_ih, b_hh], nonlinearity='tanh', reverse=False)``: one direction of one Elman "
     "RNN layer over a (T, B, I) sequence (``nn.RNN``), tanh or relu; ``(y, h_T)``.",
     "Gradient of ``nn.rnn``: ``(y_grad, h_grad, x, h0, w_ih, w_hh, y[, b_ih, b_hh])`` -> "
     "``(dx, dh0, dw_ih, dw_hh[, db])`` (``db`` is both biases' gradient)."), ElmanAttrs))

__all__ = ["ElmanAttrs", "rnn", "rnn_grad"]
