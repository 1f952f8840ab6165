# ruff: noqa: B023  (closures are timed inside the loop iteration that defines them)
"""Prototype of the torch target (issue 14): pullback's ``@main_fwd`` / ``@main_bwd`` run on torch tensors
with ATen kernels, to measure what the real target (renovation issue) can reach before it exists.

The interpreter walks each function in topological order (``ir.traversal.post_order``), frees values
after their last use, and maps the hot operators to ATen (GEMMs, convolutions and their gradients,
softmax, layer_norm, gelu, batch norm, pooling, elementwise, reductions, layout). Any other operator runs
its NumPy kernel on zero-copy views (``t.numpy()`` / ``torch.from_numpy``) and is counted as a fallback.
The result is checked against the numpy target, then timed: the numpy target's executables vs this
interpreter on the same inputs, and a whole training step (torch tensors in and out, no conversions)
against eager PyTorch.

    PYTHONPATH=src .venv/bin/python bench/experiments/torch_target_proto.py [--only transformer,cnn] [--threads 2]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F
from common import add_common_args, median_ms, setup

from pullback.ir.expr import Call, Constant, Function, Tuple, TupleGetItem, Var
from pullback.ir.traversal import post_order
from pullback.ops.registry import OpDef

A = torch.ops.aten


def _shape(node):
    return tuple(node.checked_type.shape)


def _pad2(p, what):
    t, left, b, r = p
    if t != b or left != r:
        raise NotImplementedError(f"asymmetric {what} padding")
    return (t, left)


def _reduce(fn):
    def run(node, x):
        a = node.attrs
        if a.exclude:
            raise NotImplementedError("exclude")
        if a.axis is None:
            return fn(x, dim=tuple(range(x.ndim)), keepdim=a.keepdims) if a.keepdims else fn(x)
        return fn(x, dim=tuple(a.axis), keepdim=a.keepdims)
    return run


def _collapse_sum_to(node, x):
    shape = _shape(node)
    lead = x.ndim - len(shape)
    if lead:
        x = x.sum(dim=tuple(range(lead)))
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(dim=dims, keepdim=True) if dims else x


def _batch_norm(node, x, g, b, mm, mv):
    a = node.attrs
    if a.axis % x.ndim != 1 or not (a.scale and a.center):
        raise NotImplementedError("batch_norm layout")
    if a.training:
        out, _, _, new_mm, new_mv = A._native_batch_norm_legit_functional(x, g, b, mm, mv, True, a.momentum, a.epsilon)
        return out, new_mm, new_mv
    return F.batch_norm(x, mm, mv, g, b, False, 0.0, a.epsilon), mm, mv


def _max_pool(node, x):
    a = node.attrs
    return F.max_pool2d(x, a.pool_size, a.strides, _pad2(a.padding, "pool"), a.dilation, a.ceil_mode)


def _max_pool_grad(node, g, x):
    a = node.attrs
    p = _pad2(a.padding, "pool")
    _, idx = A.max_pool2d_with_indices(x, a.pool_size, a.strides, p, a.dilation, a.ceil_mode)  # a real target saves these
    return A.max_pool2d_with_indices_backward(g, x, a.pool_size, a.strides, p, a.dilation, a.ceil_mode, idx)


def _conv2d(node, x, w):
    a = node.attrs
    return F.conv2d(x, w, None, a.strides, _pad2(a.padding, "conv"), a.dilation, a.groups)


def _conv2d_transpose(node, g, w):
    a = node.attrs
    return F.conv_transpose2d(g, w, None, a.strides, _pad2(a.padding, "conv"), a.output_padding, a.groups, a.dilation)


def _conv2d_backward_weight(node, g, x):
    a = node.attrs
    w = torch.empty(_shape(node), dtype=g.dtype)  # only its shape is read
    return A.convolution_backward(g, x, w, None, list(a.strides), list(_pad2(a.padding, "conv")), list(a.dilation),
                                  False, [0, 0], a.groups, [False, True, False])[1]


def _batch_matmul(node, a, b):
    at = node.attrs
    return torch.matmul(a.transpose(-1, -2) if at.transpose_a else a, b.transpose(-1, -2) if at.transpose_b else b)


def _layer_norm(node, x, g, b):
    a = node.attrs
    if a.axis not in (-1, x.ndim - 1) or not (a.scale and a.center):
        raise NotImplementedError("layer_norm axis")
    return F.layer_norm(x, (x.shape[-1],), g, b, a.epsilon)


def _gelu(node, x):
    return F.gelu(x, approximate="none" if node.attrs.approximate == "none" else "tanh")


def _strided_slice(node, x):
    a = node.attrs
    axes = a.axes if a.axes is not None else tuple(range(len(a.begin)))
    idx = [slice(None)] * x.ndim
    for ax, b, e, s in zip(axes, a.begin, a.end, a.strides or (1,) * len(axes)):
        idx[ax] = slice(b, e, s)
    return x[tuple(idx)]


def _strided_set(node, x, v):
    a = node.attrs
    axes = a.axes if a.axes is not None else tuple(range(len(a.begin)))
    idx = [slice(None)] * x.ndim
    for ax, b, e, s in zip(axes, a.begin, a.end, a.strides or (1,) * len(axes)):
        idx[ax] = slice(b, e, s)
    out = x.clone()
    out[tuple(idx)] = v
    return out


TABLE = {
    "add": lambda n, a, b: a + b, "subtract": lambda n, a, b: a - b, "multiply": lambda n, a, b: a * b,
    "divide": lambda n, a, b: a / b, "power": lambda n, a, b: torch.pow(a, b), "greater": lambda n, a, b: a > b,
    "where": lambda n, c, a, b: torch.where(c, a, b), "exp": lambda n, x: torch.exp(x),
    "sqrt": lambda n, x: torch.sqrt(x), "erf": lambda n, x: torch.erf(x), "negative": lambda n, x: -x,
    "nn.relu": lambda n, x: torch.relu(x), "tanh": lambda n, x: torch.tanh(x),
    "nn.dense": lambda n, x, w: F.linear(x, w), "nn.batch_matmul": _batch_matmul,
    "nn.softmax": lambda n, x: torch.softmax(x, n.attrs.axis), "nn.log_softmax": lambda n, x: torch.log_softmax(x, n.attrs.axis),
    "nn.layer_norm": _layer_norm, "nn.gelu": _gelu, "nn.batch_norm": _batch_norm,
    "reshape": lambda n, x: x.reshape(_shape(n)), "expand_dims": lambda n, x: x.reshape(_shape(n)),
    "squeeze": lambda n, x: x.reshape(_shape(n)),
    "transpose": lambda n, x: x.permute(n.attrs.axes) if n.attrs.axes is not None else x.permute(*range(x.ndim - 1, -1, -1)),
    "broadcast_to": lambda n, x: x.expand(_shape(n)), "collapse_sum_to": _collapse_sum_to,
    "sum": _reduce(torch.sum), "mean": _reduce(torch.mean),
    "zeros": lambda n: torch.zeros(_shape(n), dtype=getattr(torch, n.checked_type.dtype)),
    "strided_slice": _strided_slice, "strided_set": _strided_set,
    "nn.conv2d": _conv2d, "nn.conv2d_transpose": _conv2d_transpose, "nn.conv2d_backward_weight": _conv2d_backward_weight,
    "nn.max_pool2d": _max_pool, "nn.max_pool2d_grad": _max_pool_grad,
    "nn.adaptive_avg_pool2d": lambda n, x: F.adaptive_avg_pool2d(x, n.attrs.output_size),
    "nn.adaptive_avg_pool2d_grad": lambda n, g, x: A._adaptive_avg_pool2d_backward(g, x),
    "nn.nll_loss": lambda n, x, t, w: F.nll_loss(x, t, w, reduction=n.attrs.reduction, ignore_index=n.attrs.ignore_index),
}


def _to_torch(v):
    if isinstance(v, tuple):
        return tuple(_to_torch(x) for x in v)
    a = np.asarray(v)
    return torch.from_numpy(a if a.flags.writeable and a.flags.c_contiguous else a.copy())


def _to_numpy(v):
    return tuple(_to_numpy(x) for x in v) if isinstance(v, tuple) else v.numpy()


class TorchFunction:
    """One pullback function compiled to a flat list of torch calls."""

    def __init__(self, fn: Function, fallbacks: Counter):
        order = [n for n in post_order(fn.body) if not isinstance(n, Var)]
        slot = {id(p): i for i, p in enumerate(fn.params)}
        for n in order:
            slot[id(n)] = len(slot)
        last: dict = {}
        for i, n in enumerate(order):
            for c in n.children():
                last[id(c)] = i
        self.code = []
        for i, n in enumerate(order):
            args = [slot[id(c)] for c in n.children()]
            frees = [slot[id(c)] for c in set(n.children()) if last.get(id(c)) == i and c is not fn.body]
            if isinstance(n, Call) and isinstance(n.op, OpDef):
                fn_ = TABLE.get(n.op.name)
                if fn_ is None:
                    fallbacks[n.op.name] += 1
                    k = n.op.impl("numpy")
                    fn_ = (lambda k: lambda node, *xs: _to_torch(k(*_to_numpy(xs), node.attrs)))(k)
                self.code.append((0, fn_, n, args, slot[id(n)], frees))
            elif isinstance(n, Constant):
                self.code.append((1, torch.from_numpy(np.array(n.data)), n, args, slot[id(n)], frees))
            elif isinstance(n, Tuple):
                self.code.append((2, None, n, args, slot[id(n)], frees))
            elif isinstance(n, TupleGetItem):
                self.code.append((3, n.index, n, args, slot[id(n)], frees))
            else:
                raise NotImplementedError(type(n).__name__)
        self.nslots = len(slot)
        self.result = slot[id(fn.body)]

    def __call__(self, *args, times: Counter | None = None):
        """Run on torch tensors; with ``times``, add each operator's seconds to it."""
        s = [None] * self.nslots
        s[: len(args)] = args
        for kind, f, n, a, out, frees in self.code:
            if kind == 0:
                t0 = time.perf_counter()
                s[out] = f(n, *[s[i] for i in a])
                if times is not None:
                    times[n.op.name] += time.perf_counter() - t0
            elif kind == 1:
                s[out] = f
            elif kind == 2:
                s[out] = tuple(s[i] for i in a)
            else:
                s[out] = s[a[0]][f]
            for i in frees:
                s[i] = None
        return s[self.result]


def _close(a, b):
    if isinstance(a, tuple):
        return all(_close(x, y) for x, y in zip(a, b))
    return np.allclose(np.asarray(a, dtype=np.float64), np.asarray(b.detach(), dtype=np.float64), rtol=1e-3, atol=1e-4)


def run(name: str, reps: int) -> None:
    import pullback.integrations.torch as pbt
    from pullback.testing.torch_models import make_workload

    wl = make_workload(name)
    model, inputs = wl.model, wl.example_inputs
    cm = pbt.compile(model, inputs)
    (tp,) = cm._programs.values()
    prog = tp.prog
    fallbacks: Counter = Counter()
    fwd, bwd = TorchFunction(tp.mod["main_fwd"], fallbacks), TorchFunction(tp.mod["main_bwd"], fallbacks)
    state = dict(model.named_parameters())
    state.update(model.named_buffers())
    tensors = [t.detach() for t in list(inputs) + [state[prog.state_names[n]] for n in prog.params]]
    np_in = [t.numpy() for t in tensors]
    with torch.inference_mode():
        out, res = fwd(*tensors)
        cts = tuple(torch.from_numpy(np.ones(t.shape, t.dtype) if "float" in t.dtype else np.zeros(t.shape, t.dtype))
                    for t in tp.out_types)
        ct = cts[0] if prog.single_output else cts
        grads = bwd(*res, ct)
    nout, nres = tp.fwd(*np_in)
    ngrads = tp.bwd(*nres, ct.numpy() if prog.single_output else tuple(c.numpy() for c in ct))
    ok = _close(nout, out) and _close(tuple(ngrads), tuple(grads))

    def torch_proto():
        with torch.inference_mode():
            o, r = fwd(*tensors)
            return bwd(*r, ct)

    npct = ct.numpy() if prog.single_output else tuple(c.numpy() for c in ct)

    def numpy_target():
        o, r = tp.fwd(*np_in)
        return tp.bwd(*r, npct)

    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def eager_step():
        opt.zero_grad(set_to_none=True)
        model(*inputs).backward()
        opt.step()

    t_np, t_proto, t_eager = median_ms(numpy_target, reps), median_ms(torch_proto, reps), median_ms(eager_step, reps)
    times: Counter = Counter()
    for _ in range(3):
        with torch.inference_mode():
            _, r = fwd(*tensors, times=times)
            bwd(*r, ct, times=times)
    top = ", ".join(f"{k} {v / 3 * 1e3:.1f}" for k, v in times.most_common(8))
    fb = ", ".join(f"{k} x{v}" for k, v in fallbacks.most_common()) or "none"
    print(f"{name:<12s} numpy target fwd+bwd {t_np:8.2f} ms | torch prototype fwd+bwd {t_proto:8.2f} ms | "
          f"eager step {t_eager:8.2f} ms | matches numpy target: {ok} | NumPy fallbacks: {fb}\n"
          f"{'':<13s}prototype per op (ms, total {sum(times.values()) / 3 * 1e3:.1f}): {top}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="transformer,bert,cnn,resnet")
    ap.add_argument("--reps", type=int, default=10)
    add_common_args(ap)
    args = ap.parse_args()
    setup(args)
    for name in args.only.split(","):
        run(name, args.reps)


if __name__ == "__main__":
    main()
