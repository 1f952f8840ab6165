"""The ``torch.compile`` backend ``"pullback"``: ``torch.compile(model, backend="pullback")``.

Dynamo hands over a forward FX graph; the backend exports it to ATen
(``torch.export``), imports it, builds ``@main_fwd`` / ``@main_bwd`` with
pullback's AD and partitioner, and returns a callable that runs them through
the autograd Function of ``integrations.torch`` (so training works). Every
float input, lifted parameters included, gets a gradient when torch asks for
one. Registered through the entry point group ``torch_dynamo_backends``.

With static shapes the graph is compiled at once (an unsupported operator is
reported when ``torch.compile``'s first call compiles). Under
``torch.compile(..., dynamic=True)`` Dynamo's graph has symbolic sizes (and
size arguments); the backend then compiles at the first call ONE program with
a dynamic batch (dimension 0 of the inputs that share the first input's
symbolic dimension 0; size arguments equal to it are read off those inputs),
for every batch size. Other symbolic sizes are fixed per program (one program
per value), and when the batch cannot stay dynamic (``torch.export``
specialises it, or the first batch is 1) one program per input shape.
"""

from __future__ import annotations

import functools
import warnings
from typing import Optional, Sequence

from ..frontend.context import higher_order
from ..frontend.torch_importer import export, import_exported, tied_keys
from ..ir.errors import PullbackError
from .torch import DEFAULT_TARGET, TrainingProgram, call, check_target, module_state, placed, training_wrt


def _bound_module(gm, inputs: Sequence, is_input: Sequence[bool], sizes: dict):
    """``gm`` as a module of its tensor inputs only (``is_input``): a size argument Dynamo passes is read off a
    tensor (``sizes``: argument position -> (tensor position, axis)) or fixed to its value in ``inputs``; a
    Python number Dynamo passes as a 0-d tensor (a dropout rate) is a constant of the program."""
    import torch

    class Bound(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gm = gm

        def forward(self, *tensors):
            it, args = iter(tensors), []
            for k, x in enumerate(inputs):
                if is_input[k]:
                    args.append(next(it))
                elif isinstance(x, torch.Tensor):
                    args.append(torch.tensor(x.item(), dtype=x.dtype))
                else:
                    args.append(tensors[sizes[k][0]].shape[sizes[k][1]] if k in sizes else x)
            return self.gm(*args)

    return Bound()


def _is_static(x) -> bool:
    import torch

    return isinstance(x, torch.Tensor) and all(isinstance(d, int) for d in x.shape)


class _Layout:
    """What Dynamo's placeholders say: ``is_input[k]``: argument ``k`` is a tensor input of the program (not a
    size, nor a Python number passed as a 0-d tensor); ``batched[k]``: a tensor input whose dimension 0 is the batch (the
    symbol of the first symbolic dimension 0); ``sizes``: size arguments equal to the batch -> (tensor input
    position, 0)."""

    def __init__(self, gm):
        import torch

        nodes = [n for n in gm.graph.nodes if n.op == "placeholder"]
        vals = [n.meta.get("example_value") for n in nodes]
        number = [getattr(n.meta.get("grapharg"), "pass_arg_as_tensor", False) for n in nodes]
        # a NumPy array Dynamo passes as a tensor is an input like any (a number is a constant of the program)
        self.is_input = [isinstance(v, torch.Tensor) and not (f and v.ndim == 0) for v, f in zip(vals, number)]
        sym = lambda d: str(d.node.expr) if isinstance(d, torch.SymInt) else None  # noqa: E731
        dim0 = [sym(v.shape[0]) if i and v.ndim else None for v, i in zip(vals, self.is_input)]
        batch = next((d for d in dim0 if d is not None), None)
        self.batched = [batch is not None and d == batch for d in dim0]
        first = sum(self.is_input[: self.batched.index(True)]) if any(self.batched) else None
        self.sizes = {k: (first, 0) for k, v in enumerate(vals) if first is not None and sym(v) == batch}

    def key(self, inputs: Sequence, dynamic: bool) -> tuple:
        """The program cache key: shapes, dtypes and requires_grad, the batch dimension left out when ``dynamic``."""
        out = []
        for k, x in enumerate(inputs):
            if self.is_input[k]:
                shape = tuple(x.shape)[1:] if dynamic and self.batched[k] else tuple(x.shape)
                out.append((shape, x.dtype, x.requires_grad))
            else:
                out.append(("size",) if dynamic and k in self.sizes else ("value", x.item() if hasattr(x, "item") else x))
        return tuple(out)


def _registers_tensor_hooks(gm) -> bool:
    """``gm`` registers a gradient hook on a tensor it computes (``Tensor.register_hook`` in forward: Dynamo keeps
    it as the ``register_hook`` higher-order operator), which a compiled backward cannot call (torch.export drops
    it: the hook silently did not run). Such a graph runs eagerly, with a warning."""

    hop = higher_order("register_hook")
    sites = [n.meta.get("stack_trace", "").strip().splitlines()[-2:] for n in gm.graph.nodes
             if n.op == "call_function" and n.target is hop]
    if sites:
        where = " ".join(sites[0]).strip() if sites[0] else "in forward"
        warnings.warn("torch.compile(backend=\"pullback\"): a graph registers a gradient hook on a tensor it computes "
                      f"(Tensor.register_hook, {where}); pullback's compiled backward cannot call it, so this graph "
                      "runs eagerly (its gradients are eager's)", stacklevel=2)
    return bool(sites)


def _takes_gradients(gm) -> bool:
    """``gm`` calls ``torch.autograd.grad`` or ``backward`` itself (a gradient penalty taken in forward, which Dynamo
    traces into the graph under ``trace_autograd_ops``, and after some of PyTorch's own higher-order operators ran):
    torch.export cannot trace autograd on the fake tensors it made, so the graph runs eagerly, as Dynamo's graph
    break at the call would have it."""
    import torch

    calls = (torch.autograd.grad, torch.autograd.backward)
    return any(n.op == "call_function" and n.target in calls or n.op == "call_method" and n.target == "backward"
               for n in gm.graph.nodes)


def _higher_order_as_calls(gm, name: str, module_of):
    """``gm`` with each call of the higher-order operator ``name`` replaced by a call of the submodule
    ``module_of(gm, k, node)`` returns (its name, and its arguments); ``gm`` itself when there is none."""

    hop = higher_order(name)
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is hop]
    for k, n in enumerate(calls):
        target, args = module_of(gm, k, n)
        with gm.graph.inserting_before(n):
            new = gm.graph.call_module(target, tuple(args))
        new.meta.update(n.meta)
        n.replace_all_uses_with(new)
        gm.graph.erase_node(n)
    if calls:
        gm.recompile()
    return gm


def _custom_functions_as_functions(gm):
    """``gm`` with each custom ``torch.autograd.Function`` Dynamo kept as ``autograd_function_apply`` (its
    forward and backward graphs) applied again as a ``torch.autograd.Function`` of those graphs, which the
    importer handles as the user's own: run as plain code when its backward is its forward's derivative, else
    kept with its backward (``frontend.custom_vjp``). Exporting the higher-order operator itself would keep only
    the forward, run under no_grad: no gradient."""

    def applied(gm, k, n):
        fwd, bwd = (getattr(gm, a.target) for a in n.args[:2])
        name = f"_pullback_function_{k}"
        gm.add_submodule(name, _applied(_function_of(_without_grad_switches(fwd), bwd, f"DynamoFunction{k}")))
        return name, n.args[2:]

    return _higher_order_as_calls(gm, "autograd_function_apply", applied)


def _checkpoints_as_calls(gm):
    """``gm`` with each activation checkpoint Dynamo kept (``tag_activation_checkpoint`` of a body graph) a plain
    call of its body: checkpointing changes memory, not values, and what the program saves is the partitioner's
    choice; torch.export cannot trace the higher-order operator."""
    return _higher_order_as_calls(gm, "tag_activation_checkpoint", lambda gm, k, n: (n.args[0].target, n.args[1:]))


def _autocast_regions_as_calls(gm):
    """``gm`` with each ``torch.autocast`` block Dynamo kept as ``_enter_autocast`` ... ``_exit_autocast`` calls a
    call of a submodule that runs the block's nodes under ``torch.autocast``, as the user wrote it (torch.export
    handles the context manager; the bare calls left its casts' dtypes disagreeing with the graph's)."""
    from torch.amp.autocast_mode import _enter_autocast, _exit_autocast
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    nodes = list(gm.graph.nodes)
    enters = [n for n in nodes if n.op == "call_function" and n.target is _enter_autocast]
    regions = []
    for enter in enters:
        exits = [u for u in enter.users if u.op == "call_function" and u.target is _exit_autocast]
        if len(exits) != 1 or len(enter.users) != 1:
            return gm
        body = nodes[nodes.index(enter) + 1: nodes.index(exits[0])]
        if any(n.op not in ("call_function", "call_method", "call_module") or n.target in (_enter_autocast, _exit_autocast)
               for n in body):
            return gm  # nested blocks or other node kinds: left to torch.export as they are
        regions.append((enter, exits[0], body))
    for k, (enter, exit_, body) in enumerate(regions):
        settings = enter.args
        gm.graph.erase_node(exit_)
        gm.graph.erase_node(enter)
        if not body:
            continue
        gm = fuse_by_partitions(gm, [dict.fromkeys(body)], prefix=f"_pullback_autocast_{k}_")
        name = next(n.target for n in gm.graph.nodes if n.op == "call_module"
                    and str(n.target).startswith(f"_pullback_autocast_{k}_"))
        gm.add_submodule(name, _under_autocast()(getattr(gm, name), settings))
    if regions:
        gm.recompile()
    return gm


@functools.lru_cache(maxsize=None)
def _under_autocast():
    """The module class running a graph under ``torch.autocast`` (made on first use: no torch import at load)."""
    import torch

    class UnderAutocast(torch.nn.Module):
        """``body`` called under ``torch.autocast(*settings)``."""

        def __init__(self, body, settings):
            super().__init__()
            self.body, self.settings = body, tuple(settings)

        def forward(self, *args):
            device, dtype, enabled, cache = self.settings
            with torch.autocast(device, dtype=dtype, enabled=enabled, cache_enabled=cache):
                return self.body(*args)

    return UnderAutocast


def _data_as_detach(gm):
    """``gm`` with each ``x.data`` (Dynamo's ``_get_data_attr(x)``) a ``detach`` (the same values, no gradient):
    torch.export cannot trace ``_get_data_attr`` (the fake tensor it makes has no data)."""
    import torch

    get_data = torch._C._autograd._get_data_attr
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is get_data]
    for node in nodes:
        node.target = torch.ops.aten.detach.default
    if nodes:
        gm.recompile()
    return gm


def _function_of(fwd, bwd, name: str):
    """A ``torch.autograd.Function`` whose forward runs Dynamo's forward graph ``fwd`` (it returns the output and
    the values it saves) and whose backward runs ``bwd`` on the cotangents and those values."""
    import torch

    def forward(ctx, *args):
        output, saved = fwd(*args)
        ctx.saved_values = tuple(saved)
        return output

    def backward(ctx, *grads):
        return bwd(*grads, *ctx.saved_values)

    cls = type(name, (torch.autograd.Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward)})
    cls.__module__ = __name__  # a user Function to the importer (not one of torch's)
    return cls


def _applied(fn):
    """A module applying the Function ``fn`` (a submodule of Dynamo's graph, so exporting the graph applies it)."""
    import torch

    class Applied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fn = fn

        def forward(self, *args):
            return self.fn.apply(*args)

    return Applied()


def _without_grad_switches(fwd):
    """A copy of Dynamo's forward graph of a Function without its ``_set_grad_enabled`` calls (it runs the forward
    under no_grad; as plain code, autograd must see through it)."""
    import copy

    import torch

    gm = copy.deepcopy(fwd)
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch._C._set_grad_enabled:
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def _inputs_returned(gm, out, layout: _Layout) -> dict:
    """Output position -> input position, for the outputs that return an input that is not a tensor of the
    program unchanged (a size Dynamo passes through a graph to the code after it): they are not the program's to
    compute (with a dynamic batch their value changes with the inputs)."""
    import torch

    if not isinstance(out.args[0], (tuple, list)):
        return {}
    position = {n: k for k, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    return {i: position[a] for i, a in enumerate(out.args[0])
            if isinstance(a, torch.fx.Node) and a in position and not layout.is_input[position[a]]}


def _without_outputs(gm, dropped):
    """``gm`` as a module returning its outputs but those at the positions ``dropped``."""
    import torch

    class Kept(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gm = gm

        def forward(self, *args):
            return tuple(o for i, o in enumerate(self.gm(*args)) if i not in dropped)

    return Kept() if dropped else gm


def _computes_a_tensor(out) -> bool:
    """Whether the graph whose output node is ``out`` returns a tensor (a graph that returns none, or only its
    inputs unchanged, has nothing to differentiate: it runs as it is)."""
    import torch

    found = []
    torch.fx.node.map_arg(out.args, found.append)
    return any(n.op != "placeholder" and isinstance(n.meta.get("example_value", torch.empty(0)), torch.Tensor)
               for n in found)  # a node without Dynamo's example value (a graph traced by hand) may be one


# torch.compile's modes tune Inductor (autotuning, CUDA graphs); pullback compiles the same way under each
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def pullback_backend(gm, example_inputs: Sequence, target: str = DEFAULT_TARGET, policy: str = "save_all",
                     mode: Optional[str] = None, options: Optional[dict] = None):
    """Compile the Dynamo graph ``gm`` for ``example_inputs``; returns ``callable(*inputs) -> outputs``.
    ``target``: the executor (``integrations.torch.TARGETS``; default ``DEFAULT_TARGET``); ``policy``: what the
    forward saves for the backward. ``torch.compile(model, backend="pullback", options={"target": "jax"})`` passes
    them as ``options``; its ``mode`` is accepted and changes nothing."""
    if mode not in MODES:
        raise PullbackError(f"pullback_backend: mode must be one of {', '.join(map(str, MODES[1:]))}, got {mode!r}")
    unknown = sorted(set(options or {}) - {"target", "policy"})
    if unknown:
        raise PullbackError(f"pullback_backend: unknown option {', '.join(map(repr, unknown))} (options: 'target', "
                            "'policy')")
    target, policy = (options or {}).get("target", target), (options or {}).get("policy", policy)
    check_target(target, "pullback_backend")
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    if not _computes_a_tensor(out_node):
        return gm  # e.g. the empty graph Dynamo makes between two graph breaks: nothing to compile
    if _registers_tensor_hooks(gm) or _takes_gradients(gm):
        return gm
    gm = _custom_functions_as_functions(_checkpoints_as_calls(_autocast_regions_as_calls(_data_as_detach(gm))))

    as_tuple = isinstance(out_node.args[0], (tuple, list))
    programs: dict = {}
    layout = _Layout(gm)
    passed = _inputs_returned(gm, out_node, layout)
    graph = _without_outputs(gm, passed)
    dynamic = [any(layout.batched)]  # cleared when torch.export cannot keep the batch dynamic

    def compile_for(inputs: Sequence, dyn: bool) -> tuple:
        tensors = [x for x, i in zip(inputs, layout.is_input) if i]
        plain = len(tensors) == len(inputs)
        module = graph if plain else _bound_module(graph, inputs, layout.is_input, layout.sizes if dyn else {})
        flags = [b for b, i in zip(layout.batched, layout.is_input) if i] if dyn else False
        prog = import_exported(export(module, tensors, dynamic_batch=flags), tied=tied_keys(module), copy_params=False,
                               grad_inputs=[x.requires_grad for x in tensors])
        tp = TrainingProgram(prog, training_wrt(prog, tensors), target, policy)
        return tp, module_state(module)

    def program(inputs: Sequence):
        entry = programs.get(layout.key(inputs, dynamic[0]))
        if entry is None:
            if dynamic[0]:
                try:
                    entry = compile_for(inputs, True)
                except Exception:  # noqa: BLE001 - the batch cannot stay dynamic: one program per shape
                    dynamic[0] = False
            if entry is None:
                entry = compile_for(inputs, False)
            programs[layout.key(inputs, dynamic[0])] = entry
        return entry

    if all(_is_static(x) for x in example_inputs):
        program(example_inputs)  # compile now: errors surface at compile time

    def compiled(*inputs):
        tp, state = program(inputs)
        user = [x for x, i in zip(inputs, layout.is_input) if i]
        outs = call(tp, user, state, batched=[x for x, b in zip(inputs, layout.batched) if b])
        outs = placed(placed(outs, tp.prog.constant_outputs), {i: inputs[k] for i, k in passed.items()})
        return tuple(outs) if as_tuple else outs[0]

    compiled.programs = programs
    return compiled


__all__ = ["pullback_backend"]
