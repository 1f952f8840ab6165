"""``nn.gru``: one direction of one GRU layer over a whole sequence, and ``nn.gru_grad``, its gradient
(backpropagation through time).

``nn.gru(x, h0, w_ih, w_hh[, b_ih, b_hh], reverse=False)`` takes a (T, B, I) sequence, the (B, H) initial hidden
state and PyTorch's weights (gates stacked in the order reset, update, new: ``w_ih`` is (3H, I), ``w_hh`` (3H, H),
the biases (3H,)), and gives ``(y, h_T)``: the (T, B, H) hidden states of every step and the last. Each step is
PyTorch's ``GRUCell``::

    r = sigmoid(x_t W_ir + b_ir + h W_hr + b_hr);   z = sigmoid(x_t W_iz + b_iz + h W_hz + b_hz)
    n = tanh(x_t W_in + b_in + r (h W_hn + b_hn));   h = (1 - z) n + z h

On torch it runs eager's kernel (ATen's ``gru``, float32 and float64), its graph kept for the gradient (``rnn``);
elsewhere one ``xp`` kernel loops over the steps (float16 and bfloat16 in float32). Its gradient recomputes every
step's gates from ``y`` in two GEMMs. ``nn.gru_grad`` has no rule of its own: AD differentiates its step-by-step
expansion (second derivatives).
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
from .rnn import (Layer, aten_runner, define_layer, eager_dtype, input_gates, parts, per_step, previous, rounded, sigmoid,
                  steps)
from .shape import concatenate, split, stack

STATES = ("h0",)


def _thirds(v, hidden: int) -> tuple:
    return tuple(v[..., k * hidden:(k + 1) * hidden] for k in range(3))


def _wide(xp, b):
    return None if b is None else accumulated(xp, b)


def _gru_kernel(xp, x, h0, w_ih, w_hh, *rest):
    """One step at a time (float16/bfloat16 in float32)."""
    b_ih, b_hh, a = parts(rest)
    wx, h, wi, wh = (accumulated(xp, t) for t in (x, h0, w_ih, w_hh))
    gi, bh = input_gates(xp, wx, wi, _wide(xp, b_ih)), _wide(xp, b_hh)
    whT, hidden, ys = xp.permute_dims(wh, (1, 0)), h.shape[1], [None] * x.shape[0]
    for t in steps(x.shape[0], a.reverse):
        gh = xp.matmul(h, whT) if bh is None else xp.matmul(h, whT) + bh
        (ir, iz, i_n), (hr, hz, hn) = _thirds(gi[t], hidden), _thirds(gh, hidden)
        r, z = sigmoid(xp, ir + hr), sigmoid(xp, iz + hz)
        n = xp.tanh(i_n + r * hn)
        h = (1.0 - z) * n + z * h
        ys[t] = h
    y = xp.stack(ys, axis=0) if ys else xp.zeros(x.shape[:2] + (hidden,), dtype=h.dtype)
    return rounded(xp, (y, h), x)


def _gru_grad_kernel(xp, gy, gh, x, h0, w_ih, w_hh, y, *rest):
    """Backpropagation through time from the hidden states ``y``: the gates of all steps from two GEMMs, the sweep
    back (one small GEMM per step), then the weights' GEMMs."""
    b_ih, b_hh, a = parts(rest)
    wgy, dh, wx, wh0, wi, wh, wy = (accumulated(xp, t) for t in (gy, gh, x, h0, w_ih, w_hh, y))
    n, hidden = x.shape[0], h0.shape[1]
    order = steps(n, a.reverse)
    h_prev = xp.stack(previous(order, wh0, wy), axis=0) if n else xp.zeros(wy.shape, dtype=wy.dtype)
    gi = input_gates(xp, wx, wi, _wide(xp, b_ih))
    ghh = input_gates(xp, h_prev, wh, _wide(xp, b_hh))
    (ir, iz, i_n), (hr, hz, hn) = _thirds(gi, hidden), _thirds(ghh, hidden)
    r, z = sigmoid(xp, ir + hr), sigmoid(xp, iz + hz)
    nn_ = xp.tanh(i_n + r * hn)
    dgi, dgh = [None] * n, [None] * n
    for t in reversed(order):
        dh = wgy[t] + dh
        dn = dh * (1.0 - z[t]) * (1.0 - nn_[t] * nn_[t])
        dr = dn * hn[t] * r[t] * (1.0 - r[t])
        dz = dh * (h_prev[t] - nn_[t]) * z[t] * (1.0 - z[t])
        dgi[t] = xp.concat([dr, dz, dn], axis=-1)
        dgh[t] = xp.concat([dr, dz, dn * r[t]], axis=-1)
        dh = dh * z[t] + xp.matmul(dgh[t], wh)
    empty = xp.zeros(x.shape[:2] + (3 * hidden,), dtype=wx.dtype)
    di, dhh = (xp.stack(d, axis=0) if n else empty for d in (dgi, dgh))
    rows = di.shape[0] * di.shape[1]
    di2, dh2 = xp.reshape(di, (rows, 3 * hidden)), xp.reshape(dhh, (rows, 3 * hidden))
    dw_ih = xp.matmul(xp.permute_dims(di2, (1, 0)), xp.reshape(wx, (rows, x.shape[2])))
    dw_hh = xp.matmul(xp.permute_dims(dh2, (1, 0)), xp.reshape(h_prev, (rows, hidden)))
    grads = [xp.matmul(di, wi), dh, dw_ih, dw_hh]
    return rounded(xp, grads + ([] if b_ih is None else [xp.sum(di2, axis=0), xp.sum(dh2, axis=0)]), x)


# ------------------------------------------------------------------ torch: eager's kernel


_ATEN = aten_runner("gru", 1)


def _runner(x, attrs):
    """ATen's GRU where eager runs it; else None (the shared kernel)."""
    return _ATEN if eager_dtype(x) else None


# ------------------------------------------------------------------ AD


def _gru_grad_expanded(call: Call) -> Expr:
    """``nn.gru_grad`` step by step in differentiable operators (the shared kernel's arithmetic): what AD
    differentiates for second derivatives."""
    gy, gh, x, h0, w_ih, w_hh, y = call.args[:7]
    n = x.checked_type.shape[0]
    if n is Any:
        raise PullbackError("second derivatives of nn.gru need a static sequence length (its steps are unrolled)")
    xs, ys, gys = (per_step(v, n) for v in (x, y, gy))
    b_ih, b_hh = call.args[7:] if len(call.args) == 9 else (None, None)
    order = steps(n, call.attrs.reverse)
    prev, gates = previous(order, h0, ys), {}
    for t in order:
        gi, ghh = dense(xs[t], w_ih), dense(prev[t], w_hh)
        gi, ghh = (gi, ghh) if b_ih is None else (E.add(gi, b_ih), E.add(ghh, b_hh))
        (ir, iz, i_n), (hr, hz, hn) = ([TupleGetItem(split(v, 3, axis=1), k) for k in range(3)] for v in (gi, ghh))
        r, z = E.sigmoid(ir + hr), E.sigmoid(iz + hz)
        gates[t] = (r, z, E.tanh(i_n + r * hn), hn)
    dh, dgi, dgh = gh, {}, {}
    for t in reversed(order):
        r, z, nt, hn = gates[t]
        dh = gys[t] + dh
        dn = dh * (1.0 - z) * (1.0 - nt * nt)
        dr = dn * hn * r * (1.0 - r)
        dz = dh * (prev[t] - nt) * z * (1.0 - z)
        dgi[t], dgh[t] = concatenate([dr, dz, dn], axis=1), concatenate([dr, dz, dn * r], axis=1)
        dh = dh * z + matmul(dgh[t], w_hh)
    rows_i, rows_h = (concatenate([d[t] for t in range(n)], axis=0) for d in (dgi, dgh))  # (T B, 3H)
    grads = [stack([matmul(dgi[t], w_ih) for t in range(n)], axis=0), dh,
             matmul(rows_i, concatenate(xs, axis=0), True), matmul(rows_h, concatenate(prev, axis=0), True)]
    return Tuple(grads + ([] if b_ih is None else [R.sum(rows_i, (0,)), R.sum(rows_h, (0,))]))


gru, gru_grad = define_layer("nn.gru", Layer(
    STATES, 3, 2, _gru_kernel, _gru_grad_kernel, _runner, _gru_grad_expanded, ("gru", "gru_backward"),
    ("``nn.gru(x, h0, w_ih, w_hh[, b_ih, b_hh], reverse=False)``: one direction of one GRU layer over a (T, B, I) "
     "sequence, PyTorch's gates and weights; ``(y, h_T)``.",
     "Gradient of ``nn.gru``: ``(y_grad, h_grad, x, h0, w_ih, w_hh, y[, b_ih, b_hh])`` -> "
     "``(dx, dh0, dw_ih, dw_hh[, db_ih, db_hh])``.")))

__all__ = ["gru", "gru_grad"]
