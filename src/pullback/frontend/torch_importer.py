"""Import PyTorch modules through ``torch.export`` into a pullback ``IRModule``.

``from_torch(module, example_inputs)`` exports the module (in its current
train/eval mode), runs the Core-ATen decompositions except for a few composite
operators that map to one pullback operator (linear, layer_norm, conv2d,
max/adaptive pooling, scaled_dot_product_attention, cross_entropy_loss), and
converts every ATen node through ``aten_table.ATEN_TABLE``.

The signature of ``@main`` (order of parameters):

1. the user inputs, named after the exported placeholders (``%x``, ``%input``...);
2. with ``params_as="inputs"``: every parameter, then every buffer, named after
   its ``state_dict`` key with characters other than ``[A-Za-z0-9_]`` replaced by
   ``_`` and a ``v`` before a leading digit (``0.weight`` -> ``%v0_weight``); ``TorchProgram.state_names`` maps back;
3. one ``%dropout_mask_K`` per dropout applied in training (K = 0, 1, ... in
   execution order), of the data's shape and dtype, holding 0/1 values:
   ``nn.dropout(x, mask, rate) = x * mask / (1 - rate)``; PyTorch's own dropout
   draws ``torch.empty_like(x).bernoulli_(1 - rate)``. In eval mode dropout is
   the identity and adds no parameter.

The result is the user output when there is exactly one and nothing is mutated;
otherwise a tuple ``(user outputs..., new values of mutated buffers/inputs...)``
(e.g. batch norm's running statistics in training mode).
"""

from __future__ import annotations

import operator
import re
import warnings
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ..analysis.type_infer import infer_expr, infer_module
from ..ir.errors import DiagnosticError, PullbackError
from ..ir.expr import Constant, Expr, Function, Tuple, Var
from ..ir.module import IRModule
from ..ir.types import DTYPES, TensorType
from .aten_table import ATEN_TABLE

# composite ops kept whole by run_decompositions because one pullback op covers them
PRESERVED = (
    "linear.default", "layer_norm.default", "conv2d.default", "max_pool2d.default", "adaptive_avg_pool2d.default",
    "scaled_dot_product_attention.default", "cross_entropy_loss.default", "matmul.default",
)
PARAMS_AS = ("inputs", "constants")


class UnsupportedOperatorError(DiagnosticError):
    """ATen operators the importer cannot convert, each with the source line that produced it."""


@dataclass(frozen=True)
class DropoutMask:
    """A dropout mask parameter: 0/1 values of ``shape``; ``keep = 1 - rate``."""

    name: str
    shape: tuple
    dtype: str
    rate: float


@dataclass
class TorchProgram:
    """An imported program and what it takes to call ``@main`` like the torch module."""

    mod: IRModule
    params: dict  # var name -> np.ndarray: parameters then buffers (params_as="inputs")
    inputs: list  # var names of the user inputs, in order
    state_names: dict  # var name -> state_dict key, for parameters and buffers
    trainable: list  # var names of the parameters (not buffers)
    masks: list  # DropoutMask per mask parameter, in order
    num_outputs: int  # number of user outputs (leading fields of the result)
    single_output: bool  # the result is one tensor (not a tuple)
    mutations: list = field(default_factory=list)  # ("buffer", state key) | ("input", input var name) per extra field

    @property
    def main(self) -> Function:
        return self.mod["main"]


def sanitize(name: str) -> str:
    """A valid ``%name`` from a state_dict key or placeholder name."""
    s = re.sub(r"[^A-Za-z0-9_]", "_", name) or "_"
    return "v" + s if s[0].isdigit() else s


def torch_dtype_name(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    if name not in DTYPES:
        raise PullbackError(f"from_torch: dtype {dtype} is not supported (supported: {', '.join(DTYPES)})")
    return name


def source_line(node) -> str:
    """The last frame of ``node.meta["stack_trace"]``: ``file:line (code)``, or the node name."""
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    for i in range(len(trace) - 1, -1, -1):
        m = re.match(r'\s*File "([^"]+)", line (\d+), in (\S+)', trace[i])
        if m:
            code = trace[i + 1].strip() if i + 1 < len(trace) else ""
            return f"{m.group(1)}:{m.group(2)} in {m.group(3)}" + (f" ({code})" if code else "")
    return f"node %{node.name} (no stack trace)"


class ConvertContext:
    """What a converter may ask about the node it converts (see ``aten_table``)."""

    def __init__(self, names: "_Names"):
        self.node = None
        self._meta: dict[int, tuple] = {}
        self._names = names
        self.masks: list[DropoutMask] = []
        self.mask_vars: list[Var] = []

    def record(self, expr: Expr, val) -> None:
        if isinstance(expr, Expr) and hasattr(val, "shape"):
            self._meta[id(expr)] = (tuple(int(d) for d in val.shape), torch_dtype_name(val.dtype))

    def _info(self, e: Expr) -> tuple:
        info = self._meta.get(id(e))
        if info is None:
            t = infer_expr(e)  # an expression a converter built (its operands are typed Vars/recorded)
            if not isinstance(t, TensorType):
                raise PullbackError(f"from_torch: an operand of %{self.node.name} is not a tensor ({t!r})")
            info = self._meta[id(e)] = (tuple(t.shape), t.dtype)
        return info

    def shape_of(self, e: Expr) -> tuple:
        return self._info(e)[0]

    def dtype_of(self, e: Expr) -> str:
        return self._info(e)[1]

    @property
    def out_shape(self) -> tuple:
        return tuple(int(d) for d in self.node.meta["val"].shape)

    @property
    def out_shapes(self) -> list:
        return [tuple(int(d) for d in v.shape) for v in self.node.meta["val"]]

    @property
    def out_dtype(self) -> str:
        return torch_dtype_name(self.node.meta["val"].dtype)

    def dropout_mask(self, shape: Sequence[int], rate: float) -> Var:
        """A new mask parameter ``%dropout_mask_K`` of ``shape`` (0/1 values, the data's dtype)."""
        dtype = self.out_dtype if hasattr(self.node.meta.get("val"), "dtype") else torch_dtype_name(self.node.meta["val"][0].dtype)
        name = self._names.fresh(f"dropout_mask_{len(self.masks)}")
        v = Var(name, TensorType(tuple(shape), dtype))
        self.masks.append(DropoutMask(name, tuple(shape), dtype, float(rate)))
        self.mask_vars.append(v)
        self.record(v, _Shaped(tuple(shape), dtype))
        return v


@dataclass
class _Shaped:
    shape: tuple
    dtype_name: str

    @property
    def dtype(self):
        return self.dtype_name


class _Names:
    def __init__(self):
        self.used: set[str] = set()

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        return name


_MISSING = object()


# core overloads lowered by PyTorch's own decompositions (torch._decomp) although the default table keeps them
EXTRA_DECOMPOSED: tuple = ()


def decomposition_table() -> dict:
    """The table ``export`` hands to ``run_decompositions``: ``torch.export.default_decompositions()``
    without the ``PRESERVED`` composites, plus PyTorch's decompositions of ``EXTRA_DECOMPOSED``."""
    import torch
    from torch._decomp import decomposition_table as registry

    table = torch.export.default_decompositions()
    for name in PRESERVED:
        table.pop(_overload(name), None)
    for name in EXTRA_DECOMPOSED:
        op = _overload(name)
        table[op] = registry[op]
    return table


def _overload(name: str):
    """``"aten.add.Tensor"`` or ``"add.Tensor"`` -> ``torch.ops.aten.add.Tensor``."""
    import torch

    parts = name.removeprefix("aten.").split(".")
    return getattr(getattr(torch.ops.aten, parts[0]), parts[1] if len(parts) > 1 else "default")


def export(module, example_inputs: Sequence, decompose: bool = True):
    """``torch.export.export`` of ``module`` on ``example_inputs`` (+ Core ATen decompositions)."""
    import torch

    with warnings.catch_warnings():  # torch.export's internal deprecation notices are not the user's to act on
        warnings.simplefilter("ignore", FutureWarning)
        try:
            ep = torch.export.export(module, tuple(example_inputs))
        except Exception as e:  # noqa: BLE001 - report torch's reason as a pullback error
            raise PullbackError(f"from_torch: torch.export failed: {type(e).__name__}: {e}") from e
        return ep.run_decompositions(decomposition_table()) if decompose else ep


def _to_numpy(t) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy().copy()


def import_exported(ep, params_as: str = "inputs") -> TorchProgram:
    """Convert an ``ExportedProgram`` (see the module docstring for the signature of ``@main``)."""
    from torch.export.graph_signature import InputKind, OutputKind

    if params_as not in PARAMS_AS:
        raise PullbackError(f"from_torch: params_as must be one of {', '.join(map(repr, PARAMS_AS))}, got {params_as!r}")
    sig = ep.graph_signature
    specs = {s.arg.name: s for s in sig.input_specs}
    state = dict(ep.state_dict)
    state.update(getattr(ep, "constants", {}) or {})
    names = _Names()
    cx = ConvertContext(names)
    env: dict = {}
    user_vars: list[Var] = []
    state_vars: list[tuple[Var, str, bool]] = []  # (var, state key, is parameter)
    params: dict = {}
    problems: list[str] = []
    for node in ep.graph.nodes:
        cx.node = node
        if node.op == "placeholder":
            spec = specs[node.name]
            val = node.meta["val"]
            ty = TensorType(tuple(int(d) for d in val.shape), torch_dtype_name(val.dtype))
            if spec.kind == InputKind.USER_INPUT:
                v = Var(names.fresh(sanitize(node.name)), ty)
                user_vars.append(v)
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                data = _to_numpy(state[spec.target])
                if params_as == "constants" or spec.kind == InputKind.CONSTANT_TENSOR:
                    v = Constant(data)
                else:
                    v = Var(names.fresh(sanitize(spec.target)), ty)
                    state_vars.append((v, spec.target, spec.kind == InputKind.PARAMETER))
                    params[v.name_hint] = data
            else:
                raise PullbackError(f"from_torch: input {node.name} of kind {spec.kind.name} is not supported")
            env[node] = v
            cx.record(v, val)
        elif node.op == "call_function":
            args = _map_args(node.args, env)
            kwargs = _map_args(node.kwargs, env)
            if _has_missing(args) or _has_missing(kwargs):
                env[node] = _MISSING
                continue
            if node.target is operator.getitem:
                value = args[0][args[1]]
                if value is None:
                    problems.append(f"output {args[1]} of %{node.args[0].name} ({node.args[0].target}) is not supported, "
                                    f"at {source_line(node)}")
                    value = _MISSING
            else:
                key = str(node.target)
                conv = ATEN_TABLE.get(key)
                if conv is None:
                    problems.append(f"{key} at {source_line(node)}")
                    env[node] = _MISSING
                    continue
                try:
                    value = conv(cx, *args, **kwargs)
                except PullbackError as e:
                    problems.append(f"{key} at {source_line(node)}: {e}")
                    value = _MISSING
            env[node] = value
            if isinstance(value, list):
                for e, val in zip(value, node.meta.get("val", ())):
                    cx.record(e, val)
            else:
                cx.record(value, node.meta.get("val"))
        elif node.op == "output":
            outs = node.args[0]
        else:
            problems.append(f"FX node %{node.name} of kind {node.op} is not supported, at {source_line(node)}")
    if problems:
        raise UnsupportedOperatorError("from_torch: cannot import the module", problems)

    user_out, mutations, extra = [], [], []
    by_name = {v.name_hint: v for v in user_vars}
    for spec, out in zip(sig.output_specs, outs):
        e = env[out] if not isinstance(out, (int, float)) else Constant(np.asarray(out))
        if spec.kind in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT):
            user_out.append(e)
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            mutations.append(("buffer", spec.target))
            extra.append(e)
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            mutations.append(("input", by_name.get(sanitize(spec.target), user_vars[0]).name_hint if user_vars else spec.target))
            extra.append(e)
        else:
            raise PullbackError(f"from_torch: output of kind {spec.kind.name} is not supported")
    single = len(user_out) == 1 and not extra
    body = user_out[0] if single else Tuple(user_out + extra)
    fn_params = user_vars + [v for v, _, _ in state_vars] + cx.mask_vars
    mod = IRModule({"main": Function(fn_params, body)})
    infer_module(mod)
    return TorchProgram(
        mod=mod, params=params, inputs=[v.name_hint for v in user_vars],
        state_names={v.name_hint: key for v, key, _ in state_vars},
        trainable=[v.name_hint for v, _, is_param in state_vars if is_param],
        masks=list(cx.masks), num_outputs=len(user_out), single_output=single, mutations=mutations,
    )


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


def import_torch(module, example_inputs: Sequence, params_as: str = "inputs", decompose: bool = True) -> TorchProgram:
    """Export ``module`` (in its current train/eval mode) and convert it; see ``TorchProgram``."""
    if params_as not in PARAMS_AS:
        raise PullbackError(f"from_torch: params_as must be one of {', '.join(map(repr, PARAMS_AS))}, got {params_as!r}")
    if not isinstance(example_inputs, (list, tuple)):
        example_inputs = (example_inputs,)
    return import_exported(export(module, example_inputs, decompose), params_as)


def from_torch(module, example_inputs: Sequence, params_as: str = "inputs") -> tuple[IRModule, dict]:
    """``(IRModule, params)`` for a ``torch.nn.Module`` traced with ``torch.export`` on ``example_inputs``.

    ``params`` maps each parameter/buffer parameter name of ``@main`` to its NumPy
    value (empty with ``params_as="constants"``, where they become Constants).
    Unsupported ATen operators raise one ``UnsupportedOperatorError`` listing
    each with its source line.
    """
    prog = import_torch(module, example_inputs, params_as)
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


__all__ = ["from_torch", "import_torch", "import_exported", "export", "TorchProgram", "DropoutMask",
           "UnsupportedOperatorError", "main_inputs", "sanitize", "source_line"]
