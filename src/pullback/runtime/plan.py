"""Compiling a Function to a flat plan: instructions over integer value slots.

A plan is a list of tuples run by one loop (``evaluator.run``), the same for
every target: the target only chooses the kernels (``Target.kernel``), the
constants' representation and whether a fused group runs as one kernel. Every
node of the body gets a slot; parameters take slots ``0..k-1`` and constants
are preloaded in the slot template. ``If`` is compiled to jumps: the nodes of a
branch (``ir.scope.ScopeInfo``) sit between the ``IF`` and the branch's
``END``, so they run only when the branch is taken (a traced target runs each
branch range as a function of its own instead, see ``evaluator``). Each
instruction carries the slots whose last use it is (``frees``); the loop sets
them to None right after it.

Before slots are assigned, a body without ``If`` is lowered for execution (the
values stay those of the body as written): a reshape of a value that an earlier
reshape reads reshapes that result instead, so a transposed value is copied
once (``share_reshape_sources``), and a GEMM of rows whose one use adds a bias
vector runs as ``nn.linear`` (``fuse_bias_adds``); its nodes then run in ``schedule.memory_order`` (each value's
last reader as soon as it can: a backward's weight gradients beside their activation gradients).

Instruction layouts (``node`` is the IR node, for errors and checks)::

    (CALL1, kernel, attrs, a0, out, frees, node)
    (CALL2, kernel, attrs, a0, a1, out, frees, node)
    (CALLN, kernel, attrs, (a...), out, frees, node)
    (FN, FunctionPlan, (a...), out, frees, node)      call a module function (or an unfused group)
    (CALLN, group_kernel, None, (a...), out, frees, node)   a fused group (primitive Function) as one kernel
    (TUPLE, (a...), out, frees, node)
    (GET, src, index, out, frees, node)
    (IF, cond, else_pc, then_frees, else_frees, end_pc, out, node)
    (END, src, dst, frees, next_pc)                   a branch's result into the If's slot, then go on
    (RET, src)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Optional

from ..ir.errors import ExecutionError
from ..ir.expr import Call, Constant, Expr, Function, GlobalVar, If, Tuple, TupleGetItem, Var, set_span, set_type
from ..ir.scope import Scope, ScopeInfo, ancestor_at
from ..ir.traversal import post_order, transform
from ..ir.types import TensorType
from ..ir.gc_pause import gc_paused
from ..ops import layout as T
from ..ops.registry import OpDef, get_op, value_args
from .fused import group_label
from .schedule import memory_order, reads_before_writes
from .schedule import operands as _operands

if TYPE_CHECKING:
    from .evaluator import Target

CALL1, CALL2, CALLN, FN, TUPLE, GET, IF, END, RET = range(9)
OPCODE_NAMES = ("CALL1", "CALL2", "CALLN", "FN", "TUPLE", "GET", "IF", "END", "RET")
KERNEL_OPS = (CALL1, CALL2, CALLN)


class FunctionPlan:
    """One function compiled lazily (on first ``ensure()``) to flat code for ``target``.

    ``resolve(callee)`` maps a GlobalVar or a called Function to its FunctionPlan;
    callees are compiled only when first entered, so recursion is fine.
    """

    __slots__ = ("name", "func", "code", "template", "num_params", "_resolve", "target", "returned_constants")

    def __init__(self, name: str, func: Function, resolve: Callable[[Expr], "FunctionPlan"], target: "Target"):
        self.target = target
        self.name = name
        self.func = func
        self.code: Optional[list] = None
        self.template: list = []
        # ids of the template values of the constants the function may return (only on targets with ``fresh``)
        self.returned_constants: frozenset = frozenset()
        self.num_params = len(func.params)
        self._resolve = resolve

    def ensure(self) -> "FunctionPlan":
        if self.code is None:
            self.code, self.template, self.returned_constants = compile_function(self.func, self.name, self._resolve,
                                                                                 self.target)
        return self

    def dump(self) -> str:
        """The instructions, one per line (for debugging)."""
        self.ensure()
        lines = []
        for pc, ins in enumerate(self.code):
            op = ins[0]
            if op in (END, RET):
                lines.append(f"{pc:5d} {OPCODE_NAMES[op]:6s} {ins[1:]}")
                continue
            node = ins[-1]
            label = node.op_name if isinstance(node, Call) else type(node).__name__
            operands = ins[3:-1] if op in KERNEL_OPS else ins[2:-1] if op == FN else ins[1:-1]
            lines.append(f"{pc:5d} {OPCODE_NAMES[op]:6s} {label} {operands}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        state = f"{len(self.code)} instructions" if self.code is not None else "not compiled"
        return f"FunctionPlan(@{self.name}, {state})"


class _RootOnly:
    """Stand-in for ScopeInfo when a body has no If: every node is in the root scope."""

    def __init__(self, order: list):
        self.root = Scope(None)
        self.root.nodes = order
        self.branches: dict = {}


def _assign_slots(fn: Function, order: list, where: str, constant: Callable) -> tuple[dict, list]:
    slot: dict[Expr, int] = {}  # node (identity hash) -> its slot
    template: list = []
    for p in fn.params:
        slot[p] = len(template)
        template.append(None)
    for n in order:
        t = type(n)
        if t is Call or t is Tuple or t is TupleGetItem or t is If:
            slot[n] = len(template)
            template.append(None)
        elif n in slot:
            continue
        elif isinstance(n, Constant):
            slot[n] = len(template)
            template.append(constant(n.data))
        elif isinstance(n, Var):
            raise ExecutionError(f"{where}: variable %{n.name_hint} is not a parameter (closures are not supported by the executor)")
        elif isinstance(n, GlobalVar):
            raise ExecutionError(f"{where}: @{n.name_hint} used as a value; the executor runs first-order programs only")
        elif isinstance(n, Function):
            raise ExecutionError(f"{where}: a function value (closure) in the body; the executor runs first-order programs only")
        else:
            slot[n] = len(template)
            template.append(None)
    return slot, template


PRECISE_DEPTH = 16
"""How many If levels below its home scope a value's lifetime is followed branch by branch (see ``_liveness``)."""


def _liveness(scopes, slot: dict, all_scopes: list) -> tuple[dict, dict, dict]:
    """Where each slot dies: after a node, at the start of a branch, or after a branch's END.

    A value is tracked in every scope from its home scope down to its uses. In a
    scope, its last use is a node, the scope's end (the branch result), or an If
    holding a use: then it dies in each branch that uses it (recursively) and at
    the start of each branch that does not, so it is freed once whichever branch runs.
    Tracking stops ``PRECISE_DEPTH`` levels below the home scope: a use deeper
    than that counts as a use of the whole branch at that level, and the value
    dies at that branch's END (so deeply nested Ifs cost time linear in their
    depth, not quadratic: each value is followed through a bounded number of scopes).
    Returns ``{id(scope): {position: [slots]}}``, ``{(id(if), branch): [slots]}`` twice.
    """
    root = all_scopes[0]
    scope_of = getattr(scopes, "scope_of", None)
    branches = scopes.branches
    pos: dict[int, int] = {}
    if branches:
        for s in all_scopes:
            for i, n in enumerate(s.nodes):
                pos[id(n)] = i
    last: dict[int, dict[int, int]] = {id(s): {} for s in all_scopes}
    deep: dict[tuple, dict] = {}  # (id(scope), position of an If) -> {slot: branches using it beyond the cap}
    for s in all_scopes:
        here = last[id(s)]
        for p, n in enumerate(s.nodes):
            t = type(n)
            if t is If:
                then_s, else_s = branches[id(n)]
                uses = ((n.cond, s, p), (n.true_branch, then_s, len(then_s.nodes)), (n.false_branch, else_s, len(else_s.nodes)))
            elif t is Var or t is Constant:
                continue
            else:
                if scope_of is None:  # fast path: one scope, positions increase
                    for c in _operands(n):
                        if type(c) is not Constant:
                            here[slot[c]] = p
                    continue
                uses = tuple((c, s, p) for c in _operands(n))
            for c, us, q in uses:
                if type(c) is Constant:
                    continue
                k = slot[c]
                home = root if scope_of is None or isinstance(c, Var) else scope_of[id(c)]
                if us.depth > home.depth + PRECISE_DEPTH:  # a use of the whole branch at the cap
                    below = ancestor_at(us, home.depth + PRECISE_DEPTH + 1)
                    us, q = below.parent, pos[id(below.if_node)]
                    deep.setdefault((id(us), q), {}).setdefault(k, set()).add(below.branch)
                while True:
                    d = last[id(us)]
                    seen = d.get(k, -1)
                    if seen < q:
                        d[k] = q
                    if us is home or seen >= 0:
                        break  # tracked here already: the scopes above were set by that walk
                    q = pos[id(us.if_node)]
                    us = us.parent
    free_after: dict[int, dict[int, list]] = {}
    branch_start: dict[tuple, list] = {}
    branch_end: dict[tuple, list] = {}
    dies: dict[int, set] = {}  # slots whose lifetime ends in a scope (parents come first in all_scopes)
    for s in all_scopes:
        nodes = s.nodes
        end = len(nodes)
        fa = free_after[id(s)] = {}
        here = last[id(s)]
        if s is root:
            dies[id(s)] = set(here)
        else:  # defined here, or dying in the parent at this If
            up, up_dies, at = last[id(s.parent)], dies[id(s.parent)], pos[id(s.if_node)]
            dies[id(s)] = {k for k in here if k not in up or (k in up_dies and up[k] == at)}
        ending = dies[id(s)]
        for k, q in here.items():
            if k not in ending:
                continue
            if q == end:
                if s is not root:  # the root's end is the returned value
                    branch_end.setdefault((id(s.if_node), s.branch), []).append(k)
                continue
            n = nodes[q]
            if type(n) is If:
                beyond = deep.get((id(s), q), {}).get(k, ())
                for b, bs in enumerate(branches[id(n)]):
                    if b in beyond:  # used deeper than followed: freed once that branch is done
                        branch_end.setdefault((id(n), b), []).append(k)
                    elif k not in last[id(bs)]:
                        branch_start.setdefault((id(n), b), []).append(k)
            elif q in fa:
                fa[q].append(k)
            else:
                fa[q] = [k]
    return free_after, branch_start, branch_end


def _owned_first_fields(order: list, body: Expr, target: "Target") -> set:
    """The projections ``t.0`` of calls whose kernel allocates their first field (``target.allocates_first``),
    where ``t`` is read only through projections, one per field, and is not the returned value."""
    first_of = target.allocates_first
    projections: dict = {}  # tuple-valued call -> its projections
    whole: set = {body}  # calls read as a whole (an operand of something other than a projection)
    for n in order:
        if type(n) is TupleGetItem:
            projections.setdefault(n.tuple_value, []).append(n)
        else:
            whole.update(_operands(n))
    firsts = set()
    for t, gets in projections.items():
        if t in whole or type(t) is not Call or not isinstance(t.op, OpDef) or not first_of(t):
            continue
        if len({g.index for g in gets}) == len(gets):  # two projections of one field would alias
            firsts.update(g for g in gets if g.index == 0)
    return firsts


def buffer_reuse(order: list, body: Expr, target: "Target") -> dict:
    """``{call: (i, kernel)}``: calls that may write their result into argument ``i``'s buffer with
    ``kernel`` (``target.inplace_kernel``), for a body without ``If`` whose nodes are ``order``.

    A buffer is the memory a call allocates (``target.allocates``: its result shares memory with
    nothing else). Any other node may alias every buffer its operands hold (views, tuples, calls of
    functions); parameters and constants hold memory the plan does not own. A call may take over
    argument ``i``'s buffer when that argument allocated it and the call is the last use of every
    value that may alias it (so the result of a function, a residual, or a view still needed is never
    written), and no other argument aliases it. A like-operator's result does not alias its template
    (``OpDef.type_only``). The first field of a tuple whose kernel allocates it (``target.allocates_first``: a
    batch norm's output) is a buffer of its own when the tuple is read only through one projection of each
    field (a relu after a batch norm runs in place, as eager's ``ReLU(inplace=True)``).

    A ``strided_set`` that would otherwise copy its whole base because views of the base are still needed
    after it (slices saved for the backward, a row read again later) copies those views instead, when they
    are smaller than the base: such views are ``{view: (None, kernel)}`` entries whose kernel returns new memory
    (``target.fresh``). A loop writing rows of one tensor, unrolled by torch.export, then writes in place."""
    end = len(order)
    last: dict[Expr, int] = {body: end}  # the returned value lives on
    for p, n in enumerate(order):
        for c in _operands(n):
            last[c] = p
    firsts = _owned_first_fields(order, body, target)
    aliases = _Aliases(order, last, firsts, target, (), holders=target.fresh is not None)
    copied = _views_to_copy(aliases, last, target) if target.fresh is not None else ()
    if copied:
        aliases = _Aliases(order, last, firsts, target, copied)
    inplace = target.inplace_kernel
    reuse: dict = {v: (None, _copying(target.kernel(v), target.fresh)) for v in copied}
    holds, buffer_last, owned = aliases.holds, aliases.buffer_last, aliases.owned
    for p, n in aliases.candidates:
        args = n.args
        for i, c in enumerate(args):
            if c not in owned or buffer_last[c] != p:
                continue
            if len(args) > 1 and any(c in holds[e] for j, e in enumerate(args) if j != i and e is not c):
                continue
            fn = inplace(n, i)
            if fn is not None:
                reuse[n] = (i, fn)
                break
    return reuse


class _Aliases:
    """Which buffers each node may hold (``holds``), the last position any holder of a buffer is read
    (``buffer_last``), the owned buffers, the allocating calls in order (``candidates``: (position, call)) and
    the holders of each buffer (only when asked: ``holders``); ``copied`` nodes hold new memory of their own."""

    def __init__(self, order: list, last: dict, firsts: set, target: "Target", copied, holders: bool = False):
        allocates = target.allocates
        self.owned = owned = set(firsts)
        self.holds = holds = {}
        self.buffer_last = buffer_last = {}
        self.holders = by_buffer = {}
        self.candidates = candidates = []
        self.position = {}
        no_buffers: tuple = ()
        for p, n in enumerate(order):
            self.position[n] = p
            until = last.get(n, p)
            if n in firsts or n in copied:
                holds[n] = (n,)
                buffer_last[n] = until
                continue
            if type(n) is Call and isinstance(n.op, OpDef) and allocates(n):
                owned.add(n)
                holds[n] = (n,)
                buffer_last[n] = until
                candidates.append((p, n))
                continue
            # a view, a tuple, a call of a function or another kernel: it may hold its operands' buffers (not those
            # of the operands a kernel reads only for their type: a like-operator's template)
            ops = value_args(n) if type(n) is Call else _operands(n)
            b = no_buffers if not ops else holds[ops[0]] if len(ops) == 1 else frozenset().union(*(holds[c] for c in ops))
            holds[n] = b
            for k in b:
                if holders:
                    by_buffer.setdefault(k, []).append(n)
                if buffer_last[k] < until:
                    buffer_last[k] = until


def _views_to_copy(aliases: _Aliases, last: dict, target: "Target") -> set:
    """The views to copy so that a ``strided_set`` can write into its base (``buffer_reuse``): for each
    ``strided_set`` whose base is still held after it, the holders alive after it that read the base
    directly or through a holder dead by then, when each is a single tensor of static shape and together
    they are smaller than the base."""
    strided_set = get_op("strided_set")
    holds, owned, position = aliases.holds, aliases.owned, aliases.position
    copied: set = set()
    for p, n in aliases.candidates:
        if n.op is not strided_set or n.args[0] not in owned or aliases.buffer_last[n.args[0]] <= p:
            continue
        c, v = n.args
        if c in holds[v] or not _copyable(c) or target.inplace_kernel(n, 0) is None:
            continue
        alive = {h for h in aliases.holders.get(c, ()) if position[h] < p and last.get(h, position[h]) > p}
        roots = [h for h in alive if any(o is c or (o not in alive and c in holds[o]) for o in _operands(h))]
        if all(_copyable(h) for h in roots) and sum(_size(h) for h in roots) < _size(c):
            copied.update(roots)
    return copied


def _copyable(n: Expr) -> bool:
    t = n._checked_type
    return type(n) is Call and isinstance(n.op, OpDef) and isinstance(t, TensorType) and t.is_static


def _size(n: Expr) -> int:
    return math.prod(n._checked_type.shape)


def _copying(kernel: Callable, fresh: Callable) -> Callable:
    return lambda *a: fresh(kernel(*a))


def kernel_label(node: Call, kernel: Optional[Callable] = None) -> str:
    """Profile/error name of a kernel call: the op name, or ``fused(op+op+...)`` for a group."""
    op = node.op
    if isinstance(op, OpDef):
        return op.name
    return kernel.__name__ if kernel is not None else group_label(op) if isinstance(op, Function) else repr(op)


def compile_function(fn: Function, name: str, resolve: Callable[[Expr], FunctionPlan],
                     target: "Target") -> tuple[list, list, frozenset]:
    """Flat code and slot template for ``fn`` on ``target`` (see the module docstring), and the ids of the
    template values of the constants ``fn`` may return (where the target copies those: ``target.fresh``).

    Calls of operators run ``target.kernel(call)``; a call of a primitive Function
    (a FuseOps group) runs ``target.group_kernel(fn)`` when the target gives one,
    else it is called like a module function."""
    with gc_paused():
        return _compile(fn, name, resolve, target)


def _returned_constants(body: Expr) -> list:
    """The Constants a function may return as its result or part of it: reached from ``body`` through tuples,
    tuple projections and If branches (not through calls: a kernel's result is its own)."""
    out, stack = [], [body]
    while stack:
        e = stack.pop()
        if isinstance(e, Constant):
            out.append(e)
        elif isinstance(e, Tuple):
            stack.extend(e.fields)
        elif isinstance(e, TupleGetItem):
            stack.append(e.tuple_value)
        elif isinstance(e, If):
            stack.extend((e.true_branch, e.false_branch))
    return out


def share_reshape_sources(body: Expr, order: list) -> Expr:
    """``body`` (without ``If``; its nodes are ``order``) with every ``reshape`` of a value that an earlier
    ``reshape`` also reads rewritten to reshape that earlier result: the same elements in the same order, so
    where the value is not contiguous its one copy serves both (the backward of attention's in-projection copied
    its transposed gradient twice, for the weight's GEMM and for the bias's sum). ``body`` itself if none."""
    first: dict = {}  # a reshaped value -> the first reshape of it
    later: dict = {}  # id of a later reshape -> the first one
    for n in order:
        if (type(n) is Call and getattr(n.op, "name", None) == "reshape" and 0 not in n.attrs.newshape
                and n._checked_type is not None):
            r = first.setdefault(n.args[0], n)  # (a 0 in newshape copies a dim of the reshaped value: kept as is)
            if r is not n:
                later[id(n)] = r
    if not later:
        return body
    return _rewrite(body, lambda old, memo: Call(old.op, [memo[id(later[id(old)])]], old.attrs) if id(old) in later else None)


def fold_gemm_transposes(body: Expr, order: list) -> Expr:
    """``body`` (without ``If``; its nodes are ``order``) with each ``nn.dense`` of a transposed matrix
    (``transpose(a, (1, 0))``: a weight gradient's ``dense(g^T, x^T)``) as the ``nn.matmul`` of the matrices with
    its transpose flags, ``a^T b``: the same GEMM on the same memory, as eager's ``mm(g.t(), x)``, without two
    kernel calls and F.linear's own transpose; ``body`` itself if none."""
    found = {}
    for n in order:
        if type(n) is Call and getattr(n.op, "name", None) == "nn.dense" and n._checked_type is not None:
            a, b = _matrix_of_transpose(n.args[0]), _matrix_of_transpose(n.args[1])
            if a is not None:
                found[id(n)] = (a, b if b is not None else n.args[1], b is None)
    if not found:
        return body
    matmul = get_op("nn.matmul")

    def fold(old: Expr, memo: dict) -> Optional[Expr]:
        if id(old) not in found:
            return None
        a, b, tb = found[id(old)]
        new = Call(matmul, [memo.get(id(a), a), memo.get(id(b), b)], matmul.make_attrs(transpose_a=True, transpose_b=tb))
        set_type(new, old._checked_type)
        return new

    return _rewrite(body, fold)


def _matrix_of_transpose(e: Expr) -> Optional[Expr]:
    """``m`` where ``e`` is ``transpose(m)`` of a typed matrix ``m``, else None."""
    if type(e) is not Call or getattr(e.op, "name", None) != "transpose" or e.attrs.axes not in (None, (1, 0)):
        return None
    m = e.args[0]
    t = m._checked_type
    return m if isinstance(t, TensorType) and t.ndim == 2 else None


def _rows_gemm(e: Expr) -> bool:
    """Is ``e`` a GEMM of rows by a weight matrix: ``nn.dense``, or ``nn.matmul`` of data (rank >= 2, not
    transposed) by a matrix (``x @ w``: GPT-2's ``Conv1D``, ``addmm``)?"""
    if type(e) is not Call or e._checked_type is None or any(a._checked_type is None for a in e.args):
        return False
    name = getattr(e.op, "name", None)
    if name == "nn.dense":
        return True
    return (name == "nn.matmul" and not e.attrs.transpose_a and e.args[0]._checked_type.ndim >= 2
            and e.args[1]._checked_type.ndim == 2)


def _linear_args(gemm: Call, x: Expr, w: Expr) -> tuple:
    """``(data, weight)`` of ``gemm`` (``_rows_gemm``, its operands now ``x``, ``w``) as ``nn.linear`` takes them."""
    if gemm.op.name == "nn.matmul" and not gemm.attrs.transpose_b:
        wt = T.transpose(w, (1, 0))  # a view on NumPy and torch; oneDNN takes the transposed weight as it is
        t = w._checked_type
        set_type(wt, TensorType(t.shape[::-1], t.dtype))
        w = wt
    return x, w


def _conv(e: Expr) -> bool:
    return (type(e) is Call and getattr(e.op, "name", None) == "nn.conv2d" and e._checked_type is not None
            and all(a._checked_type is not None for a in e.args))


def _bias_of(add: Call, gemm: Expr) -> Optional[Expr]:
    """The bias ``add`` adds to ``gemm`` when ``gemm`` is a GEMM of rows (``_rows_gemm``) and the other operand
    is a vector of its units, or a convolution (``nn.conv2d``) and the other operand is a vector of its output
    channels reshaped to (C, 1, 1), in its dtype (the result keeps its type), else None."""
    conv = _conv(gemm)
    if not conv and not _rows_gemm(gemm):
        return None
    t = gemm._checked_type
    if add.op.name == "nn.bias_add":
        if add.args[0] is not gemm or add.attrs.axis not in ((1, -3) if conv else (-1, t.ndim - 1)):
            return None
        b = add.args[1]
    else:
        b = add.args[1] if add.args[0] is gemm else add.args[0]
        if conv:  # the importer's bias: reshape(b, (-1, 1, 1))
            if not (type(b) is Call and getattr(b.op, "name", None) == "reshape" and b._checked_type is not None
                    and tuple(b._checked_type.shape[1:]) == (1, 1)):
                return None
            b = b.args[0]
    bt = b._checked_type
    units = t.shape[1] if conv else t.shape[-1]
    if not (isinstance(bt, TensorType) and bt.ndim == 1 and bt.dtype == t.dtype and bt.shape[0] == units
            and isinstance(bt.shape[0], int) and add._checked_type == t):
        return None
    return b


def fuse_bias_adds(body: Expr, order: list) -> Expr:
    """``body`` (without ``If``; its nodes are ``order``) with each ``add`` / ``nn.bias_add`` of a bias vector
    to a GEMM of rows used nowhere else (``_rows_gemm``) as one ``nn.linear``, and of a channel bias to a
    convolution used nowhere else as one ``nn.conv2d_bias`` (the GEMM or the convolution writes its result with
    the bias: one pass over the result less); ``body`` itself if none."""
    found = []  # (add, dense, bias)
    for n in order:
        if type(n) is Call and getattr(n.op, "name", None) in ("add", "nn.bias_add"):
            for d in n.args:
                b = _bias_of(n, d)
                if b is not None:
                    found.append((n, d, b))
                    break
    if not found:
        return body
    # the GEMMs' uses: fused only where the add is the one. A read of its type alone (a ``*_like``'s shape over a
    # dynamic size) is no use: it reads the fused result's instead, which must then run before it
    uses = dict.fromkeys([d for _, d, _ in found], 0)
    if body in uses:
        uses[body] += 1
    typed_at: dict = {}  # id(GEMM) -> the positions of the nodes reading its type alone
    for i, n in enumerate(order):
        for c in (value_args(n) if type(n) is Call else _operands(n)):
            if c in uses:
                uses[c] += 1
        if type(n) is Call and isinstance(n.op, OpDef) and n.op.type_only:
            for k in n.op.type_only:
                typed_at.setdefault(id(n.args[k]), []).append(i)
    at = {id(n): i for i, n in enumerate(order)}
    fused = {id(n): (d, b) for n, d, b in found  # id(add) -> (dense, bias)
             if uses[d] == 1 and all(i > at[id(n)] for i in typed_at.get(id(d), ()))}
    if not fused:
        return body
    linear, conv_bias = get_op("nn.linear"), get_op("nn.conv2d_bias")
    sum_of = {id(fused[k][0]): k for k in fused}  # id(dense) -> id(add)

    def fuse(old: Expr, memo: dict) -> Optional[Expr]:
        if id(old) not in fused:
            if type(old) is Call and isinstance(old.op, OpDef) and old.op.type_only and \
                    any(id(old.args[i]) in sum_of for i in old.op.type_only):
                return Call(old.op, [memo[sum_of[id(a)]] if i in old.op.type_only and id(a) in sum_of
                                     else memo.get(id(a), a) for i, a in enumerate(old.args)], old.attrs)
            return None
        d, b = fused[id(old)]
        args = [memo.get(id(a), a) for a in d.args]
        if d.op.name == "nn.conv2d":
            return Call(conv_bias, [*args, memo.get(id(b), b)], d.attrs)
        x, w = _linear_args(d, *args)
        return Call(linear, [x, w, memo.get(id(b), b)])

    return _rewrite(body, fuse)


def _rewrite(body: Expr, replace: Callable[[Expr, dict], Optional[Expr]]) -> Expr:
    """``body`` rebuilt bottom-up with ``replace(old, memo)`` (a node computing the same value, or None) for
    each node; every new node, replaced or rebuilt over new operands, gets the type and source span of the
    node it stands for (a lowering changes how values are computed, not what they are: no inference, which a
    call of a module function could not do without its module)."""

    def fn(old: Expr, new: Expr) -> Expr:
        out = replace(old, memo)
        if out is None:
            out = new
        if out is not old and old._checked_type is not None and out._checked_type is None:  # a new node
            set_type(out, old._checked_type)
            set_span(out, old.span)
        return out

    memo: dict = {}
    return transform(body, fn, memo=memo)


def drop_stop_gradients(body: Expr, order: list) -> Expr:
    """``body`` (without ``If``; its nodes are ``order``) with each ``stop_gradient(x)`` read as ``x``: it only
    marks where differentiation stops, and its kernel returns ``x`` itself (a batch norm's saved statistics and
    written-back buffers: a kernel call each, on every step). ``body`` itself if none."""
    if not any(type(n) is Call and getattr(n.op, "name", None) == "stop_gradient" for n in order):
        return body

    def lower(old: Expr, memo: dict):
        if type(old) is Call and getattr(old.op, "name", None) == "stop_gradient":
            return memo.get(id(old.args[0]), old.args[0])  # (an inner stop_gradient already dropped)
        return None

    return _rewrite(body, lower)


def _lowered(body: Expr, order: list) -> tuple[Expr, list]:
    """``body`` and the order its nodes run in after the plan's lowerings (bodies without ``If``):
    ``stop_gradient`` dropped, reshapes sharing their source's copy, dense + bias as ``nn.linear``, conv2d + bias
    as ``nn.conv2d_bias``, dense of transposed matrices as ``nn.matmul``; then ``memory_order`` and ``reads_before_writes``."""
    for lower in (drop_stop_gradients, share_reshape_sources, fuse_bias_adds, fold_gemm_transposes):
        new = lower(body, order)
        if new is not body:
            body, order = new, post_order(new)
    return body, reads_before_writes(memory_order(order, body))


def _compile(fn: Function, name: str, resolve: Callable[[Expr], FunctionPlan], target: "Target") -> tuple[list, list, frozenset]:
    where = f"@{name}"
    body = fn.body
    order = post_order(body)
    branching = any(type(n) is If for n in order)
    if not branching:
        body, order = _lowered(body, order)
    slot, template = _assign_slots(fn, order, where, target.constant)
    scopes = ScopeInfo(body, order) if branching else _RootOnly(order)
    reuse = buffer_reuse(order, body, target) if not branching and target.reuses_buffers else {}
    root = scopes.root
    all_scopes = [root] + [s for pair in scopes.branches.values() for s in pair]
    free_after, branch_start, branch_end = _liveness(scopes, slot, all_scopes)
    no_frees = ()
    code: list = []
    emit = code.append
    kernel = target.kernel
    group_kernel = target.group_kernel
    # explicit work stack: ("nodes", scope, i) | ("else", if, if_pc) | ("end", if, b, if_pc)
    work: list = [("nodes", root, 0)]
    while work:
        task = work.pop()
        kind = task[0]
        if kind == "nodes":
            _, s, i = task
            nodes = s.nodes
            fa = free_after[id(s)]
            while i < len(nodes):
                n = nodes[i]
                t = type(n)
                frees = tuple(fa[i]) if i in fa else no_frees
                i += 1
                if t is Var or t is Constant or isinstance(n, (Var, Constant)):
                    continue
                out = slot[n]
                if t is Call or isinstance(n, Call):
                    op = n.op
                    nargs = n.args
                    group = group_kernel(op) if isinstance(op, Function) and op.is_primitive else None
                    if group is not None:
                        emit((CALLN, group, None, tuple([slot[a] for a in nargs]), out, frees, n))
                    elif isinstance(op, OpDef):
                        k = reuse[n][1] if n in reuse else kernel(n)
                        if len(nargs) == 1:
                            emit((CALL1, k, n.attrs, slot[nargs[0]], out, frees, n))
                        elif len(nargs) == 2:
                            emit((CALL2, k, n.attrs, slot[nargs[0]], slot[nargs[1]], out, frees, n))
                        else:
                            args = tuple([slot[a] for a in nargs])
                            emit((CALLN, k, n.attrs, args, out, frees, n))
                    elif isinstance(op, (GlobalVar, Function)):
                        emit((FN, resolve(op), tuple([slot[a] for a in nargs]), out, frees, n))
                    else:
                        raise ExecutionError(f"{where}: cannot run a call to {op!r} (not an OpDef, GlobalVar or Function)")
                elif isinstance(n, Tuple):
                    emit((TUPLE, tuple(slot[f] for f in n.fields), out, frees, n))
                elif isinstance(n, TupleGetItem):
                    emit((GET, slot[n.tuple_value], n.index, out, frees, n))
                elif isinstance(n, If):
                    if_pc = len(code)
                    emit(None)  # patched once the else branch's pc is known
                    then_s, else_s = scopes.branches[id(n)]
                    work.append(("nodes", s, i))
                    work.append(("end", n, 1, if_pc))
                    work.append(("nodes", else_s, 0))
                    work.append(("else", n, if_pc))
                    work.append(("end", n, 0, if_pc))
                    work.append(("nodes", then_s, 0))
                    break
                else:
                    raise ExecutionError(f"{where}: cannot run a {type(n).__name__} node")
        elif kind == "end":  # a branch finished: its result goes into the If's slot
            _, n, b, if_pc = task
            res = n.true_branch if b == 0 else n.false_branch
            ins = (END, slot[res], slot[n], tuple(branch_end.get((id(n), b), no_frees)))
            if b == 0:
                emit(ins)  # next_pc (after the else branch) patched at the If's end
                code[if_pc] = len(code) - 1  # remember this END's pc until "else" patches the IF
            else:
                end_pc = len(code) + 1
                emit(ins + (end_pc,))
                _if, cond, else_pc, then_frees, else_frees, node = code[if_pc]
                code[else_pc - 1] += (end_pc,)
                code[if_pc] = (IF, cond, else_pc, then_frees, else_frees, end_pc, slot[n], node)
        elif kind == "else":
            _, n, if_pc = task
            then_end = code[if_pc]
            code[if_pc] = (IF, slot[n.cond], then_end + 1, tuple(branch_start.get((id(n), 0), no_frees)),
                           tuple(branch_start.get((id(n), 1), no_frees)), n)
    emit((RET, slot[body]))
    returned = frozenset(id(template[slot[c]]) for c in _returned_constants(body)) if target.fresh else frozenset()
    return code, template, returned
