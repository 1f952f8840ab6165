"""PartitionForwardBackward: split a vjp-mode gradient function into forward and backward.

Input: ``@main_grad(x0..xn, ct) -> (out, (grads...))`` as made by
``FirstOrderGradient(mode="vjp")`` (the last parameter is the cotangent of ``out``).
Output (added to the module, ``@main_grad`` is kept):

- ``@main_fwd(x0..xn) -> (out, (r0..rk))``: the same parameters without ``ct``;
  the residuals ``r0..rk`` are in the order the nodes appear in the program;
- ``@main_bwd(r0..rk, ct) -> (grads...)``: the residuals (one parameter each, in
  the same order, named after the parameter they are, else ``%res_i``), then the
  cotangent; the result is the gradient tuple of ``@main_grad``.

Nodes that depend on ``ct`` are backward nodes; nodes that depend on neither
``ct`` nor a parameter (constants) are recomputed where needed. Policies:

- ``save_all``: the residuals are every forward value a backward node uses;
- ``min_cut``: like AOTAutograd's partitioner, a minimum cut (networkx max-flow,
  imported lazily) over the forward nodes, weighted by bytes, chooses what to
  save; cheap elementwise/broadcast/injective ops may be recomputed in the
  backward, never matmul/conv (OUT_ELEMWISE_FUSABLE), reductions or opaque ops.
  Its residuals never take more bytes than ``save_all``'s (that set is a cut).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..analysis.liveness import type_bytes
from ..analysis.type_infer import infer_module
from ..ir.errors import PassError
from ..ir.expr import Call, Expr, Function, GlobalVar, If, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.traversal import free_vars, post_order, transform
from ..ir.types import TupleType
from ..ops.registry import OpDef, FusionKind
from .pass_infra import ModulePass, PassContext

POLICIES = ("save_all", "min_cut")
RECOMPUTABLE = (FusionKind.ELEMWISE, FusionKind.BROADCAST, FusionKind.INJECTIVE)


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


def recomputable(node: Expr) -> bool:
    """May ``node`` be recomputed in the backward (cheap, no matmul/conv/reduction)?"""
    if isinstance(node, (Tuple, TupleGetItem)):
        return True
    return isinstance(node, Call) and isinstance(node.op, OpDef) and node.op.pattern in RECOMPUTABLE


def _min_cut(forward: list, needed: list) -> list:
    """Forward nodes to save: a minimum byte cut between the parameters/non-recomputable nodes and the backward."""
    try:
        import networkx as nx
    except ImportError as e:
        raise PassError("PartitionForwardBackward(policy=\"min_cut\") needs networkx (pip install networkx)") from e
    g = nx.DiGraph()
    fwd_ids = {id(n) for n in forward}
    for n in forward:
        k = id(n)
        g.add_edge(("in", k), ("out", k), capacity=max(type_bytes(n.checked_type), 1))
        if not recomputable(n):
            g.add_edge("source", ("in", k))  # no capacity attribute: infinite
        for c in n.children():
            if id(c) in fwd_ids:
                g.add_edge(("out", id(c)), ("in", k))
    for n in needed:
        g.add_edge(("out", id(n)), "sink")
    if "source" not in g:
        return []
    _, (reach, _) = nx.minimum_cut(g, "source", "sink")
    return [n for n in forward if ("in", id(n)) in reach and ("out", id(n)) not in reach]


def partition(fn: Function, name: str = "main_grad", policy: str = "save_all") -> tuple[Function, Function]:
    """``(fwd, bwd)`` Functions for the vjp-mode gradient function ``fn`` (see the module docstring)."""
    if policy not in POLICIES:
        raise PassError(f"PartitionForwardBackward: policy must be one of {', '.join(map(repr, POLICIES))}, got {policy!r}")
    _check_vjp(fn, name)
    ct = fn.params[-1]
    out, grads = _fields(fn.body)
    order = post_order(fn.body)
    on_ct: set[int] = {id(ct)}
    on_var: set[int] = set()
    for n in order:
        if isinstance(n, (If, Function)) or (isinstance(n, Call) and isinstance(n.op, (GlobalVar, Function))):
            raise PassError(f"PartitionForwardBackward: @{name} holds a {type(n).__name__ if not isinstance(n, Call) else 'call to ' + n.op_name}; "
                            "run it on a gradient function without If, closures or calls (inline them first)")
        if isinstance(n, Var):
            if n is not ct:
                on_var.add(id(n))
            continue
        kids = n.children()
        if any(id(c) in on_ct for c in kids):
            on_ct.add(id(n))
        elif any(id(c) in on_var for c in kids):
            on_var.add(id(n))
    if id(out) in on_ct:
        raise PassError(f"PartitionForwardBackward: the output of @{name} depends on the cotangent %{ct.name_hint}")

    # forward nodes the backward reads, in program order
    bwd_order = post_order(grads)
    fwd_of_bwd = [n for n in bwd_order if id(n) in on_var]
    fwd_ids = {id(n) for n in fwd_of_bwd}
    needed_ids: set[int] = set()
    for n in bwd_order:
        if id(n) in on_ct:
            needed_ids.update(id(c) for c in n.children() if id(c) in fwd_ids)
    if isinstance(grads, Tuple):
        needed_ids.update(id(f) for f in grads.fields if id(f) in fwd_ids)
    elif id(grads) in fwd_ids:
        needed_ids.add(id(grads))
    needed = [n for n in fwd_of_bwd if id(n) in needed_ids]
    saved = needed if policy == "save_all" else _min_cut(fwd_of_bwd, needed)

    fwd_params = list(fn.params[:-1])
    res_vars = [Var(n.name_hint if isinstance(n, Var) else f"res_{i}", n.checked_type) for i, n in enumerate(saved)]
    fwd_ret = TupleType((out.checked_type, TupleType(tuple(n.checked_type for n in saved))))
    fwd = Function(fwd_params, Tuple([out, Tuple(saved)]), fwd_ret)
    new_ct = Var(ct.name_hint, ct.type_annotation)
    memo: dict = {id(n): v for n, v in zip(saved, res_vars)}
    memo[id(ct)] = new_ct
    bwd_body = transform(grads, memo=memo) if not isinstance(grads, Var) else memo.get(id(grads), grads)
    bwd_params = res_vars + [new_ct]
    allowed = {id(v) for v in bwd_params}
    leaked = [v for v in free_vars(bwd_body) if id(v) not in allowed]
    if leaked:
        raise PassError(f"PartitionForwardBackward: internal error, the backward of @{name} still reads "
                        f"{', '.join('%' + v.name_hint for v in leaked)}")
    bwd = Function(bwd_params, bwd_body, grads.checked_type)
    return fwd, bwd


@dataclass(frozen=True)
class PartitionForwardBackward(ModulePass):
    """Add ``@{base}_fwd`` and ``@{base}_bwd`` for the vjp-mode gradient ``@{func}``
    (``base`` is ``func`` without its ``_grad`` suffix); see the module docstring."""

    name = "PartitionForwardBackward"
    func: str = "main_grad"
    policy: str = "save_all"
    names: Optional[tuple] = None

    def __post_init__(self):
        func = self.func
        if self.policy not in POLICIES:
            raise PassError(f"PartitionForwardBackward: policy must be one of {', '.join(map(repr, POLICIES))}, "
                            f"got {self.policy!r}")
        if not isinstance(func, str) or not func:
            raise PassError(f"PartitionForwardBackward: func must be a function name, got {func!r}")
        base = func[: -len("_grad")] if func.endswith("_grad") else func
        object.__setattr__(self, "names", tuple(self.names) if self.names else (f"{base}_fwd", f"{base}_bwd"))

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        fn = mod[self.func]
        infer_module(mod)
        fwd, bwd = partition(fn, self.func, self.policy)
        new = mod.with_functions({self.names[0]: fwd, self.names[1]: bwd})
        infer_module(new)
        return new

__all__ = ["PartitionForwardBackward", "partition", "recomputable", "POLICIES"]
