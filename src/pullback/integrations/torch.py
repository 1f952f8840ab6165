"""Train PyTorch modules with pullback: ``compile(module, example_inputs)``.

The module is imported (``frontend.import_torch``), differentiated
(``FirstOrderGradient(mode="vjp")`` with respect to the float user inputs and the
parameters), cleaned (``standard_cleanup``), split by
``PartitionForwardBackward`` into ``@main_fwd`` / ``@main_bwd`` and built for
``target``. A ``torch.autograd.Function`` runs ``@main_fwd`` in its forward
(keeping the residuals) and ``@main_bwd`` in its backward, so any torch
optimizer trains the original module's parameters (the compiled module holds
the original as ``.module`` and shares its parameters).

The compiled module is called as the original (positional and keyword tensors; keywords that are not
tensors, e.g. ``use_cache=False``, are settings the program is specialised on) and returns ``forward``'s
structure (tensor, tuple, dict, Hugging Face ``ModelOutput``: ``structured``).

Per call: dropout masks are drawn with ``torch.empty(shape).bernoulli_(1 - p)``
(PyTorch's CPU dropout draws the same way), mutated buffers (batch norm's
running statistics) are written back, and a new program is compiled for a new
train/eval mode, input shape, set of keywords or settings (kept in a cache; with ``dynamic_batch=True`` one
program serves every batch size), for new ``requires_grad`` flags of the inputs and parameters (frozen
parameters get no gradient computed) and for grad mode: under ``torch.no_grad()`` only ``@main`` runs.

``target`` picks the executor; the default (``DEFAULT_TARGET``) is the fastest one installed, by the
measurements of ``bench/torch_train.py``: ``"torch"`` (ATen kernels on the tensors themselves) when the
``torch`` extra is installed, else ``"numpy"``; ``"jax"`` only when asked for.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from functools import lru_cache
from operator import attrgetter
from time import perf_counter
from typing import Optional, Sequence

from ..frontend.torch_checks import check_inputs
from ..frontend.torch_importer import TorchProgram, batch_range, export, import_exported, input_sizes, sizes_hold, tied_keys
from ..ir.errors import PullbackError
from ..ir.expr import Call, Expr, Tuple
from ..ir.types import flatten_type, is_inexact
from ..transform import FirstOrderGradient, PartitionForwardBackward, standard_cleanup
from .bridges import BRIDGES, build_for, version
from .higher_order import DifferentiableProgram, cotangent_uses, gradients, structural_zeros, tracked_sources, wanted
from .structure import StructureWatch, module_structure, structure_change

TARGETS = ("torch", "numpy", "jax")

# The default target: the first of these whose modules are installed, fastest first as measured by
# bench/torch_train.py (bench/experiments/REPORT.md): torch (ATen/oneDNN kernels on the tensors themselves,
# no copies; 1.1-1.6x faster than numpy per step on every workload); numpy (needs nothing beyond NumPy). jax
# is never the default: its XLA compile takes the first step past 3 s and its CPU convolutions are 4x eager's.
_PREFERENCE = (("torch", ("torch", "array_api_compat")), ("numpy", ()))


def default_target() -> str:
    """The fastest installed target (``_PREFERENCE``): ``"torch"`` when PyTorch and ``array_api_compat``
    (the ``torch`` extra) are installed, else ``"numpy"``."""
    import importlib.util

    for target, modules in _PREFERENCE:
        if all(importlib.util.find_spec(m) is not None for m in modules):
            return target
    return "numpy"


DEFAULT_TARGET = default_target()


class TrainingProgram:
    """An imported program with its built ``@main_fwd`` / ``@main_bwd``, run on torch tensors by a
    ``bridges.Bridge`` of the target; ``infer`` runs ``@main`` alone (built on first use) where no gradient
    is wanted (``torch.no_grad()``, or nothing in ``wrt`` requires grad). With ``wrt`` empty only ``infer`` runs.

    ``phases``: seconds per phase of compiling it, in order (``export`` and ``import`` when given by the
    caller, then ``AD``, ``cleanup``, ``partition``, ``build``: the executables and their plans)."""

    def __init__(self, prog: TorchProgram, wrt: Sequence[str], target: str = DEFAULT_TARGET, policy: str = "save_all",
                 phases: Optional[dict] = None):
        check_target(target, "pullback.integrations.torch")
        self.prog = prog
        self.target = target
        self.phases = lap = Phases(phases)
        params = prog.main.params
        names = [p.name_hint for p in params]
        self.wrt_index = [names.index(w) for w in wrt]
        self.out_types = flatten_type(prog.main.body.checked_type) if not prog.single_output else [prog.main.body.checked_type]
        self.state_keys = [prog.state_key(n) for n in prog.params]
        position = {k: i for i, k in enumerate(self.state_keys)}
        # each written-back state tensor's position among the state tensors (None: looked up by its key)
        self.mutated_state = [position.get(name) if kind != "input" else None for kind, name in prog.mutations]
        self._inference = self._differentiable = None
        self.mod = self.fwd = self.bwd = self.bridge = None
        self.no_path = frozenset()
        if wrt:
            self._build(wrt, policy, lap)

    def _build(self, wrt: Sequence[str], policy: str, lap: "Phases") -> None:
        prog, target = self.prog, self.target
        mod = lap("AD", FirstOrderGradient("main", wrt=list(wrt), mode="vjp")(prog.mod))
        mod = lap("cleanup", standard_cleanup()(mod))
        # min_cut prices recomputation with the target's costs
        self.mod = lap("partition", PartitionForwardBackward("main_grad", policy=policy, target=target)(mod))
        exe = build_for(self.mod, target)
        self.fwd, self.bwd = exe["main_fwd"], exe["main_bwd"]
        self.fwd.plan.ensure()
        lap("build", self.bwd.plan.ensure())
        # outputs autograd tracks: floats computed from a wrt input (not from constants alone, nor under no_grad),
        # other than a written-back value (a running mean returned: eager updates it under no_grad)
        sources = tracked_sources(prog.main, [prog.main.params[i] for i in self.wrt_index])
        body = prog.main.body
        fields = body.fields if isinstance(body, Tuple) else (body,)
        written = {_under_stop_gradient(f) for f in fields[prog.num_outputs:]}
        self.tracked_out = [is_inexact(t.dtype) and m != 0 and f not in written
                            for t, m, f in zip(self.out_types, sources, fields)]
        # per wrt position, the tracked outputs autograd's graph joins it to (through zero gradients too)
        joined = [sum(1 << j for j, m in enumerate(sources) if self.tracked_out[j] and m >> k & 1)
                  for k in range(len(self.wrt_index))]
        bwd = self.mod["main_bwd"]
        # wrt positions whose gradient is structurally zero and that no tracked output joins (the parameter does not
        # reach the loss, or only through no_grad paths or integer results): None, as eager leaves .grad (optimizers
        # then skip it: no weight decay); one joined only through zero gradients (``round``) gets zeros, as in eager
        self.no_path = frozenset(k for k in structural_zeros(bwd.body) if not joined[k])
        # per wrt position, the outputs whose gradients reach it: when autograd gives none to any of them (a
        # pooler output the loss does not use), the gradient is None, as eager leaves .grad (AdamW then neither
        # decays the weight nor moves its moments)
        self.reaches = [r | j for r, j in zip(cotangent_uses(bwd), joined)]
        # outputs whose cotangent the backward never propagates: integer/bool results and the written-back
        # buffers (under stop_gradient): their zero cotangents are made once, not every step
        inert = [i for i, f in enumerate(self.tracked_out) if not f or i >= prog.num_outputs]
        self.bridge = BRIDGES[target](self.fwd, self.bwd, self.out_types, prog.single_output, inert)

    def eager_layout(self, results: list) -> list:
        """``results`` with each user output that eager returns contiguous made so (a copy where it is not)."""
        for i in self.prog.contiguous_outputs:
            if not results[i].is_contiguous():
                results[i] = results[i].contiguous()
        return results

    def differentiable(self) -> DifferentiableProgram:
        """``@main`` as a program whose gradients are differentiable (``higher_order``), made on first use."""
        if self._differentiable is None:
            self._differentiable = DifferentiableProgram(self.prog.mod, self.target)
        return self._differentiable

    def wants_grad(self, tensors: Sequence) -> bool:
        """Whether a call on ``tensors`` records a gradient: grad mode is on and a ``wrt`` tensor requires grad."""
        import torch

        return self.bridge is not None and torch.is_grad_enabled() and any(tensors[i].requires_grad for i in self.wrt_index)

    def infer(self, tensors: Sequence) -> list:
        """``@main`` on ``tensors`` (no residuals, no autograd graph): all results as torch tensors."""
        import torch

        if self._inference is None:
            main = build_for(standard_cleanup()(self.prog.mod), self.target)["main"]
            self._inference = BRIDGES[self.target](main, None, self.out_types, self.prog.single_output)
        with torch.no_grad():
            return self._inference.infer(tensors)


def _under_stop_gradient(e: Expr) -> Expr:
    """``e`` without the ``stop_gradient`` calls around it."""
    while isinstance(e, Call) and getattr(e.op, "name", None) == "stop_gradient":
        e = e.args[0]
    return e


class Phases(dict):
    """Phase name -> seconds; ``lap(name, value)`` records the time since the previous lap (or since it was
    made) under ``name`` and returns ``value``, so ``x = lap("AD", ad(mod))`` times one phase."""

    def __init__(self, done: Optional[dict] = None):
        super().__init__(done or {})
        self.last = perf_counter()

    def __call__(self, name: str, value=None):
        now = perf_counter()
        self[name] = self.get(name, 0.0) + now - self.last
        self.last = now
        return value


def check_target(target: str, who: str) -> None:
    if target not in TARGETS:
        raise PullbackError(f"{who}: target must be one of {', '.join(TARGETS)}, got {target!r}")


def _untracked_apart(results, tracked_out) -> tuple:
    """``results`` with each output returned without a gradient a tensor of its own where the same tensor is also
    returned with one (``h.detach()`` beside ``h``): marking it non-differentiable would cut the other's gradient."""
    tracked = {id(r) for r, f in zip(results, tracked_out) if f}
    return tuple(r.detach() if not f and id(r) in tracked else r for r, f in zip(results, tracked_out))


@lru_cache(maxsize=None)
def _function():
    """The ``torch.autograd.Function`` (made on first use so ``import pullback`` never imports torch)."""
    import torch

    class PullbackFunction(torch.autograd.Function):
        """forward: ``@main_fwd`` (residuals kept for the backward); backward: ``@main_bwd``."""

        @staticmethod
        def forward(ctx, tp: TrainingProgram, call: tuple, *tracked):
            tensors, mutated = call  # every input in @main's order (``tracked``: those at ``tp.wrt_index``)
            bridge = tp.bridge
            results, residuals = bridge.forward(tensors)
            n = tp.prog.num_outputs
            ctx.out_shapes = [r.shape for r in results]  # concrete, also where the program's batch dim is ``?``
            if mutated:  # a residual sharing memory with a tensor the write-back overwrites keeps its value
                residuals = bridge.unalias(residuals, mutated)
                write_back(tp.prog, mutated, results[n:])
            # a result that is a view (of an input, a residual or another result: the torch target's reshapes)
            # would be a view "returned by a function that returns several", which autograd forbids to write in
            # place (``h[mask] = v`` after the call); detached, it is a tensor of its own on the same memory
            results = tp.eager_layout([r.detach() if r._is_view() else r for r in results[:n]])
            ctx.tp = tp
            ctx.set_materialize_grads(False)  # an output without a gradient: None, the bridge makes its zeros
            # the inputs too, for a differentiable backward (create_graph=True: higher_order), unless the call
            # overwrites some of them (written-back buffers). Not through save_for_backward: autograd would then
            # refuse every backward once an input is written in place after the call, also the first-order one,
            # which never reads them (eager saves only what its backward reads); their versions are checked when
            # a differentiable backward does read them
            ctx.inputs = None if mutated or tp.prog.mutations else _Versioned(tensors)
            if bridge.saves_tensors and _saved_tensor_hooks():  # the user's hooks (offloading) see each one
                ctx.save_for_backward(*residuals)
                ctx.residuals = _SAVED
            else:  # the backward's plan frees each after its last reader (autograd: each node's after it ran)
                ctx.residuals = list(residuals)
                ctx.viewed = bridge.viewed(residuals)
            if not all(tp.tracked_out[:n]):
                results = _untracked_apart(results, tp.tracked_out)
                ctx.mark_non_differentiable(*[r for r, f in zip(results, tp.tracked_out) if not f])
            return tuple(results)

        @staticmethod
        def backward(ctx, *grads):
            return run_backward(ctx, grads)

    def _backward(ctx, grads):
        """PullbackFunction's backward. Never traced by Dynamo: autograd runs it also inside a frame Dynamo
        evaluates (``torch.autograd.grad`` in a compiled module's forward, a gradient penalty), whose code Dynamo
        would otherwise compile as a graph of its own (the numpy and jax targets' conversions cannot be)."""
        tp = ctx.tp
        saved = ctx.saved_tensors
        needs = wanted(ctx, ctx.needs_input_grad[2:])
        given = sum(1 << j for j, g in enumerate(grads) if g is not None)
        reaches = tp.reaches
        wrt = [k for k in range(len(needs)) if needs[k] and reaches[k] & given and k not in tp.no_path]
        full = [None] * len(needs)
        if torch.is_grad_enabled():  # create_graph=True: a differentiable gradient, from the inputs
            if ctx.inputs is None or ctx.inputs is _RELEASED:
                raise PullbackError(DOUBLE_BACKWARD if ctx.inputs is None else BACKWARD_TWICE)
            positions = tuple(tp.wrt_index[k] for k in wrt)
            inputs = ctx.inputs.unchanged(tp.differentiable().vjp(positions).reads)
            for k, g in zip(wrt, gradients(tp.differentiable(), inputs, ctx.out_shapes, grads, positions)):
                full[k] = g
            return (None, None, *full)
        if not _keeps_graph():  # as autograd frees what it saved
            ctx.inputs = _RELEASED
        residuals, consume = ctx.residuals, False
        if residuals is _SAVED:
            residuals = saved
        else:  # given up to the backward's plan (``consume``), unless the graph is retained
            if residuals is None:
                raise PullbackError(BACKWARD_TWICE)
            _check_versions(ctx.viewed)
            if not _keeps_graph():
                ctx.residuals, ctx.viewed, consume = None, (), True
        gs = tp.bridge.backward(residuals, grads, ctx.out_shapes, consume)  # written-back values' cotangents: zeros
        for k in wrt:
            full[k] = gs[k]
        return (None, None, *full)

    run_backward = torch.compiler.disable(_backward)
    return PullbackFunction


class SavedTensorModifiedError(PullbackError, RuntimeError):
    """A tensor the backward reads was written in place after the call (autograd's error for saved tensors)."""

    def __init__(self, t, version: int, what: str = "one of the tensors the compiled call's backward reads"):
        super().__init__(
            f"pullback.integrations.torch: {what} (shape {tuple(t.shape)}, dtype {t.dtype}) has been modified by an "
            f"inplace operation since the call: it is at version {t._version}; expected version {version} instead. "
            f"Write into a copy (x = x.clone()) or after the backward")


_RELEASED = object()  # ``ctx.inputs`` after a backward that did not keep the graph
_SAVED = object()  # ``ctx.residuals`` when they went through ``save_for_backward``


def _check_versions(viewed) -> None:
    """Raise as autograd does for a saved tensor if one of the ``(tensor, version)`` pairs was written in place."""
    for t, v in viewed:
        if t._version != v:
            raise SavedTensorModifiedError(t, v)


def _saved_tensor_hooks() -> bool:
    """Is a ``torch.autograd.graph.saved_tensors_hooks`` context open (``save_on_cpu``, a user's packing)?"""
    import torch

    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top is None or top(False) is not None  # not knowing, save through autograd


class _Versioned:
    """The inputs of a call with their version counters, for a differentiable backward: ``unchanged(reads)``
    gives them back, or raises as autograd does for a saved tensor written in place since, if one of those at
    positions ``reads`` (those the gradient program reads) was."""

    def __init__(self, tensors: tuple):
        self.tensors = tensors
        self.versions = tuple(version(t) for t in tensors)

    def unchanged(self, reads) -> tuple:
        for i, (t, v) in enumerate(zip(self.tensors, self.versions)):
            if i in reads and version(t) != v:
                raise SavedTensorModifiedError(
                    t, v, f"input {i} of the compiled call, which a differentiable gradient (create_graph=True) "
                          f"recomputes from,")
        return self.tensors


def _keeps_graph() -> bool:
    """Whether the running backward keeps the graph (``retain_graph=True``; AOTAutograd asks the same)."""
    import torch

    keeps = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return keeps is None or keeps()  # not knowing, keep them: freed with the graph


BACKWARD_TWICE = (
    "pullback.integrations.torch: trying to backward through the graph a second time: the residuals were freed "
    "after the first backward (as PyTorch frees saved tensors). Specify retain_graph=True in the first backward "
    "call if you need to backward through the graph again")
DOUBLE_BACKWARD = (
    "pullback.integrations.torch: this call's gradient is not differentiable (create_graph=True, double backward, "
    "gradient penalties): the module overwrites buffers or inputs in its forward (e.g. batch norm's running "
    "statistics in training mode), so the values a differentiable gradient recomputes from are gone. Call it in "
    "eval mode, or apply transform.FirstOrderGradient to the gradient program itself")


def draw_masks(prog: TorchProgram, inputs: Sequence = (), batched: Optional[Sequence] = None) -> list:
    """Fresh random inputs for ``prog`` in execution order, drawn as eager draws them (``RandomInput.draw``:
    dropout masks are ``empty_like(x).bernoulli_(1 - rate)``, like PyTorch's CPU dropout); a dynamic batch
    dimension takes the batch size of ``batched`` (default ``inputs``), another dynamic size that of the user
    input (of ``inputs``) that carries it."""
    batch = next((x.shape[0] for x in (inputs if batched is None else batched) if getattr(x, "ndim", 0)), None)
    return [m.draw(batch, inputs) for m in prog.masks]


def run(tp: TrainingProgram, tensors: Sequence, mutated: Sequence = ()) -> tuple:
    """The user outputs, through the autograd Function when a gradient is wanted (``TrainingProgram.wants_grad``:
    its inputs are the tensors at ``wrt`` positions, the others ride along untracked), else of ``@main`` alone.
    ``mutated``: the tensors the mutated values are written back into (residuals sharing their memory are
    copied first)."""
    if tp.wants_grad(tensors):
        return _function().apply(tp, (tensors, tuple(mutated)), *[tensors[i] for i in tp.wrt_index])
    results = tp.eager_layout(tp.infer(tensors))
    n = tp.prog.num_outputs
    if mutated:
        write_back(tp.prog, mutated, results[n:])
    return tuple(results[:n])


def write_back(prog: TorchProgram, targets: Sequence, values: Sequence) -> None:
    """Copy the mutated ``values`` into their ``targets`` (the module's buffers, the inputs it overwrites)."""
    import torch

    with torch.no_grad():
        for i in prog.resized:  # as eager resizes them (a per-channel observer's first batch); the import may
            t = targets[i]      # have shared the old storage with NumPy, which cannot resize it: a new one
            t.set_(t.new_empty(values[i].shape))
        torch._foreach_copy_(list(targets), list(values))  # one call: ResNet's 60 buffers in ~18 us


def call(tp: TrainingProgram, inputs: Sequence, state, batched: Optional[Sequence] = None,
         state_tensors: Optional[Sequence] = None) -> tuple:
    """Run ``tp`` on the user's ``inputs`` with the parameters and buffers of ``state`` (state_dict key ->
    tensor: a dict or a ``ModuleState``; or ``state_tensors``, already read in ``tp.state_keys`` order), fresh
    random inputs drawn as eager draws them (a dynamic batch dimension sized like ``batched``, default
    ``inputs``); writes the mutated parameters, buffers and inputs back and returns the user outputs."""
    prog = tp.prog
    if state_tensors is None:
        state_tensors = [state[k] for k in tp.state_keys]
    tensors = [*inputs, *state_tensors, *draw_masks(prog, inputs, batched)]
    if not prog.mutations:
        return run(tp, tensors)
    by_input = dict(zip(prog.inputs, inputs))
    targets = [by_input[name] if kind == "input" else state_tensors[i] if i is not None else state[name]
               for (kind, name), i in zip(prog.mutations, tp.mutated_state)]
    return run(tp, tensors, targets)


def placed(values: Sequence, extra: dict) -> list:
    """``values`` with the ``extra`` values (position in the result -> value) in their places."""
    it = iter(values)
    return [extra[i] if i in extra else next(it) for i in range(len(values) + len(extra))]


def structured(outs: Sequence, spec=None, constants: Optional[dict] = None):
    """The user outputs in the structure ``forward`` returned them (a tensor, tuple, list, dict or Hugging Face
    ``ModelOutput``) by ``spec``, torch.export's output spec, with ``forward``'s results that are not tensors
    (``constants``: leaf position -> value) back in their places; without a spec, a tensor or a tuple."""
    if constants:
        outs = placed(outs, constants)
    if spec is not None and spec.num_leaves == len(outs):
        from torch.utils._pytree import tree_unflatten

        return tree_unflatten(list(outs), spec)
    return outs[0] if len(outs) == 1 else tuple(outs)


def float_wrt(prog: TorchProgram, names: Sequence[str]) -> list[str]:
    params = {p.name_hint: p for p in prog.main.params}
    return [n for n in names if is_inexact(params[n].type_annotation.dtype)]


def training_wrt(prog: TorchProgram, inputs: Sequence, frozen: frozenset = frozenset()) -> list[str]:
    """What the backward differentiates: the float inputs that require grad (as AOTAutograd, a program is
    specialised on it: an image batch gets no gradient computed), then the parameters but the ``frozen``
    ones (names of parameters whose ``requires_grad`` is off: a frozen backbone gets no weight gradients)."""
    inputs = float_wrt(prog, [n for n, x in zip(prog.inputs, inputs) if x.requires_grad])
    return inputs + [n for n in prog.trainable if n not in frozen]


def module_state(module) -> dict:
    """state_dict key -> tensor of every parameter and buffer of ``module`` (tied ones under each key)."""
    state = dict(module.named_parameters(remove_duplicate=False))
    state.update(module.named_buffers(remove_duplicate=False))
    return state


class ModuleState:
    """``module_state(module)`` looked up key by key when read (the module as it is at that moment; a few
    dictionary lookups per key instead of walking every submodule on every step)."""

    __slots__ = ("module", "_all")

    def __init__(self, module):
        self.module = module
        self._all = None

    def __getitem__(self, key: str):
        owner = self.owner(key)
        if owner is not None:
            return _held(owner)
        if self._all is None:  # not a plain submodule path (parametrizations, ...)
            self._all = module_state(self.module)
        return self._all[key]

    def owner(self, key: str):
        """``(submodule, attribute)`` holding ``key`` as a parameter or buffer, or None when ``key`` is not a
        plain path of submodules (a parametrization's, a property's)."""
        *path, attr = key.split(".")
        m = self.module
        try:
            for p in path:
                m = m._modules[p]
            if attr in m._parameters or attr in m._buffers:
                return m, attr
        except (KeyError, AttributeError, TypeError):
            pass
        return None


def _held(owner: tuple):
    """The parameter or buffer ``(submodule, attribute)`` holds now."""
    m, attr = owner
    t = m._parameters.get(attr)
    return t if t is not None else m._buffers[attr]


class _Import:
    """A module exported and imported for one mode and input shapes, shared by the programs compiled from it:
    its state keys and parameter var names in ``@main``'s order, the positions of the parameters among them,
    the shapes and dtypes it was exported with, and the export/import ``Phases`` (until the first program
    takes them)."""

    def __init__(self, prog: TorchProgram, phases: Optional["Phases"], module=None):
        import torch

        self.prog = prog
        # the plain tensor attributes baked into @main as constants: (owner's __dict__, name, tensor, version)
        self.constants = _attribute_constants(module, prog.constant_tensors) if module is not None else []
        self.names = list(prog.params)
        self.state_keys = [prog.state_key(n) for n in self.names]
        trainable = set(prog.trainable)
        self.params = [i for i, n in enumerate(self.names) if n in trainable]
        types = {p.name_hint: p.type_annotation for p in prog.main.params}
        self.shapes = [torch.Size(types[n].shape) for n in self.names]
        self.dtypes = [getattr(torch, types[n].dtype) for n in self.names]
        self.seen: list = []  # the ids of the tensors ``read`` last found as exported (no reference kept)
        self.phases = phases
        self.batches = None  # with dynamic_batch: (lo, hi) of the batch sizes the export holds for (hi None: any)
        self.sizes = None  # exported with sizes that vary: the inputs' sizes it holds for (``input_sizes``)
        self.family = None  # then: the key of the inputs' ranks and dtypes whose varying sizes it was exported for
        self.dims = None  # and (the dimensions exported dynamic, those that were before: ``CompiledModule._fix_sizes``)
        self.owners: Optional[list] = None  # ``ModuleState.owner`` of each state key, found under ``watch``
        self.watch = None

    def read(self, state, watch=None) -> Optional[list]:
        """The parameters and buffers of ``state`` in the program's order, or None when the module no longer
        has them as exported (a layer replaced by one of another shape or dtype, or removed). ``watch``: the
        module's ``StructureWatch``, unchanged since this call began; while it stays the one under which the
        keys' owners were found, the same submodules hold them (its children are compared by identity), so
        they are read from those submodules without walking the key paths again. ``STALE`` when a plain tensor
        attribute baked into the program was rebound or written in place since the export."""
        for d, name, t, v in self.constants:
            if d.get(name) is not t or t._version != v:
                return STALE
        try:
            if watch is None or watch is not self.watch:
                owners = [state.owner(k) for k in self.state_keys]
                self.owners, self.watch = (None, None) if watch is None or None in owners else (owners, watch)
            if self.owners is None:  # a key that is not a plain submodule path: read through the state
                tensors = [state[k] for k in self.state_keys]
            else:
                tensors = list(map(_held, self.owners))
        except (KeyError, AttributeError):
            return None
        ids, dtypes = list(map(id, tensors)), list(map(_DTYPE, tensors))
        if dtypes != self.dtypes:  # also of the same tensors: module.double() after the export converts in place
            return None
        if ids == self.seen:
            return tensors  # the tensors of the last call (a training loop): checked then
        if list(map(_SHAPE, tensors)) != self.shapes:
            return None
        self.seen = ids
        return tensors


_SHAPE, _DTYPE = attrgetter("shape"), attrgetter("dtype")
STALE = object()  # ``_Import.read``: a tensor attribute baked into the program changed since the export


def _attribute_constants(module, names) -> list:
    """``(owner's __dict__, name, tensor, version)`` for each of ``names`` (the FQNs of an export's lifted
    constants) that is a plain tensor attribute of a submodule of ``module``."""
    import torch

    out = []
    for fqn in names:
        prefix, _, name = fqn.rpartition(".")
        try:
            d = module.get_submodule(prefix).__dict__
        except (AttributeError, TypeError):
            continue
        t = d.get(name)
        if isinstance(t, torch.Tensor):
            out.append((d, name, t, t._version))
    return out


def _state_signature(module) -> tuple:
    """The names, shapes and dtypes of ``module``'s parameters and buffers."""
    return tuple((k, tuple(t.shape), t.dtype) for k, t in module_state(module).items())


def _recompiled(module, target: str, policy: str, dynamic_batch: bool, dynamic: Optional[bool] = None):
    """A compiled module of ``module`` that exports at its first call (how a compiled module is pickled)."""
    return _module_class()(module, None, target, policy, dynamic_batch, dynamic=dynamic)


def _varying(first: tuple, now: tuple, dims: tuple, skip_batch: bool) -> tuple:
    """``dims`` (per input, the dimensions whose sizes vary) with those where ``now``'s shapes differ from
    ``first``'s added (dimension 0 left to ``dynamic_batch`` when ``skip_batch``)."""
    return tuple(frozenset(d) | {k for k, (a, b) in enumerate(zip(f, n)) if a != b and not (skip_batch and k == 0)}
                 for d, f, n in zip(dims, first, now))


def _masked(shape: tuple, dims: frozenset, skip_batch: bool) -> tuple:
    """``shape`` with the sizes that vary (``dims``) as None and, with ``dynamic_batch``, without dimension 0."""
    out = tuple(None if k in dims else n for k, n in enumerate(shape))
    return out[1:] if skip_batch else out


def _named(args: tuple, kwargs: dict, order: Sequence) -> tuple:
    """``(args, kwargs)`` with the leading positional arguments moved to ``kwargs`` under the names of the
    ``forward`` parameters (``order``: ``inspect.Parameter`` objects) they bind to (all of them, or none: a
    ``*args`` or positional-only parameter keeps them positional)."""
    bound = order[: len(args)]
    if not args or len(bound) < len(args) or any(p.kind is not p.POSITIONAL_OR_KEYWORD or p.name in kwargs
                                                 for p in bound):
        return args, kwargs
    return (), {**{p.name: a for p, a in zip(bound, args)}, **kwargs}


_CONTAINERS = (tuple, list, dict)


def _tensor_leaves(value) -> tuple:
    """``([value], None)``, or for a tuple, list or dict ``(its leaves, its pytree structure)``: torch.export
    flattens it so, a placeholder per leaf."""
    if not isinstance(value, _CONTAINERS):
        return [value], None
    from torch.utils._pytree import tree_flatten

    return tree_flatten(value)


_SCALARS = (bool, int, float, str)


def _is_setting(value) -> bool:
    """A keyword that is not a tensor input: None, a number, a string, or a tuple, list or dict of them
    (QwenImage's ``img_shapes``, an empty ``cross_attention_kwargs``)."""
    if value is None or isinstance(value, _SCALARS):
        return True
    if not isinstance(value, _CONTAINERS):
        return False
    leaves, _ = _tensor_leaves(value)
    return all(v is None or isinstance(v, _SCALARS) for v in leaves)


class _Setting:
    """A setting that is a tuple, list or dict (``value``), compared and hashed by its structure and leaves."""

    __slots__ = ("value", "_key")

    def __init__(self, value):
        leaves, spec = _tensor_leaves(value)
        self.value, self._key = value, (spec, tuple((type(v), v) for v in leaves))

    def __eq__(self, other) -> bool:
        return isinstance(other, _Setting) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return repr(self.value)


def _takes_use_cache(module, params) -> bool:
    """Does ``module.forward`` take ``use_cache`` (Hugging Face decoders), by name or through ``**kwargs`` in a
    model whose ``config`` has it?"""
    if "use_cache" in params:
        return True
    config = getattr(module, "config", None)
    return any(p.kind is p.VAR_KEYWORD for p in params.values()) and isinstance(getattr(config, "use_cache", None), bool)


EXPORTS_BEFORE_WARNING = 4
MANY_SHAPES = ("pullback.integrations.torch: the module is being exported for the {n}th time, for inputs of other "
               "shapes ({shapes}); each export takes seconds. With batch sizes that vary, compile with "
               "dynamic_batch=True (one program for every batch size); sizes that vary other than the batch (sequence "
               "lengths) are made dynamic by the second export unless that fails ({why}): then pad them to a few "
               "fixed lengths")
MANY_STRUCTURES = ("pullback.integrations.torch: the module has changed since its last call for the {n}th time "
                   "({what}); each change exports it again (seconds). A value that changes at every step should be "
                   "a tensor (a buffer or an input), not a module attribute")
STALE_CONSTANTS = ("pullback.integrations.torch: the module is being exported again because a tensor attribute it "
                   "reads ({names}) was written or rebound since its last export: a plain tensor attribute is a "
                   "constant of the program, and each change exports it again (seconds). Register it as a buffer "
                   "(self.register_buffer(name, tensor)): every call then reads it")


def autocast_region() -> Optional[tuple]:
    """``("cpu", dtype)`` when a CPU ``torch.autocast`` region is open (the module is exported inside one, and
    its program computes as eager does there), else None."""
    import torch

    return ("cpu", torch.get_autocast_dtype("cpu")) if torch.is_autocast_enabled("cpu") else None


def _module_class():
    import torch

    class CompiledModule(torch.nn.Module):
        """``module`` trained through pullback; ``.module`` is the original (parameters shared)."""

        def __init__(self, module, example_inputs: Sequence, target: str, policy: str, dynamic_batch: bool = False,
                     example_kwargs: Optional[dict] = None, dynamic: Optional[bool] = None):
            super().__init__()
            self.module = module
            self.target = target
            self.policy = policy
            self.dynamic_batch = dynamic_batch
            self.dynamic = dynamic
            self._dims: dict = {}  # (mode, keywords, settings, inputs' ranks and dtypes) -> per input, dims that vary
            self._first: dict = {}  # that key -> the shapes of the first inputs seen
            self._fixed: dict = {}  # that key -> why sizes that vary could not be dynamic (each shape exported)
            self._imports: dict = {}  # (mode, keywords, settings, input shapes) -> _Import
            self._programs: dict = {}  # that key + which inputs require grad + the frozen parameters -> TrainingProgram
            self._params = None  # forward's parameters, their positions and order, whether it takes use_cache: read at the first call
            self._structures = [module_structure(module)]  # the module's structures seen (module_structure)
            self._structure = 0  # the index of the last one seen
            self._stale_exports = 0  # exports again because a tensor attribute baked into a program changed
            self._watch = StructureWatch(module)  # has it changed since?
            if example_inputs is not None:
                self._prepared(*self._flat(tuple(example_inputs), dict(example_kwargs or {})))

        def __reduce__(self):  # pickling (torch.save): the module and the options; programs are made again
            return _recompiled, (self.module, self.target, self.policy, self.dynamic_batch, self.dynamic)

        def __deepcopy__(self, memo):
            """A compiled module of a deep copy of ``module`` sharing the programs (they read the parameters
            at each call), so a copy (an EMA of the weights) does not export again: those of the module's
            structure now (``module_structure``; the copy's only one so far), if its last call had it."""
            new = _recompiled(copy.deepcopy(self.module, memo), self.target, self.policy, self.dynamic_batch, self.dynamic)
            sid = self._structure
            if self._structures[sid] == module_structure(self.module):
                def ours(table: dict) -> dict:
                    return {(0, *k[1:]): v for k, v in table.items() if k[0] == sid}

                new._imports, new._programs = ours(self._imports), ours(self._programs)
                new._dims, new._first, new._fixed = ours(self._dims), ours(self._first), ours(self._fixed)
            return new

        def _flat(self, args: tuple, kwargs: dict) -> tuple:
            """``(inputs, keywords, settings)``: the positional inputs, then the tensors passed by keyword in
            ``forward``'s parameter order (any order of the same keywords runs one program), their names, and
            the other keywords (``use_cache=False``: numbers, strings, None) as sorted ``(name, value)`` pairs,
            constants of the program. A keyword given None where its default is None is left out, as if not
            given (Hugging Face's ``forward``). A ``forward`` taking ``use_cache`` (Hugging Face decoders) gets
            ``use_cache=False`` unless the call gives it (also one taking ``**kwargs`` in a model whose
            ``config`` has ``use_cache``: GraniteMoe, Switch Transformers): torch.export cannot return the cache
            object, and training has no use for it. With keywords, positional arguments count by their names
            (``model(ids, labels=y)`` and ``model(input_ids=ids, labels=y)`` run one program). A tuple, list or
            dict of tensors passed by keyword (or by a position that has a name) is its leaves, in
            ``torch.utils._pytree`` order, and a keyword ``(name, structure)``."""
            if self._params is None:
                params = inspect.signature(self.module.forward).parameters
                self._params = (params, {name: i for i, name in enumerate(params)}, tuple(params.values()),
                                _takes_use_cache(self.module, params))
            params, rank, order, cached = self._params
            if cached and kwargs.get("use_cache") is None:
                kwargs = {**kwargs, "use_cache": False}  # a decoder's key/value cache: of no use to a training step
            elif not kwargs and not any(isinstance(a, _CONTAINERS) for a in args):
                return args, (), ()
            args, kwargs = _named(args, kwargs, order)
            given = {n: v for n, v in kwargs.items() if not (v is None and n in params and params[n].default is None)}
            fixed = {n for n, v in given.items() if _is_setting(v)}
            names = sorted((n for n in given if n not in fixed), key=lambda n: (rank.get(n, len(rank)), n))
            settings = tuple(sorted((n, _Setting(given[n]) if isinstance(given[n], _CONTAINERS) else given[n])
                                    for n in fixed))
            inputs, keywords = list(args), []
            for n in names:  # a tuple, list or dict of tensors (SDXL's added_cond_kwargs): its leaves, its structure
                leaves, spec = _tensor_leaves(given[n])
                inputs += leaves
                keywords.append(n if spec is None else (n, spec))
            return tuple(inputs), tuple(keywords), settings

        def _state(self, inputs: tuple, keywords: tuple = (), settings: tuple = ()) -> tuple:
            """``(import key, state, state tensors)``: the module imported for ``inputs``' mode, shapes,
            keywords, settings and ``torch.autocast`` region (exported once), its ``ModuleState`` and its
            parameters and buffers read now, in the program's order. Sizes that vary between calls (other than
            the batch, ``dynamic_batch``'s) are dynamic from the second export on (``dynamic``), as
            ``torch.compile``'s automatic dynamic shapes: one program for every sequence length."""
            check_inputs(inputs, "pullback.integrations.torch", "input", keywords)
            autocast = autocast_region()
            base = (self._structure_id(), keywords, settings, autocast)  # the structure holds each mode
            key = self._key(base, inputs, None)  # an export of exactly these shapes (the first one's) first
            state = ModuleState(self.module)
            entry = self._imports.get(key)
            family = dims = previous = None
            if entry is None or self._dims:
                family = base + (tuple((x.ndim, x.dtype) for x in inputs),)
                dims = previous = self._dims.get(family)
            if entry is None and dims is not None:  # else the export of dynamic sizes that holds them
                key = self._key(base, inputs, dims)
                entry = self._imports.get(key)
            if entry is None and self.dynamic is not False and family not in self._fixed:
                full = tuple(tuple(x.shape) for x in inputs)
                grown = _varying(self._first.setdefault(family, full), full,
                                 dims or (frozenset(),) * len(inputs), self.dynamic_batch)
                if any(grown) and grown != dims:
                    dims = self._dims[family] = grown
                    key = self._key(base, inputs, dims)
                    entry = self._imports.get(key)
            tensors = None if entry is None else entry.read(state, self._watch)
            if tensors is STALE:  # a tensor attribute baked in as a constant changed: export again
                self._forget(key, entry)
                entry = None
            if entry is not None and tensors is None:  # parameters changed since the export: by their shapes
                key += (_state_signature(self.module),)
                entry = self._imports.get(key)
                tensors = None if entry is None else entry.read(state, self._watch)
            if entry is None:
                self._warn_if_exporting_often(key, key[4: 4 + len(inputs)], family)
                lap = Phases()
                try:
                    ep = lap("export", export(self.module, inputs, dynamic_batch=self.dynamic_batch, keywords=keywords,
                                              settings={n: getattr(v, "value", v) for n, v in settings},
                                              autocast=autocast, batch_ranges=True,
                                              dynamic_dims=None if dims is None else [sorted(d) for d in dims]))
                    prog = lap("import", import_exported(ep, tied=tied_keys(self.module), copy_params=False))
                except PullbackError as e:
                    if not self._fix_sizes(family, dims, previous, e):
                        raise
                    return self._state(inputs, keywords, settings)
                entry = self._imports[key] = _Import(prog, lap, self.module)
                if self.dynamic_batch:
                    entry.batches = batch_range(ep)
                if dims is not None:
                    entry.sizes, entry.family, entry.dims = input_sizes(ep), family, (dims, previous)
                tensors = [state[k] for k in entry.state_keys]
            return key, state, tensors

        def _key(self, base: tuple, inputs: tuple, dims: Optional[tuple]) -> tuple:
            """The import key of ``inputs``: ``base``, their shapes but the sizes that vary (``dims``; with
            ``dynamic_batch``, dimension 0) and dtypes, and the index of the export that holds their sizes."""
            skip = self.dynamic_batch
            if dims is None:
                key = base + tuple(((tuple(x.shape)[1:] if skip else tuple(x.shape)), x.dtype) for x in inputs)
            else:
                key = base + tuple((_masked(tuple(x.shape), d, skip), x.dtype) for x, d in zip(inputs, dims))
            return key + (self._bucket(key, inputs),) if skip or dims is not None else key

        def _fix_sizes(self, family: tuple, dims: Optional[tuple], previous: Optional[tuple], error: Exception) -> bool:
            """After ``error`` in importing or compiling an export whose sizes vary (``dims``), keep the sizes that
            varied before (``previous``: their exports stay, and serve sizes they hold) and export the others for
            each shape from now on (``dynamic=None``; the error is the user's with ``dynamic=True``, or without
            such sizes): whether to export again."""
            if dims is None or self.dynamic is True:
                return False
            self._fixed[family] = f"{type(error).__name__}: {error}"
            if previous is None:
                self._dims.pop(family, None)
            else:
                self._dims[family] = previous
            for k in [k for k, e in self._imports.items() if e.family == family and e.dims[0] == dims]:
                del self._imports[k]
                for p in [p for p in self._programs if p[:len(k)] == k]:
                    del self._programs[p]
            return True

        def _bucket(self, base: tuple, inputs: tuple) -> int:
            """The index of the export under ``base`` whose sizes hold those of ``inputs``, or a new index. With
            ``dynamic_batch``, an export holds for a range of batch sizes (a model branching on the batch size,
            diffusers' ``if x.shape[0] >= 64``, holds for a range: each range is an export of its own); exported
            with other sizes that vary, for the sizes torch.export bounds them to (``input_sizes``)."""
            batch = next((x.shape[0] for x in inputs if x.ndim), None)
            n, last, shapes = len(base), -1, None
            for k, entry in self._imports.items():
                if k[:n] == base and len(k) > n:
                    lo, hi = entry.batches or (0, None)
                    if batch is None or lo <= batch and (hi is None or batch <= hi):
                        if entry.sizes is None:
                            return k[n]
                        shapes = shapes or tuple(tuple(x.shape) for x in inputs)
                        if sizes_hold(entry.sizes, shapes):
                            return k[n]
                    last = max(last, k[n])
            return last + 1

        def _forget(self, key: tuple, entry: "_Import") -> None:
            """Forget the import of ``key`` and its programs (a tensor attribute they baked in changed); warn the
            ``EXPORTS_BEFORE_WARNING``-th time: such a tensor should be a buffer."""
            del self._imports[key]
            for k in [k for k in self._programs if k[:len(key)] == key]:
                del self._programs[k]
            self._stale_exports += 1
            if self._stale_exports == EXPORTS_BEFORE_WARNING - 1:
                names = ", ".join(repr(name) for _, name, _, _ in entry.constants)
                warnings.warn(STALE_CONSTANTS.format(names=names), UserWarning, stacklevel=6)

        def _structure_id(self) -> int:
            """The index of the module's structure (``module_structure``) among those seen: programs are kept
            per structure, so switching back (a layer frozen, then unfrozen) exports nothing again."""
            if self._watch.unchanged():
                return self._structure
            now = module_structure(self.module)
            self._watch = StructureWatch(self.module)
            seen = self._structures
            if seen[self._structure] != now:
                last, self._structure = seen[self._structure], next((i for i, s in enumerate(seen) if s == now), len(seen))
                if self._structure == len(seen):
                    seen.append(now)
                    if len(seen) == EXPORTS_BEFORE_WARNING:
                        warnings.warn(MANY_STRUCTURES.format(n=len(seen), what=structure_change(self.module, last, now)),
                                      UserWarning, stacklevel=6)
            return self._structure

        def _warn_if_exporting_often(self, key: tuple, shapes: tuple, family: tuple) -> None:
            """Warn once when the module in one mode is about to be exported ``EXPORTS_BEFORE_WARNING`` times for
            inputs of different shapes (each export takes seconds: varying batch sizes, or sizes that could not be
            dynamic)."""
            seen = [k[4: 4 + len(shapes)] for k in self._imports if k[:4] == key[:4]] + [shapes]
            if len(seen) == EXPORTS_BEFORE_WARNING and not self.dynamic_batch:
                listed = "; ".join(", ".join(str(tuple(s)) for s, _ in inputs) for inputs in seen)
                why = self._fixed.get(family, "dynamic=False" if self.dynamic is False else "they vary in new dimensions")
                # the caller's line: past _state, _prepared, forward and torch's Module.__call__ (two frames)
                warnings.warn(MANY_SHAPES.format(n=len(seen), shapes=listed, why=why), UserWarning, stacklevel=7)

        def _program(self, inputs: tuple, key: tuple, tensors: list) -> TrainingProgram:
            """The program for ``inputs`` and the state ``tensors``: specialised on which inputs require grad,
            which parameters do not (frozen: no gradient computed for them) and grad mode (under
            ``torch.no_grad()``, e.g. evaluation, ``@main`` alone: no differentiation, no residuals)."""
            entry = self._imports[key]
            prog = entry.prog
            frozen = tuple(i for i in entry.params if not tensors[i].requires_grad)
            grad = torch.is_grad_enabled()
            full = key + (tuple(x.requires_grad for x in inputs), frozen, grad)
            tp = self._programs.get(full)
            if tp is None:
                wrt = training_wrt(prog, inputs, frozenset(entry.names[i] for i in frozen)) if grad else []
                tp = TrainingProgram(prog, wrt, self.target, self.policy, entry.phases)
                entry.phases = None  # the export and import phases are the first program's
                self._programs[full] = tp
            return tp

        def _prepared(self, inputs: tuple, keywords: tuple = (), settings: tuple = ()) -> tuple:
            """``(import key, state, state tensors, program)`` for ``inputs`` (``_state``, ``_program``); a program
            of sizes that vary which cannot be differentiated or compiled is exported again for these sizes."""
            key, state, tensors = self._state(inputs, keywords, settings)
            try:
                return key, state, tensors, self._program(inputs, key, tensors)
            except PullbackError as e:
                entry = self._imports.get(key)
                if entry is None or entry.family is None or not self._fix_sizes(entry.family, *entry.dims, e):
                    raise
            key, state, tensors = self._state(inputs, keywords, settings)
            return key, state, tensors, self._program(inputs, key, tensors)

        def forward(self, *args, **kwargs):
            inputs, *named = self._flat(args, kwargs)
            key, state, tensors, tp = self._prepared(inputs, *named)
            prog = tp.prog
            outs = call(tp, inputs, state, state_tensors=tensors)
            if prog.resized:  # buffers changed shape: the next call checks them again (and exports for them)
                self._imports[key].seen = []  # ``read`` trusts the tensors it saw last only while this is theirs
            return structured(outs, prog.out_spec, prog.constant_outputs)

    return CompiledModule


def compile(module, example_inputs, target: str = DEFAULT_TARGET, policy: str = "save_all",
            dynamic_batch: bool = False, example_kwargs: Optional[dict] = None, dynamic: Optional[bool] = None):
    """A ``torch.nn.Module`` that runs ``module`` through pullback (see the module docstring).

    ``example_inputs``: a tensor, a sequence of tensors (positional arguments of ``forward``) or a dict of
    them (keyword arguments, e.g. a Hugging Face batch: ``compile(model, batch)``, then ``model(**batch)``);
    ``example_kwargs``: keyword arguments beside positional ones. The compiled module is called as the original
    (positional and keyword tensors); keywords given None where ``forward``'s default is None count as not given,
    and keywords that are not tensors (``use_cache=False``: numbers, strings, None) are settings, each value
    compiling a program of its own.

    ``target``: the executor of ``@main_fwd``/``@main_bwd`` (see ``bridges``): ``"torch"`` (ATen kernels on
    the tensors themselves), ``"numpy"`` or ``"jax"``; the default is the fastest installed (``default_target``:
    torch with the ``torch`` extra installed, else numpy);
    ``policy``: what the forward saves for the backward (``PartitionForwardBackward``: ``"save_all"``, or
    ``"min_cut"`` to recompute cheap ops in the backward and save fewer bytes, priced for ``target``);
    ``dynamic_batch``: import with a ``?`` batch dimension and compile one program for every batch size
    (else one per batch size);
    ``dynamic``: sizes other than the batch that vary between calls (a sequence length), as ``torch.compile``'s:
    None (automatic) exports once for the first shape, and when an input's size changes, once more with that
    dimension dynamic (``?``: one program for every length torch.export allows), or for each shape where the
    program cannot take it dynamic (a converter, gradient rule or kernel that needs it static); False exports
    each shape; True is automatic too, but an error with a dynamic size is raised instead of exporting each shape.
    """
    check_target(target, "pullback.integrations.torch.compile")
    if isinstance(example_inputs, dict):
        example_inputs, example_kwargs = (), {**example_inputs, **(example_kwargs or {})}
    elif not isinstance(example_inputs, (list, tuple)):
        example_inputs = (example_inputs,)
    return _module_class()(module, example_inputs, target, policy, dynamic_batch, example_kwargs, dynamic)


def train_side_by_side(model, batches: Sequence, loss_fn, lr: float = 0.1, target: str = DEFAULT_TARGET,
                       policy: str = "save_all", verbose: bool = True, route: str = "export") -> dict:
    """Train a copy of ``model`` eagerly and ``model`` through pullback with ``torch.optim.SGD`` on
    the same ``batches`` (tuples ``(inputs, labels)``), from the same initial weights and RNG seeds.
    ``route``: ``"export"`` compiles with ``compile`` (one whole-model export), ``"dynamo"`` with
    ``torch.compile(model, backend=...)`` of pullback's backend (Dynamo splits the model at graph breaks).

    Returns ``{"eager": [losses], "pullback": [losses], "max_weight_diff": float, "eager_model": m}``.
    """
    import numpy as np
    import torch

    eager = copy.deepcopy(model)
    if route == "dynamo":
        import functools

        from .dynamo_backend import pullback_backend

        compiled = torch.compile(model, backend=functools.partial(pullback_backend, target=target, policy=policy))
    elif route == "export":
        compiled = compile(model, batches[0][0], target=target, policy=policy)
    else:
        raise PullbackError(f"train_side_by_side: route must be 'export' or 'dynamo', got {route!r}")
    opts = [torch.optim.SGD(m.parameters(), lr=lr) for m in (eager, compiled)]
    losses: dict = {"eager": [], "pullback": []}
    for step, (inputs, labels) in enumerate(batches):
        for key, m, opt in (("eager", eager, opts[0]), ("pullback", compiled, opts[1])):
            torch.manual_seed(step)  # same dropout masks on both sides (NumPy's draws too: SpecAugment)
            np.random.seed(step)
            loss = loss_fn(m(*inputs), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[key].append(loss.item())
        if verbose:
            e, p = losses["eager"][-1], losses["pullback"][-1]
            print(f"step {step:3d}  eager {e:.7f}  pullback {p:.7f}  rel.diff {abs(e - p) / max(abs(e), 1e-12):.2e}")
    ref = eager.state_dict()
    losses["max_weight_diff"] = max(float((ref[k] - v).abs().max()) for k, v in model.state_dict().items())
    losses["eager_model"] = eager
    return losses


def check_side_by_side(result: dict, rtol: float = 1e-4, atol: float = 1e-4, verbose: bool = True) -> dict:
    """Assert that per-step losses agree within ``rtol`` (relative) and final weights within ``atol``."""
    for step, (e, p) in enumerate(zip(result["eager"], result["pullback"])):
        if abs(e - p) > rtol * abs(e):
            raise AssertionError(f"step {step}: eager loss {e} vs pullback {p} (rtol {rtol})")
    if result["max_weight_diff"] > atol:
        raise AssertionError(f"final weights differ by {result['max_weight_diff']:.2e} > {atol}")
    if verbose:
        print(f"final weights: max abs difference {result['max_weight_diff']:.2e}")
    return result


__all__ = ["compile", "train_side_by_side", "check_side_by_side", "TrainingProgram", "run", "call", "structured", "draw_masks",
           "float_wrt", "training_wrt", "module_state", "ModuleState", "TARGETS", "DEFAULT_TARGET", "default_target",
           "SavedTensorModifiedError"]
