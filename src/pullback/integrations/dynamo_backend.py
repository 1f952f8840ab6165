"""The ``torch.compile`` backend ``"pullback"``: ``torch.compile(model, backend="pullback")``.

Dynamo hands over a forward FX graph; the backend exports it to ATen
(``torch.export``), imports it, builds ``@main_fwd`` / ``@main_bwd`` with
pullback's AD and partitioner, and returns a callable that runs them through
the autograd Function of ``integrations.torch`` (so training works). Every
float input, lifted parameters included, gets a gradient when torch asks for
one. Registered through the entry point group ``torch_dynamo_backends``.
"""

from __future__ import annotations

from typing import Sequence

from ..ir.errors import PullbackError
from ..frontend.torch_importer import export, import_exported
from .torch import TrainingProgram, draw_masks, float_wrt, run


def pullback_backend(gm, example_inputs: Sequence, target: str = "numpy", policy: str = "save_all"):
    """Compile the Dynamo graph ``gm`` for ``example_inputs``; returns ``callable(*inputs) -> outputs``."""
    import torch

    symbolic = [i for i, x in enumerate(example_inputs) if not isinstance(x, torch.Tensor)]
    if symbolic:
        raise PullbackError(f"the pullback backend needs static shapes, but inputs {symbolic} of the Dynamo graph are symbolic; "
                            "use torch.compile(model, backend=\"pullback\", dynamic=False)")
    prog = import_exported(export(gm, tuple(example_inputs)))
    tp = TrainingProgram(prog, float_wrt(prog, prog.inputs) + prog.trainable, target, policy)
    state = dict(gm.named_parameters(remove_duplicate=False))
    state.update(gm.named_buffers(remove_duplicate=False))
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    as_tuple = isinstance(out_node.args[0], (tuple, list))

    def compiled(*inputs):
        tensors = list(inputs) + [state[prog.state_key(n)] for n in prog.params] + draw_masks(prog)
        results = run(tp, tensors)
        by_input = dict(zip(prog.inputs, inputs))
        with torch.no_grad():
            for (kind, target_name), value in zip(prog.mutations, results[prog.num_outputs:]):
                (state[target_name] if kind == "buffer" else by_input[target_name]).copy_(value)
        outs = results[: prog.num_outputs]
        return tuple(outs) if as_tuple else outs[0]

    compiled.program = tp
    return compiled


__all__ = ["pullback_backend"]
