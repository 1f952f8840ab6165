"""Import PyTorch modules through ``torch.export`` into a pullback ``IRModule``.

``from_torch(module, example_inputs)`` exports the module (in its current
train/eval mode), runs PyTorch's Core ATen decompositions (``decomposition_table``:
the default table, except a few composite operators that map to one pullback
operator, ``PRESERVED``), and converts every ATen node through
``aten_table.ATEN_TABLE``.

The signature of ``@main`` (order of parameters):

1. the user inputs, named after the exported placeholders (``%x``, ``%input``...);
2. with ``params_as="inputs"``: every parameter, then every buffer, named after
   its ``state_dict`` key with characters other than ``[A-Za-z0-9_]`` replaced by
   ``_`` and a ``v`` before a leading digit (``0.weight`` -> ``%v0_weight``); ``TorchProgram.state_names`` maps
   each back to its keys: tied weights (one tensor under several keys, e.g. GPT-2's ``wte``/``lm_head``) are
   ONE parameter whose ``state_names`` entry lists every key;
3. one random input per random draw in execution order (``RandomInput``): ``%dropout_mask_K`` per dropout
   applied in training (K = 0, 1, ...), of the data's shape and dtype, holding 0/1 values:
   ``nn.dropout(x, mask, rate) = x * mask / (1 - rate)``, drawn as PyTorch's own dropout draws
   ``torch.empty_like(x).bernoulli_(1 - rate)``; ``%uniform_K`` / ``%normal_K`` / ``%randperm_K`` for
   ``torch.rand`` / ``torch.randn`` / ``torch.randperm`` in ``forward``. In eval mode dropout is the identity
   and adds no parameter.

The result is the user output when there is exactly one and nothing is mutated;
otherwise a tuple ``(user outputs..., new values of mutated buffers/inputs...)``
(e.g. batch norm's running statistics in training mode).

Operators that cannot be converted are all collected first: one
``UnsupportedOperatorError`` lists each missing operator once, with its count and
the whole statement of user code of every use.
"""

from __future__ import annotations

import functools
import io
import operator
import re
import types
import warnings
from contextlib import redirect_stderr
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ..analysis.type_infer import infer_expr, infer_module
from ..ir.errors import DiagnosticError, PullbackError
from ..ir.expr import Constant, Expr, Function, If, Tuple, TupleGetItem, Var, const
from ..ir.module import IRModule
from ..ir.types import Any, TensorType
from ..runtime.values import tensor_numpy
from ..transform.recognize_ops import RecognizeOps
from . import custom_functions, custom_vjp, export_repairs
from .aten_table import ATEN_TABLE, _op
from .aten_linalg import CHECK_ERRORS, TOKEN
from .core_aten import UNSUPPORTED
from .context import (ConvertContext, DropoutMask, Names, RandomInput, higher_order, source_line, static_dim,
                      torch_dtype_name, torch_shape)
from .decompositions import own_decompositions
from .torch_checks import (check_inputs, check_module_state, keyword_arguments, keyword_labels, quiet_torch_logs,
                           tensor_hooks_refused, attribute_writes_warned)

# composite ops kept whole by run_decompositions because one pullback op covers them (or, for detach, because
# decomposing it to ``alias`` would lose its meaning: no gradient). Still the better choice: on a
# TransformerEncoderLayer (d256, h4, ff1024, batch 8 x 64) the preserved forward has 49 pullback operators
# against 69 fully decomposed (linear -> permute + addmm + view, SDPA -> bmm/softmax/where chains), and a
# compiled training step takes 1.5-1.9x less time; the decomposed forms remain converted (OpInfo covers both).
PRESERVED = (
    "linear.default", "layer_norm.default", "conv2d.default", "max_pool2d.default", "adaptive_avg_pool2d.default",
    "scaled_dot_product_attention.default", "cross_entropy_loss.default", "matmul.default", "detach.default",
    "silu.default", "softplus.default", "tril.default", "triu.default", "special_log_ndtr.default",
    # one kernel each way, eager's, where PyTorch's decompositions take four to seven (MobileNetV3, LeViT, Mish in
    # YOLOv4 and U-Nets)
    "hardswish.default", "hardsigmoid.default", "mish.default",
    # a write of one index (``out[:, t] = v`` in a loop): PyTorch's decomposition is a where over the whole tensor
    # (RWKV's time loop: quadratic in the sequence length), ours a strided_set of the one slice
    "select_scatter.default",
    # PyTorch's decompositions of these change the gradient: multilabel_margin_loss also sums the entries after a
    # -1 (a wrong loss); _safe_softmax's gives NaN (0 * NaN) on fully masked rows; index_fill's counts a repeated
    # index once per repeat in the fill value's gradient
    "multilabel_margin_loss.default", "_safe_softmax.default", "index_fill.int_Tensor", "index_fill.int_Scalar",
    # its decomposition draws float32 uniforms where eager draws them in the probabilities' dtype (float64: another
    # stream, other masks)
    "bernoulli.default",
    # F.nll_loss (after log_softmax: PyTorch's MNIST example): one ATen kernel each way, where PyTorch's decomposition
    # takes twelve small operators forward and eight backward (a third of a small MLP's step)
    "nll_loss_forward.default", "nll_loss2d_forward.default",
    # F.binary_cross_entropy_with_logits (segmentation, multi-label heads, GAN discriminators): one kernel forward and
    # one formula back, where the decomposition takes sixteen operators and saves two masks
    "binary_cross_entropy_with_logits.default",
    # nn.GRU and nn.RNN over a padded batch: one nn.gru / nn.rnn per layer and direction (ATen's kernels on torch,
    # eager's both ways), where PyTorch's decomposition unrolls every step's cell (nn.LSTM: decompositions.lstm)
    "gru.input", "rnn_tanh.input", "rnn_relu.input",
)
PARAMS_AS = ("inputs", "constants")
# a library's own operator (a torch.library custom op: its Python body and registered backward are opaque to the
# importer; those pullback knows are converted in ``library_ops``)
CUSTOM_OP_HINT = ("a library's custom operator (torch.library): pullback converts ATen operators and the custom ops of "
                  "frontend.library_ops; write it in PyTorch operations (a torch.autograd.Function for its own backward)")


class UnsupportedOperatorError(DiagnosticError):
    """ATen operators the importer cannot convert: each listed once, with its count and every source line."""


@dataclass
class TorchProgram:
    """An imported program and what it takes to call ``@main`` like the torch module."""

    mod: IRModule
    params: dict  # var name -> np.ndarray: parameters then buffers (params_as="inputs")
    inputs: list  # var names of the user inputs, in order
    state_names: dict  # var name -> tuple of state_dict keys (several for tied weights), for parameters and buffers
    trainable: list  # var names of the parameters (not buffers)
    masks: list  # RandomInput per random input parameter, in order
    num_outputs: int  # number of user outputs (leading fields of the result)
    single_output: bool  # the result is one tensor (not a tuple)
    # per extra field: ("buffer" | "parameter", state key) or ("input", input var name)
    mutations: list = field(default_factory=list)
    # positions in ``mutations`` of the buffers whose new value has another shape (a per-channel observer's
    # first batch: eager resizes them); the PyTorch integration resizes them, and exports again for the next call
    resized: tuple = ()
    out_spec: object = None  # torch.export's pytree spec of forward's result (a tuple, dict, ModelOutput, ...)
    # forward's results that are not tensors (a number, a string, None), by their position among its results'
    # leaves: not outputs of @main, put back by the PyTorch integration as they are
    constant_outputs: dict = field(default_factory=dict)
    # positions among the user outputs of those eager returns contiguous (its fake values' layout): the PyTorch
    # integration returns them so (a GEMM of a transposed input may run as a view in the input's axis order)
    contiguous_outputs: tuple = ()
    # the FQNs of the tensors torch.export lifted as constants: a plain tensor attribute of a submodule (not a
    # parameter or buffer) among them is baked into @main; the PyTorch integration exports again when it changes
    constant_tensors: tuple = ()

    @property
    def main(self) -> Function:
        return self.mod["main"]

    def state_key(self, name: str) -> str:
        """The first ``state_dict`` key of parameter/buffer ``name`` (the one ``torch.export`` names)."""
        return self.state_names[name][0]


def sanitize(name: str) -> str:
    """A valid ``%name`` from a state_dict key or placeholder name."""
    s = re.sub(r"[^A-Za-z0-9_]", "_", name) or "_"
    return "v" + s if s[0].isdigit() else s


_MISSING = object()


# core overloads lowered by PyTorch's own decompositions (torch._decomp) although the default table keeps them
# (upsampling becomes index arithmetic and ``index``/``_unsafe_index``, i.e. ``take``: the same formulas as eager)
# (``upsample_bilinear2d.vec``: ``decompositions.upsample_bilinear2d``, one ``image.resize2d`` for static sizes)
EXTRA_DECOMPOSED: tuple = ("upsample_nearest2d.vec", "grid_sampler_2d.default",
                           "upsample_nearest1d.vec", "upsample_linear1d.vec", "upsample_nearest3d.vec",
                           "upsample_trilinear3d.vec", "upsample_bicubic2d.vec")


def decomposition_table() -> dict:
    """The table ``export`` hands to ``run_decompositions``: ``torch.export.default_decompositions()``
    without the ``PRESERVED`` composites, plus PyTorch's decompositions of ``EXTRA_DECOMPOSED`` and the
    importer's own (``decompositions``) (a fresh dict each call; PyTorch's lazy table is materialised once
    per process)."""
    return dict(_decomposition_table())


@functools.cache
def _decomposition_table() -> dict:
    import torch
    from torch._decomp import decomposition_table as registry

    table = torch.export.default_decompositions()
    for name in PRESERVED:
        table.pop(_overload(name), None)
    for name in EXTRA_DECOMPOSED:
        op = _overload(name)
        if op in registry:
            table[op] = registry[op]
    table.update(own_decompositions())
    return dict(table.items())


def _overload(name: str):
    """``"aten.add.Tensor"`` or ``"add.Tensor"`` -> ``torch.ops.aten.add.Tensor``."""
    import torch

    parts = name.removeprefix("aten.").split(".")
    return getattr(getattr(torch.ops.aten, parts[0]), parts[1] if len(parts) > 1 else "default")


def batch_dynamic_shapes(example_inputs: Sequence, batched: Optional[Sequence[bool]] = None, batch=None,
                         dims: Optional[Sequence] = None):
    """``dynamic_shapes`` for ``torch.export``: dimension 0 of every tensor input (of those ``batched`` flags;
    none with ``batched=False``) is one symbolic batch size (a ``ShapesCollection``: keyed by the tensors, so it
    fits any ``forward`` signature, ``*args`` included); ``batch``: the ``Dim`` (default one named ``batch``, any
    size from 2). ``dims``: per input, more dimensions whose sizes may vary (``Dim.AUTO``: torch.export relates
    them, bounds them, or fixes those the model fixes), or None."""
    import torch

    batch = torch.export.Dim("batch") if batch is None else batch
    shapes = torch.export.ShapesCollection()
    for k, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            continue
        spec = {d: torch.export.Dim.AUTO for d in (dims[k] if dims is not None and k < len(dims) else ())}
        if x.ndim and batched is not False and (batched is None or batched is True or batched[k]):
            spec[0] = batch
        if spec:
            shapes[x] = spec
    return shapes


def _unaliased(example_inputs: Sequence) -> list:
    """``example_inputs`` with each tensor given again (the same object: ``model(ids, labels=ids)``) as a copy.
    torch.export traces the two inputs as one, reading the last placeholder for both: the program would read the
    labels where it is later given distinct token ids."""
    seen, out = set(), []
    for x in example_inputs:
        if id(x) in seen and hasattr(x, "detach"):
            x = x.detach().clone().requires_grad_(x.requires_grad)
        seen.add(id(x))
        out.append(x)
    return out


def export(module, example_inputs: Sequence, decompose: bool = True, dynamic_batch=False, keywords: Sequence[str] = (),
           settings: Optional[dict] = None, autocast=None, batch_ranges: bool = False,
           dynamic_dims: Optional[Sequence] = None):
    """``torch.export.export`` of ``module`` on ``example_inputs`` (+ Core ATen decompositions); with
    ``dynamic_batch``, dimension 0 of every input (or of those a sequence of flags selects) is symbolic (the
    example's batch must be at least 2). ``keywords``: the names the last ``len(keywords)`` inputs are passed
    by (``forward(ids, labels=labels)``; ``(name, spec)``: a tuple, list or dict of tensors, its leaves,
    ``torch_checks.keyword_labels``); the program's inputs keep the order of ``example_inputs``.
    ``settings``: keyword arguments that are not tensors (``use_cache=False``), constants of the program.
    ``autocast``: ``(device_type, dtype)`` of a ``torch.autocast`` region ``forward`` runs in (its casts become
    the program's), or None. ``batch_ranges``: where torch.export cannot give the batch every size (the model
    branches on it), a batch dimension of the range it infers (``batch_range``), or this batch size alone.
    ``dynamic_dims``: per input, the dimensions (other than the batch) whose sizes may vary (a sequence length:
    ``[(1,), (1,)]`` for token ids and labels); torch.export keeps each symbolic, or fixes it where the model
    does."""
    import torch

    if autocast is not None:
        with export_repairs.forward_in_autocast(module, *autocast):
            return export(module, example_inputs, decompose, dynamic_batch, keywords, settings, None, batch_ranges,
                          dynamic_dims)

    check_module_state(module, "from_torch")
    check_inputs(example_inputs, "from_torch", keywords=keywords)
    example_inputs = _unaliased(example_inputs)
    flags = bool(dynamic_batch) if isinstance(dynamic_batch, bool) else tuple(dynamic_batch)
    dims = None if dynamic_dims is None else [tuple(d) for d in dynamic_dims]
    varies = flags is True or flags is not False and any(flags) or dims is not None and any(dims)
    dynamic = batch_dynamic_shapes(example_inputs, flags, dims=dims) if varies else None
    # torch.export's internal notices are not the user's to act on
    with warnings.catch_warnings(), quiet_torch_logs(), export_repairs.memoised_callable_aliases(), \
            export_repairs.composite_ops_materialised_once(), export_repairs.graph_code_made_lazily():
        warnings.simplefilter("ignore", FutureWarning)
        # nn.RNN modules refresh _flat_weights in forward: torch.export's notice, not the user's to act on
        warnings.filterwarnings("ignore", "The tensor attributes .* were assigned during export", UserWarning)
        printed = io.StringIO()  # torch.export prints the partial graph of a failed trace to stderr
        with export_repairs.host_random_draws_refused():  # checked once the trace succeeded
            n = len(example_inputs) - len(keyword_labels(keywords))
            kwargs = {**keyword_arguments(keywords, example_inputs[n:]), **(settings or {})}

            def trace():
                with redirect_stderr(printed), export_repairs.while_tracing():
                    return torch.export.export(module, tuple(example_inputs[:n]), kwargs=kwargs, dynamic_shapes=dynamic)

            try:
                with custom_functions.recorded() as applied, tensor_hooks_refused("from_torch"), \
                        attribute_writes_warned("from_torch"):
                    try:
                        ep = trace()
                    except Exception as e:  # noqa: BLE001
                        if dynamic is None or not batch_ranges or "Constraints violated" not in str(e):
                            raise
                        # the model branches on the batch size (diffusers' Upsample2D: `if x.shape[0] >= 64`): a
                        # batch dimension of the range torch infers (batch_range), another export outside it; a
                        # batch torch specialises (1, or one the model fixes): this size only
                        dynamic = batch_dynamic_shapes(example_inputs, flags, torch.export.Dim.DYNAMIC, dims)
                        try:
                            ep = trace()
                        except Exception:  # noqa: BLE001
                            dynamic = batch_dynamic_shapes(example_inputs, False, dims=dims) if dims else None
                            ep = trace()
                # custom Functions whose backward is not their forward's derivative: exported again as opaque
                # operators, imported with their own backward (custom_vjp)
                own = custom_functions.mismatched(applied)
                if own:
                    with custom_vjp.routed(own):
                        ep = trace()
            except PullbackError:
                raise
            except Exception as e:  # noqa: BLE001 - report torch's reason as a pullback error
                export_repairs.pass_on(printed.getvalue(), getattr(e, "partial_fx_graph", None))
                raise PullbackError(f"from_torch: torch.export failed{export_repairs.failure_hint(e)}: "
                                    f"{type(e).__name__}: {e}") from e
        export_repairs.pass_on(printed.getvalue())
        export_repairs.detach_no_grad_blocks(ep)
        export_repairs.outer_guards_left_to_dynamo(ep)
        export_repairs.autocast_casts_kept(ep)
        if not decompose:
            return ep
        with export_repairs.rnn_dropout_between_layers(), export_repairs.random_draws_kept(_seeded_ops()), \
                export_repairs.composite_overrides_narrowed(ep), export_repairs.stack_traces_kept(), \
                export_repairs.data_dependent_sizes_retraced(ep):
            return ep.run_decompositions(decomposition_table())


@functools.cache
def batch_range(ep) -> tuple:
    """``(lo, hi)``: the batch sizes the exported program holds for (``hi`` None: no upper bound): the range of
    dimension 0 of its tensor user inputs that have one (symbolic: torch.export's range constraints; static: that
    size), intersected."""
    import sympy
    import torch
    from torch.export.graph_signature import InputKind
    from torch.utils._sympy.numbers import int_oo

    lo, hi = 0, None
    kinds = {s.arg.name: s.kind for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    for node in ep.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if kinds.get(node.name) != InputKind.USER_INPUT or not isinstance(val, torch.Tensor) or not val.ndim:
            continue
        d = val.shape[0]
        if isinstance(d, int):
            a, b = d, d
        else:
            r = ep.range_constraints.get(d.node.expr)
            if r is None:
                continue
            a, b = int(r.lower), (None if r.upper in (int_oo, sympy.oo) else int(r.upper))
        lo, hi = max(lo, a), b if hi is None else hi if b is None else min(hi, b)
    return lo, hi


def input_sizes(ep) -> tuple:
    """Per tensor user input of ``ep``, per dimension: its size (an int), or ``(symbol, lo, hi)`` for a size the
    program takes symbolic (torch.export's range for it; ``hi`` None: no bound). A size torch relates to others
    by a formula (not a plain symbol) stands for its example's size."""
    import sympy
    import torch
    from torch.export.graph_signature import InputKind
    from torch.utils._sympy.numbers import int_oo

    kinds = {s.arg.name: s.kind for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    out = []
    for node in ep.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if kinds.get(node.name) != InputKind.USER_INPUT or not isinstance(val, torch.Tensor):
            continue
        dims = []
        for d in val.shape:
            expr = None if static_dim(d) is not Any else d.node.expr
            if expr is None or not expr.is_Symbol:
                dims.append(int(static_dim(d)) if expr is None else int(d.node.hint))
                continue
            r = ep.range_constraints.get(expr)
            lo, hi = (0, None) if r is None else (int(r.lower), None if r.upper in (int_oo, sympy.oo) else int(r.upper))
            dims.append((str(expr), lo, hi))
        out.append(tuple(dims))
    return tuple(out)


def sizes_hold(sizes: tuple, shapes) -> bool:
    """Do tensors of ``shapes`` fit a program of ``input_sizes`` ``sizes`` (equal sizes where static, each
    symbol one size within its range)?"""
    bound: dict = {}
    if len(sizes) != len(shapes):
        return False
    for want, shape in zip(sizes, shapes):
        if len(want) != len(shape):
            return False
        for w, n in zip(want, shape):
            if isinstance(w, int):
                if w != n:
                    return False
                continue
            name, lo, hi = w
            if bound.setdefault(name, n) != n or n < lo or hi is not None and n > hi:
                return False
    return True


def _seeded_ops() -> tuple:
    """The converted ATen overloads that draw random numbers (PyTorch's ``nondeterministic_seeded`` tag)."""
    import torch

    out = []
    for name in ATEN_TABLE:
        parts = name.split(".")
        op = getattr(getattr(torch.ops.aten, parts[1], None), parts[2], None) if len(parts) == 3 else None
        if op is not None and torch.Tag.nondeterministic_seeded in op.tags:
            out.append(op)
    return tuple(out)


def _to_numpy(t) -> np.ndarray:
    return tensor_numpy(t.detach().cpu().contiguous()).copy()


def _read_only_view(t) -> np.ndarray:
    """The tensor's memory as a read-only array (a copy only when it is not a contiguous CPU tensor)."""
    t = t.detach()
    a = tensor_numpy(t) if t.is_cpu and t.is_contiguous() and not t.is_conj() and not t.is_neg() else _to_numpy(t)
    a = a.view()
    a.flags.writeable = False
    return a


def _rewritten_inputs(sig, OutputKind) -> dict:
    """The FX node giving a parameter's or an input's new value (a write in place) -> that input's node name."""
    inputs = {s.target: s.arg.name for s in sig.input_specs if getattr(s, "target", None) is not None}
    out = {}
    for spec in sig.output_specs:
        if spec.kind == OutputKind.PARAMETER_MUTATION and spec.target in inputs:
            out[spec.arg.name] = inputs[spec.target]
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            out[spec.arg.name] = spec.target
    return out


def _read_as_leaf(cx, env: dict, node, input_name: str, direct: bool) -> Expr:
    """A read of the new value a forward wrote into a trainable tensor outside autograd, as eager reads it: that
    value, whose gradient is the tensor's own (``stop_gradient(new) + (p - stop_gradient(p))``: ``new`` exactly
    for a finite ``p``). Functionalised, the later reads take ``new``, computed from ``p.data`` (``direct``: the
    written value itself, when it is computed from ``p``'s data and nothing differentiable: ``p.data.clamp_(...)``)
    or seen through the ``detach`` that closes a ``torch.no_grad()`` block (Gemma3n's AltUp clamps its
    coefficients so), and the tensor got no gradient at all. A value written with gradients (an input written in
    place by a differentiable operation, ``h.mul_(2)`` or ``h.zero_()``) is left as it is: its own gradient is
    the right one."""
    import torch

    e = env[node]
    leaf = next((v for n, v in env.items() if getattr(n, "name", None) == input_name and isinstance(v, Var)), None)
    val, old = node.meta.get("val"), None if leaf is None else leaf.type_annotation
    if leaf is None or id(leaf) not in cx.trainable or not isinstance(val, torch.Tensor) or not val.is_floating_point() \
            or torch_shape(val.shape) != old.shape or torch_dtype_name(val.dtype) != old.dtype \
            or (direct and not _from_data_of(e, leaf, cx)):
        return e
    sg = _op("stop_gradient")
    return _op("add")(sg(e), _op("subtract")(leaf, sg(leaf)))


def _from_data_of(e: Expr, leaf: Var, cx) -> bool:
    """Whether ``e`` is computed from ``leaf``'s data alone: it reads ``stop_gradient(leaf)`` (``leaf.data``) and
    no trainable variable other than through ``stop_gradient`` (an explicit stack)."""
    from ..ir.expr import Call
    from ..ir.traversal import children

    stack, seen, reads = [e], set(), False
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if isinstance(n, Call) and getattr(n.op, "name", None) == "stop_gradient":
            reads = reads or n.args[0] is leaf
            continue
        if isinstance(n, Var) and id(n) in cx.trainable:
            return False
        stack.extend(children(n))
    return reads


def _check_sizes_kept(cx, node, problems) -> None:
    """A problem for ``node`` if converting it fixed a dynamic input size (a converter that compared the size or
    made an int of it: torch then specialises it to the example's size; the program would hold for that size
    alone)."""
    fixed = [(name, axis, static_dim(d)) for name, axis, d in cx.symbolic_inputs if static_dim(d) is not Any]
    if fixed:
        cx.symbolic_inputs = [t for t in cx.symbolic_inputs if static_dim(t[2]) is Any]
        sizes = ", ".join(f"dimension {axis} of {name} at {n}" for name, axis, n in fixed)
        problems.add(f"{node.target}", node, f"converting it fixed a dynamic size ({sizes})")


def import_exported(ep, params_as: str = "inputs", tied: Optional[dict] = None,
                    copy_params: bool = True, grad_inputs: Optional[Sequence[bool]] = None) -> TorchProgram:
    """Convert an ``ExportedProgram`` (see the module docstring for the signature of ``@main``).

    ``tied`` (optional) maps a state_dict key to every key sharing its tensor (``tied_keys(module)``); keys
    whose tensors are one object in ``ep.state_dict`` are tied in any case. ``copy_params=False``: ``params``
    holds read-only views of the parameters and buffers (they follow the module's training) instead of copies
    (the PyTorch integration, which passes the live tensors: a copy took 0.7 s and 440 MB for BERT-base).
    ``grad_inputs`` (optional): per tensor user input, whether it requires grad, for a program specialised on it
    (Dynamo's graphs take the parameters as inputs): as a trainable parameter, it picks eager's kernel for what
    depends on it (a learnable attention bias).
    """
    import torch
    from torch.export.graph_signature import InputKind, OutputKind

    if params_as not in PARAMS_AS:
        raise PullbackError(f"from_torch: params_as must be one of {', '.join(map(repr, PARAMS_AS))}, got {params_as!r}")
    sig = ep.graph_signature
    specs = {s.arg.name: s for s in sig.input_specs}
    state = dict(ep.state_dict)
    state.update(getattr(ep, "constants", {}) or {})
    names = Names()
    cx = ConvertContext(names)
    env: dict = {}
    user_vars: list[Var] = []
    state_vars: list[list] = []  # [var, [state keys], is parameter]
    by_tensor: dict = {}  # id(tensor) -> entry of state_vars (tied weights share one)
    params: dict = {}
    problems = _Problems()
    rewritten, raw = _rewritten_inputs(sig, OutputKind), {}
    for node in ep.graph.nodes:
        cx.node = node
        if node.op == "placeholder":
            spec = specs[node.name]
            val = node.meta["val"]
            if spec.kind == InputKind.USER_INPUT and not isinstance(val, torch.Tensor):
                env[node] = val  # a setting passed by keyword (use_cache=False): specialised, not an input
                continue
            ty = TensorType(torch_shape(val.shape), torch_dtype_name(val.dtype))
            if spec.kind == InputKind.USER_INPUT:
                v = Var(names.fresh(sanitize(node.name)), ty)
                if grad_inputs is not None and len(user_vars) < len(grad_inputs) and grad_inputs[len(user_vars)]:
                    cx.trainable.add(id(v))
                user_vars.append(v)
                cx.user_inputs.append(v)
                cx.note_sizes(v, val)
                cx.symbolic_inputs += [(v.name_hint, axis, d) for axis, d in enumerate(val.shape) if ty.shape[axis] is Any]
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                tensor = state[spec.target]
                if params_as == "constants" or spec.kind == InputKind.CONSTANT_TENSOR:
                    v = Constant(_to_numpy(tensor))
                elif id(tensor) in by_tensor:  # a tied weight: the same parameter under another key
                    entry = by_tensor[id(tensor)]
                    v = entry[0]
                    entry[1].append(spec.target)
                else:
                    v = Var(names.fresh(sanitize(spec.target)), ty)
                    entry = by_tensor[id(tensor)] = [v, [spec.target], spec.kind == InputKind.PARAMETER]
                    state_vars.append(entry)
                    if spec.kind == InputKind.PARAMETER and tensor.requires_grad:
                        cx.trainable.add(id(v))
                    params[v.name_hint] = _to_numpy(tensor) if copy_params else _read_only_view(tensor)
            elif spec.kind == InputKind.TOKEN:  # threaded through operators with side effects
                if _effects(ep.graph):
                    raise _effects_error(ep.graph)
                env[node] = TOKEN  # only linalg's error checks, which the kernels make themselves
                continue
            else:
                raise PullbackError(f"from_torch: input {node.name} of kind {spec.kind.name} is not supported")
            env[node] = v
            cx.record(v, val)
        elif node.op == "call_function":
            env[node] = _convert(cx, node, env, problems)
            if cx.symbolic_inputs:
                _check_sizes_kept(cx, node, problems)
            written = node.name if node.name in rewritten else export_repairs.no_grad_read_of(node)
            if written in rewritten:
                raw[node] = env[node]  # what is written back: the value itself, bit for bit
                env[node] = _read_as_leaf(cx, env, node, rewritten[written], node.name in rewritten)
        elif node.op == "output":
            outs = node.args[0]
        else:
            env[node] = _other_node(ep.graph_module, node, problems)
    if problems:
        raise problems.error()

    # mutated values are state writes (eager updates buffers under no_grad): no gradient flows back from them
    user_out, mutations, extra, constant_outputs, contiguous = [], [], [], {}, []
    constant_tensors = tuple(spec.target for spec in sig.input_specs if spec.kind == InputKind.CONSTANT_TENSOR)
    by_name = {v.name_hint: v for v in user_vars}
    for spec, out in zip(sig.output_specs, outs):
        if spec.kind in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT) and out not in env:
            constant_outputs[len(user_out) + len(constant_outputs)] = out  # a number, string or None: not computed
            continue
        if spec.kind == OutputKind.TOKEN:
            continue
        e = env[out]
        if spec.kind in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT):
            if _contiguous(out):
                contiguous.append(len(user_out))
            user_out.append(e)
        elif spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION):
            mutations.append(("buffer" if spec.kind == OutputKind.BUFFER_MUTATION else "parameter", spec.target))
            extra.append(_op("stop_gradient")(raw.get(out, e)))
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            mutations.append(("input", by_name.get(sanitize(spec.target), user_vars[0]).name_hint if user_vars else spec.target))
            extra.append(_op("stop_gradient")(raw.get(out, e)))
        else:
            raise PullbackError(f"from_torch: output of kind {spec.kind.name} is not supported")
    if not user_out:
        raise PullbackError(f"from_torch: forward returns no tensor (only {list(constant_outputs.values())}): "
                            "there is nothing to compute")
    single = len(user_out) == 1 and not extra
    body = user_out[0] if single else Tuple(user_out + extra)
    fn_params = user_vars + [entry[0] for entry in state_vars] + cx.mask_vars
    mod = IRModule({"main": Function(fn_params, body), **cx.functions})
    infer_module(mod)
    # decomposed formulas (Hugging Face's gelu_new) back into operators
    mod = RecognizeOps(frozenset(v.name_hint for v in fn_params if id(v) in cx.trainable))(mod)
    by_key = {k: v for v, keys, _ in state_vars for k in keys}
    resized = tuple(i for i, ((kind, name), e) in enumerate(zip(mutations, extra))
                    if name in by_key and e.checked_type.shape != by_key[name].type_annotation.shape)
    state_names = {}
    for v, keys, _ in state_vars:
        more = [k for key in keys for k in (tied or {}).get(key, ()) if k not in keys]
        state_names[v.name_hint] = tuple(keys) + tuple(dict.fromkeys(more))
    return TorchProgram(
        mod=mod, params=params, inputs=[v.name_hint for v in user_vars], state_names=state_names,
        trainable=[v.name_hint for v, _, is_param in state_vars if is_param],
        masks=list(cx.masks), num_outputs=len(user_out), single_output=single, mutations=mutations,
        resized=resized, out_spec=getattr(getattr(ep, "call_spec", None), "out_spec", None), constant_outputs=constant_outputs,
        contiguous_outputs=tuple(contiguous), constant_tensors=constant_tensors,
    )


def _contiguous(node) -> bool:
    """Is the FX ``node``'s value (its fake tensor) of rank 2 or more, and contiguous?"""
    v = getattr(node, "meta", {}).get("val")
    try:
        return v is not None and v.dim() >= 2 and bool(v.is_contiguous())
    except Exception:  # noqa: BLE001 - a symbolic layout: left as it comes
        return False


class _Problems:
    """Unconvertible nodes, grouped by operator: each operator once, with its count and every source line."""

    def __init__(self):
        self.by_op: dict = {}  # operator -> list of (source line, detail)

    def add(self, key: str, node, detail: str = "") -> None:
        self.by_op.setdefault(key, []).append((source_line(node), detail))

    def __bool__(self) -> bool:
        return bool(self.by_op)

    def error(self) -> UnsupportedOperatorError:
        diags = []
        for key, uses in self.by_op.items():
            n = len(uses)
            lines = [f"{key} ({n} use{'s' if n != 1 else ''})"]
            for where, detail in uses:
                lines.append(f"    at {where}" + (f": {detail}" if detail else ""))
            diags.append("\n".join(lines))
        total = sum(len(u) for u in self.by_op.values())
        header = (f"from_torch: cannot import the module: {len(self.by_op)} operator{'s' if len(self.by_op) != 1 else ''} "
                  f"({total} node{'s' if total != 1 else ''}) not supported; everything else converted")
        return UnsupportedOperatorError(header, diags)


def _effects(graph) -> list:
    """The ``with_effects`` nodes of operators with side effects other than linalg's error checks (prints)."""
    hop = higher_order("with_effects")
    return [n for n in graph.nodes if n.op == "call_function" and n.target is hop and str(n.args[1]) != CHECK_ERRORS]


def _effects_error(graph) -> PullbackError:
    """The error for operators torch.export runs with an effect token (``with_effects``: prints), listed with the
    user code that calls them."""
    uses = [f"{n.args[1]} at {source_line(n)}" for n in _effects(graph)]
    return PullbackError("from_torch: the module calls operators with side effects, which pullback does not convert "
                         f"(torch.export threads an effect token through them): {'; '.join(uses) or 'none found'}")


def _other_node(gm, node, problems: _Problems):
    """A ``get_attr`` node's graph (the branch of a ``torch.cond``), else reported (``_MISSING``)."""
    import torch

    if node.op == "get_attr" and isinstance(getattr(gm, node.target, None), torch.fx.GraphModule):
        return getattr(gm, node.target)
    problems.add(f"FX node of kind {node.op}", node, f"{node.target}")
    return _MISSING


def _branch(cx: ConvertContext, gm, operands: list, problems: _Problems) -> list:
    """The values the graph of a ``torch.cond`` branch computes from ``operands`` (its placeholders, in order)."""
    env: dict = {}
    inputs = iter(operands)
    outer, outs = cx.node, []
    try:
        for node in gm.graph.nodes:
            cx.node = node
            if node.op == "placeholder":
                env[node] = next(inputs)
            elif node.op == "call_function":
                env[node] = _convert(cx, node, env, problems)
            elif node.op == "output":
                outs = _map_args(node.args[0], env)
            else:
                env[node] = _other_node(gm, node, problems)
    finally:
        cx.node = outer
    return list(outs)


def _cond(cx: ConvertContext, node, args: list, problems: _Problems):
    """``torch.cond(pred, true_fn, false_fn, operands)``: an ``If`` of the two branches' values (a tuple), each
    result one field of it; only the taken branch runs, and the gradient flows through it."""
    pred, true_gm, false_gm, operands = args[:4]
    branches = [_branch(cx, gm, list(operands), problems) for gm in (true_gm, false_gm)]
    if any(_has_missing(b) for b in branches):
        return _MISSING
    if isinstance(pred, (bool, int)):  # decided when exporting
        return branches[0] if pred else branches[1]
    test = pred if cx.dtype_of(pred) == "bool" else _op("not_equal")(pred, const(np.zeros((), cx.dtype_of(pred))))
    if cx.shape_of(test):
        test = _op("reshape")(test, ())
    out = If(test, Tuple(branches[0]), Tuple(branches[1]))
    return [TupleGetItem(out, i) for i in range(len(branches[0]))]


def _convert(cx: ConvertContext, node, env: dict, problems: _Problems):
    """The pullback value of one ``call_function`` node (``_MISSING`` when it, or an input, cannot be converted)."""
    args = _map_args(node.args, env)
    kwargs = _map_args(node.kwargs, env)
    if _has_missing(args) or _has_missing(kwargs):
        return _MISSING  # an input is already reported: no follow-on error
    if node.target is operator.getitem:
        value = args[0][args[1]]
        if value is None:
            problems.add(f"output {args[1]} of {node.args[0].target}", node, "this result is not converted")
            return _MISSING
    elif node.target is higher_order("cond"):
        value = _cond(cx, node, args, problems)
        if value is _MISSING:
            return value
    elif str(node.target).startswith(custom_vjp.NAMESPACE + "."):  # a custom Function with its own backward
        value = custom_vjp.convert(cx, str(node.target).split(".")[1], args[0])
    else:
        key = target_key(node.target)
        conv = ATEN_TABLE.get(key)
        if conv is None:
            hint = UNSUPPORTED.get(key) or (CUSTOM_OP_HINT if _is_library_op(node.target) else "")
            problems.add(key, node, hint)  # a known gap says why
            return _MISSING
        try:
            value = conv(cx, *args, **kwargs)
            for e in (value if isinstance(value, list) else (value,)):
                if isinstance(e, Expr):  # typed here: an operator's type error is this node's, not a later one's
                    infer_expr(e)
        except PullbackError as e:
            problems.add(key, node, str(e).replace("from_torch: ", ""))
            return _MISSING
        except (TypeError, ValueError, IndexError, KeyError) as e:  # a form the converter does not handle
            problems.add(key, node, f"these arguments are not supported ({type(e).__name__}: {e})")
            return _MISSING
    if isinstance(value, list):
        for e, val in zip(value, node.meta.get("val", ())):
            cx.record(e, val)
    else:
        cx.record(value, node.meta.get("val"))
    return value


def target_key(target) -> str:
    """The converter table's key of a graph node's target: an operator's name (``aten.add.Tensor``), a Python
    function's ``module.qualname`` (``torch.sym_sum``), else its ``str`` (``operator.add``'s)."""
    if isinstance(target, types.FunctionType):
        return f"{target.__module__}.{target.__qualname__}"
    return str(target)


def _is_library_op(target) -> bool:
    """An operator of a library's namespace (torch.library), not ATen's or prims'."""
    import torch

    return isinstance(target, torch._ops.OpOverload) and target.namespace not in ("aten", "prims")


def _map_args(a, env):
    """FX args with nodes replaced by their values (iterative over nested lists/tuples/dicts)."""
    from torch.fx import Node

    if isinstance(a, Node):
        return env[a]
    if not isinstance(a, (list, tuple, dict)):
        return a
    root: list = [None]
    stack = [(a, root, 0)]
    while stack:
        src, dst, i = stack.pop()
        if isinstance(src, Node):
            dst[i] = env[src]
        elif isinstance(src, dict):
            out = dict(src)
            dst[i] = out
            for k, v in src.items():
                stack.append((v, out, k))
        elif isinstance(src, (list, tuple)):
            out = list(src)
            dst[i] = out  # tuples become lists (converters accept both)
            for j, v in enumerate(src):
                stack.append((v, out, j))
        else:
            dst[i] = src
    return root[0]


def _has_missing(a) -> bool:
    stack = [a]
    while stack:
        x = stack.pop()
        if x is _MISSING:
            return True
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return False


def tied_keys(module) -> dict:
    """``state_dict`` key -> every key of ``module`` sharing its tensor (parameters and buffers)."""
    groups: dict = {}
    for key, t in list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False)):
        groups.setdefault(id(t), []).append(key)
    return {k: tuple(keys) for keys in groups.values() if len(keys) > 1 for k in keys}


def import_torch(module, example_inputs: Sequence, params_as: str = "inputs", decompose: bool = True,
                 dynamic_batch: bool = False, dynamic_dims: Optional[Sequence] = None) -> TorchProgram:
    """Export ``module`` (in its current train/eval mode) and convert it; see ``TorchProgram``. With
    ``dynamic_batch``, ``@main``'s inputs have a ``?`` batch dimension (one program for every batch size);
    ``dynamic_dims``: per input, more dimensions that may vary (``export``), ``?`` where torch keeps them so."""
    if params_as not in PARAMS_AS:
        raise PullbackError(f"from_torch: params_as must be one of {', '.join(map(repr, PARAMS_AS))}, got {params_as!r}")
    if not isinstance(example_inputs, (list, tuple)):
        example_inputs = (example_inputs,)
    ep = export(module, example_inputs, decompose, dynamic_batch, dynamic_dims=dynamic_dims)
    return import_exported(ep, params_as, tied_keys(module))


def from_torch(module, example_inputs: Sequence, params_as: str = "inputs", dynamic_batch: bool = False,
               dynamic_dims: Optional[Sequence] = None) -> tuple[IRModule, dict]:
    """``(IRModule, params)`` for a ``torch.nn.Module`` traced with ``torch.export`` on ``example_inputs``.

    ``params`` maps each parameter/buffer parameter name of ``@main`` to its NumPy
    value (empty with ``params_as="constants"``, where they become Constants).
    ``dynamic_batch=True`` gives the inputs of ``@main`` a ``?`` batch dimension; ``dynamic_dims`` (per input,
    a sequence of dimensions: ``[(1,), (1,)]``) a ``?`` to those that may vary (a sequence length).
    Unsupported ATen operators raise one ``UnsupportedOperatorError`` listing
    each once with its count and source lines.
    """
    prog = import_torch(module, example_inputs, params_as, dynamic_batch=dynamic_batch, dynamic_dims=dynamic_dims)
    return prog.mod, prog.params


def _as_array(x) -> np.ndarray:
    return _to_numpy(x) if hasattr(x, "detach") else np.asarray(x)


def main_inputs(prog: TorchProgram, user_inputs: Sequence, masks: Optional[Sequence] = None) -> list:
    """Arguments of ``@main`` in order: user inputs (arrays), ``prog.params``, then masks."""
    masks = list(masks or [])
    if len(masks) != len(prog.masks):
        raise PullbackError(f"@main takes {len(prog.masks)} dropout mask(s) ({', '.join(m.name for m in prog.masks) or 'none'}), "
                            f"got {len(masks)}")
    return [_as_array(x) for x in user_inputs] + list(prog.params.values()) + masks


__all__ = ["from_torch", "import_torch", "import_exported", "export", "decomposition_table", "TorchProgram", "RandomInput",
           "DropoutMask", "UnsupportedOperatorError", "main_inputs", "sanitize", "source_line", "tied_keys"]
