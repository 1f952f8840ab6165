"""Train PyTorch modules with pullback: ``compile(module, example_inputs)``.

The module is imported (``frontend.import_torch``), differentiated
(``FirstOrderGradient(mode="vjp")`` with respect to the float user inputs and the
parameters), cleaned (``standard_cleanup``), split by
``PartitionForwardBackward`` into ``@main_fwd`` / ``@main_bwd`` and built for
``target``. A ``torch.autograd.Function`` runs ``@main_fwd`` in its forward
(keeping the residuals) and ``@main_bwd`` in its backward, so any torch
optimizer trains the original module's parameters (the compiled module holds
the original as ``.module`` and shares its parameters).

Per call: dropout masks are drawn with ``torch.empty(shape).bernoulli_(1 - p)``
(PyTorch's CPU dropout draws the same way), mutated buffers (batch norm's
running statistics) are written back, and a new program is compiled for a new
train/eval mode or input shape (kept in a cache; with ``dynamic_batch=True`` one program serves every
batch size).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..frontend.torch_checks import check_inputs
from ..frontend.torch_importer import TorchProgram, export, import_exported, tied_keys
from ..ir.errors import PullbackError
from ..ir.types import FLOAT_DTYPES, flatten_type
from ..runtime import build
from ..transform import FirstOrderGradient, PartitionForwardBackward, standard_cleanup

TARGETS = ("numpy", "jax")


class TrainingProgram:
    """An imported program with its built ``@main_fwd`` / ``@main_bwd`` and how torch values map to them."""

    def __init__(self, prog: TorchProgram, wrt: Sequence[str], target: str = "numpy", policy: str = "save_all"):
        if target not in TARGETS:
            raise PullbackError(f"pullback.integrations.torch: target must be one of {', '.join(TARGETS)}, got {target!r}")
        self.prog = prog
        params = prog.main.params
        names = [p.name_hint for p in params]
        self.wrt_index = [names.index(w) for w in wrt]
        mod = FirstOrderGradient("main", wrt=list(wrt), mode="vjp")(prog.mod)
        mod = standard_cleanup()(mod)
        self.mod = PartitionForwardBackward("main_grad", policy=policy)(mod)
        exe = build(self.mod, target=target)
        self.fwd, self.bwd = exe["main_fwd"], exe["main_bwd"]
        self.num_inputs = len(params)
        self.out_types = flatten_type(prog.main.body.checked_type) if not prog.single_output else [prog.main.body.checked_type]
        self.num_results = len(self.out_types)


def _to_numpy(t) -> np.ndarray:
    return t.detach().cpu().numpy()


def _to_torch(a):
    import torch

    a = np.asarray(a)
    if not a.flags.writeable or not a.flags.c_contiguous:
        a = np.array(a, copy=True)
    return torch.from_numpy(a)


def _function():
    """The ``torch.autograd.Function`` (made on first use so ``import pullback`` never imports torch)."""
    global _FUNCTION
    if _FUNCTION is not None:
        return _FUNCTION
    import torch

    class PullbackFunction(torch.autograd.Function):
        """forward: ``@main_fwd`` (residuals kept on ctx); backward: ``@main_bwd``."""

        @staticmethod
        def forward(ctx, tp: TrainingProgram, *tensors):
            out, residuals = tp.fwd(*[_to_numpy(t) for t in tensors])
            ctx.tp = tp
            ctx.residuals = residuals
            outs = [out] if tp.prog.single_output else list(out)
            ctx.out_shapes = [np.shape(o) for o in outs]  # concrete, also where the program's batch dim is ``?``
            results = tuple(_to_torch(o) for o in outs)
            nondiff = [r for r, t in zip(results, tp.out_types) if t.dtype not in FLOAT_DTYPES]
            nondiff += list(results[tp.prog.num_outputs:])
            if nondiff:
                ctx.mark_non_differentiable(*nondiff)
            return results

        @staticmethod
        def backward(ctx, *grads):
            if torch.is_grad_enabled():  # create_graph=True: a differentiable gradient is asked for
                raise PullbackError(DOUBLE_BACKWARD)
            tp = ctx.tp
            cts = []
            for g, t, shape in zip(grads, tp.out_types, ctx.out_shapes):
                cts.append(np.zeros(shape, t.dtype) if g is None or t.dtype not in FLOAT_DTYPES else _to_numpy(g).astype(t.dtype, copy=False))
            ct = cts[0] if tp.prog.single_output else tuple(cts)
            gs = tp.bwd(*ctx.residuals, ct)
            ctx.residuals = None
            full = [None] * tp.num_inputs
            for k, i in enumerate(tp.wrt_index):
                if ctx.needs_input_grad[1 + i]:
                    full[i] = _to_torch(gs[k])
            return (None, *full)

    _FUNCTION = PullbackFunction
    return _FUNCTION


_FUNCTION = None
DOUBLE_BACKWARD = (
    "pullback.integrations.torch: a compiled module's gradient is not differentiable (create_graph=True, "
    "double backward, gradient penalties): its backward is one pullback program. For higher derivatives, apply "
    "transform.FirstOrderGradient to the gradient program itself, or differentiate the eager module")


def draw_masks(prog: TorchProgram, inputs: Sequence = ()) -> list:
    """Fresh random inputs for ``prog`` in execution order, drawn as eager draws them (``RandomInput.draw``:
    dropout masks are ``empty_like(x).bernoulli_(1 - rate)``, like PyTorch's CPU dropout); a dynamic batch
    dimension takes the batch size of ``inputs``."""
    batch = next((x.shape[0] for x in inputs if getattr(x, "ndim", 0)), None)
    return [m.draw(batch) for m in prog.masks]


def run(tp: TrainingProgram, tensors: Sequence) -> tuple:
    """Apply the autograd Function: all results (user outputs, then mutated values)."""
    return _function().apply(tp, *tensors)


def float_wrt(prog: TorchProgram, names: Sequence[str]) -> list[str]:
    params = {p.name_hint: p for p in prog.main.params}
    return [n for n in names if params[n].type_annotation.dtype in FLOAT_DTYPES]


def _module_class():
    import torch

    class CompiledModule(torch.nn.Module):
        """``module`` trained through pullback; ``.module`` is the original (parameters shared)."""

        def __init__(self, module, example_inputs: Sequence, target: str, policy: str, dynamic_batch: bool = False):
            super().__init__()
            self.module = module
            self.target = target
            self.policy = policy
            self.dynamic_batch = dynamic_batch
            self._programs: dict = {}
            self._program(tuple(example_inputs))

        def _program(self, inputs: tuple) -> TrainingProgram:
            check_inputs(inputs, "pullback.integrations.torch", "input")
            shapes = tuple((tuple(x.shape)[1:] if self.dynamic_batch else tuple(x.shape), x.dtype) for x in inputs)
            key = (self.module.training,) + shapes
            tp = self._programs.get(key)
            if tp is None:
                prog = import_exported(export(self.module, inputs, dynamic_batch=self.dynamic_batch), tied=tied_keys(self.module))
                tp = TrainingProgram(prog, float_wrt(prog, prog.inputs) + prog.trainable, self.target, self.policy)
                self._programs[key] = tp
            return tp

        def forward(self, *inputs):
            tp = self._program(inputs)
            prog = tp.prog
            state = dict(self.module.named_parameters(remove_duplicate=False))
            state.update(self.module.named_buffers(remove_duplicate=False))
            tensors = list(inputs) + [state[prog.state_key(n)] for n in prog.params] + draw_masks(prog, inputs)
            results = run(tp, tensors)
            by_input = dict(zip(prog.inputs, inputs))
            import torch

            with torch.no_grad():
                for (kind, target), value in zip(prog.mutations, results[prog.num_outputs:]):
                    (by_input[target] if kind == "input" else state[target]).copy_(value)
            return results[0] if prog.num_outputs == 1 else results[: prog.num_outputs]

    return CompiledModule


def compile(module, example_inputs: Sequence, target: str = "numpy", policy: str = "save_all", dynamic_batch: bool = False):
    """A ``torch.nn.Module`` that runs ``module`` through pullback (see the module docstring).

    ``target``: ``"numpy"`` or ``"jax"`` (the executor of ``@main_fwd``/``@main_bwd``);
    ``policy``: what the forward saves for the backward (``PartitionForwardBackward``);
    ``dynamic_batch``: import with a ``?`` batch dimension and compile one program for every batch size
    (else one per input shape).
    """
    if target not in TARGETS:
        raise PullbackError(f"pullback.integrations.torch.compile: target must be one of {', '.join(TARGETS)}, got {target!r}")
    if not isinstance(example_inputs, (list, tuple)):
        example_inputs = (example_inputs,)
    return _module_class()(module, example_inputs, target, policy, dynamic_batch)


def train_side_by_side(model, batches: Sequence, loss_fn, lr: float = 0.1, target: str = "numpy",
                       policy: str = "save_all", verbose: bool = True) -> dict:
    """Train a copy of ``model`` eagerly and ``model`` through ``compile`` with ``torch.optim.SGD`` on
    the same ``batches`` (tuples ``(inputs, labels)``), from the same initial weights and RNG seeds.

    Returns ``{"eager": [losses], "pullback": [losses], "max_weight_diff": float, "eager_model": m}``.
    """
    import copy

    import torch

    eager = copy.deepcopy(model)
    compiled = compile(model, batches[0][0], target=target, policy=policy)
    opts = [torch.optim.SGD(m.parameters(), lr=lr) for m in (eager, compiled)]
    losses: dict = {"eager": [], "pullback": []}
    for step, (inputs, labels) in enumerate(batches):
        for key, m, opt in (("eager", eager, opts[0]), ("pullback", compiled, opts[1])):
            torch.manual_seed(step)  # same dropout masks on both sides
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


__all__ = ["compile", "train_side_by_side", "check_side_by_side", "TrainingProgram", "run", "draw_masks", "float_wrt"]
