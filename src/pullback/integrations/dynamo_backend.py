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
size arguments); the backend then compiles one program per concrete input
shape, at the first call with that shape.
"""

from __future__ import annotations

from typing import Sequence

from ..frontend.torch_importer import export, import_exported, tied_keys
from .torch import TrainingProgram, draw_masks, float_wrt, run


def _bound_module(gm, inputs: Sequence):
    """``gm`` as a module of its tensor inputs only (the size arguments Dynamo passes are fixed to ``inputs``')."""
    import torch

    class Bound(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gm = gm

        def forward(self, *tensors):
            it = iter(tensors)
            return self.gm(*[next(it) if isinstance(x, torch.Tensor) else x for x in inputs])

    return Bound()


def _is_static(x) -> bool:
    import torch

    return isinstance(x, torch.Tensor) and all(isinstance(d, int) for d in x.shape)


def pullback_backend(gm, example_inputs: Sequence, target: str = "numpy", policy: str = "save_all"):
    """Compile the Dynamo graph ``gm`` for ``example_inputs``; returns ``callable(*inputs) -> outputs``."""
    import torch

    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    as_tuple = isinstance(out_node.args[0], (tuple, list))
    programs: dict = {}

    def program(inputs: Sequence):
        key = tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else ("size", x) for x in inputs)
        entry = programs.get(key)
        if entry is None:
            plain = all(isinstance(x, torch.Tensor) for x in inputs)
            module = gm if plain else _bound_module(gm, inputs)
            tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
            prog = import_exported(export(module, tensors), tied=tied_keys(module))
            tp = TrainingProgram(prog, float_wrt(prog, prog.inputs) + prog.trainable, target, policy)
            state = dict(module.named_parameters(remove_duplicate=False))
            state.update(module.named_buffers(remove_duplicate=False))
            entry = programs[key] = (tp, state)
        return entry

    if all(_is_static(x) for x in example_inputs):
        program(example_inputs)  # compile now: errors surface at compile time

    def compiled(*inputs):
        tp, state = program(inputs)
        prog = tp.prog
        user = [x for x in inputs if isinstance(x, torch.Tensor)]
        tensors = user + [state[prog.state_key(n)] for n in prog.params] + draw_masks(prog)
        results = run(tp, tensors)
        by_input = dict(zip(prog.inputs, user))
        with torch.no_grad():
            for (kind, target_name), value in zip(prog.mutations, results[prog.num_outputs:]):
                (by_input[target_name] if kind == "input" else state[target_name]).copy_(value)
        outs = results[: prog.num_outputs]
        return tuple(outs) if as_tuple else outs[0]

    compiled.programs = programs
    return compiled


__all__ = ["pullback_backend"]
