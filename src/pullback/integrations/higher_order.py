"""Gradients of gradients through a compiled module: ``create_graph=True``, gradient penalties, Hessians.

The compiled module's usual backward runs ``@main_bwd`` on the forward's residuals: one program, fast, but
not itself differentiable. When autograd asks for a differentiable gradient (the backward runs in grad mode),
the gradient is instead a ``DifferentiableProgram``: the vector-Jacobian product of ``@main``
(``FirstOrderGradient(mode="vjp")``), a program of the inputs and the cotangents, run by an autograd Function
whose own backward is the VJP of that program, and so on: every order is pullback's AD applied to the program
of the order below, built on first use and kept (per set of inputs that need a gradient).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from ..analysis.tracking import tracked_children
from ..ir.expr import Call, Function, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.traversal import post_order, transform
from ..ir.types import TupleType, flatten_type, is_inexact
from ..transform import standard_cleanup
from ..transform.eliminate_identity import uniform_value
from ..transform.first_order_gradient import differentiate
from .bridges import BRIDGES, build_for


def structural_zeros(body) -> frozenset:
    """Positions of the gradient tuple ``body`` that are evidently zero (a zeros fill or constant): gradients
    that do not depend on the input at all, left None as eager leaves them."""
    fields = body.fields if isinstance(body, Tuple) else (body,)
    return frozenset(k for k, f in enumerate(fields) if (u := uniform_value(f)) is not None and not u)


def tracked_sources(fn: Function, sources: Sequence[Var]) -> list[int]:
    """Per output of ``fn`` (its body's fields), a bit mask of the ``sources`` (bit ``k``: ``sources[k]``) that
    autograd would track into it (``analysis.tracked_children``: through zero gradients too, ``round``, ``sign``:
    eager gives those parameters a zero gradient, not None)."""
    bit = {v: 1 << k for k, v in enumerate(sources)}
    mask: dict = {}
    for node in post_order(fn.body):
        if node in mask:
            continue
        m = bit.get(node, 0) if isinstance(node, Var) else 0
        for c in tracked_children(node):
            m |= mask.get(c, 0)
        mask[node] = m
    body = fn.body
    return [mask[f] for f in (body.fields if isinstance(body, Tuple) else (body,))]


def cotangent_uses(fn: Function) -> list[int]:
    """Per field of the gradient tuple ``fn`` returns (``@main_bwd``: the residuals, then the outputs'
    cotangent, one tensor or a flat tuple), a bit mask of the outputs whose cotangents it reads (bit ``i``:
    output ``i``; all of them where the tuple is read whole or a local function is called). A gradient that
    reads only outputs autograd gave no gradient is left None, as eager leaves it."""
    ct = fn.params[-1]
    ty = ct.checked_type
    every = (1 << (len(ty.fields) if isinstance(ty, TupleType) else 1)) - 1
    mask: dict = {ct: every}
    for node in post_order(fn.body):
        if node in mask:
            continue
        if isinstance(node, TupleGetItem) and node.tuple_value is ct:
            mask[node] = 1 << node.index
        elif isinstance(node, Function) or isinstance(node, Call) and isinstance(node.op, Function):
            mask[node] = every
        else:
            m = 0
            for c in node.children():
                m |= mask.get(c, 0)
            mask[node] = m
    body = fn.body
    return [mask[f] for f in (body.fields if isinstance(body, Tuple) else (body,))]


def _structure(ty, leaves: list):
    """An expression of type ``ty`` made of the Vars ``leaves`` (consumed in order), rebuilding its tuples."""
    if not isinstance(ty, TupleType):
        return leaves.pop(0)
    return Tuple([_structure(f, leaves) for f in ty.fields])


def vjp_module(mod: IRModule, wrt: Sequence[int]) -> IRModule:
    """A module whose ``@main`` takes ``@main``'s parameters, then one cotangent per (flattened) result, and
    returns the flat tuple of the gradients of ``@main``'s parameters at positions ``wrt``."""
    main = mod["main"]
    grad = differentiate(mod, "main", [main.params[i] for i in wrt], mode="vjp")
    *params, ct = grad.params
    cts = [Var(f"ct{i}", t) for i, t in enumerate(flatten_type(ct.type_annotation))]
    body = transform(TupleGetItem(grad.body, 1), memo={id(ct): _structure(ct.type_annotation, list(cts))})
    out = mod.with_function("main", Function([*params, *cts], body))
    return standard_cleanup()(out)


class DifferentiableProgram:
    """``@main`` of ``mod`` on torch tensors (flat inputs, flat results) through ``target``, differentiable any
    number of times (``differentiable_call``)."""

    def __init__(self, mod: IRModule, target: str):
        self.mod = mod
        self.target = target
        self.out_types = flatten_type(mod["main"].body.checked_type)
        self.zeros = structural_zeros(mod["main"].body)  # results that are evidently zero (as gradients: None)
        self._bridge = None
        self._vjps: dict = {}
        self._reads = None

    def run(self, tensors: Sequence) -> list:
        """The results as torch tensors (the program built on first use)."""
        if self._bridge is None:
            main = build_for(self.mod, self.target)["main"]
            single = not isinstance(self.mod["main"].body.checked_type, TupleType)
            self._bridge = BRIDGES[self.target](main, None, self.out_types, single)
        return self._bridge.infer(tensors)

    @property
    def reads(self) -> frozenset:
        """Positions of the parameters of ``@main`` its body reads, local functions included (the others' values
        do not matter)."""
        if self._reads is None:
            main = self.mod["main"]
            index = {p: i for i, p in enumerate(main.params)}
            self._reads = frozenset(index[n] for n in post_order(main.body, into_functions=True) if n in index)
        return self._reads

    def vjp(self, wrt: tuple) -> "DifferentiableProgram":
        """The program of the gradients w.r.t. the inputs at positions ``wrt`` (built on first use, kept)."""
        p = self._vjps.get(wrt)
        if p is None:
            p = self._vjps[wrt] = DifferentiableProgram(vjp_module(self.mod, wrt), self.target)
        return p

    def cotangents(self, grads: Sequence, shapes: Sequence) -> list:
        """The incoming gradients, zeros of the results' ``shapes`` where there is none (or the result is not a
        float), one per result."""
        import torch

        out = []
        for g, t, shape in zip(grads, self.out_types, shapes):
            dtype = getattr(torch, t.dtype)
            out.append(torch.zeros(shape, dtype=dtype) if g is None or not is_inexact(t.dtype) else g.to(dtype))
        return out


def differentiable_call(program: DifferentiableProgram, tensors: Sequence) -> tuple:
    """``program`` on ``tensors`` as a differentiable autograd node (its results have a ``grad_fn`` whose
    backward is ``program.vjp``, itself differentiable when run in grad mode)."""
    return _function().apply(program, *tensors)


def gradients(program: DifferentiableProgram, tensors: Sequence, shapes: Sequence, grads: Sequence,
              wrt: tuple) -> list:
    """The gradients w.r.t. ``tensors[i]`` for ``i`` in ``wrt`` of ``program`` on ``tensors``, given the incoming
    gradients ``grads`` of its results (of ``shapes``): differentiable (recorded by autograd) in grad mode,
    else plain tensors; None where the gradient is structurally zero (as eager leaves ``.grad``)."""
    import torch

    vjp = program.vjp(wrt)
    args = [*tensors, *program.cotangents(grads, shapes)]
    out = differentiable_call(vjp, args) if torch.is_grad_enabled() else vjp.run(args)
    return [None if k in vjp.zeros else g for k, g in enumerate(out)]


def wanted(ctx, needs: Sequence[bool]) -> list:
    """Per tensor input of the autograd Function whose backward is running (``needs``: its
    ``needs_input_grad`` entries for those inputs), whether this backward wants its gradient: the input
    requires grad and the engine will run its edge. ``torch.autograd.grad(y, x)`` runs only the edges towards
    ``x``, so the gradients of parameters it did not ask for are not computed (a gradient penalty on the
    input of a critic computes the input's gradient only, as eager does)."""
    import torch

    will = getattr(torch._C, "_will_engine_execute_node", None)
    edges = ctx.next_functions
    if will is None or len(edges) != len(needs):  # an older PyTorch, or inputs that are not all tensors
        return list(needs)
    out = []
    for need, (node, _) in zip(needs, edges):
        if need and node is not None:
            try:
                need = will(node)
            except RuntimeError:  # a leaf asked for by autograd.grad: the engine cannot say; it is wanted
                pass
        out.append(need)
    return out


@lru_cache(maxsize=None)
def _function():
    """The ``torch.autograd.Function`` (made on first use: ``import pullback`` never imports torch)."""
    import torch

    class DifferentiableFunction(torch.autograd.Function):
        """forward: a ``DifferentiableProgram``; backward: its VJP program (differentiable in grad mode)."""

        @staticmethod
        def forward(ctx, program: DifferentiableProgram, *tensors):
            results = program.run(tensors)
            ctx.program = program
            # only the inputs the program reads (its VJP reads no other): one written in place after the call
            # stops a backward only if that backward needs it, as in eager; the others' places are kept by a
            # stand-in of their shape and dtype (its values are never read)
            reads = program.reads
            ctx.save_for_backward(*(t if i in reads else None for i, t in enumerate(tensors)))
            ctx.unread = {i: (t.shape, t.dtype, t.device) for i, t in enumerate(tensors) if i not in reads}
            ctx.floating = [t.is_floating_point() for t in tensors]
            ctx.shapes = [r.shape for r in results]
            ctx.set_materialize_grads(False)
            nondiff = [r for r, t in zip(results, program.out_types) if not is_inexact(t.dtype)]
            if nondiff:
                ctx.mark_non_differentiable(*nondiff)
            return tuple(results)

        @staticmethod
        def backward(ctx, *grads):
            tensors = list(ctx.saved_tensors)
            for i, (shape, dtype, device) in ctx.unread.items():
                tensors[i] = torch.zeros((), dtype=dtype, device=device).expand(shape)
            n = len(tensors)
            needs = wanted(ctx, ctx.needs_input_grad[1:])
            wrt = tuple(i for i, (f, need) in enumerate(zip(ctx.floating, needs)) if need and f)
            full = [None] * n
            if wrt and any(g is not None for g in grads):
                for i, g in zip(wrt, gradients(ctx.program, tensors, ctx.shapes, grads, wrt)):
                    full[i] = g
            return (None, *full)

    return DifferentiableFunction


__all__ = ["DifferentiableProgram", "differentiable_call", "gradients", "structural_zeros", "vjp_module", "wanted"]
