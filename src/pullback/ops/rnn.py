"""Recurrent layers as one operator: ``nn.lstm`` runs one direction of one LSTM layer over a whole sequence, and
``nn.lstm_grad`` is its gradient (backpropagation through time).

``nn.lstm(x, h0, c0, w_ih, w_hh[, b_ih, b_hh], reverse=False)`` takes a (T, B, I) sequence, the (B, H) initial
hidden and cell states and PyTorch's weights (gates stacked in the order input, forget, cell, output: ``w_ih`` is
(4H, I), ``w_hh`` (4H, H), the biases (4H,)), and gives ``(y, h_T, c_T)``: the (T, B, H) hidden states of every
step and the last ones. ``reverse`` runs the sequence from its last step to its first (the second direction of
a bidirectional LSTM; ``y`` stays in the input's order). Each step is PyTorch's ``LSTMCell``::

    i, f, g, o = split(x_t w_ih^T + b_ih + h w_hh^T + b_hh)
    c = sigmoid(f) c + sigmoid(i) tanh(g);   h = sigmoid(o) tanh(c)

On torch (CPU, float32 and bfloat16) it runs eager's kernel, oneDNN's fused RNN layer (``mkldnn_rnn_layer``);
elsewhere one ``xp`` kernel loops over the steps (one GEMM of the whole sequence's inputs, then a small GEMM and the
gates' arithmetic per step; float16 and bfloat16 in float32).

The gradient needs no saved gates: from the hidden states ``y`` the forward gave, every step's gates come back
in two GEMMs over the whole sequence, the cell states in one elementwise pass per step, and the sweep back in time
costs one small GEMM per step; the weights' gradients are then two GEMMs over the whole sequence. A training step
keeps only ``y`` (which the next layer reads anyway) between its forward and its backward. On torch the
gradient is eager's own (oneDNN's backward, after its forward again: its saved gates are internal to it).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from ..ir.errors import PullbackError
from ..ir.expr import Call, Expr, Tuple, TupleGetItem
from ..ir.types import FLOAT_DTYPES, Any, TensorType, TupleType
from . import elemwise as E
from . import layout as T
from . import reduce as R
from .common import numel, same_dtype, tensor_arg
from .kernels import accumulated
from .linalg import matmul
from .nn import check_bool, dense, field, nonzero
from .registry import FusionKind, defop, type_error
from .shape import concatenate, split, squeeze, stack


@dataclass(frozen=True)
class LSTMAttrs:
    """``reverse``: run the sequence from its last step to its first (``y`` stays in the input's order)."""

    reverse: bool = False

    def __post_init__(self):
        check_bool(self, "reverse")


def _known_differ(a, b) -> bool:
    return a is not Any and b is not Any and a != b


def _check_layer(name: str, arg_types, first: int) -> tuple:
    """``(x, h0, w_ih)`` types of the operands ``x, h0, c0, w_ih, w_hh[, b_ih, b_hh]`` from position ``first``,
    each shape checked against the others."""
    x, h0, c0, w_ih, w_hh = (tensor_arg(name, arg_types, first + i) for i in range(5))
    biases = [tensor_arg(name, arg_types, i) for i in range(first + 5, len(arg_types))]
    if x.dtype not in FLOAT_DTYPES:
        raise type_error(name, arg_types, f"expects floating-point tensors, got {x.dtype}")
    if x.ndim != 3 or h0.ndim != 2 or c0.ndim != 2 or w_ih.ndim != 2 or w_hh.ndim != 2:
        raise type_error(name, arg_types, "expects a (T, B, I) sequence, (B, H) states h0 and c0, (4H, I) w_ih and "
                                          "(4H, H) w_hh")
    hidden = h0.shape[1]
    if hidden is Any or w_ih.shape[0] is Any:
        raise type_error(name, arg_types, "needs a static hidden size")
    four = 4 * hidden
    fits = (c0.shape == h0.shape and not _known_differ(x.shape[1], h0.shape[0])
            and w_ih.shape[0] == four and not _known_differ(w_ih.shape[1], x.shape[2]) and w_hh.shape == (four, hidden)
            and all(b.shape == (four,) for b in biases))
    if not fits:
        got = ", ".join(str(t.shape) for t in arg_types[first:])
        raise type_error(name, arg_types, f"shapes {got} are not x (T, B, I), h0 and c0 (B, H), w_ih (4H, I), "
                                          f"w_hh (4H, H) and biases (4H,) with H = {hidden}")
    return x, h0, w_ih


def _operands(name: str, arg_types, counts: tuple, what: str) -> None:
    """``counts`` operands (without or with the two biases) of one dtype."""
    if len(arg_types) not in counts:
        raise type_error(name, arg_types, f"expects {what} and optionally b_ih, b_hh, got {len(arg_types)} operands")
    same_dtype(name, arg_types)


def _lstm_infer(arg_types, attrs):
    _operands("nn.lstm", arg_types, (5, 7), "x, h0, c0, w_ih, w_hh")
    x, h0, _ = _check_layer("nn.lstm", arg_types, 0)
    state = TensorType(h0.shape, x.dtype)
    return TupleType([TensorType(x.shape[:2] + h0.shape[1:], x.dtype), state, state])


def _lstm_grad_infer(arg_types, attrs):
    name = "nn.lstm_grad"
    _operands(name, arg_types, (9, 11), "(y_grad, h_grad, c_grad, x, h0, c0, w_ih, w_hh, y)")
    x, h0, w_ih = _check_layer(name, arg_types[:8] + arg_types[9:], 3)
    y_type = TensorType(x.shape[:2] + h0.shape[1:], x.dtype)
    for i in (0, 8):
        if not _fits(arg_types[i], y_type):
            raise type_error(name, arg_types, f"operand {i} of shape {arg_types[i].shape} is not y's {y_type.shape}")
    for i in (1, 2):
        if not _fits(arg_types[i], h0):
            raise type_error(name, arg_types, f"operand {i} of shape {arg_types[i].shape} is not h0's {h0.shape}")
    grads = [x, h0, h0, w_ih, TensorType(arg_types[7].shape, x.dtype)]
    return TupleType(grads + ([TensorType((w_ih.shape[0],), x.dtype)] if len(arg_types) == 11 else []))


def _fits(t: TensorType, like: TensorType) -> bool:
    return t.ndim == like.ndim and not any(_known_differ(a, b) for a, b in zip(t.shape, like.shape))


def _parts(rest: tuple) -> tuple:
    """``(b_ih, b_hh, attrs)`` from a kernel's operands after the weights (biases None when absent)."""
    return (rest[0], rest[1], rest[2]) if len(rest) == 3 else (None, None, rest[0])


def _sigmoid(xp, v):
    return 1.0 / (1.0 + xp.exp(-v))


def _steps(n: int, reverse: bool) -> range:
    return range(n - 1, -1, -1) if reverse else range(n)


def _input_gates(xp, x, w_ih, b_ih, b_hh):
    """``x w_ih^T (+ b_ih + b_hh)`` for every step at once: (T, B, 4H)."""
    pre = xp.matmul(x, xp.permute_dims(w_ih, (1, 0)))
    return pre if b_ih is None else pre + (b_ih + b_hh)


def _split(xp, gates, hidden: int) -> tuple:
    """The activated gates ``sigmoid(i), sigmoid(f), tanh(g), sigmoid(o)`` of pre-activations (..., 4H)."""
    i, f, g, o = (gates[..., k * hidden:(k + 1) * hidden] for k in range(4))
    return _sigmoid(xp, i), _sigmoid(xp, f), xp.tanh(g), _sigmoid(xp, o)


def _lstm_kernel(xp, x, h0, c0, w_ih, w_hh, *rest):
    """One step at a time (float16/bfloat16 in float32)."""
    b_ih, b_hh, a = _parts(rest)
    wx, h, c, wi, wh = (accumulated(xp, t) for t in (x, h0, c0, w_ih, w_hh))
    wb = None if b_ih is None else [accumulated(xp, b) for b in (b_ih, b_hh)]
    pre = _input_gates(xp, wx, wi, *(wb or (None, None)))
    whT, hidden, ys = xp.permute_dims(wh, (1, 0)), h.shape[1], [None] * x.shape[0]
    for t in _steps(x.shape[0], a.reverse):
        i, f, g, o = _split(xp, pre[t] + xp.matmul(h, whT), hidden)
        c = f * c + i * g
        h = o * xp.tanh(c)
        ys[t] = h
    y = xp.stack(ys, axis=0) if ys else xp.zeros(x.shape[:2] + (hidden,), dtype=h.dtype)
    return tuple(xp.astype(v, x.dtype) if v.dtype != x.dtype else v for v in (y, h, c))


def _lstm_grad_kernel(xp, gy, gh, gc, x, h0, c0, w_ih, w_hh, y, *rest):
    """Backpropagation through time from the hidden states ``y``: the gates of all steps from two GEMMs, the cell
    states in one pass per step, then the sweep back (one small GEMM per step) and the weights' GEMMs."""
    b_ih, b_hh, a = _parts(rest)
    wgy, dh, dc, wx, wh0, wc0, wi, wh, wy = (accumulated(xp, t) for t in (gy, gh, gc, x, h0, c0, w_ih, w_hh, y))
    wb = None if b_ih is None else [accumulated(xp, b) for b in (b_ih, b_hh)]
    n, hidden = x.shape[0], h0.shape[1]
    order = list(_steps(n, a.reverse))
    # the state each step starts from: h0 for the first step run, else the previous step's output
    prev = [None] * n
    for k, t in enumerate(order):
        prev[t] = wh0 if k == 0 else wy[order[k - 1]]
    h_prev = xp.stack(prev, axis=0) if n else xp.zeros(wy.shape, dtype=wy.dtype)
    pre = _input_gates(xp, wx, wi, *(wb or (None, None))) + xp.matmul(h_prev, xp.permute_dims(wh, (1, 0)))
    i, f, g, o = _split(xp, pre, hidden)
    ig, cs, c = i * g, [None] * n, wc0
    c_prev = [None] * n
    for t in order:
        c_prev[t] = c
        c = f[t] * c + ig[t]
        cs[t] = c
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
    return tuple(xp.astype(v, x.dtype) if v.dtype != x.dtype else v for v in grads)


# ------------------------------------------------------------------ torch: oneDNN's fused layer, as eager runs it

_LSTM_MODE = 2  # oneDNN's rnn kind for an LSTM (ideep::rnn_kind::LSTM), as ATen passes it


def _onednn(x) -> bool:
    """Whether ATen's oneDNN RNN layer takes ``x`` (eager's condition: CPU, float32 or bfloat16, oneDNN on)."""
    import torch

    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and x.numel() > 0
            and torch._C._get_mkldnn_enabled())


def _onednn_layer(x, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse: bool, train: bool):
    """``mkldnn_rnn_layer``: (y, h_T, c_T, workspace); zero biases where the layer has none (ATen's own way)."""
    import torch

    biases = (b_ih, b_hh) if b_ih is not None else (w_ih.new_zeros(w_ih.shape[0]), w_hh.new_zeros(w_hh.shape[0]))
    return torch.ops.aten.mkldnn_rnn_layer.default(
        x.contiguous(), w_ih, w_hh, *biases, h0.contiguous(), c0.contiguous(), reverse, [], _LSTM_MODE,
        h0.shape[1], 1, b_ih is not None, False, False, train)


# A layer's forward on torch runs under autograd (oneDNN's training forward, which keeps its gates in a workspace)
# and its graph waits here for the gradient, keyed by the hidden states ``y`` it gave: ``nn.lstm_grad`` is given
# that ``y`` and runs oneDNN's backward from the graph, as eager does, instead of the forward again. An entry goes
# when its gradient takes it or when ``y`` is freed (a program that never asks for the gradient keeps nothing).
# The gradient takes it only for the same ``y`` and operands of the same values: the forward's own tensors
# unchanged since (version counters), each the tensor given or equal to it (a backward program may compute its
# copy of a cheap operand again: zero initial states, a transposed input).
_TAPES: dict = {}


def _key(y) -> tuple:
    return y.data_ptr(), tuple(y.shape), tuple(y.stride())


def _forget(key, ref) -> None:
    if _TAPES.get(key, (None,))[0] is ref:
        del _TAPES[key]


def _lstm_torch(x, h0, c0, w_ih, w_hh, *rest):
    """oneDNN's fused layer (eager's kernel) where ATen takes it, its graph kept for the gradient; else the shared
    kernel."""
    import torch

    b_ih, b_hh, a = _parts(rest)
    if not _onednn(x):
        from .registry import array_namespace

        return _lstm_kernel(array_namespace("torch"), x, h0, c0, w_ih, w_hh, *rest)
    leaves = [t.detach().requires_grad_() for t in (x, h0, c0, w_ih, w_hh) + (() if b_ih is None else (b_ih, b_hh))]
    with torch.enable_grad():
        *out, workspace = _onednn_layer(*leaves[:5], *(leaves[5:] or (None, None)), a.reverse, True)
    y, h, c = (t.detach() for t in out)
    key = _key(y)
    ref = weakref.ref(y, lambda r, k=key: _forget(k, r))
    _TAPES[key] = (ref, [t._version for t in leaves + [y]], a.reverse, out, leaves, workspace)
    return y, h, c


def tie(y, holder) -> None:
    """Keep the graph of the forward that gave ``y`` while ``holder`` lives (instead of while ``y`` does): the
    NumPy array on ``y``'s memory that the numpy target hands on (``runtime.aten_on_numpy``), ``y`` itself being a
    tensor that dies with the call."""
    key = _key(y)
    entry = _TAPES.get(key)
    if entry is not None:
        _TAPES[key] = (weakref.ref(holder, lambda r, k=key: _forget(k, r)),) + entry[1:]


def taped_tensors() -> list:
    """The tensors the kept graphs hold for their gradients (``_TAPES``: operands, results, oneDNN's workspace),
    what a forward keeps for its backward besides a program's own residuals (``bench/torch_train.py`` counts
    them)."""
    return [t for entry in list(_TAPES.values()) for t in (*entry[3], *entry[4], entry[5])]


def _same(leaf, given) -> bool:
    import torch

    return leaf.data_ptr() == given.data_ptr() and leaf.stride() == given.stride() or torch.equal(leaf, given)


def _taped(y, operands: tuple, reverse: bool):
    """``(outputs, leaves)`` of the forward that gave ``y`` from operands equal to these, taken out of ``_TAPES``;
    or None."""
    entry = _TAPES.get(_key(y))
    if entry is None or entry[0]() is None:  # (alive, the forward's y holds this memory: the same values)
        return None
    del _TAPES[_key(y)]
    _, versions, was_reverse, out, leaves, _ = entry
    if was_reverse != reverse or [t._version for t in leaves + [y]] != versions or len(leaves) != len(operands) \
            or not all(_same(leaf, t) for leaf, t in zip(leaves, operands)):
        return None
    return out, leaves


def _lstm_grad_torch(gy, gh, gc, x, h0, c0, w_ih, w_hh, y, *rest):
    """oneDNN's backward (eager's) from the forward's graph (``_TAPES``), or after its forward again; the shared
    kernel where ATen's layer does not take the operands."""
    import torch

    b_ih, b_hh, a = _parts(rest)
    if not _onednn(x):
        from .registry import array_namespace

        return _lstm_grad_kernel(array_namespace("torch"), gy, gh, gc, x, h0, c0, w_ih, w_hh, y, *rest)
    operands = (x, h0, c0, w_ih, w_hh) + (() if b_ih is None else (b_ih, b_hh))
    taped = _taped(y, operands, a.reverse)
    with torch.enable_grad():
        if taped is None:
            leaves = [t.detach().requires_grad_() for t in operands]
            taped = _onednn_layer(*leaves[:5], *(leaves[5:] or (None, None)), a.reverse, True)[:3], leaves
        grads = torch.autograd.grad(taped[0], taped[1], (gy, gh, gc))
    return tuple(grads[:6])  # (the two biases' gradients are equal: one is given)


# ------------------------------------------------------------------ registration


def _lstm_grad_rule(call: Call, g: Expr):
    """``nn.lstm_grad`` from the hidden states the forward gave; a symbolic-zero cotangent becomes zeros."""
    cts = [nonzero(field(g, k)) for k in range(3)]
    if all(c is None for c in cts):
        return [None] * len(call.args)
    cts = [T.zeros_like(TupleGetItem(call, k)) if c is None else c for k, c in enumerate(cts)]
    x, h0, c0, w_ih, w_hh = call.args[:5]
    d = lstm_grad(*cts, x, h0, c0, w_ih, w_hh, TupleGetItem(call, 0), *call.args[5:], reverse=call.attrs.reverse)
    grads = [TupleGetItem(d, k) for k in range(5)]
    return grads + ([TupleGetItem(d, 5)] * 2 if len(call.args) == 7 else [])


def _per_step(v: Expr, n: int) -> list:
    """The ``n`` steps of a (T, ...) expression, each without its leading axis."""
    parts = split(v, n, axis=0)
    return [squeeze(TupleGetItem(parts, k), (0,)) for k in range(n)]


def _lstm_grad_expanded(call: Call) -> Expr:
    """``nn.lstm_grad`` step by step in differentiable operators (the shared kernel's arithmetic): what AD
    differentiates for second derivatives."""
    gy, gh, gc, x, h0, c0, w_ih, w_hh, y = call.args[:9]
    n = x.checked_type.shape[0]
    if n is Any:
        raise PullbackError("second derivatives of nn.lstm need a static sequence length (its steps are unrolled)")
    xs, ys, gys = (_per_step(v, n) for v in (x, y, gy))
    bias = E.add(*call.args[9:]) if len(call.args) == 11 else None
    order = list(_steps(n, call.attrs.reverse))
    prev, c_prev, cs, gates, c = {}, {}, {}, {}, c0
    for k, t in enumerate(order):
        prev[t] = h0 if k == 0 else ys[order[k - 1]]
        pre = E.add(dense(xs[t], w_ih), dense(prev[t], w_hh))
        parts = split(pre if bias is None else E.add(pre, bias), 4, axis=1)
        i, f, g, o = (fn(TupleGetItem(parts, j)) for j, fn in enumerate((E.sigmoid, E.sigmoid, E.tanh, E.sigmoid)))
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
    steps = range(n)
    rows = concatenate([dgates[t] for t in steps], axis=0)  # (T B, 4H)
    dx = stack([matmul(dgates[t], w_ih) for t in steps], axis=0)
    grads = [dx, dh, dc, matmul(rows, concatenate(xs, axis=0), True),
             matmul(rows, concatenate([prev[t] for t in steps], axis=0), True)]
    return Tuple(grads + ([R.sum(rows, (0,))] if bias is not None else []))


def _gemm_flops(arg_types, out_type, attrs, first: int = 0, factor: int = 1) -> int:
    x, h0 = arg_types[first], arg_types[first + 1]
    n = numel(x.shape[:2])
    if not n or x.shape[2] is Any:
        return 0
    hidden = h0.shape[1]
    return factor * 2 * n * 4 * hidden * (x.shape[2] + hidden) + 12 * n * hidden


def _lstm_flops(arg_types, out_type, attrs) -> int:
    return _gemm_flops(arg_types, out_type, attrs)


def _lstm_grad_flops(arg_types, out_type, attrs) -> int:
    return _gemm_flops(arg_types, out_type, attrs, first=3, factor=3)


lstm = defop(
    "nn.lstm", 5, _lstm_infer, kernel=_lstm_kernel, impls={"torch": _lstm_torch}, optional_inputs=2,
    attrs_type=LSTMAttrs, grad=_lstm_grad_rule, pattern=FusionKind.OPAQUE, dtypes=FLOAT_DTYPES, flops=_lstm_flops,
    torch_name="lstm",
    doc="``nn.lstm(x, h0, c0, w_ih, w_hh[, b_ih, b_hh], reverse=False)``: one direction of one LSTM layer over a "
        "(T, B, I) sequence, PyTorch's gates and weights; ``(y, h_T, c_T)``.")
lstm_grad = defop(
    "nn.lstm_grad", 9, _lstm_grad_infer, kernel=_lstm_grad_kernel, impls={"torch": _lstm_grad_torch},
    optional_inputs=2, attrs_type=LSTMAttrs, expand=_lstm_grad_expanded, pattern=FusionKind.OPAQUE, dtypes=FLOAT_DTYPES,
    flops=_lstm_grad_flops, torch_name="mkldnn_rnn_layer_backward",
    doc="Gradient of ``nn.lstm``: ``(y_grad, h_grad, c_grad, x, h0, c0, w_ih, w_hh, y[, b_ih, b_hh])`` -> "
        "``(dx, dh0, dc0, dw_ih, dw_hh[, db])`` (``db`` is both biases' gradient).")

__all__ = ["LSTMAttrs", "lstm", "lstm_grad", "taped_tensors", "tie"]
