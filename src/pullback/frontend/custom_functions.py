"""Custom ``torch.autograd.Function``s met while exporting.

torch.export keeps only a Function's forward: differentiating it is right when the backward is the forward's
derivative (Bloom's tanh-GELU, written as a Function to save memory), and then the forward imports as plain
operators that fuse with their neighbours. Otherwise (a straight-through estimator, a gradient reversal) the
user's backward must run: ``custom_vjp`` keeps it. ``recorded`` notes every Function applied while exporting
(class outside torch, where, the shapes it got); ``mismatched`` runs each once on random float64 inputs of those
shapes and compares its backward with autograd through its forward, naming each Function whose backward differs.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator



@dataclass
class Use:
    """The first application of a Function while exporting: where, and its arguments (tensors as
    ``(shape, dtype)``, other values as given)."""

    where: str
    args: tuple


@contextmanager
def recorded() -> Iterator[dict]:
    """Record ``class -> Use`` for the ``torch.autograd.Function`` subclasses outside torch applied inside."""
    import torch

    applied: dict = {}
    base = torch.autograd.Function
    original = base.__dict__["apply"]

    def apply(cls, *args, **kwargs):
        if not cls.__module__.startswith("torch.") and cls not in applied:
            caller = sys._getframe(1)
            specs = tuple((_static_shape(a), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
            applied[cls] = Use(f"{caller.f_code.co_filename}:{caller.f_lineno}", specs)
        return original.__func__(cls, *args, **kwargs)

    base.apply = classmethod(apply)
    try:
        yield applied
    finally:
        base.apply = original


def _static_shape(t) -> tuple:
    """The tensor's shape, a symbolic dimension taken as 3 (the check needs sizes, not the traced ones)."""
    return tuple(d if isinstance(d, int) else 3 for d in t.shape)


def mismatched(applied: dict) -> dict:
    """``class -> what differs`` for the recorded Functions whose backward is not autograd through their forward
    (or could not be compared with it)."""
    bad = {}
    for cls, use in applied.items():
        problem = _backward_mismatch(cls, use.args)
        if problem:
            bad[cls] = f"{cls.__qualname__} (applied at {use.where}: {problem})"
    return bad


class StandInCtx:
    """A stand-in ``ctx`` for calling a Function's forward (and backward) as plain code."""

    saved_tensors: tuple = ()

    def __init__(self, needs_input_grad: tuple = ()):
        self.needs_input_grad = needs_input_grad

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *args):
        pass

    def mark_dirty(self, *args):
        pass

    def set_materialize_grads(self, value):
        pass


def _backward_mismatch(cls, specs: tuple) -> str:
    """'' when ``cls``'s backward matches autograd through its forward on random inputs, else what differs."""
    import torch

    overridden = cls.setup_context is not torch.autograd.Function.setup_context
    return mismatch(lambda args: cls.apply(*args),
                    lambda args: cls.forward(*args) if overridden else cls.forward(StandInCtx(), *args), specs)


def mismatch(custom: Callable, plain: Callable, specs: tuple) -> str:
    """'' when ``custom(args)`` (run with the user's backward) and ``plain(args)`` (the forward as plain code,
    differentiated by autograd) give the same gradients on random float64 inputs built from ``specs`` (tensors
    as ``(shape, dtype)``, other values as given), else what differs."""
    import torch

    gen = torch.Generator().manual_seed(0)

    def inputs():
        out = []
        for s in specs:
            if isinstance(s, tuple) and len(s) == 2 and isinstance(s[1], torch.dtype):
                shape, dtype = s
                if dtype.is_floating_point:
                    out.append(torch.randn(shape, generator=gen, dtype=torch.float64).requires_grad_(True))
                else:
                    out.append(torch.zeros(shape, dtype=dtype))
            else:
                out.append(s)
        return out

    def run(fn, args):  # with the same draws each time; the user's generator is left as it was
        with torch.enable_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return _tensors(fn(args))

    def fresh(args):
        return [a.detach().requires_grad_(True) if isinstance(a, torch.Tensor) and a.requires_grad else a
                for a in args]

    try:
        args = inputs()
        outs_c = run(custom, args)
        cts = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs_c]
        wrt = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
        g_c = _grads(outs_c, cts, [args[i] for i in wrt])
        plain_args = fresh(args)
        try:
            g_p = _grads(run(plain, plain_args), cts, [plain_args[i] for i in wrt])
        except RuntimeError as e:  # an in-place write autograd cannot go back through (XSoftmax's masked_fill_)
            if "inplace operation" not in str(e):
                raise
            plain_args = fresh(args)
            g_p = _grads(run(torch.func.functionalize(plain), plain_args), cts, [plain_args[i] for i in wrt])
    except Exception as e:  # noqa: BLE001 - a Function that cannot run on float64 inputs is not checked: refused
        return f"its backward could not be compared with its forward on float64 inputs ({type(e).__name__}: {e})"
    for i, a, b in zip(wrt, g_c, g_p):
        if not torch.allclose(a, b, rtol=1e-5, atol=1e-7):
            return f"its backward differs from its forward's derivative for argument {i} by up to {float((a - b).abs().max()):.3g}"
    return ""


def _tensors(value) -> list:
    import torch

    values = list(value) if isinstance(value, (tuple, list)) else [value]
    while any(isinstance(v, (tuple, list)) for v in values):  # nested results (Dynamo's forward graphs)
        values = [w for v in values for w in (v if isinstance(v, (tuple, list)) else (v,))]
    return [v for v in values if isinstance(v, torch.Tensor) and v.dtype.is_floating_point]


def _grads(outs: list, cts: list, wrt: list) -> list:
    import torch

    pairs = [(o, c) for o, c in zip(outs, cts) if o.requires_grad]
    if not pairs:
        return [torch.zeros_like(w) for w in wrt]
    got = torch.autograd.grad([o for o, _ in pairs], wrt, [c for _, c in pairs], allow_unused=True)
    return [torch.zeros_like(w) if g is None else g for g, w in zip(got, wrt)]


__all__ = ["Use", "recorded", "mismatched", "mismatch", "StandInCtx"]
