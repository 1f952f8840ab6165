"""FuseOps: group operators by Relay's fusion rules into primitive functions.

The grouping is ``analysis.fusion.partition`` (see there for the rules). Each
group of more than one operator becomes ``fn [Primitive=1] (params) { ops }``
called in place from the function; a group holding a single operator stays a
plain call (there is nothing to fuse, and later passes see the op itself).
Group inputs become parameters in first-use order; constants of at most 16
elements are copied into the group instead. Groups never cross an If branch
boundary. ``fuse_opt_level=0`` leaves the module unchanged (every op is its
own group). Functions that are primitive already are left alone, and calls to
them are opaque, so running FuseOps twice changes nothing the second time.
"""

from __future__ import annotations

from ..analysis.fusion import DEFAULT_MAX_ARGS, DEFAULT_MAX_DEPTH, is_inline_constant, num_ops, partition
from ..ir.errors import PassError
from ..ir.expr import Call, Constant, Expr, Function, Var
from ..ir.module import IRModule
from ..ir.traversal import rebuild
from dataclasses import dataclass
from ..analysis.type_infer import infer_module
from ..ir.gc_pause import gc_paused
from .pass_infra import FunctionPass, PassContext


def _param_name(node: Expr, k: int) -> str:
    return node.name_hint if isinstance(node, Var) else f"p{k}"


def fuse_function(fn: Function, fuse_opt_level: int = 2, max_depth: int = DEFAULT_MAX_DEPTH,
                  max_args: int = DEFAULT_MAX_ARGS) -> Function:
    """``fn`` (typed) with every group of more than one op made a primitive function; ``fn`` if none."""
    with gc_paused():
        return _fuse_function(fn, fuse_opt_level, max_depth, max_args)


def _fuse_function(fn: Function, fuse_opt_level: int, max_depth: int, max_args: int) -> Function:
    part = partition(fn.body, fuse_opt_level, max_depth, max_args)
    nodes = part.nodes
    groups = {r: m for r, m in part.groups().items() if num_ops(nodes[i] for i in m) > 1}
    if not groups:
        return fn
    fused_root: dict[Expr, int] = {}  # member -> group root index, for members of fused groups (identity keys)
    for r, members in groups.items():
        for i in members:
            fused_root[nodes[i]] = r
    _check_single_output(nodes, fused_root, fn.body)
    memo: dict[Expr, Expr] = {}  # old node in fn -> node in the new body (only nodes that changed)
    get = memo.get

    def mapped(c):
        return get(c, c)

    for i, node in enumerate(nodes):
        r = fused_root.get(node)
        if r is None:
            for c in node.children():
                if c in memo:
                    memo[node] = rebuild(node, mapped)
                    break
        elif r == i:
            prim, inputs = _make_group(nodes, groups[r], fn, fused_root, r)
            call = Call(prim, [get(a, a) for a in inputs])
            if node.span is not None:
                call.span = node.span
            memo[node] = call
    body = memo.get(fn.body, fn.body)
    return fn.replace(body=body)


def _check_single_output(nodes: list, fused_root: dict, body: Expr) -> None:
    """Only a group's root may be used outside the group (else the partition is wrong)."""
    for n in nodes:
        for c in n.children():
            r = fused_root.get(c)
            if r is not None and nodes[r] is not c and fused_root.get(n) != r:
                at = next(i for i, x in enumerate(nodes) if x is c)
                raise PassError(f"FuseOps: internal error: {c.op_name if isinstance(c, Call) else type(c).__name__} "
                                f"#{at} is used outside its group")
    r = fused_root.get(body)
    if r is not None and nodes[r] is not body:
        raise PassError("FuseOps: internal error: the function result is inside a group")


def _make_group(nodes: list, members: list, fn: Function, fused_root: dict, r: int) -> tuple[Function, list]:
    """The primitive Function of one group and the outer expressions it takes as arguments."""
    members_set = {nodes[i] for i in members}
    inputs: list[Expr] = []
    local: dict[Expr, Expr] = {}  # node of fn -> its counterpart in the group's body
    params: list[Var] = []
    for i in members:
        node = nodes[i]
        for a in node.children():
            if a in members_set or a in local:
                continue
            if is_inline_constant(a):
                local[a] = Constant(a.data)
                continue
            p = Var(_param_name(a, len(params)), a.checked_type)
            params.append(p)
            inputs.append(a)
            local[a] = p
    for i in members:
        node = nodes[i]
        if isinstance(node, Call) and isinstance(node.op, Function):
            raise PassError(f"FuseOps: a call to a function cannot be part of a group (in group of {nodes[r]!r})")
        local[node] = rebuild(node, local.__getitem__)
    root = nodes[r]
    if members[-1] != r:
        raise PassError("FuseOps: internal error: a group's root is not its last node")
    prim = Function(params, local[root], ret_type=root.checked_type, attrs={"Primitive": 1})
    return prim, inputs


@dataclass(frozen=True)
class FuseOps(FunctionPass):
    """Fuse operators into primitive functions by Relay's rules on op patterns.

    ``fuse_opt_level``: 0 fuses nothing; ``max_depth``: most nodes per group; ``max_args``:
    most inputs per group (0: no limit). Single-op groups stay plain calls.
    """

    name = "FuseOps"
    required = ("InferType",)
    fuse_opt_level: int = 2
    max_depth: int = DEFAULT_MAX_DEPTH
    max_args: int = DEFAULT_MAX_ARGS

    def __post_init__(self):
        partition(Constant(0.0), self.fuse_opt_level, self.max_depth, self.max_args)  # validates the settings early

    def transform_function(self, func: Function, mod: IRModule, ctx: PassContext) -> Function:
        infer_module(mod)
        return fuse_function(func, self.fuse_opt_level, self.max_depth, self.max_args)


__all__ = ["FuseOps", "fuse_function"]
