"""Custom ``torch.autograd.Function``s whose backward is not their forward's derivative, kept with that backward.

A straight-through estimator (round forward, identity backward), a gradient reversal or a clipped gradient
trains with the user's backward in eager PyTorch. torch.export keeps only a Function's forward, so the importer
routes each such Function (``custom_functions.mismatched`` finds them) through an opaque operator while exporting
again (``routed``): ``pullback_custom::fK(Tensor[] args) -> Tensor[]``, one per Function and non-tensor arguments.
Converting a call of it (``convert``) exports the Function's forward and a backward program on its own, at the
call's shapes, and adds them to the module:

- ``@Name(args...)``: the forward, with the attribute ``custom_vjp="Name_vjp"``;
- ``@Name_vjp(args..., cts...)``: runs the forward (for what it saves in ``ctx``), then the user's backward; it
  returns one gradient per tensor argument (zeros where the backward returns None). A forward output that is
  not floating point has no cotangent parameter.

``FirstOrderGradient`` calls ``@Name_vjp`` instead of differentiating ``@Name``; what the backward does not read
of the forward is dead code (a straight-through estimator saves nothing).
"""

from __future__ import annotations

import itertools
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from ..analysis.type_infer import infer_expr
from ..ir.errors import PullbackError
from ..ir.expr import CUSTOM_VJP, Call, Function, GlobalVar, Tuple, TupleGetItem
from ..ir.module import IRModule
from ..ir.types import Any
from ..ops.registry import get_op
from .custom_functions import StandInCtx

NAMESPACE = "pullback_custom"


@dataclass
class Route:
    """One opaque operator: the Function, its arguments with the tensors left out (``None`` in ``template``,
    their positions in ``slots``), and where it was first applied."""

    cls: type
    template: tuple
    slots: tuple
    where: str
    single: bool = True  # the forward returns one tensor (not a tuple): set when the operator first runs

    def merged(self, tensors) -> list:
        args = list(self.template)
        for i, t in zip(self.slots, tensors):
            args[i] = t
        return args

    def ctx(self) -> StandInCtx:
        """A fresh stand-in context: every tensor argument needs a gradient."""
        return StandInCtx(tuple(i in self.slots for i in range(len(self.template))))

    def forward(self, ctx, tensors):
        """The Function's forward as plain code on ``tensors`` (``ctx`` a stand-in context)."""
        import torch

        args = self.merged(tensors)
        if self.cls.setup_context is not torch.autograd.Function.setup_context:
            out = self.cls.forward(*args)
            self.cls.setup_context(ctx, tuple(args), out)
            return out
        return self.cls.forward(ctx, *args)


_ROUTES: dict[str, Route] = {}  # operator name -> route
_KEYS: dict[tuple, str] = {}  # (class, non-tensor arguments) -> operator name
_counter = itertools.count()
_library = None


def _outputs(out, name: str) -> list:
    import torch

    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not all(isinstance(o, torch.Tensor) for o in outs):
        raise PullbackError(f"from_torch: custom Function {name}'s forward returns {type(out).__name__} values other "
                            "than tensors; pullback keeps a Function's own backward only for tensor results")
    return outs


def _operator(cls, args: tuple, where: str) -> str:
    """The opaque operator for ``cls`` applied to ``args`` (registered on first use)."""
    global _library
    import torch

    slots = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
    template = tuple(None if i in slots else a for i, a in enumerate(args))
    for a in template:
        if isinstance(a, (list, tuple, dict)) and any(isinstance(v, torch.Tensor) for v in a):
            raise PullbackError(f"from_torch: custom Function {cls.__qualname__} (applied at {where}) takes tensors "
                                "inside a list; pullback keeps a Function's own backward only for tensor arguments")
    try:
        key = (cls, template)
        hash(key)
    except TypeError:  # an unhashable setting: a fresh operator for this use
        key = (cls, next(_counter))
    name = _KEYS.get(key)
    if name is not None:
        return name
    if _library is None:
        _library = torch.library.Library(NAMESPACE, "FRAGMENT")
    name = f"f{next(_counter)}"
    route = _ROUTES[name] = Route(cls, template, slots, where)
    _KEYS[key] = name

    def run(tensors):  # what the operator computes: the forward, outputs never aliasing inputs
        with torch.no_grad():
            out = route.forward(route.ctx(), tensors)
        route.single = not isinstance(out, (tuple, list))
        return [o.clone() for o in _outputs(out, cls.__qualname__)]

    _library.define(f"{name}(Tensor[] args) -> Tensor[]")
    _library.impl(name, run, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", lib=_library)(run)
    return name


@contextmanager
def routed(classes) -> Iterator[None]:
    """While exporting, each Function of ``classes`` applied becomes a call of its opaque operator."""
    import torch

    base = torch.autograd.Function
    original = base.__dict__["apply"]

    def apply(cls, *args, **kwargs):
        if cls not in classes or kwargs:
            return original.__func__(cls, *args, **kwargs)
        caller = sys._getframe(1)
        name = _operator(cls, args, f"{caller.f_code.co_filename}:{caller.f_lineno}")
        route = _ROUTES[name]
        outs = getattr(getattr(torch.ops, NAMESPACE), name)([args[i] for i in route.slots])
        return outs[0] if route.single else tuple(outs)

    base.apply = classmethod(apply)
    try:
        yield
    finally:
        base.apply = original


def _examples(vals) -> tuple[list, list]:
    """Tensors of the shapes and dtypes of the (fake) values ``vals`` (random floats: the values do not matter),
    a symbolic batch (dimension 0) at its example size, and per tensor whether its batch is symbolic."""
    import torch

    from .context import static_dim

    gen = torch.Generator().manual_seed(0)
    out, batched = [], []
    for v in vals:
        shape = [static_dim(d) for d in v.shape]
        if any(d is Any for d in shape[1:]):
            raise PullbackError("from_torch: a custom Function whose backward pullback keeps takes a tensor with a "
                                f"dynamic size other than the batch (dimension 0): {tuple(v.shape)}")
        batched.append(bool(shape) and shape[0] is Any)
        if batched[-1]:
            shape[0] = max(2, int(getattr(v.shape[0].node, "hint", None) or 2))  # the example's batch size
        out.append(torch.randn(shape, generator=gen, dtype=v.dtype) if v.dtype.is_floating_point
                   else torch.zeros(shape, dtype=v.dtype))
    return out, batched


def _program(module, examples, batched: list, what: str):
    """The program of ``module`` imported on ``examples`` (constants for its own tensors; dimension 0 symbolic
    for the ``batched`` ones): a ``TorchProgram``, whose random draws become inputs after the examples."""
    from .torch_importer import import_torch

    prog = import_torch(module, tuple(examples), params_as="constants", dynamic_batch=batched if any(batched) else False)
    if prog.mutations:
        raise PullbackError(f"from_torch: {what} writes buffers; pullback keeps a custom Function's own backward "
                            "only for a forward without side effects")
    return prog


RECOMPUTING_BACKWARD = (
    "from_torch: the backward of {what} calls torch.autograd.{fn}: it runs autograd itself (a reversible layer or "
    "hand-written checkpointing recomputes the forward and differentiates it, writing the parameters' .grad as it "
    "goes), which pullback cannot keep as a program of its own. Train the model through "
    "torch.compile(model, backend=\"pullback\"): Dynamo leaves this Function to eager autograd and compiles the "
    "rest")


@contextmanager
def _differentiation_refused(what: str) -> Iterator[None]:
    """``torch.autograd.backward``, ``torch.autograd.grad`` and ``Tensor.backward`` raise, naming the Function,
    while a Function's backward is exported (torch.export's own error would name a lifted fake tensor)."""
    import torch

    def refuse(fn: str):
        def raiser(*args, **kwargs):
            raise PullbackError(RECOMPUTING_BACKWARD.format(what=what, fn=fn))

        return raiser

    saved = torch.autograd.backward, torch.autograd.grad, torch.Tensor.backward
    torch.autograd.backward, torch.autograd.grad = refuse("backward"), refuse("grad")
    torch.Tensor.backward = refuse("backward")
    try:
        yield
    finally:
        torch.autograd.backward, torch.autograd.grad, torch.Tensor.backward = saved


def _draw(m) -> tuple:
    """What a random input draws (its name aside)."""
    return (m.kind, m.shape, m.dtype, m.rate, m.params)


def convert(cx, name: str, tensors: list):
    """The call of custom Function operator ``name`` on ``tensors`` (pullback values), its forward and backward
    programs added to ``cx.functions``; a list of the results (one per output)."""

    route = _ROUTES.get(name)
    if route is None:
        raise PullbackError(f"from_torch: {NAMESPACE}::{name} is not an operator of this process")
    examples, batched = _examples([a.meta["val"] for a in cx.node.args[0]])
    outs = list(cx.val)
    key = (name, tuple((tuple(e.shape), e.dtype, b) for e, b in zip(examples, batched)))
    pair = cx.function_keys.get(key)
    if pair is None:  # one pair per operator and shapes (a quantizer in every layer: one pair)
        pair = cx.function_keys[key] = _pair(cx, route, examples, batched, outs)
    fwd_name, draws = pair
    # the forward's random draws are the program's, drawn here in eager's order, and passed to @F and its vjp
    drawn = [cx.random_input(m.kind, tuple(d if isinstance(d, int) else Any for d in m.shape), m.dtype, m.rate, m.stride,
                             m.params)
             for m in draws]
    call = Call(GlobalVar(fwd_name), list(tensors) + drawn)
    try:  # typed now: the converters after it ask
        infer_expr(call, IRModule({fwd_name: cx.functions[fwd_name]}))
    except PullbackError as e:  # e.g. torch.export fixed a batch the caller keeps dynamic
        raise PullbackError(f"from_torch: the forward of custom Function {route.cls.__qualname__} (applied at "
                            f"{route.where}) does not take its arguments' types: {e}") from e
    return [call] if route.single else [TupleGetItem(call, i) for i in range(len(outs))]


def _pair(cx, route: Route, examples: list, batched: list, outs: list) -> tuple:
    """Export ``route``'s forward and backward programs at the shapes of ``examples`` (a dynamic batch for the
    ``batched`` ones) into ``cx.functions``; returns the forward's name and its random draws (``RandomInput``s,
    parameters of both functions after the arguments)."""
    import torch

    cls_name = route.cls.__qualname__.replace(".", "_").replace("<", "").replace(">", "")
    fwd_name = _fresh(cx, cls_name)
    bwd_name = fwd_name + "_vjp"
    floats = [i for i, o in enumerate(outs) if o.dtype.is_floating_point]

    class Forward(torch.nn.Module):
        def forward(self, *ts):
            return route.forward(route.ctx(), list(ts))

    class Backward(torch.nn.Module):
        def forward(self, *ts):
            xs, cts = list(ts[:len(examples)]), ts[len(examples):]
            ctx = route.ctx()
            out = _outputs(route.forward(ctx, xs), route.cls.__qualname__)
            full = [torch.zeros_like(o) for o in out]  # what autograd passes for a non-differentiable result
            for i, c in zip(floats, cts):
                full[i] = c
            with _differentiation_refused(what):
                grads = route.cls.backward(ctx, *full)
            grads = list(grads) if isinstance(grads, (tuple, list)) else [grads]
            return tuple(grads[i] if i < len(grads) and grads[i] is not None else torch.zeros_like(x)
                         for i, x in zip(route.slots, xs))

    what = f"custom Function {route.cls.__qualname__} (applied at {route.where})"
    fwd_prog = _program(Forward(), examples, batched, what)
    cts, ct_batched = _examples([outs[i] for i in floats])
    bwd_prog = _program(Backward(), examples + cts, batched + ct_batched, what)
    fwd, bwd, draws = fwd_prog.main, bwd_prog.main, fwd_prog.masks
    if [_draw(m) for m in bwd_prog.masks] != [_draw(m) for m in draws]:
        raise PullbackError(f"from_torch: the backward of {what} draws random numbers of its own; pullback keeps a "
                            "custom Function's own backward when only its forward draws")
    body = fwd.body if route.single or len(outs) > 1 else Tuple([fwd.body])  # a 1-tuple the importer unpacked
    cx.functions[fwd_name] = Function(fwd.params, body, None, {CUSTOM_VJP: bwd_name})
    # the vjp takes @F's parameters (the arguments, then the draws), then the cotangents; it returns one gradient
    # per parameter, always a tuple (the importer makes a single result the body itself): zeros for the draws
    n, k = len(examples), len(cts)
    xs, ct_params, drawn = bwd.params[:n], bwd.params[n:n + k], bwd.params[n + k:]
    grads = list(bwd.body.fields) if len(route.slots) > 1 else [bwd.body]
    grads += [get_op("zeros_like")(d) for d in drawn]
    cx.functions[bwd_name] = Function(list(xs) + list(drawn) + list(ct_params), Tuple(grads))
    return fwd_name, draws


def _fresh(cx, base: str) -> str:
    name, k = base, 0
    while name in cx.functions or name == "main":
        k += 1
        name = f"{base}_{k}"
    return name


__all__ = ["routed", "convert", "NAMESPACE"]
