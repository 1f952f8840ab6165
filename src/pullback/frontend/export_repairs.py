"""What ``torch.export`` and its decompositions lose or add, put right before conversion (``torch_importer.export``).

- a ``with torch.no_grad():`` block is inlined by ``run_decompositions``: its results get a ``detach``;
- torch 2.13's RNN decomposition never applies the dropout between stacked layers: it is applied as eager does;
- a failed trace prints its partial graph to stderr: only what the model itself printed is passed on;
- a trace that branches on a tensor's value fails: the error says how to make the branch static; one whose
  shapes depend on values says what to use instead;
- ``torch.distributions`` validate their arguments by a branch on values: not while exporting, and neither does
  ``F.gaussian_nll_loss`` (``nn.GaussianNLLLoss``) check its variance for negative entries;
- ``nn.Transformer*`` compare a given mask with a causal one to pick an attention kernel: the mask is used as given;
- reentrant activation checkpointing runs its function under no_grad: it runs as plain code;
- a forward drawing from NumPy's or Python's random generator would bake the draws in: an error;
- a ``torch.autocast`` region open around the call is not traced: ``forward`` runs inside one
  (``forward_in_autocast``); ``run_decompositions`` decomposes some composite operators outside the region
  (``einsum``, ``nll_loss_nd``): their operands get autocast's casts before (``autocast_casts_kept``);
- ``run_decompositions`` drops a random draw whose result is unused (a dropout feeding only an unused output):
  eager still draws it, so every later draw would differ; such draws are kept (``random_draws_kept``);
- ``run_decompositions`` spends up to half its time building ``Callable[...]`` annotations: they are memoised
  while it runs (``memoised_callable_aliases``); export and ``run_decompositions`` materialise every C++
  composite operator about 26 times per call: once, unless new ones were registered
  (``composite_ops_materialised_once``); it overrides the kernels of every composite operator twice per call:
  only of those the program calls or the table decomposes otherwise (``composite_overrides_narrowed``).
"""

from __future__ import annotations

import collections.abc
import contextvars
import functools
import operator
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

from .context import higher_order

DATA_DEPENDENT_HINT = (
    " (the module branches on a tensor's value, e.g. `if mask.any():` or LayerDrop's `torch.rand(()) < p`, or "
    "makes a Python number of one, e.g. `int(mask.sum())` or `.item()`; "
    "torch.export follows one path: make the choice a Python setting, e.g. layerdrop=0 in a model's config, "
    "or compute both sides and pick with torch.where, or branch with torch.cond (only the taken side runs); or "
    "train it through torch.compile(model, backend=\"pullback\"), "
    "which runs such branches eagerly between the graphs it compiles)")
EAGER_BETWEEN_GRAPHS = ("train it through torch.compile(model, backend=\"pullback\"), which runs that part eagerly "
                        "between the graphs it compiles")
DYNAMIC_SHAPE_HINT = (
    " (an operator whose result's shape depends on the values of its inputs, such as nonzero, unique, masked_select, "
    "boolean-mask indexing or ctc_loss, has no static type: compute with masks of fixed shape, "
    f"e.g. torch.where, instead, or {EAGER_BETWEEN_GRAPHS})")
DATA_DEPENDENT_SIZE_HINT = (
    " (a size computed from tensor values, such as the number of rows `x[mask]`, `nonzero` or `masked_select` "
    "select, reaches a check or operator that torch.export cannot decide for every size, e.g. batch_norm's batch "
    "size check or cdist: compute on the fixed shape and weight by the mask instead, e.g. "
    "`(F.cross_entropy(logits, labels, reduction='none') * mask).sum() / mask.sum()`, "
    f"or {EAGER_BETWEEN_GRAPHS})")
HOST_READ_HINT = (" (forward reads a tensor's values into NumPy, e.g. a matching computed with SciPy on the "
                  "detached costs, which torch.export cannot trace: compute it with torch operators, or "
                  f"{EAGER_BETWEEN_GRAPHS})")
VALUE_SIZE_HINT = (
    " (a size is computed from a tensor's values, e.g. the batch sizes of pack_padded_sequence's lengths in an RNN "
    f"over a PackedSequence, which torch.export cannot trace: pad the batch and mask instead, or {EAGER_BETWEEN_GRAPHS})")
CACHE_OUTPUT_HINT = (
    " (the model returns its key/value cache, an object torch.export cannot flatten: to train, turn the cache "
    "off with model.config.use_cache = False or by passing use_cache=False)")

DATA_WRITE_HINT = (
    " (the forward most likely reads or writes a tensor's .data, e.g. Gemma3n's `weight.data.clamp_(...)` in "
    "training, which torch.export cannot trace: write it in place under `with torch.no_grad():` instead, or train "
    "through torch.compile(model, backend=\"pullback\"); either keeps the tensor's gradient as eager does)")


def failure_hint(e: BaseException) -> str:
    """What to change in the model, for the export failures whose torch message does not say it."""
    name = type(e).__name__
    if "GuardOnDataDependent" in name:
        sized = "Size-like symbols:" in str(e) and "Size-like symbols: none" not in str(e)
        return DATA_DEPENDENT_SIZE_HINT if sized else DATA_DEPENDENT_HINT
    if name == "DynamicOutputShapeException":
        return DYNAMIC_SHAPE_HINT
    if isinstance(e, TypeError) and "FakeTensor" in str(e):  # a tensor where a size goes: torch.zeros(n, t)
        return VALUE_SIZE_HINT
    if ".numpy() is not supported for tensor subclasses" in str(e):
        return HOST_READ_HINT
    if "Cache'> in output" in str(e):  # Hugging Face's DynamicCache (use_cache=True, the default of decoders)
        return CACHE_OUTPUT_HINT
    if "fake tensor in the exported program constant" in str(e):  # what `.data` in forward leaves behind
        return DATA_WRITE_HINT
    return ""


def pass_on(text: str, drop=None) -> None:
    """Write what the model printed to stderr while exporting back to stderr, without torch's ``drop``."""
    if drop is not None:
        text = text.replace(str(drop), "")
    if text.strip():
        sys.stderr.write(text)


class _WhileOpen:
    """A context manager replacing ``owner().name`` by ``patch(original)`` while any of its blocks is open: blocks
    may nest and overlap across threads, the first patches and the last restores. ``patch`` returns None to
    leave an attribute it does not recognise (another Python or torch version) alone."""

    def __init__(self, owner, name: str, patch):
        self.owner, self.name, self.patch = owner, name, patch
        self._lock = threading.Lock()
        self._blocks = 0
        self._saved = None  # (owner, original) while patched

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._blocks == 0:
                owner = self.owner()
                original = owner.__dict__.get(self.name)
                replacement = self.patch(original)
                if replacement is not None:
                    setattr(owner, self.name, replacement)
                    self._saved = (owner, original)
            self._blocks += 1
        try:
            yield
        finally:
            with self._lock:
                self._blocks -= 1
                if self._blocks == 0 and self._saved is not None:
                    owner, original = self._saved
                    if original is None:  # the owner inherited it
                        delattr(owner, self.name)
                    else:
                        setattr(owner, self.name, original)
                    self._saved = None


def _memoised_class_getitem(original):
    if not isinstance(original, classmethod):
        return None
    build = original.__get__(None, collections.abc.Callable)
    memo = functools.lru_cache(maxsize=256)(build)

    def alias(cls, args):
        try:
            return memo(args)
        except TypeError:  # unhashable arguments (a list of parameter types)
            return build(args)

    return classmethod(alias)


_callable_aliases = _WhileOpen(lambda: collections.abc.Callable, "__class_getitem__", _memoised_class_getitem)


def memoised_callable_aliases():
    """``collections.abc.Callable[args]`` gives one alias per distinct hashable ``args`` inside the block (as
    ``typing.Callable[...]`` always does); unhashable ones (``Callable[[int], str]``) are built as before.

    ``torch/_ops.py`` does not postpone its annotations, so each ``OperatorBase.py_impl`` call builds
    ``Callable[_P, _T]`` anew, and ``run_decompositions`` registers and removes a few thousand Python kernels
    of composite operators on every call: 40% of a small module's export went to building these aliases
    (profiled on the OpInfo samples). The aliases are immutable, so a shared one is indistinguishable.
    """
    return _callable_aliases()


def _torch_export_utils():
    import torch._export.utils

    return torch._export.utils


def _exported_program_module():
    import torch.export.exported_program

    return torch.export.exported_program


_materialised_cia = None  # the CompositeImplicitAutograd registrations last materialised


def _materialise_once(original):
    if not callable(original):
        return None

    def materialise():
        global _materialised_cia
        import torch

        registered = torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
        if registered != _materialised_cia:
            original()
            _materialised_cia = registered

    return materialise


_cia_once = _WhileOpen(_torch_export_utils, "_materialize_cpp_cia_ops", _materialise_once)

_collected_cia = (None, frozenset())  # (the registrations and namespaces it was collected for, the operators)


def _collected_once(original):
    if not callable(original):
        return None

    def collect():
        global _collected_cia
        import torch

        key = (torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"), tuple(torch.ops._dir))
        if _collected_cia[0] != key:
            _collected_cia = (key, frozenset(original()))
        return _collected_cia[1]

    return collect


_collect_once = _WhileOpen(_exported_program_module, "_collect_all_valid_cia_ops", _collected_once)


@contextmanager
def composite_ops_materialised_once() -> Iterator[None]:
    """torch's ``_materialize_cpp_cia_ops`` (creating the Python objects of every C++ CompositeImplicitAutograd
    operator, about 2,000, a few ms) runs only when those registrations changed since it last ran, and so does
    ``run_decompositions``' collection of the composite operators (``_collect_all_valid_cia_ops``, 17 ms).

    Collecting the composite operators an export may keep calls it once per operator namespace (about 26 times) on
    every ``torch.export`` and again in ``run_decompositions``: about 65 ms of each export (26 x 2.5 ms; the
    collection 75 -> 10 ms). Materialising is idempotent, and new registrations (a custom operator, a new
    namespace) change the list, so a skipped call would have done nothing.
    """
    with _cia_once(), _collect_once():
        yield


_CALLED_OPS: contextvars.ContextVar = contextvars.ContextVar("pullback_called_ops", default=None)


def _as_registered(op, fn) -> bool:
    """Whether ``fn`` is what dispatching ``op`` would run anyway: its own CompositeImplicitAutograd kernel, as
    the C++ composite (``_special_op_to_decompose_cia``) or as the Python kernel registered for that key."""
    import torch

    if isinstance(fn, functools.partial) and getattr(fn.func, "__name__", "") == "_special_op_to_decompose_cia":
        return True
    return fn is op.py_kernels.get(torch._C.DispatchKey.CompositeImplicitAutograd)


def _narrowed_override(original):
    if not callable(original):
        return None

    def override(cia_ops_to_callable):
        called = _CALLED_OPS.get()
        if called is not None:
            cia_ops_to_callable = {op: fn for op, fn in cia_ops_to_callable.items()
                                   if op in called or not _as_registered(op, fn)}
        return original(cia_ops_to_callable)

    return override


_narrowed = _WhileOpen(_exported_program_module, "_override_composite_implicit_decomp", _narrowed_override)


def called_operators(ep) -> frozenset:
    """The operators ``ep``'s graphs call (its higher-order operators' subgraphs included)."""
    import torch.fx

    return frozenset(n.target for gm in ep.graph_module.modules() if isinstance(gm, torch.fx.GraphModule)
                     for n in gm.graph.nodes if n.op == "call_function")


@contextmanager
def composite_overrides_narrowed(ep) -> Iterator[None]:
    """While ``ep.run_decompositions`` runs in the block, it overrides only the composite operators that matter.

    It overrides the Python kernels of every composite (CompositeImplicitAutograd) operator, about 525, twice per
    call, and restores them after: 110 of its 180 ms for a one-operator program. Overriding an operator with its
    own composite kernel changes nothing where the dispatcher reaches it from inside another decomposition, so
    only the operators ``ep`` calls, the kept ones and those given another decomposition are overridden (a dozen;
    the decomposed graphs are identical on every OpInfo sample)."""
    token = _CALLED_OPS.set(called_operators(ep))
    try:
        with _narrowed():
            yield
    finally:
        _CALLED_OPS.reset(token)


def _distribution_class():
    import torch.distributions

    return torch.distributions.Distribution


_unvalidated = _WhileOpen(_distribution_class, "_validate_args", lambda original: False if isinstance(original, bool) else None)


def _functional():
    import torch.nn.functional

    return torch.nn.functional


def _gaussian_nll_unchecked(original):
    """``F.gaussian_nll_loss`` computing the same loss without its check for negative variances (a branch on
    values): ``0.5 (log v + (input - target)^2 / v)`` (plus ``0.5 log 2 pi`` when ``full``), ``v`` the variance
    (unsqueezed when it lacks ``input``'s last dim, broadcast in the heteroscedastic case) clamped to ``eps``, its
    gradient passed through the clamp unchanged, as through eager's in-place clamp under ``no_grad`` (which
    ``torch.export`` would turn into a detach)."""
    if not callable(original):
        return None

    def loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
        import math

        import torch

        if not isinstance(var, torch.Tensor) or reduction not in ("none", "mean", "sum"):
            return original(input, target, var, full=full, eps=eps, reduction=reduction)
        if var.shape != input.shape and input.shape[:-1] == var.shape:
            var = var.unsqueeze(-1)
        elif var.shape != input.shape and not (
                input.ndim == var.ndim and sum(b for a, b in zip(input.shape, var.shape) if a != b) == 1):
            raise ValueError("var is of incorrect size")
        var = var.clamp(min=eps).detach() + (var - var.detach())  # the clamped value, the gradient passed through
        out = 0.5 * (torch.log(var) + (input - target) ** 2 / var)
        if full:
            out = out + 0.5 * math.log(2 * math.pi)
        return out.mean() if reduction == "mean" else out.sum() if reduction == "sum" else out

    return loss


_gaussian_nll = _WhileOpen(_functional, "gaussian_nll_loss", _gaussian_nll_unchecked)


@contextmanager
def unvalidated_arguments() -> Iterator[None]:
    """While the block is open, ``torch.distributions`` objects made then do not validate their arguments (unless
    made with ``validate_args=True``), and ``F.gaussian_nll_loss`` does not check its variance for negative
    entries. Both check values and raise in Python, a branch on a tensor's value that ``torch.export`` cannot
    trace: a policy or VAE using ``Normal(mu, sigma)``, a regression head trained by ``nn.GaussianNLLLoss``,
    failed to export. The compiled program computes what eager computes on valid arguments (as
    ``validate_args=False`` does in eager)."""
    with _unvalidated(), _gaussian_nll():
        yield


@contextmanager
def stack_traces_kept() -> Iterator[None]:
    """While the block is open, a retrace (``run_decompositions``) records no stack traces of its own: each node
    keeps the one torch.export recorded for the node it decomposes (its meta is carried over), the same strings
    (compared node by node on ResNet-18), and symbolising the retrace's frames took 10-25% of it (DenseNet-121
    2.9 -> 2.5 s, a Llama block 0.5 -> 0.4 s)."""
    import torch.fx.config as fx_config

    before = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        fx_config.do_not_emit_stack_traces = before


def _decompositions_module():
    import torch._decomp

    return torch._decomp


# PyTorch's Python reference of nll_loss asks `input.numel() == 0` (to return its empty-batch results), which a
# batch of data-dependent size cannot answer: the C++ composite (what eager and torch.export themselves run) can
_GUARDING_REFERENCES = ("nll_loss",)  # their .default overloads


def _without_guarding_references(original):
    if not isinstance(original, dict):
        return None
    import torch

    guarding = {getattr(torch.ops.aten, name).default for name in _GUARDING_REFERENCES}
    return {op: fn for op, fn in original.items() if op not in guarding}


_composites_for_unbacked = _WhileOpen(_decompositions_module, "decomposition_table", _without_guarding_references)


def has_data_dependent_sizes(ep) -> bool:
    """Whether a value of ``ep`` has a size computed from tensor values (boolean-mask indexing, nonzero): an
    unbacked symbol among the program's range constraints (torch.export records each one's range there; reading
    every node's value instead took ~12 us a node of each export)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return any(free_unbacked_symbols(s) for s in ep.range_constraints)


@contextmanager
def data_dependent_sizes_retraced(ep) -> Iterator[None]:
    """While the block is open, a retrace of ``ep`` (``run_decompositions``) computes the fake results of the
    composites whose Python references ask a question of a data-dependent size (``F.cross_entropy(logits[mask],
    labels[mask])``: "is the masked batch empty?") with their C++ composites instead, as torch.export did; other
    programs retrace as before."""
    if not has_data_dependent_sizes(ep):
        yield
        return
    with _composites_for_unbacked():
        yield


@contextmanager
def graph_code_made_lazily() -> Iterator[None]:
    """While the block is open, the graph modules torch.export makes generate and compile their Python code only
    when it is run or read (FX's lazy graph module, as Inductor has them), not each time one is made: an export
    and its retrace made 18 and compiled each (Mamba's 4,000 nodes: 1.35 of its 7.7 s), 8 of them are ever run.
    A PyTorch without the switch exports as before."""
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:
        yield
        return
    with _use_lazy_graph_module(True):
        yield


@contextmanager
def random_draws_kept(ops) -> Iterator[None]:
    """While the block is open, FX's dead-code elimination keeps calls of the random operators ``ops`` (those of
    PyTorch's ``nondeterministic_seeded`` operators that the importer converts) even when their results are
    unused, as eager draws them: each becomes a random input drawn in order (and its result left unused)."""
    import torch.fx.node

    effectful = torch.fx.node._side_effectful_functions
    added = [op for op in ops if op not in effectful]
    effectful.update(added)
    try:
        yield
    finally:
        effectful.difference_update(added)


HOST_RANDOM_HINT = (
    "from_torch: the forward draws random numbers from {which} while it is traced; torch.export keeps the "
    "values drawn then as constants, so every call would reuse them (e.g. Wav2Vec2's and HuBERT's SpecAugment "
    "masks: set mask_time_prob=0 and mask_feature_prob=0 in the config). Draw them with torch (torch.rand, "
    "torch.bernoulli): pullback draws those anew at each call, as eager does")


@contextmanager
def host_random_draws_refused() -> Iterator[None]:
    """A traced forward that draws from NumPy's or Python's global random generator is an error (the draws
    would be baked into the program as constants); either generator is left as it was before the trace."""
    import random

    import numpy as np

    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        now = np.random.get_state()
        np_drawn = not (np.array_equal(now[1], np_state[1]) and now[2:] == np_state[2:])
        py_drawn = random.getstate() != py_state
        np.random.set_state(np_state)
        random.setstate(py_state)
    if np_drawn or py_drawn:
        from ..ir.errors import PullbackError

        which = " and ".join(w for w, d in (("NumPy's generator (np.random)", np_drawn),
                                            ("Python's random module", py_drawn)) if d)
        raise PullbackError(HOST_RANDOM_HINT.format(which=which))


def _transformer_module():
    import torch.nn.modules.transformer

    return torch.nn.modules.transformer


def _causal_as_given(mask, is_causal=None, size=None) -> bool:
    return is_causal is True


_masks_as_given = _WhileOpen(_transformer_module, "_detect_is_causal_mask",
                             lambda original: _causal_as_given if callable(original) else None)


def transformer_masks_as_given():
    """``nn.Transformer``, ``nn.TransformerEncoder`` and ``nn.TransformerDecoder`` called with a mask but no
    ``is_causal`` flag use the mask as given while the block is open. Eager compares the mask with a causal one
    (``(mask == causal).all()``, a branch on values torch.export cannot trace) only to pick a faster attention
    kernel: with the flag False attention applies the mask itself, with the same result. A Transformer
    decoder trained with ``tgt_mask=generate_square_subsequent_mask(n)`` failed to export."""
    return _masks_as_given()


def _checkpoint_function():
    import torch.utils.checkpoint

    return torch.utils.checkpoint.CheckpointFunction


def _run_plainly(cls, run_function, preserve_rng_state, *args):
    return run_function(*args)


_plain_checkpoints = _WhileOpen(_checkpoint_function, "apply", lambda original: classmethod(_run_plainly))


def checkpoints_as_plain_calls():
    """``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=True)`` (Hugging Face's gradient
    checkpointing) runs ``fn(*args)`` as plain code while the block is open. Its autograd Function runs ``fn``
    under no_grad and recomputes it in its backward, which torch.export does not keep: the block and everything
    after it trained with no gradient at all. Checkpointing changes memory, not values (with the same random
    draws): what the program saves for the backward is the partitioner's choice (``policy="min_cut"``)."""
    return _plain_checkpoints()


def _module_class():
    import torch.nn

    return torch.nn.Module


def _to_unchanged_as_is(original):
    import torch

    def to(self, *args, **kwargs):
        device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        if memory_format is None and all(
                (device is None or t.device == device) and (dtype is None or t.dtype == dtype or not (
                    t.is_floating_point() or t.is_complex())) for t in (*self.parameters(), *self.buffers())):
            return self
        return original(self, *args, **kwargs)

    return to if callable(original) else None


_modules_to_as_is = _WhileOpen(_module_class, "to", _to_unchanged_as_is)


def module_to_unchanged_as_is():
    """``module.to(dtype)`` or ``.to(device)`` in ``forward`` returns the module itself while the block is open,
    when it converts nothing (Switch Transformers' router: ``self.classifier = self.classifier.to(self.dtype)``).
    Eager then leaves every tensor as it is; under torch.export, ``Module._apply`` tries to swap each traced
    parameter with itself and fails ("Couldn't swap Linear.weight")."""
    return _modules_to_as_is()


@contextmanager
def forward_in_autocast(module, device_type: str, dtype) -> Iterator[None]:
    """``module.forward`` running inside ``torch.autocast(device_type, dtype)`` while the block is open.
    torch.export ignores a region open around the call (the trace computes in the parameters' dtypes) but
    keeps one opened inside ``forward``: its casts become ``_to_copy`` operators of the program."""
    import torch

    own = module.__dict__.get("forward")
    original = module.forward

    @functools.wraps(original)
    def forward(*args, **kwargs):
        with torch.autocast(device_type, dtype=dtype):
            return original(*args, **kwargs)

    module.forward = forward
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


@contextmanager
def while_tracing() -> Iterator[None]:
    """The repairs ``torch.export`` needs while it traces: ``unvalidated_arguments``,
    ``transformer_masks_as_given``, ``checkpoints_as_plain_calls``, ``module_to_unchanged_as_is``."""
    with unvalidated_arguments(), transformer_masks_as_given(), checkpoints_as_plain_calls(), \
            module_to_unchanged_as_is():
        yield


@contextmanager
def rnn_dropout_between_layers() -> Iterator[None]:
    """Decompose multi-layer RNNs (LSTM, GRU, RNN) with their dropout between layers. ``run_decompositions``
    lowers them through ``torch._decomp.decompositions._rnn_helper``, which in torch 2.13 never applies ``dropout`` (its
    test ``num_layers < i - 1`` is always false): a training-mode ``nn.LSTM(num_layers=2, dropout=p)`` would
    train without dropout. Here the helper runs one layer at a time and the dropout is applied between layers,
    where eager applies it (the masks are drawn in eager's order)."""
    import torch
    from torch._decomp import decompositions

    original = decompositions._rnn_helper

    def layer_by_layer(input, hidden, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,
                       layer_fn):
        if not (dropout and train and num_layers > 1):
            return original(input, hidden, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,
                            layer_fn)
        dirs = 2 if bidirectional else 1
        finals = []
        for i in range(num_layers):
            layer = slice(i * dirs, (i + 1) * dirs)
            input, last = original(input, hidden[layer], params[layer], has_biases, 1, 0.0, train, bidirectional,
                                   batch_first, layer_fn)
            finals.extend(last)
            if i < num_layers - 1:
                input = torch.dropout(input, dropout, train=True)
        return input, finals

    decompositions._rnn_helper = layer_by_layer
    try:
        yield
    finally:
        decompositions._rnn_helper = original


def outer_guards_left_to_dynamo(ep) -> None:
    """Inside Dynamo's compilation (the ``torch.compile`` backend), torch.export shares Dynamo's ShapeEnv: the
    guards it lists name the sources of Dynamo's frame (``L['args'][0].size()[1] == 4``,
    ``L['n'].item() == 1``), which ``run_decompositions`` would compile into a ``_guards_fn`` over the graph's own
    inputs (a NameError or IndexError). Dynamo installs those guards on its frame and recompiles when one fails,
    so the exported program drops them."""
    import torch

    if torch._guards.TracingContext.try_get() is not None:
        ep._guards_code = []


def _inputs_returned(graph) -> set:
    """The positions of a block's results that are one of its inputs, unchanged: through ``to`` converting
    nothing and ``set_`` of a tensor to itself (both return ``self``). A parameter passed so through a no_grad
    block (Switch Transformers' ``self.classifier = self.classifier.to(dtype)`` in ``forward``) keeps its gradient
    in eager, where a view or a value computed in the block has none."""
    import torch.fx

    same: dict = {}  # node -> the node it is the same tensor as, with the same values (in graph order)
    for n in graph.nodes:
        same[n] = n
        name = getattr(getattr(n.target, "_schema", None), "name", None) if n.op == "call_function" else None
        nodes = [a for a in n.args[:2] if isinstance(a, torch.fx.Node)] if name else []
        if name == "aten::to" and nodes and nodes[0] is n.args[0]:
            a, b = (x.meta.get("val") for x in (nodes[0], n))
            if a is not None and b is not None and (a.dtype, a.device, a.layout) == (b.dtype, b.device, b.layout):
                same[n] = same.get(nodes[0], n)
        elif name == "aten::set_" and len(n.args) == 2 and len(nodes) == 2 and same.get(nodes[0]) is same.get(nodes[1], n):
            same[n] = same[nodes[0]]
    (out,) = [n for n in graph.nodes if n.op == "output"]
    results = out.args[0] if isinstance(out.args[0], (list, tuple)) else (out.args[0],)
    return {i for i, n in enumerate(results) if getattr(same.get(n), "op", None) == "placeholder"}


NO_GRAD_READ = "pullback_no_grad_block_result"  # node.meta["custom"] key of the detaches detach_no_grad_blocks adds


def no_grad_read_of(node) -> Optional[str]:
    """The name of the node whose value ``node`` reads at the end of a ``torch.no_grad()`` block (one of
    ``detach_no_grad_blocks``' detaches), else None."""
    if (node.meta.get("custom") or {}).get(NO_GRAD_READ) and node.args and hasattr(node.args[0], "name"):
        return node.args[0].name
    return None


def detach_no_grad_blocks(ep) -> None:
    """Give each result of a ``with torch.no_grad():`` block a ``detach``: torch.export keeps the block as a
    ``wrap_with_set_grad_enabled(False, ...)`` call, which ``run_decompositions`` inlines, losing the grad mode
    (the block's parameters would be trained). ``detach`` is kept whole and converts to ``stop_gradient``."""
    import torch

    hop = higher_order("wrap_with_set_grad_enabled")
    graph = ep.graph_module.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not hop or node.args[0] is not False:
            continue
        kept = _inputs_returned(getattr(ep.graph_module, node.args[1].target).graph)
        for user in list(node.users):
            if user.target is not operator.getitem or user.args[1] in kept:
                continue
            with graph.inserting_after(user):
                detached = graph.call_function(torch.ops.aten.detach.default, (user,))
            detached.meta.update({k: v for k, v in user.meta.items() if k in ("val", "stack_trace", "nn_module_stack")})
            detached.meta["custom"] = {**user.meta.get("custom", {}), NO_GRAD_READ: True}  # kept by the retrace
            user.replace_all_uses_with(detached, delete_user_cb=lambda n, d=detached: n is not d)
            changed = True
    if changed:
        ep.graph_module.recompile()



# Composite operators whose eager implementation reaches operators on autocast's lists (einsum's bmm,
# nll_loss_nd's nll_loss): eager casts their operands at those inner calls, but ``run_decompositions`` applies
# their Python decompositions above the autocast dispatch key (pytorch/pytorch#137274), so the casts are lost
# (einsum computes in float32, nll_loss in bfloat16, an einsum of a float32 and a bfloat16 operand fails).
# Per operator: the autocast policy of what it reaches ("lower": the region's dtype; "float32"), and a condition
# on its arguments (None: always).
_AUTOCAST_COMPOSITES = {
    "aten::einsum": ("lower", lambda args: len(args[1]) > 1),  # one operand: no product, nothing cast
    "aten::tensordot": ("lower", None),
    "aten::linalg_multi_dot": ("lower", None),
    "aten::chain_matmul": ("lower", None),
    "aten::inner": ("lower", lambda args: all(a.meta["val"].ndim for a in args[:2])),  # a scalar operand: mul
    "aten::nll_loss_nd": ("float32", None),
    # F.pad's reflect and replicate modes reach reflection_pad / replication_pad: on the CPU's float32 list
    "aten::pad": ("float32", lambda args: len(args) > 2 and args[2] in ("reflect", "replicate")),
}


def _autocast_eligible(node, device: str, dtype) -> bool:
    """Does autocast on ``device`` cast ``node``'s value to ``dtype``: a floating tensor of that device and of
    another dtype, not float64."""
    import torch

    val = node.meta.get("val")
    return (isinstance(val, torch.Tensor) and val.is_floating_point() and val.device.type == device
            and val.dtype not in (torch.float64, dtype))


def _cast_operands(graph, node, device: str, dtype) -> bool:
    """Give each eligible tensor operand of ``node`` (also inside a list) a ``_to_copy`` to ``dtype``."""
    import torch
    import torch.fx

    casts: dict = {}

    def cast(a):
        if not isinstance(a, torch.fx.Node) or not _autocast_eligible(a, device, dtype):
            return a
        if a not in casts:
            with graph.inserting_before(node):
                c = casts[a] = graph.call_function(torch.ops.aten._to_copy.default, (a,), {"dtype": dtype})
            c.meta["val"] = a.meta["val"].to(dtype)
        return casts[a]

    node.args = torch.fx.node.map_aggregate(node.args, cast)
    node.kwargs = torch.fx.node.map_aggregate(node.kwargs, cast)
    return bool(casts)


def autocast_casts_kept(ep) -> None:
    """Inside each ``torch.autocast`` region of ``ep`` (``wrap_with_autocast`` bodies, nested ones included,
    and the whole program when exported inside a region: a Dynamo graph compiled for a call inside one), cast
    the operands of the composite operators of ``_AUTOCAST_COMPOSITES`` as eager's autocast casts them inside,
    before ``run_decompositions`` decomposes them outside the region."""
    import torch

    hop = higher_order("wrap_with_autocast")
    ambient = {d: torch.get_autocast_dtype(d) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)}
    stack = [(ep.graph_module, ambient)]  # (graph module, {device type: dtype} of the regions open there)
    while stack:
        gm, regions = stack.pop()
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function":
                continue
            if hop is not None and node.target is hop:  # (device_type, dtype, enabled, cache_enabled, body, *operands)
                device, dtype, enabled = node.args[:3]
                inner = {d: t for d, t in regions.items() if d != device}
                stack.append((getattr(gm, node.args[4].target), {**inner, device: dtype} if enabled else inner))
                continue
            for a in node.args:  # other higher-order operators' bodies (cond's branches): the same regions
                if getattr(a, "op", None) == "get_attr" and isinstance(getattr(gm, a.target, None), torch.fx.GraphModule):
                    stack.append((getattr(gm, a.target), regions))
            rule = _AUTOCAST_COMPOSITES.get(getattr(getattr(node.target, "_schema", None), "name", None))
            if not regions or rule is None or (rule[1] is not None and not rule[1](node.args)):
                continue
            for device, dtype in regions.items():
                changed |= _cast_operands(gm.graph, node, device, dtype if rule[0] == "lower" else torch.float32)
        if changed:
            gm.recompile()


__all__ = ["CACHE_OUTPUT_HINT", "DATA_DEPENDENT_HINT", "DATA_DEPENDENT_SIZE_HINT", "DATA_WRITE_HINT", "no_grad_read_of", "data_dependent_sizes_retraced", "has_data_dependent_sizes", "DYNAMIC_SHAPE_HINT", "VALUE_SIZE_HINT", "HOST_READ_HINT", "failure_hint", "pass_on", "unvalidated_arguments", "transformer_masks_as_given", "host_random_draws_refused", "random_draws_kept", "HOST_RANDOM_HINT", "rnn_dropout_between_layers", "detach_no_grad_blocks", "autocast_casts_kept", "module_to_unchanged_as_is", "checkpoints_as_plain_calls", "while_tracing",
           "stack_traces_kept", "graph_code_made_lazily"]
