"""Operator fusion analysis: Relay's graph partitioner and ``fusion_report``.

``partition(func)`` groups the nodes of one function body by Relay's rules
(``src/relay/analysis/graph_partitioner.cc``) on operator patterns
(``ops.FusionKind``); ``transform.FuseOps`` turns each group into a primitive
Function. The algorithm, all loops flat (a chain of a million nodes is fine):

1. the dataflow graph: every non-leaf node of the body is a graph node (Calls
   to operators carry their op's pattern, Tuple/TupleGetItem are TUPLE, If and
   calls to functions are OPAQUE); an edge ``producer -> consumer`` carries the
   consumer's pattern, except that a BROADCAST edge whose input already has the
   output's shape counts as ELEMWISE. A node used by the function result, by a
   node of another If scope, or as an If condition/branch result is *extern*:
   it is the output of its group.
2. immediate post-dominators, in reverse topological order: the least common
   ancestor of a node's consumers in the post-dominator tree, with the
   combined (max) pattern of the edges along the way.
3. three phases over the nodes in topological order (Relay's): OUT_ELEMWISE_FUSABLE
   ops (dense, conv2d, batch_matmul) take an elementwise path to their
   post-dominator; ops <= BROADCAST fuse into an injective or reduction
   post-dominator when every op between is <= INJECTIVE; in phase 1 INJECTIVE
   and TUPLE nodes fuse along injective paths; in phase 2 injective ops fuse
   into tuples already fused into injective consumers. OPAQUE and COMM_REDUCE
   nodes never start a fusion (a reduction can end one). A fusion is refused
   when the group would hold more than ``max_depth`` nodes or take more than
   ``max_args`` inputs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Union

from ..ir.errors import PullbackError
from ..ir.expr import Call, Constant, Expr, Function, GlobalVar, If, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.scope import ScopeInfo
from ..ir.traversal import post_order
from ..ir.types import TensorType
from ..ops.registry import OpDef, FusionKind

ELEMWISE, BROADCAST, INJECTIVE = FusionKind.ELEMWISE, FusionKind.BROADCAST, FusionKind.INJECTIVE
COMM_REDUCE, OUT_EWISE, TUPLE, OPAQUE = FusionKind.COMM_REDUCE, FusionKind.OUT_ELEMWISE_FUSABLE, FusionKind.TUPLE, FusionKind.OPAQUE

DEFAULT_MAX_DEPTH = 256
DEFAULT_MAX_ARGS = 64
INLINE_CONST_SIZE = 16  # constants up to this many elements are copied into groups instead of passed


def node_pattern(node: Expr) -> FusionKind:
    """The fusion kind of a graph node."""
    if isinstance(node, Call):
        return node.op.pattern if isinstance(node.op, OpDef) else OPAQUE
    if isinstance(node, (Tuple, TupleGetItem)):
        return TUPLE
    return OPAQUE


def is_inline_constant(node: Expr) -> bool:
    return isinstance(node, Constant) and node.data.size <= INLINE_CONST_SIZE


def _edge_pattern(producer: Expr, consumer: Expr) -> FusionKind:
    if isinstance(consumer, (Tuple, TupleGetItem)):
        return INJECTIVE
    pat = node_pattern(consumer)
    if pat == BROADCAST:
        pt, ct = producer._checked_type, consumer._checked_type
        if isinstance(pt, TensorType) and isinstance(ct, TensorType) and pt.shape == ct.shape:
            return ELEMWISE
    return pat


@dataclass
class Partition:
    """The grouping of one function body.

    ``nodes``: graph nodes in topological order; ``group_of[i]``: index of the root
    node of node ``i``'s group; ``reasons[i]``: why node ``i`` was not fused into its
    post-dominator (None when it was, or when it is a group's own root by design);
    ``index[node]``: the position of a graph node in ``nodes``.
    """

    body: Expr
    nodes: list
    index: dict
    group_of: list
    reasons: list
    ipdom: list
    fuse_opt_level: int
    max_depth: int
    max_args: int

    def groups(self) -> dict[int, list[int]]:
        """Root index -> member indices in topological order (the root last)."""
        out: dict[int, list[int]] = {}
        for i, g in enumerate(self.group_of):
            out.setdefault(g, []).append(i)
        return out

    def edges(self):
        """``(producer_index, consumer_index)`` for every dataflow edge between graph nodes."""
        index = self.index
        for ci, n in enumerate(self.nodes):
            for c in n.children():
                pi = index.get(c)
                if pi is not None:
                    yield pi, ci


def num_ops(nodes) -> int:
    """Operator calls among ``nodes`` (Tuple and TupleGetItem do not count)."""
    return sum(1 for n in nodes if isinstance(n, Call) and isinstance(n.op, OpDef))


class _Partitioner:
    def __init__(self, body: Expr, fuse_opt_level: int, max_depth: int, max_args: int):
        self.body = body
        order = post_order(body)
        nodes = [n for n in order if not isinstance(n, (Var, Constant, GlobalVar, Function))]
        self.nodes = nodes
        self.index = {n: i for i, n in enumerate(nodes)}  # nodes hash by identity
        self.fuse_opt_level = fuse_opt_level
        self.max_depth = max_depth
        self.max_args = max_args
        self.scope_of = None
        if any(isinstance(n, If) for n in nodes):
            self.scope_of = ScopeInfo(body, order).scope_of
        n = len(nodes)
        self.pattern = [node_pattern(x) for x in nodes]
        self.outputs: list[list] = [[] for _ in range(n)]  # (consumer index, edge pattern)
        self.extern = [False] * n
        self.extern_reason: list = [None] * n
        self._build_graph()

    # -- 1. the dataflow graph
    def _build_graph(self) -> None:
        index, nodes, scope_of = self.index, self.nodes, self.scope_of
        root = self.index.get(self.body)
        if root is not None:
            self.extern[root] = True
            self.extern_reason[root] = "the function's result"
        for ci, c in enumerate(nodes):
            if isinstance(c, If):
                for kid, what in ((c.cond, "an If condition"), (c.true_branch, "an If branch result"),
                                  (c.false_branch, "an If branch result")):
                    pi = index.get(kid)
                    if pi is not None:
                        self.extern[pi] = True
                        self.extern_reason[pi] = self.extern_reason[pi] or f"used as {what}"
                continue
            for a in c.children():
                pi = index.get(a)
                if pi is None:
                    continue
                if scope_of is not None and scope_of[id(a)] is not scope_of[id(c)]:
                    self.extern[pi] = True
                    self.extern_reason[pi] = self.extern_reason[pi] or "used inside an If branch it is not part of"
                    continue
                self.outputs[pi].append((ci, _edge_pattern(a, c)))

    # -- 2. post-dominators
    def _post_dominators(self) -> None:
        """Immediate post-dominators and the combined pattern of the paths to them, in O(E log N).

        Nodes are visited in reverse topological order; a node's post-dominator is the least
        common ancestor of its consumers in the post-dominator tree built so far (extern nodes
        and nodes without consumers hang below a virtual exit, index ``n``, meaning "none"). The
        tree only grows at its leaves, so each node gets a skew-binary jump pointer (Myers 1983)
        at insertion: ancestors and least common ancestors are found in O(log N) steps instead
        of walking the tree (which is quadratic when a value feeds many distant consumers, as
        forward values do in gradient programs). ``jmax[v]`` is the combined pattern of the
        nodes from ``v`` up to ``jump[v]`` (excluded), so the pattern of the walked paths comes
        with the jumps: the result is the same as Relay's step-by-step walk.
        """
        n = len(self.nodes)
        exit_ = n
        parent = [exit_] * (n + 1)
        depth = [1] * n + [0]
        jump = [exit_] * (n + 1)
        dpat = [OPAQUE] * n + [ELEMWISE]
        jmax = [OPAQUE] * n + [ELEMWISE]
        outputs, extern = self.outputs, self.extern
        for i in range(n - 1, -1, -1):
            outs = outputs[i]
            if extern[i] or not outs:
                continue  # a root: below the exit, depth 1, pattern OPAQUE
            lca, pat = outs[0]
            for ci, epat in outs[1:]:
                if epat > pat:
                    pat = epat
                a, b = (lca, ci) if depth[lca] >= depth[ci] else (ci, lca)
                while depth[a] > depth[b]:  # lift the deeper one (the combined pattern is symmetric)
                    j = jump[a]
                    if depth[j] >= depth[b]:
                        pat = max(pat, jmax[a])
                        a = j
                    else:
                        pat = max(pat, dpat[a])
                        a = parent[a]
                while a != b:  # same depth, so jump[a] and jump[b] are at the same depth too
                    ja, jb = jump[a], jump[b]
                    if ja != jb:
                        pat = max(pat, jmax[a], jmax[b])
                        a, b = ja, jb
                    else:
                        pat = max(pat, dpat[a], dpat[b])
                        a, b = parent[a], parent[b]
                lca = a
                if lca == exit_:
                    break
            if lca == exit_:
                continue
            parent[i] = lca
            depth[i] = depth[lca] + 1
            dpat[i] = pat
            j = jump[lca]
            if depth[lca] - depth[j] == depth[j] - depth[jump[j]]:
                jump[i] = jump[j]
                jmax[i] = max(pat, jmax[lca], jmax[j])
            else:
                jump[i] = lca
                jmax[i] = pat
        self.ipdom = [-1 if p == exit_ else p for p in parent[:n]]
        self.dom_pattern = dpat[:n]

    # -- union-find groups
    def _find(self, i: int) -> int:
        up = self.up
        r = up[i]
        if up[r] == r:
            return r
        while up[r] != r:
            r = up[r]
        while up[i] != r:
            up[i], i = r, up[i]
        return r

    def _path(self, src: int, sink: int) -> Optional[list[int]]:
        """Nodes on the paths from ``src`` (excluded) to ``sink`` (included), iteratively; None when
        there are more than ``max_depth`` (their groups could not be merged anyway, and the walk
        stays bounded: a forward value whose post-dominator is in the backward is far from it)."""
        outs = self.outputs[src]
        if len(outs) == 1 and outs[0][0] == sink:  # the common case: the consumer is the post-dominator
            return [sink]
        seen = {src}
        out = []
        stack = [ci for ci, _ in outs]
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            out.append(i)
            if len(out) > self.max_depth:
                return None
            if i != sink:
                stack.extend(ci for ci, _ in self.outputs[i])
        return out

    def _union_args(self, roots: set) -> set:
        """External inputs (nodes) of the union of the groups ``roots``."""
        out: set = set()
        for r in roots:
            out |= self.args[r]
        index, find = self.index, self._find
        return {a for a in out if (j := index.get(a)) is None or find(j) not in roots}

    def _try_fuse(self, src: int, sink: int, fcond) -> Optional[str]:
        """Merge the groups on every path from ``src`` into ``sink``'s group; a reason when refused."""
        path = self._path(src, sink)
        if path is None:
            return f"the group would hold more than {self.max_depth} nodes (max_depth={self.max_depth})"
        gpat, find = self.gpattern, self._find
        found = [find(i) for i in path]
        for i, g in zip(path, found):
            if not fcond(gpat[g], i == sink):
                return (f"the path to its post-dominator passes a {gpat[g].name} group "
                        f"({_label(self.nodes[i])})")
        roots = {find(src), *found}
        size = sum(self.size[r] for r in roots)
        if size > self.max_depth:
            return f"the group would hold {size} nodes (max_depth={self.max_depth})"
        args = self._union_args(roots)
        if self.max_args and len(args) > self.max_args:
            return f"the group would take {len(args)} inputs (max_args={self.max_args})"
        target = find(sink)
        for r in roots:
            if r != target:
                self._merge(r, target)
        self.args[target] = args
        return None

    def _merge(self, child: int, parent: int) -> None:
        self.up[child] = parent
        self.size[parent] += self.size[child]
        self.args[child] = set()
        if self.anchor[child]:
            self.anchor[parent] = True
            self.gpattern[parent] = max(self.gpattern[parent], self.gpattern[child])

    def run(self) -> Partition:
        n = len(self.nodes)
        self.up = list(range(n))
        self.size = [1] * n
        self.gpattern = list(self.pattern)
        self.anchor = [p == OUT_EWISE for p in self.pattern]
        self.args = [{a for a in x.children() if not is_inline_constant(a)} for x in self.nodes]
        self._post_dominators()
        if self.fuse_opt_level > 0:
            reasons: list = [None] * n
            for phase in range(3):
                for i in range(n):
                    r = self._step(i, phase)
                    if r is not None:
                        reasons[i] = r
        else:
            reasons = ["fuse_opt_level=0"] * n
        group_of = [self._find(i) for i in range(n)]
        for i in range(n):  # nodes that fused carry no reason
            if group_of[i] != i or (self.ipdom[i] != -1 and group_of[self.ipdom[i]] == group_of[i]):
                reasons[i] = None
        return Partition(self.body, self.nodes, self.index, group_of, reasons, self.ipdom,
                         self.fuse_opt_level, self.max_depth, self.max_args)

    def _step(self, i: int, phase: int) -> Optional[str]:
        """Try to fuse node ``i`` into its post-dominator in ``phase``; a reason if it cannot."""
        if self.pattern[i] == OPAQUE:
            return "an opaque op never fuses"
        dom = self.ipdom[i]
        if dom == -1:
            if self.extern[i]:
                return f"its value is {self.extern_reason[i]}" if self.extern_reason[i] else "its value leaves the group"
            if not self.outputs[i]:
                return "it has no consumer"
            return "its consumers have no common post-dominator"
        gi = self._find(i)
        if gi == self._find(dom):
            return None
        pat = self.gpattern[gi]
        if self.pattern[i] == COMM_REDUCE:
            return "a reduction never starts a group"
        dpat = self.dom_pattern[i]
        if pat == OUT_EWISE:
            if phase != 0:
                return None
            if dpat != ELEMWISE:
                return f"its group (an out-elementwise-fusable op) takes only elementwise consumers, the path is {dpat.name}"
            return self._try_fuse(i, dom, lambda k, sink: k <= BROADCAST)
        if pat <= BROADCAST:
            if phase == 2:
                return self._phase2(i, dom, pat)
            if not (dpat <= INJECTIVE or dpat == COMM_REDUCE):
                return f"the path to its post-dominator is {dpat.name}"
            return self._try_fuse(i, dom, lambda k, sink: k <= INJECTIVE if not sink else
                                  (k <= INJECTIVE or k in (COMM_REDUCE, OUT_EWISE)))
        if pat in (INJECTIVE, TUPLE):
            if phase == 0:
                return None
            if phase == 2:
                return self._phase2(i, dom, pat)
            return self._try_fuse(i, dom, lambda k, sink: k <= INJECTIVE)
        if pat == COMM_REDUCE:
            return "a reduction never starts a group"
        return f"a {pat.name} group never fuses"

    def _phase2(self, i: int, dom: int, pat: FusionKind) -> Optional[str]:
        """Fuse injective ops into intermediate tuples already fused into injective consumers."""
        if pat > INJECTIVE:
            return None
        dom_root = self._find(dom)
        if self.gpattern[dom] == TUPLE and self.gpattern[dom_root] <= INJECTIVE:
            return self._try_fuse(i, dom, lambda k, sink: k <= INJECTIVE)
        return None


def _label(n: Expr) -> str:
    if isinstance(n, Call):
        return n.op_name
    return type(n).__name__


def _check_limits(fuse_opt_level: int, max_depth: int, max_args: int) -> None:
    for name, v, lo in (("fuse_opt_level", fuse_opt_level, 0), ("max_depth", max_depth, 1), ("max_args", max_args, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise PullbackError(f"FuseOps: {name} must be an int >= {lo}, got {v!r}")


def partition(body: Expr, fuse_opt_level: int = 2, max_depth: int = DEFAULT_MAX_DEPTH,
              max_args: int = DEFAULT_MAX_ARGS) -> Partition:
    """Group the nodes of a (typed) function body by Relay's fusion rules.

    ``max_depth`` caps the nodes per group, ``max_args`` the inputs of a group
    (0: no limit); ``fuse_opt_level=0`` makes every node its own group.
    """
    _check_limits(fuse_opt_level, max_depth, max_args)
    return _Partitioner(body, fuse_opt_level, max_depth, max_args).run()


# ---------------------------------------------------------------- report


@dataclass
class BlockedEdge:
    producer: str
    consumer: str
    reason: str


@dataclass
class FusionReport:
    """What FuseOps does (or did) to one function.

    ``group_sizes``: operator calls per group, one entry per group (a group of
    one op stays a plain call); ``blocked``: dataflow edges between two ops that
    end in different groups, with the reason the producer did not fuse.
    """

    func: str
    group_sizes: list = field(default_factory=list)
    blocked: list = field(default_factory=list)
    existing_primitives: int = 0

    @property
    def num_groups(self) -> int:
        return len(self.group_sizes)

    @property
    def num_ops(self) -> int:
        return sum(self.group_sizes)

    @property
    def num_fused(self) -> int:
        """Groups of more than one op (those FuseOps turns into primitive functions)."""
        return sum(1 for s in self.group_sizes if s > 1)

    def render(self, max_edges: int = 50) -> str:
        lines = [f"fusion report of @{self.func}: {self.num_ops} ops in {self.num_groups} groups "
                 f"({self.num_fused} fused, {self.num_groups - self.num_fused} single)"]
        if self.existing_primitives:
            lines.append(f"  ({self.existing_primitives} groups were primitive functions already)")
        hist = Counter(self.group_sizes)
        lines.append("  ops per group: " + ", ".join(f"{k} op{'s' if k != 1 else ''} x {v}" for k, v in sorted(hist.items())))
        if self.blocked:
            lines.append(f"  edges that prevented fusion ({len(self.blocked)}):")
            for e in self.blocked[:max_edges]:
                lines.append(f"    {e.producer} -> {e.consumer}: {e.reason}")
            if len(self.blocked) > max_edges:
                lines.append(f"    ... {len(self.blocked) - max_edges} more")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


def fusion_report(mod: Union[IRModule, Function], func: str = "main", fuse_opt_level: int = 2,
                  max_depth: int = DEFAULT_MAX_DEPTH, max_args: int = DEFAULT_MAX_ARGS) -> FusionReport:
    """The grouping FuseOps makes of ``func`` with these settings, and why edges did not fuse.

    Primitive functions already in the body (an already fused module) count as one
    group each, with the ops they hold.
    """
    from .type_infer import infer_module

    if isinstance(mod, Function):
        mod = IRModule.from_expr(mod)
    if not isinstance(mod, IRModule):
        raise PullbackError(f"fusion_report expects an IRModule or a Function, got {type(mod).__name__}")
    fn = mod[func]
    if fn._checked_type is None:
        infer_module(mod)
    part = partition(fn.body, fuse_opt_level, max_depth, max_args)
    rep = FusionReport(func)
    for members in part.groups().values():
        nodes = [part.nodes[i] for i in members]
        k = num_ops(nodes)
        for n in nodes:
            if isinstance(n, Call) and isinstance(n.op, Function) and n.op.is_primitive:
                rep.existing_primitives += 1
                rep.group_sizes.append(num_ops(post_order(n.op.body)))
        if k:
            rep.group_sizes.append(k)
    for pi, ci in part.edges():
        if part.group_of[pi] == part.group_of[ci]:
            continue
        p, c = part.nodes[pi], part.nodes[ci]
        if not (isinstance(p, Call) and isinstance(c, Call)):
            continue
        reason = part.reasons[pi] or "its consumer's group was already complete"
        rep.blocked.append(BlockedEdge(_label(p), _label(c), reason))
    return rep


__all__ = ["partition", "Partition", "fusion_report", "FusionReport", "BlockedEdge", "node_pattern", "num_ops"]
