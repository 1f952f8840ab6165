"""PartitionForwardBackward: split a vjp-mode gradient function into forward and backward.

Input: ``@main_grad(x0..xn, ct) -> (out, (grads...))`` as made by
``FirstOrderGradient(mode="vjp")`` (the last parameter is the cotangent of ``out``).
Output (added to the module, ``@main_grad`` is kept):

- ``@main_fwd(x0..xn) -> (out, (r0..rk))``: the same parameters without ``ct``;
  the residuals ``r0..rk`` are in the order the nodes appear in the program;
- ``@main_bwd(r0..rk, ct) -> (grads...)``: the residuals (one parameter each, in
  the same order, named after the parameter they are, else ``%res_i``), then the
  cotangent; the result is the gradient tuple of ``@main_grad``.

Backward nodes are those that depend on ``ct`` and everything evaluated inside a
branch of an If that does (an If whose branches read residuals of a forward If
through its fields, as ``FirstOrderGradient`` makes them); the residuals are
forward values evaluated unconditionally. Nodes that depend on neither ``ct`` nor
a parameter (constants) are recomputed where needed. Policies:

- ``save_all``: the residuals are every forward value a backward node uses; on targets that gather fast
  (``REBUILDS_PARAMETER_COPIES``: torch, jax) except copies that only move data of the function's parameters
  (a weight's slice, concatenation: ``INJECTIVE`` ops of ``Recompute.VIEW`` or ``CHEAP``, one not a view),
  which the backward rebuilds from the parameters the caller holds anyway: a ResNet's 3x3 convolutions on 1x1
  maps are GEMMs with the weight's centre tap, a 1 MB copy each otherwise held from the forward to the
  backward. Views of parameters hold no memory and stay saved;
- ``min_cut``: as AOTAutograd's partitioner, a minimum cut (networkx max-flow,
  imported lazily) over the forward values the backward reaches chooses what to
  save. Saving a value costs its bytes, except the function's parameters (weights
  and inputs the caller holds anyway: free). Computing a value in the backward
  instead costs nothing when the forward's output does not need it (it only moves
  work), else its recomputation time: ``RECOMPUTE_NS[target][op.recompute]``
  nanoseconds per element, worth ``1 / recompute_ns_per_byte`` bytes per
  nanosecond. Ops of class ``Recompute.NEVER`` (GEMMs, convolutions, reductions,
  softmax, normalisations, opaque ops) and Ifs are never recomputed. So views
  and one-pass elementwise ops (~0.15 ns per float32 byte) are recomputed where
  that saves bytes, and special functions (erf, gelu, sigmoid: ~3 ns per float32
  byte with NumPy, ~0.5 with torch) under the default budget
  (``DEFAULT_NS_PER_BYTE``, 4 ns per byte: on a transformer layer, recomputing the
  GELU frees a sixth of ``save_all``'s bytes for one erf pass, ~9% of a NumPy step;
  ``bench/experiments/REPORT.md``), not silu (~6.5 with NumPy). Its residuals
  never take more bytes than ``save_all``'s (that set is a cut, and a cheaper
  cut is only taken when it saves bytes). A float32/64 ``nn.native_layer_norm`` / ``nn.native_batch_norm``
  output is a reduction's, yet it is ``(x - mean) * rstd * gamma + beta`` of the statistics the call returns:
  the backward reads it so rebuilt (``output_from_statistics``; the nodes between it and the backward rebuilt
  over it where recomputable), and the cut chooses between saving it and rebuilding it from the data and the
  statistics, which the norm's gradient saves anyway (transformer layer: 14 -> 12 MB of 19 MB).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ..analysis.liveness import type_bytes
from ..analysis.type_infer import infer_module
from ..ir.errors import PassError
from ..ir.expr import Call, Constant, Expr, Function, If, Tuple, TupleGetItem, Var, const
from ..ir.module import IRModule
from ..ir.scope import ScopeInfo
from ..ir.traversal import free_vars, post_order, transform
from ..ir.types import TensorType, TupleType
from ..ops.layout import broadcast_to_like
from ..ops.norm import output_from_statistics
from ..ops.registry import FusionKind, OpDef, Recompute, value_args
from .pass_infra import ModulePass, PassContext

POLICIES = ("save_all", "min_cut")

# Nanoseconds to recompute one element of an op of each class, per target: medians measured by
# bench/experiments/recompute_cost.py (one thread, 2^20 float32 elements; NumPy 2.4 + SciPy, torch 2.13).
# NumPy: arithmetic, comparisons, exp/log/tanh/sqrt 0.35-1.0; erf 8-13, gelu 9, sigmoid 10, silu 26.
# torch (ATen): arithmetic and exp/tanh 0.4-0.6; erf 1.0, gelu 0.6, silu 0.5 (inverse trigonometry 14-22).
# jax: one jitted XLA program fuses elementwise chains; taken as torch's.
RECOMPUTE_NS: dict[str, dict[Recompute, float]] = {
    "numpy": {Recompute.VIEW: 0.0, Recompute.CHEAP: 0.6, Recompute.SPECIAL: 12.0},
    "torch": {Recompute.VIEW: 0.0, Recompute.CHEAP: 0.6, Recompute.SPECIAL: 2.0},
    "jax": {Recompute.VIEW: 0.0, Recompute.CHEAP: 0.6, Recompute.SPECIAL: 2.0},
}
# Targets on which save_all rebuilds copies of parameters' data in the backward: torch gathers a ResNet's 512x512
# centre tap (every ninth float of the weight) in 0.2 ms with 2 threads, XLA fuses the slice into its reader;
# NumPy takes 0.36 ms warm, 0.8 ms inside a step (3 of them: 2.4 ms, 6% of the step, for 3 MB).
REBUILDS_PARAMETER_COPIES = {"numpy": False, "torch": True, "jax": True}
# The most recomputation time (ns) one byte of residual is worth by default.
DEFAULT_NS_PER_BYTE = 4.0


def _fields(body: Expr) -> tuple[Expr, Expr]:
    if isinstance(body, Tuple) and len(body.fields) == 2:
        return body.fields
    return TupleGetItem(body, 0), TupleGetItem(body, 1)


def _check_vjp(fn: Function, name: str) -> None:
    ret = fn.body.checked_type
    if not fn.params or not isinstance(ret, TupleType) or len(ret.fields) != 2:
        raise PassError(f"PartitionForwardBackward: @{name} is not a vjp-mode gradient function "
                        f"(expected (x..., ct) -> (out, (grads...)), got {fn.func_type!r})")
    if fn.params[-1].type_annotation != ret.fields[0]:
        raise PassError(f"PartitionForwardBackward: the last parameter of @{name} (%{fn.params[-1].name_hint}) must be the "
                        f"cotangent of the output, of type {ret.fields[0]!r}; use FirstOrderGradient(mode=\"vjp\")")


def recompute_class(node: Expr) -> Recompute:
    """The :class:`Recompute` class of ``node``: its op's, ``VIEW`` for tuple plumbing, ``NEVER`` otherwise
    (parameters, Ifs, calls of functions)."""
    if isinstance(node, (Tuple, TupleGetItem)):
        return Recompute.VIEW
    if isinstance(node, Call) and isinstance(node.op, OpDef):
        return node.op.recompute
    return Recompute.NEVER


def recomputable(node: Expr) -> bool:
    """May ``node`` be recomputed in the backward (no GEMM, convolution, reduction, normalisation, If)?"""
    return recompute_class(node) is not Recompute.NEVER


def _elements(t) -> int:
    """Elements of a (static) tensor type; 0 for tuples and unknown dims."""
    if not isinstance(t, TensorType):
        return 0
    size = type_bytes(t)
    return size // max(type_bytes(TensorType((), t.dtype)), 1)


class _Split:
    """Which nodes of a vjp-mode gradient body are backward, and the forward values the backward reads."""

    def __init__(self, fn: Function, name: str):
        ct = fn.params[-1]
        self.out, self.grads = _fields(fn.body)
        order = post_order(fn.body)
        on_ct: set[int] = {id(ct)}
        on_var: set[int] = set()
        for n in order:
            if isinstance(n, Function) or (isinstance(n, Call) and isinstance(n.op, Function)):
                what = type(n).__name__ if not isinstance(n, Call) else "call to a fused function"
                raise PassError(f"PartitionForwardBackward: @{name} holds a {what}; run it on a gradient function "
                                "without closures or fused functions (before FuseOps)")
            if isinstance(n, Var):
                if n is not ct:
                    on_var.add(id(n))
                continue
            kids = n.children()
            if any(id(c) in on_ct for c in kids):
                on_ct.add(id(n))
            elif any(id(c) in on_var for c in kids):
                on_var.add(id(n))
        if id(self.out) in on_ct:
            raise PassError(f"PartitionForwardBackward: the output of @{name} depends on the cotangent %{ct.name_hint}")
        self.scopes = ScopeInfo(fn.body, order)
        root = self.scopes.root
        # everything evaluated in a branch of a backward If is backward too
        bwd_scope: dict[int, bool] = {id(root): False}
        for n in order:
            s = self.scopes.scope_of[id(n)]
            chain = []
            while id(s) not in bwd_scope:
                chain.append(s)
                s = s.parent
            flag = bwd_scope[id(s)]
            for s in reversed(chain):
                flag = flag or id(s.if_node) in on_ct
                bwd_scope[id(s)] = flag
        backward = set(on_ct)
        backward.update(id(n) for n in order if not isinstance(n, Var) and bwd_scope[id(self.scopes.scope_of[id(n)])])
        self.backward = backward
        self.on_var = on_var
        # forward values the backward reads directly (each unconditional: see the module docstring)
        self.bwd_order = post_order(self.grads)
        needed: set[int] = set()
        for n in self.bwd_order:
            if id(n) in backward:
                needed.update(id(c) for c in n.children() if id(c) in on_var and id(c) not in backward)
        fields = self.grads.fields if isinstance(self.grads, Tuple) else (self.grads,)
        needed.update(id(f) for f in fields if id(f) in on_var and id(f) not in backward)
        self.needed = needed

    def unconditional(self, node: Expr) -> bool:
        """Is ``node`` available outside every If branch (a parameter, or evaluated in the body's own scope)?"""
        return isinstance(node, Var) or self.scopes.scope_of.get(id(node)) is self.scopes.root

    def forward_values(self) -> list:
        """Unconditional forward values (depending on a parameter) the backward reaches, in program order."""
        return [n for n in self.bwd_order if id(n) in self.on_var and id(n) not in self.backward and self.unconditional(n)]

    def operands(self, forward: list) -> dict:
        """``id(node) -> [unconditional forward operands]`` for ``forward``: an If reads what its branches read
        from outside them (through the nodes evaluated inside)."""
        fwd_ids = {id(n) for n in forward}
        ops: dict[int, list] = {id(n): [] for n in forward}
        for n in forward:
            if not isinstance(n, If):
                ops[id(n)] = [c for c in n.children() if id(c) in fwd_ids]
        for n in forward:  # nodes inside the branches of each unconditional forward If
            if not isinstance(n, If):
                continue
            seen: set[int] = set()
            stack = list(n.children())
            reads = ops[id(n)]
            while stack:
                c = stack.pop()
                if id(c) in seen:
                    continue
                seen.add(id(c))
                if self.unconditional(c):
                    if id(c) in fwd_ids:
                        reads.append(c)
                    continue
                stack.extend(c.children())
        return ops


def _recompute_bytes(node: Expr, ns: dict, ns_per_byte: float) -> float:
    """What computing ``node`` a second time is worth in bytes (``inf``: never)."""
    cls = recompute_class(node)
    if cls is Recompute.NEVER:
        return math.inf
    time = ns[cls] * _elements(node.checked_type)
    if not time:
        return 0
    return math.ceil(time / ns_per_byte) if ns_per_byte > 0 else math.inf


def _value_key(node: TupleGetItem) -> tuple:
    """Fields of equal keys are the same value: the same field of the same tuple."""
    return id(node.tuple_value), node.index


def _from_statistics(fn: Function, split: _Split, name: str) -> tuple[_Split, set, dict]:
    """``(split, new, origin)``: ``fn`` with its backward reading each float32/64 layer or batch norm output
    rebuilt elementwise from the statistics the norm returned (``output_from_statistics``), and the forward values
    between them and the backward rebuilt over them where recomputable; ``new``: the ids of the nodes this adds
    (their recomputation is extra work); ``origin``: ``id(rebuilt) -> original`` (the same value, what the forward
    saves if the cut keeps a rebuilt value)."""
    if not (isinstance(fn.body, Tuple) and len(fn.body.fields) == 2):
        return split, set(), {}
    origin: dict = {}
    memo: dict = {}
    order = post_order(fn.body)
    fields = {_value_key(n): n for n in order if isinstance(n, TupleGetItem)}

    def same_field(old: Expr, new: Expr) -> Optional[Expr]:  # the statistics, read through the graph's own fields
        return fields.get(_value_key(new)) if isinstance(new, TupleGetItem) else None

    def rule(old: Expr, new: Expr) -> Optional[Expr]:
        rebuilt = None
        if isinstance(old, TupleGetItem) and split.unconditional(old.tuple_value):  # its operands read anywhere
            rebuilt = output_from_statistics(old, lambda arg: memo.get(id(arg), arg))
        if rebuilt is not None:
            rebuilt = transform(rebuilt, same_field)
            origin[id(rebuilt)] = old
            return rebuilt
        if new is old:
            return None
        if id(old) not in split.backward and not recomputable(old):
            return old  # never computed twice: the forward's value
        origin[id(new)] = old
        return None

    grads = transform(split.grads, rule, memo=memo)
    if grads is split.grads:
        return split, set(), {}
    before = {id(n) for n in order}
    new_fn = Function(list(fn.params), Tuple([split.out, grads]), fn.ret_type)
    return _Split(new_fn, name), {id(n) for n in post_order(grads) if id(n) not in before}, origin


def _min_cut(split: _Split, target: str, ns_per_byte: float, extra: frozenset = frozenset()) -> list:
    """Forward values to save: a minimum cut of bytes saved plus recomputation time (see the module docstring);
    recomputing a node of ``extra`` is extra work, as one the forward's output needs."""
    try:
        import networkx as nx
    except ImportError as e:
        raise PassError("PartitionForwardBackward(policy=\"min_cut\") needs networkx (pip install networkx)") from e
    forward = split.forward_values()
    operands = split.operands(forward)
    ns = RECOMPUTE_NS[target]
    required = {id(n) for n in post_order(split.out)} | extra  # recomputing these is extra work
    # parameters are free to save, only preferred fewer: one byte of a computed value outweighs them all
    scale = 1 + sum(type_bytes(n.checked_type) for n in forward if isinstance(n, Var))
    g = nx.DiGraph()
    for n in forward:
        k = id(n)
        size = type_bytes(n.checked_type)
        g.add_edge(("in", k), ("out", k), capacity=size if isinstance(n, Var) else max(size, 1) * scale)
        if isinstance(n, Var) or k in required:  # computing it in the backward means computing it twice
            cost = _recompute_bytes(n, ns, ns_per_byte)
            if cost:
                g.add_edge("source", ("in", k), **({} if math.isinf(cost) else {"capacity": cost * scale}))
        for c in operands[k]:
            g.add_edge(("out", id(c)), ("in", k))
        if k in split.needed:
            g.add_edge(("out", k), "sink")
    if "sink" not in g or "source" not in g:
        return [n for n in forward if id(n) in split.needed]
    _, (reach, _) = nx.minimum_cut(g, "source", "sink")
    return [n for n in forward if ("in", id(n)) in reach and ("out", id(n)) not in reach]


def partition(fn: Function, name: str = "main_grad", policy: str = "save_all", target: str = "numpy",
              recompute_ns_per_byte: float = DEFAULT_NS_PER_BYTE) -> tuple[Function, Function]:
    """``(fwd, bwd)`` Functions for the vjp-mode gradient function ``fn`` (see the module docstring)."""
    _check_options(policy, target, recompute_ns_per_byte)
    _check_vjp(fn, name)
    ct = fn.params[-1]
    split = _Split(fn, name)
    origin: dict = {}
    if policy == "save_all":
        forward = split.forward_values()
        saved = [n for n in forward if id(n) in split.needed]
        if REBUILDS_PARAMETER_COPIES[target]:
            saved = _parameters_for_their_moves(forward, saved, fn.params[:-1])
    else:
        split, new, origin = _from_statistics(fn, split, name)
        saved = _min_cut(split, target, recompute_ns_per_byte, new)
    grads = split.grads
    new_ct = Var(ct.name_hint, ct.type_annotation)
    res_vars = [Var(n.name_hint if isinstance(n, Var) else f"res_{i}", n.checked_type) for i, n in enumerate(saved)]
    memo: dict = {id(n): v for n, v in zip(saved, res_vars)}
    memo[id(ct)] = new_ct
    bwd_body = transform(grads, memo=memo)
    reads = free_vars(bwd_body)
    allowed = {id(v) for v in res_vars + [new_ct]}
    leaked = [v for v in reads if id(v) not in allowed]
    if leaked:
        raise PassError(f"PartitionForwardBackward: internal error, the backward of @{name} still reads "
                        f"{', '.join('%' + v.name_hint for v in leaked)}")
    used = {id(v) for v in reads}
    keep = [i for i, v in enumerate(res_vars) if id(v) in used]  # a cut may list a free parameter nothing reads
    saved = [saved[i] for i in keep]
    res_vars = [res_vars[i] for i in keep]
    typed = _read_for_their_type(bwd_body, res_vars)
    fwd_ret = TupleType((split.out.checked_type, TupleType(tuple(n.checked_type for n in saved))))
    residuals = [origin.get(id(n), n) for n in saved]
    residuals = [_type_carrier(r) if id(v) in typed and not isinstance(r, Var) else r for r, v in zip(residuals, res_vars)]
    fwd = Function(list(fn.params[:-1]), Tuple([split.out, Tuple(residuals)]), fwd_ret)
    bwd = Function(res_vars + [new_ct], bwd_body, grads.checked_type)
    return fwd, bwd


def _read_for_their_type(body: Expr, res_vars: list) -> set:
    """The ids of the residuals ``body`` reads only for their type (the shape operands of ``*_like`` operators:
    ``OpDef.type_only``), where the shape is dynamic and ConcretizeLike could not write it out."""
    data = set()
    for n in post_order(body):
        if isinstance(n, Call) and isinstance(n.op, OpDef):
            data.update(map(id, value_args(n)))
        elif not isinstance(n, Var):
            data.update(id(c) for c in n.children())
    if isinstance(body, Var):
        data.add(id(body))
    return {id(v) for v in res_vars if id(v) not in data and isinstance(v.type_annotation, TensorType)}


def _type_carrier(value: Expr) -> Expr:
    """A residual of ``value``'s type that holds no memory: a zero broadcast to it (a view of one element on
    NumPy and torch), so the forward lets ``value`` go when the backward only needs its (dynamic) shape."""
    return broadcast_to_like(const(0, value.checked_type.dtype), value)


def _parameters_for_their_moves(forward: list, saved: list, params) -> list:
    """``saved`` (the ``forward`` values, in program order, the backward reads) with each value that only moves data of ``params`` (``INJECTIVE`` ops of
    ``Recompute.VIEW`` or ``CHEAP`` over parameters and constants) into memory of its own (one of them is not a
    ``VIEW``) replaced by those parameters. Views of parameters (a transposed weight) stay saved: they hold no
    memory of their own."""
    position = {id(n): i for i, n in enumerate(forward)}
    param_ids = {id(p) for p in params}
    moved: dict[int, Optional[tuple]] = {}  # id -> (the parameters a value only moves data of, copies?), or None
    for n in forward:
        if isinstance(n, Var):
            moved[id(n)] = ((n,), False) if id(n) in param_ids else None
        elif (isinstance(n, Call) and isinstance(n.op, OpDef) and n.op.pattern == FusionKind.INJECTIVE
              and n.op.recompute <= Recompute.CHEAP):
            got = [moved.get(id(c)) for c in n.args if not isinstance(c, Constant)]
            moved[id(n)] = None if any(g is None for g in got) else (
                tuple(p for g in got for p in g[0]), n.op.recompute != Recompute.VIEW or any(g[1] for g in got))
        else:
            moved[id(n)] = None
    out: dict[int, Expr] = {}
    for n in saved:
        m = moved[id(n)]
        for r in m[0] if m is not None and m[1] else (n,):
            out[id(r)] = r
    return sorted(out.values(), key=lambda n: position[id(n)])


def _check_options(policy: str, target: str, ns_per_byte: float) -> None:
    if policy not in POLICIES:
        raise PassError(f"PartitionForwardBackward: policy must be one of {', '.join(map(repr, POLICIES))}, got {policy!r}")
    if target not in RECOMPUTE_NS:
        raise PassError(f"PartitionForwardBackward: target must be one of {', '.join(map(repr, RECOMPUTE_NS))} "
                        f"(the recomputation costs of min_cut), got {target!r}")
    if not isinstance(ns_per_byte, (int, float)) or isinstance(ns_per_byte, bool) or not ns_per_byte >= 0:
        raise PassError(f"PartitionForwardBackward: recompute_ns_per_byte must be a number >= 0, got {ns_per_byte!r}")


@dataclass(frozen=True)
class PartitionForwardBackward(ModulePass):
    """Add ``@{base}_fwd`` and ``@{base}_bwd`` for the vjp-mode gradient ``@{func}``
    (``base`` is ``func`` without its ``_grad`` suffix); see the module docstring.

    ``policy``: ``"save_all"`` or ``"min_cut"``; ``target`` names the executor the program will run on: for
    ``save_all``, whether copies of parameters are rebuilt (``REBUILDS_PARAMETER_COPIES``); for ``min_cut``,
    whose recomputation costs apply (``RECOMPUTE_NS``), and ``recompute_ns_per_byte`` the most recomputation
    time (ns) worth one byte of residual (``inf``: recomputation is free, AOTAutograd's assumption;
    0: only work the forward's output does not need moves to the backward).
    """

    name = "PartitionForwardBackward"
    func: str = "main_grad"
    policy: str = "save_all"
    names: Optional[tuple] = None
    target: str = "numpy"
    recompute_ns_per_byte: float = DEFAULT_NS_PER_BYTE

    def __post_init__(self):
        func = self.func
        _check_options(self.policy, self.target, self.recompute_ns_per_byte)
        if not isinstance(func, str) or not func:
            raise PassError(f"PartitionForwardBackward: func must be a function name, got {func!r}")
        base = func[: -len("_grad")] if func.endswith("_grad") else func
        object.__setattr__(self, "names", tuple(self.names) if self.names else (f"{base}_fwd", f"{base}_bwd"))

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        fn = mod[self.func]
        infer_module(mod)
        fwd, bwd = partition(fn, self.func, self.policy, self.target, self.recompute_ns_per_byte)
        new = mod.with_functions({self.names[0]: fwd, self.names[1]: bwd})
        infer_module(new)
        return new

__all__ = ["PartitionForwardBackward", "partition", "recomputable", "recompute_class", "POLICIES", "RECOMPUTE_NS", "DEFAULT_NS_PER_BYTE"]
