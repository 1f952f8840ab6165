"""``nn.lstm``: one direction of one LSTM layer over a whole sequence, and ``nn.lstm_grad``, its gradient
(backpropagation through time).

``nn.lstm(x, h0, c0, w_ih, w_hh[, b_ih, b_hh], reverse=False)`` takes a (T, B, I) sequence, the (B, H) initial
hidden and cell states and PyTorch's weights (gates stacked in the order input, forget, cell, output: ``w_ih`` is
(4H, I), ``w_hh`` (4H, H), the biases (4H,)), and gives ``(y, h_T, c_T)``: the (T, B, H) hidden states of every
step and the last ones. Each step is PyTorch's ``LSTMCell``::

    i, f, g, o = split(x_t w_ih^T + b_ih + h w_hh^T + b_hh)
    c = sigmoid(f) c + sigmoid(i) tanh(g);   h = sigmoid(o) tanh(c)

On torch it runs eager's kernel (CPU float32 and bfloat16: oneDNN's fused RNN layer, ``mkldnn_rnn_layer``; float64:
ATen's ``lstm``), its graph kept for the gradient (``rnn``); elsewhere one ``xp`` kernel loops over the steps (one
GEMM of the whole sequence's inputs, then a small GEMM and the gates' arithmetic per step; float16 and bfloat16 in
float32). Its gradient recomputes the gates from ``y`` in two GEMMs and the cell states in one pass per step.
``nn.lstm_grad`` has no rule of its own: AD differentiates its step-by-step expansion (second derivatives).
"""

from __future__ import annotations

from ..ir.errors import PullbackError
from ..ir.expr import Call, Expr, Tuple, TupleGetItem
from ..ir.types import Any
from . import elemwise as E
from . import reduce as R
from .kernels import accumulated
from .linalg import matmul
from .nn import dense
from .rnn import (Layer, aten_runner, bias_sum, define_layer, input_gates, parts, per_step, previous, rounded, sigmoid,
                  steps)
from .shape import concatenate, split, stack

STATES = ("h0", "c0")


def _split(xp, gates, hidden: int) -> tuple:
    """The activated gates ``sigmoid(i), sigmoid(f), tanh(g), sigmoid(o)`` of pre-activations (..., 4H)."""
    i, f, g, o = (gates[..., k * hidden:(k + 1) * hidden] for k in range(4))
    return sigmoid(xp, i), sigmoid(xp, f), xp.tanh(g), sigmoid(xp, o)


def _lstm_kernel(xp, x, h0, c0, w_ih, w_hh, *rest):
    """One step at a time (float16/bfloat16 in float32)."""
    b_ih, b_hh, a = parts(rest)
    wx, h, c, wi, wh = (accumulated(xp, t) for t in (x, h0, c0, w_ih, w_hh))
    pre = input_gates(xp, wx, wi, bias_sum(xp, b_ih, b_hh))
    whT, hidden, ys = xp.permute_dims(wh, (1, 0)), h.shape[1], [None] * x.shape[0]
    for t in steps(x.shape[0], a.reverse):
        i, f, g, o = _split(xp, pre[t] + xp.matmul(h, whT), hidden)
        c = f * c + i * g
        h = o * xp.tanh(c)
        ys[t] = h
    y = xp.stack(ys, axis=0) if ys else xp.zeros(x.shape[:2] + (hidden,), dtype=h.dtype)
    return rounded(xp, (y, h, c), x)


def _lstm_grad_kernel(xp, gy, gh, gc, x, h0, c0, w_ih, w_hh, y, *rest):
    """Backpropagation through time from the hidden states ``y``: the gates of all steps from two GEMMs, the cell
    states in one pass per step, then the sweep back (one small GEMM per step) and the weights' GEMMs."""
    b_ih, b_hh, a = parts(rest)
    wgy, dh, dc, wx, wh0, wc0, wi, wh, wy = (accumulated(xp, t) for t in (gy, gh, gc, x, h0, c0, w_ih, w_hh, y))
    n, hidden = x.shape[0], h0.shape[1]
    order = steps(n, a.reverse)
    h_prev = xp.stack(previous(order, wh0, wy), axis=0) if n else xp.zeros(wy.shape, dtype=wy.dtype)
    pre = input_gates(xp, wx, wi, bias_sum(xp, b_ih, b_hh)) + xp.matmul(h_prev, xp.permute_dims(wh, (1, 0)))
    i, f, g, o = _split(xp, pre, hidden)
    ig, cs, c_prev, c = i * g, [None] * n, [None] * n, wc0
    for t in order:
        c_prev[t] = c
        c = cs[t] = f[t] * c + ig[t]
    dgates = [None] * n
    for t in reversed(order):
        tc = xp.tanh(cs[t])
        dh = wgy[t] + dh
        dc = dc + dh * o[t] * (1.0 - tc * tc)
        dgates[t] = xp.concat([dc * g[t] * i[t] * (1.0 - i[t]), dc * c_prev[t] * f[t] * (1.0 - f[t]),
                               dc * i[t] * (1.0 - g[t] * g[t]), dh * tc * o[t] * (1.0 - o[t])], axis=-1)
        dc = dc * f[t]
        dh = xp.matmul(dgates[t], wh)
    d = xp.stack(dgates, axis=0) if n else xp.zeros(x.shape[:2] + (4 * hidden,), dtype=wx.dtype)
    rows = d.shape[0] * d.shape[1]
    d2 = xp.reshape(d, (rows, 4 * hidden))
    dx = xp.matmul(d, wi)
    dw_ih = xp.matmul(xp.permute_dims(d2, (1, 0)), xp.reshape(wx, (rows, x.shape[2])))
    dw_hh = xp.matmul(xp.permute_dims(d2, (1, 0)), xp.reshape(h_prev, (rows, hidden)))
    grads = [dx, dh, dc, dw_ih, dw_hh] + ([] if b_ih is None else [xp.sum(d2, axis=0)])
    return rounded(xp, grads, x)


# ------------------------------------------------------------------ torch: eager's kernels

_LSTM_MODE = 2  # oneDNN's rnn kind for an LSTM (ideep::rnn_kind::LSTM), as ATen passes it


def _eager_kernel(x) -> str:
    """The kernel eager runs an LSTM layer of ``x`` with: ``"onednn"`` (CPU, float32 or bfloat16, oneDNN on),
    ``"aten"`` (float64, ATen's steps), or ``""`` (the shared kernel: float16)."""
    import torch

    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and x.numel() > 0 \
            and torch._C._get_mkldnn_enabled():
        return "onednn"
    return "aten" if x.dtype in (torch.float32, torch.float64) else ""


def _onednn_layer(leaves: list, reverse: bool) -> tuple:
    """``mkldnn_rnn_layer`` in training mode: ``((y, h_T, c_T), (workspace,))``; zero biases where the layer has
    none (ATen's own way)."""
    import torch

    x, h0, c0, w_ih, w_hh, *b = leaves
    biases = b or (w_ih.new_zeros(w_ih.shape[0]), w_hh.new_zeros(w_hh.shape[0]))
    *out, workspace = torch.ops.aten.mkldnn_rnn_layer.default(
        x.contiguous(), w_ih, w_hh, *biases, h0.contiguous(), c0.contiguous(), reverse, [], _LSTM_MODE,
        h0.shape[1], 1, bool(b), False, False, True)
    return tuple(out), (workspace,)


_RUNNERS = {"onednn": _onednn_layer, "aten": aten_runner("lstm", 2)}


def _runner(x, attrs):
    return _RUNNERS.get(_eager_kernel(x))


# ------------------------------------------------------------------ AD


def _lstm_grad_expanded(call: Call) -> Expr:
    """``nn.lstm_grad`` step by step in differentiable operators (the shared kernel's arithmetic): what AD
    differentiates for second derivatives."""
    gy, gh, gc, x, h0, c0, w_ih, w_hh, y = call.args[:9]
    n = x.checked_type.shape[0]
    if n is Any:
        raise PullbackError("second derivatives of nn.lstm need a static sequence length (its steps are unrolled)")
    xs, ys, gys = (per_step(v, n) for v in (x, y, gy))
    bias = E.add(*call.args[9:]) if len(call.args) == 11 else None
    order = steps(n, call.attrs.reverse)
    prev, c_prev, cs, gates, c = previous(order, h0, ys), {}, {}, {}, c0
    for t in order:
        pre = E.add(dense(xs[t], w_ih), dense(prev[t], w_hh))
        pieces = split(pre if bias is None else E.add(pre, bias), 4, axis=1)
        i, f, g, o = (fn(TupleGetItem(pieces, j)) for j, fn in enumerate((E.sigmoid, E.sigmoid, E.tanh, E.sigmoid)))
        c_prev[t], gates[t] = c, (i, f, g, o)
        c = cs[t] = f * c + i * g
    dh, dc, dgates = gh, gc, {}
    for t in reversed(order):
        i, f, g, o = gates[t]
        tc = E.tanh(cs[t])
        dh = gys[t] + dh
        dc = dc + dh * o * (1.0 - tc * tc)
        dgates[t] = concatenate([dc * g * i * (1.0 - i), dc * c_prev[t] * f * (1.0 - f), dc * i * (1.0 - g * g),
                                 dh * tc * o * (1.0 - o)], axis=1)
        dc = dc * f
        dh = matmul(dgates[t], w_hh)
    rows = concatenate([dgates[t] for t in range(n)], axis=0)  # (T B, 4H)
    dx = stack([matmul(dgates[t], w_ih) for t in range(n)], axis=0)
    grads = [dx, dh, dc, matmul(rows, concatenate(xs, axis=0), True), matmul(rows, concatenate(prev, axis=0), True)]
    return Tuple(grads + ([R.sum(rows, (0,))] if bias is not None else []))


lstm, lstm_grad = define_layer("nn.lstm", Layer(
    STATES, 4, 1, _lstm_kernel, _lstm_grad_kernel, _runner, _lstm_grad_expanded, ("lstm", "mkldnn_rnn_layer_backward"),
    ("``nn.lstm(x, h0, c0, w_ih, w_hh[, b_ih, b_hh], reverse=False)``: one direction of one LSTM layer over a "
     "(T, B, I) sequence, PyTorch's gates and weights; ``(y, h_T, c_T)``.",
     "Gradient of ``nn.lstm``: ``(y_grad, h_grad, c_grad, x, h0, c0, w_ih, w_hh, y[, b_ih, b_hh])`` -> "
     "``(dx, dh0, dc0, dw_ih, dw_hh[, db])`` (``db`` is both biases' gradient).")))

__all__ = ["lstm", "lstm_grad"]
