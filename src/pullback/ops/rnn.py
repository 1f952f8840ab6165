"""What the recurrent layers share (``nn.lstm`` in ``lstm.py``, ``nn.gru`` in ``gru.py``, ``nn.rnn`` in ``elman.py``:
one direction of one layer over a whole (T, B, I) sequence, PyTorch's gates and weights): their definition
(``Layer``, ``define_layer``: type relations, torch kernels, gradient rule), the operands' checks, the steps' order,
and the graphs the torch target keeps between a layer's forward and its gradient.

A layer's gradient needs no saved gates: from the hidden states ``y`` its forward gave, every step's gates come back
in two GEMMs over the whole sequence, and the sweep back in time costs one small GEMM per step. On torch, a layer
runs eager's own kernel (oneDNN's fused LSTM layer, ATen's GRU and RNN) under autograd, and its graph waits in ``_TAPES``
for the gradient, keyed by the ``y`` it gave: the gradient operator, given that ``y``, runs eager's backward from
the graph (oneDNN keeps an LSTM's gates in a workspace), not the forward again. An entry goes when its gradient
takes it or when ``y`` is freed (a program that never asks for the gradient keeps nothing). The gradient takes it
only for operands of the same values: the forward's own tensors unchanged since (version counters), each the
tensor given or equal to it (a backward program may compute its copy of a cheap operand again: zero initial
states, a transposed input).
"""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass
from typing import Callable

from ..ir.expr import Expr, TupleGetItem
from ..ir.types import FLOAT_DTYPES, Any, TensorType, TupleType
from .common import numel, same_dtype, tensor_arg
from .kernels import accumulated
from . import layout as T
from .nn import check_bool, field, nonzero
from .registry import FusionKind, array_namespace, defop, type_error
from .shape import split, squeeze


@dataclass(frozen=True)
class RNNAttrs:
    """``reverse``: run the sequence from its last step to its first (the second direction of a bidirectional
    layer; ``y`` stays in the input's order)."""

    reverse: bool = False

    def __post_init__(self):
        check_bool(self, "reverse")


# ------------------------------------------------------------------ operands


def known_differ(a, b) -> bool:
    return a is not Any and b is not Any and a != b


def fits(t: TensorType, like: TensorType) -> bool:
    """Same rank, and no dimension known on both sides differs."""
    return t.ndim == like.ndim and not any(known_differ(a, b) for a, b in zip(t.shape, like.shape))


def operands(name: str, arg_types, counts: tuple, what: str) -> None:
    """``counts`` operands (without or with the two biases) of one dtype."""
    if len(arg_types) not in counts:
        raise type_error(name, arg_types, f"expects {what} and optionally b_ih, b_hh, got {len(arg_types)} operands")
    same_dtype(name, arg_types)


def check_layer(name: str, arg_types, first: int, gates: int, states: tuple) -> tuple:
    """``(x, h0, w_ih)`` types of the operands ``x, *states, w_ih, w_hh[, b_ih, b_hh]`` from position ``first``
    (``states``: their names, each (B, H)), each shape checked against the others; ``gates`` weight blocks of H
    rows."""
    x, *st, w_ih, w_hh = (tensor_arg(name, arg_types, first + i) for i in range(3 + len(states)))
    biases = [tensor_arg(name, arg_types, i) for i in range(first + 3 + len(states), len(arg_types))]
    if x.dtype not in FLOAT_DTYPES:
        raise type_error(name, arg_types, f"expects floating-point tensors, got {x.dtype}")
    layout = f"x (T, B, I), {' and '.join(states)} (B, H), w_ih ({gates}H, I), w_hh ({gates}H, H)"
    if x.ndim != 3 or any(s.ndim != 2 for s in st) or w_ih.ndim != 2 or w_hh.ndim != 2:
        raise type_error(name, arg_types, f"expects {layout}")
    h0, hidden = st[0], st[0].shape[1]
    if hidden is Any or w_ih.shape[0] is Any:
        raise type_error(name, arg_types, "needs a static hidden size")
    rows = gates * hidden
    ok = (all(s.shape == h0.shape for s in st) and not known_differ(x.shape[1], h0.shape[0]) and w_ih.shape[0] == rows
          and not known_differ(w_ih.shape[1], x.shape[2]) and w_hh.shape == (rows, hidden)
          and all(b.shape == (rows,) for b in biases))
    if not ok:
        got = ", ".join(str(t.shape) for t in arg_types[first:])
        raise type_error(name, arg_types, f"shapes {got} are not {layout} and biases ({gates}H,) with H = {hidden}")
    return x, h0, w_ih


def check_cotangents(name: str, arg_types, ys: tuple, states: tuple, y_type: TensorType, h0: TensorType) -> None:
    """The operands at positions ``ys`` have y's type, those at ``states`` h0's."""
    for positions, like, what in ((ys, y_type, "y's"), (states, h0, "h0's")):
        for i in positions:
            if not fits(arg_types[i], like):
                raise type_error(name, arg_types, f"operand {i} of shape {arg_types[i].shape} is not {what} {like.shape}")


def layer_infer(name: str, gates: int, states: tuple):
    """The type relation of a layer operator: operands ``x, *states, w_ih, w_hh[, b_ih, b_hh]``, results
    ``(y, *last states)``."""
    what = ", ".join(("x", *states, "w_ih", "w_hh"))

    def infer(arg_types, attrs):
        operands(name, arg_types, (3 + len(states), 5 + len(states)), what)
        x, h0, _ = check_layer(name, arg_types, 0, gates, states)
        return TupleType([TensorType(x.shape[:2] + h0.shape[1:], x.dtype)] + [TensorType(h0.shape, x.dtype)] * len(states))

    return infer


def gradient_infer(name: str, gates: int, states: tuple, bias_grads: int):
    """The type relation of a layer's gradient operator: operands ``y_grad, *state grads``, the layer's operands
    (without its biases), ``y``, the biases; results the gradients of the layer's operands (``bias_grads`` for the two
    biases: one where both get the same)."""
    s = len(states)
    y_at = 4 + 2 * s  # after the cotangents (1 + s) and the layer's operands (3 + s)
    what = ", ".join(("y_grad", *(f"{n[0]}_grad" for n in states), "x", *states, "w_ih", "w_hh", "y"))

    def infer(arg_types, attrs):
        operands(name, arg_types, (y_at + 1, y_at + 3), f"({what})")
        x, h0, w_ih = check_layer(name, arg_types[:y_at] + arg_types[y_at + 1:], 1 + s, gates, states)
        check_cotangents(name, arg_types, (0, y_at), tuple(range(1, 1 + s)), TensorType(x.shape[:2] + h0.shape[1:], x.dtype),
                         h0)
        grads = [x] + [h0] * s + [w_ih, TensorType(arg_types[y_at - 1].shape, x.dtype)]
        biases = [TensorType((w_ih.shape[0],), x.dtype)] * bias_grads if len(arg_types) == y_at + 3 else []
        return TupleType(grads + biases)

    return infer


def parts(rest: tuple) -> tuple:
    """``(b_ih, b_hh, attrs)`` from a kernel's operands after the weights (biases None when absent)."""
    return (rest[0], rest[1], rest[2]) if len(rest) == 3 else (None, None, rest[0])


# ------------------------------------------------------------------ steps


def sigmoid(xp, v):
    return 1.0 / (1.0 + xp.exp(-v))


def steps(n: int, reverse: bool) -> list:
    """The order in which the steps run."""
    return list(range(n - 1, -1, -1) if reverse else range(n))


def previous(order: list, h0, ys) -> list:
    """Per step (by position), the hidden state it starts from: ``h0`` for the first step run, else the output of
    the step run before it."""
    prev = [None] * len(order)
    for k, t in enumerate(order):
        prev[t] = h0 if k == 0 else ys[order[k - 1]]
    return prev


def input_gates(xp, x, w_ih, b):
    """``x w_ih^T (+ b)`` for every step at once: (T, B, gates H)."""
    pre = xp.matmul(x, xp.permute_dims(w_ih, (1, 0)))
    return pre if b is None else pre + b


def bias_sum(xp, b_ih, b_hh):
    """``b_ih + b_hh`` (in the kernels' precision), or None for a layer without biases."""
    return None if b_ih is None else accumulated(xp, b_ih) + accumulated(xp, b_hh)


def per_step(v: Expr, n: int) -> list:
    """The ``n`` steps of a (T, ...) expression, each without its leading axis (for expansions)."""
    pieces = split(v, n, axis=0)
    return [squeeze(TupleGetItem(pieces, k), (0,)) for k in range(n)]


def rounded(xp, values, like) -> tuple:
    """Each value in ``like``'s dtype (kernels compute float16/bfloat16 in float32)."""
    return tuple(xp.astype(v, like.dtype) if v.dtype != like.dtype else v for v in values)


# ------------------------------------------------------------------ torch: eager's kernels, their graphs kept

_TAPES: dict = {}
Runner = Callable[[list, bool], tuple]  # (leaves, reverse) -> (differentiable results, other tensors they keep)


def aten_runner(name: str, states: int) -> Runner:
    """A ``Runner`` of ATen's one-layer ``name`` (``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``: eager's kernels), the
    reversed direction over the flipped sequence."""

    def run(leaves: list, reverse: bool) -> tuple:
        import torch

        x, *rest = leaves
        hx, weights = [s[None] for s in rest[:states]], rest[states:]
        y, *last = getattr(torch, name)(x.flip(0) if reverse else x, hx if states > 1 else hx[0], weights,
                                        len(weights) > 2, 1, 0.0, True, False, False)
        return ((y.flip(0) if reverse else y), *(h[0] for h in last)), ()

    return run


def eager_dtype(x) -> bool:
    """Eager's ATen RNN kernels take ``x`` (float32, float64); other dtypes run the shared kernel."""
    import torch

    return x.dtype in (torch.float32, torch.float64)


def _key(y) -> tuple:
    return y.data_ptr(), tuple(y.shape), tuple(y.stride())


def _forget(key, ref) -> None:
    if _TAPES.get(key, (None,))[0] is ref:
        del _TAPES[key]


def taped_forward(tensors: tuple, run: Runner, reverse: bool) -> tuple:
    """``run`` on ``tensors`` under autograd, its graph kept for the gradient (``taped_gradients``); the results
    detached."""
    import torch

    leaves = [t.detach().requires_grad_() for t in tensors]
    with torch.enable_grad():
        out, held = run(leaves, reverse)
    results = tuple(t.detach() for t in out)
    key = _key(results[0])
    ref = weakref.ref(results[0], lambda r, k=key: _forget(k, r))
    _TAPES[key] = (ref, [t._version for t in leaves + [results[0]]], reverse, out, leaves, held)
    return results


def _same(leaf, given) -> bool:
    import torch

    return leaf.data_ptr() == given.data_ptr() and leaf.stride() == given.stride() or torch.equal(leaf, given)


def _taped(y, tensors: tuple, reverse: bool):
    """``(outputs, leaves)`` of the forward that gave ``y`` from operands equal to ``tensors``, taken out of
    ``_TAPES``; or None."""
    key = _key(y)
    entry = _TAPES.get(key)
    if entry is None or entry[0]() is None:  # (alive, the forward's y holds this memory: the same values)
        return None
    del _TAPES[key]
    _, versions, was_reverse, out, leaves, _ = entry
    if was_reverse != reverse or [t._version for t in leaves + [y]] != versions or len(leaves) != len(tensors) \
            or not all(_same(leaf, t) for leaf, t in zip(leaves, tensors)):
        return None
    return out, leaves


def taped_gradients(y, tensors: tuple, cotangents: tuple, run: Runner, reverse: bool) -> tuple:
    """The gradients of ``tensors`` (a layer's operands) for ``cotangents`` of its results: eager's backward from
    the graph ``taped_forward`` kept for ``y``, or after ``run`` again."""
    import torch

    taped = _taped(y, tensors, reverse)
    with torch.enable_grad():
        if taped is None:
            leaves = [t.detach().requires_grad_() for t in tensors]
            taped = run(leaves, reverse)[0], leaves
        return torch.autograd.grad(taped[0], taped[1], cotangents)


def torch_layer(kernel: Callable, runner: Callable) -> Callable:
    """The torch kernel of a layer operator: eager's kernel (``runner(x, attrs)``, a ``Runner``, or None where eager's
    kernels do not take the operands) under autograd, its graph kept for the gradient; else the shared ``kernel``."""

    def run(*args):
        *tensors, a = args
        fn = runner(tensors[0], a)
        if fn is None:
            return kernel(array_namespace("torch"), *args)
        return taped_forward(tuple(tensors), fn, a.reverse)

    return run


def torch_gradient(kernel: Callable, runner: Callable, states: int, bias_grads: int) -> Callable:
    """The torch kernel of a layer's gradient operator: eager's backward from the forward's kept graph, or after
    its forward again (``runner`` as ``torch_layer``'s); else the shared ``kernel``. ``bias_grads``: 1 where both
    biases get one gradient (given once)."""

    def run(*args):
        *tensors, a = args
        cts, layer = tensors[:1 + states], tensors[1 + states:]
        fn = runner(layer[0], a)
        if fn is None:
            return kernel(array_namespace("torch"), *args)
        y, operands = layer[3 + states], layer[:3 + states] + layer[4 + states:]
        grads = taped_gradients(y, tuple(operands), tuple(cts), fn, a.reverse)
        return tuple(grads[:len(grads) - 1] if bias_grads == 1 and len(operands) > 3 + states else grads)

    return run


def tie(y, holder) -> None:
    """Keep the graph of the forward that gave ``y`` while ``holder`` lives (instead of while ``y`` does): the
    NumPy array on ``y``'s memory that the numpy target hands on (``runtime.aten_on_numpy``), ``y`` itself being a
    tensor that dies with the call."""
    key = _key(y)
    entry = _TAPES.get(key)
    if entry is not None:
        _TAPES[key] = (weakref.ref(holder, lambda r, k=key: _forget(k, r)),) + entry[1:]


def taped_tensors() -> list:
    """The tensors the kept graphs hold for their gradients (operands, results, oneDNN's workspace): what a
    forward keeps for its backward besides a program's own residuals (``bench/torch_train.py`` counts them)."""
    return [t for entry in list(_TAPES.values()) for t in (*entry[3], *entry[4], *entry[5])]


# ------------------------------------------------------------------ registration


def gemm_flops(arg_types, first: int, gates: int, factor: int) -> int:
    """A layer's GEMMs (``factor`` passes over its weights) and its gates' arithmetic."""
    x, h0 = arg_types[first], arg_types[first + 1]
    n = numel(x.shape[:2])
    if not n or x.shape[2] is Any:
        return 0
    hidden = h0.shape[1]
    return factor * 2 * n * gates * hidden * (x.shape[2] + hidden) + 3 * gates * n * hidden


@dataclass(frozen=True)
class Layer:
    """What defines a recurrent layer operator: its ``states`` (names of the (B, H) initial states), weight blocks
    (``gates``), how many bias gradients its gradient gives (``bias_grads``: 1 where both biases get the same), the
    shared ``kernel`` and ``grad_kernel`` (``xp``), ``runner(x, attrs)`` (eager's kernel on torch, or None), the
    gradient's ``expand``, ATen's names of the two, their docs, and the attributes' type."""

    states: tuple
    gates: int
    bias_grads: int
    kernel: Callable
    grad_kernel: Callable
    runner: Callable
    expand: Callable
    torch_names: tuple
    docs: tuple
    attrs_type: type = RNNAttrs


def _rule(layer: Layer, gradient: Callable) -> Callable:
    """The layer's gradient rule: its gradient operator (``gradient()``, registered after it) from the hidden states
    the forward gave; a symbolic-zero cotangent becomes zeros."""
    s, n = len(layer.states), 3 + len(layer.states)

    def rule(call, g):
        cts = [nonzero(field(g, k)) for k in range(1 + s)]
        if all(c is None for c in cts):
            return [None] * len(call.args)
        cts = [T.zeros_like(TupleGetItem(call, k)) if c is None else c for k, c in enumerate(cts)]
        d = gradient()(*cts, *call.args[:n], TupleGetItem(call, 0), *call.args[n:], **asdict(call.attrs))
        grads = [TupleGetItem(d, k) for k in range(n)]
        if len(call.args) > n:  # the biases
            grads += [TupleGetItem(d, n), TupleGetItem(d, n + layer.bias_grads - 1)]
        return grads

    return rule


def define_layer(name: str, layer: Layer) -> tuple:
    """Register a layer operator ``name`` (operands ``x``, the initial states, ``w_ih``, ``w_hh``, two optional
    biases; results ``(y, *last states)``) and its gradient ``name_grad`` (the cotangents, the layer's operands,
    ``y``, the biases; results the operands' gradients)."""
    s = len(layer.states)
    n, common = 3 + s, dict(optional_inputs=2, attrs_type=layer.attrs_type, pattern=FusionKind.OPAQUE, dtypes=FLOAT_DTYPES)
    ops: dict = {}
    ops["layer"] = defop(
        name, n, layer_infer(name, layer.gates, layer.states), kernel=layer.kernel,
        impls={"torch": torch_layer(layer.kernel, layer.runner)}, grad=_rule(layer, lambda: ops["grad"]),
        flops=lambda ts, out, a: gemm_flops(ts, 0, layer.gates, 1), torch_name=layer.torch_names[0], doc=layer.docs[0],
        **common)
    ops["grad"] = defop(
        f"{name}_grad", 2 * n - 1, gradient_infer(f"{name}_grad", layer.gates, layer.states, layer.bias_grads),
        kernel=layer.grad_kernel, impls={"torch": torch_gradient(layer.grad_kernel, layer.runner, s, layer.bias_grads)},
        expand=layer.expand, flops=lambda ts, out, a: gemm_flops(ts, n - 2, layer.gates, 3),
        torch_name=layer.torch_names[1], doc=layer.docs[1], **common)
    return ops["layer"], ops["grad"]


__all__ = ["RNNAttrs", "Layer", "aten_runner", "define_layer", "eager_dtype", "gemm_flops", "taped_forward", "taped_gradients", "taped_tensors", "tie"]
