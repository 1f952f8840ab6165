"""The reverse sweep: adjoints of every node, built in one pass over the nodes.

- Contributions to a node are kept in a list per tensor leaf (``path``) and
  summed once when the sweep reaches the node: a value used k times gets one
  sum of k terms. Gradient rules reference forward nodes directly: forward
  work is shared with the backward, never copied.
- Tuples: a ``Tuple`` routes its field adjoints to the field expressions, a
  ``TupleGetItem`` contributes to one field of its operand, a tuple-valued
  operator gets ``g`` as a Tuple with zeros only for fields nobody used.
- ``If``: each branch scope (``ir.scope.ScopeInfo``) is swept on its own,
  seeded with the If's adjoint at the branch result. What a branch contributes
  to nodes outside its scope is returned by one gradient ``If`` on the same
  condition, ``If(cond, Tuple(then contributions), Tuple(else contributions))``
  (zeros for a node one branch does not touch), and each outside node receives
  its ``TupleGetItem`` of it. Forward nodes of a branch that the backward branch
  reads (residuals) are not shared with it, which would make scope analysis
  hoist them out of the branch: ``ad.residuals`` widens the forward If to
  ``F = If(cond, (T, resT.., zeros..), (E, zeros.., resE..))``, every use of
  the If becomes ``F.0`` and the backward reads ``F.i`` (a residual that is the
  branch result is read from the If itself). Only the taken branch's forward
  work runs. Residuals of nested Ifs are threaded out through each enclosing
  widened If as flat fields. Limitation: a residual of dynamic shape (no
  ``zeros`` without a value) stays shared and is evaluated in the enclosing
  scope. Nested Ifs are handled by an explicit stack of frames, never by
  Python recursion.
"""

from __future__ import annotations

from typing import Optional

from ...analysis.type_infer import types_compatible
from ...ir.errors import PullbackError
from ...ir.expr import Call, Expr, If, Tuple, TupleGetItem, Var
from ...ir.scope import Scope, ScopeInfo
from ...ir.types import TensorType, TupleType, is_float
from ...ops.registry import OpDef
from .common import Path, at_path, binding, build_struct, fill_like, get_item, rule_type_error, sum_terms, type_at, typed
from .residuals import Residuals, fresh_uid


class _Frame:
    """The reverse sweep of one scope (the body, or one branch of an If)."""

    __slots__ = ("scope", "nodes", "i", "adj", "outside", "parent", "pending")

    def __init__(self, scope: Optional[Scope], nodes: list, parent: Optional["_Frame"]):
        self.scope = scope
        self.nodes = nodes
        self.i = len(nodes) - 1
        self.adj: dict[int, dict[Path, list]] = {}  # local nodes: id -> leaf path -> contributions
        self.outside: dict[tuple[int, Path], tuple[Expr, Path, list]] = {}  # nodes of enclosing scopes
        self.parent = parent
        self.pending = None  # (if_node, then_frame, else_frame, start uid) while its branches are swept


class ReverseSweep:
    """Adjoints of ``body`` seeded at the result; ``params_adjoint`` gives the parameters' gradients."""

    def __init__(self, body: Expr, order: list, active: set[int], fn_name: str = "main", fn=None):
        self.body = body
        self.active = active
        self.fn_name = fn_name
        self.fn = fn
        has_if = any(isinstance(n, If) for n in order)
        self.scopes = ScopeInfo(body, order) if has_if else None
        self.root = _Frame(self.scopes.root if has_if else None, self.scopes.root.nodes if has_if else order, None)
        self.residuals = Residuals(self.scopes) if has_if else None

    # ------------------------------------------------------------ contributions
    def contribute(self, frame: _Frame, node: Expr, path: Path, value: Optional[Expr]) -> None:
        """Add ``value`` (an expression of the type of ``node`` at ``path``) to the adjoint of ``node``."""
        if value is None or id(node) not in self.active:
            return
        if value._checked_type is None:
            typed(value)
        local = frame.parent is None or (not isinstance(node, Var) and self.scopes.scope_of[id(node)] is frame.scope)
        t = node.checked_type
        if not path and type(t) is TensorType:  # the common case: a tensor node
            if local:
                entry = frame.adj.get(id(node))
                if entry is None:
                    frame.adj[id(node)] = {(): [value]}
                else:
                    entry.setdefault((), []).append(value)
            else:
                self._outside(frame, node, (), value)
            return
        stack = [(path, type_at(t, path), value)]
        while stack:
            p, t, v = stack.pop()
            if isinstance(t, TupleType):
                for i in range(len(t.fields)):
                    stack.append((p + (i,), t.fields[i], get_item(v, i)))
            elif is_float(t.dtype):
                if local:
                    frame.adj.setdefault(id(node), {}).setdefault(p, []).append(v)
                else:
                    self._outside(frame, node, p, v)

    @staticmethod
    def _outside(frame: _Frame, node: Expr, p: Path, v: Expr) -> None:
        key = (id(node), p)
        entry = frame.outside.get(key)
        if entry is None:
            frame.outside[key] = (node, p, [v])
        else:
            entry[2].append(v)

    def take(self, frame: _Frame, node: Expr) -> dict[Path, Expr]:
        """The summed adjoint of ``node`` per leaf path (empty: no contribution)."""
        entry = frame.adj.pop(id(node), None)
        if not entry:
            return {}
        return {p: sum_terms(terms) for p, terms in entry.items()}

    def zeros(self, node: Expr, path: Path) -> Expr:
        ty = type_at(node.checked_type, path)
        return fill_like(0.0, ty, None if ty.is_static else at_path(node, path))

    def materialize(self, node: Expr, leaves: dict[Path, Expr]) -> Expr:
        """An expression of ``node``'s type from per-leaf adjoints, zeros where there is none."""
        return build_struct(node.checked_type, lambda p, t: leaves[p] if p in leaves else self.zeros(node, p))

    # ------------------------------------------------------------ the sweep
    def run(self, seed: Expr) -> None:
        """Sweep the body backwards from the adjoint ``seed`` of its result."""
        self.contribute(self.root, self.body, (), seed)
        stack = [self.root]
        while stack:
            f = stack[-1]
            if f.pending is not None:
                self.finish_if(f)
                continue
            if f.i < 0:
                stack.pop()
                continue
            node = f.nodes[f.i]
            if isinstance(node, If):
                leaves = self.take(f, node)
                if leaves:
                    then_s, else_s = self.scopes.branch_scopes(node)
                    frames = []
                    start = fresh_uid()
                    for scope, result in ((then_s, node.true_branch), (else_s, node.false_branch)):
                        bf = _Frame(scope, scope.nodes, f)
                        for p, g in leaves.items():
                            self.contribute(bf, result, p, g)
                        frames.append(bf)
                    f.pending = (node, frames[0], frames[1], start)
                    stack.append(frames[1])
                    stack.append(frames[0])
                    continue
            else:
                self.visit(f, node)
            f.i -= 1

    def visit(self, f: _Frame, node: Expr) -> None:
        if isinstance(node, Var) or id(node) not in self.active:
            return  # parameters keep their adjoint in the root frame
        leaves = self.take(f, node)
        if not leaves:
            return
        if isinstance(node, Call):
            g = leaves[()] if () in leaves and not isinstance(node.checked_type, TupleType) else self.materialize(node, leaves)
            self.visit_call(f, node, g)
        elif isinstance(node, Tuple):
            for p, g in leaves.items():
                self.contribute(f, node.fields[p[0]], p[1:], g)
        elif isinstance(node, TupleGetItem):
            for p, g in leaves.items():
                self.contribute(f, node.tuple_value, (node.index,) + p, g)

    def visit_call(self, f: _Frame, call: Call, g: Expr) -> None:
        op = call.op
        if not isinstance(op, OpDef) or op.grad is None:  # the scan reported it
            return
        grads = op.grad(call, g)
        if len(grads) != len(call.args):
            raise PullbackError(
                f"the gradient rule of {op.name} returned {len(grads)} gradients for {len(call.args)} arguments "
                f"{binding(self.fn_name, self.fn, call)}"
            )
        for i, (arg, d) in enumerate(zip(call.args, grads)):
            if d is None or id(arg) not in self.active:
                continue
            dt = d._checked_type or typed(d)._checked_type
            at = arg._checked_type
            if dt is not at and dt != at and not types_compatible(at, dt):
                raise rule_type_error(op.name, i, arg.checked_type, d.checked_type, binding(self.fn_name, self.fn, call))
            self.contribute(f, arg, (), d)

    def finish_if(self, f: _Frame) -> None:
        """Build the gradient If from both branch sweeps and route its fields outward."""
        node, tf, ef, start = f.pending
        f.pending = None
        f.i -= 1
        keys = list(tf.outside)
        keys += [k for k in ef.outside if k not in tf.outside]
        if not keys:
            return
        sides = []
        for bf in (tf, ef):
            fields = []
            for k in keys:
                entry = bf.outside.get(k)
                if entry is None:
                    target, p, _ = tf.outside.get(k) or ef.outside[k]
                    fields.append(self.zeros(target, p))
                else:
                    fields.append(sum_terms(entry[2]))
            sides.append(typed(Tuple(fields)))
        self.residuals.widen(node, sides, start, f.parent is None)
        grad_if = typed(If(node.cond, sides[0], sides[1]))
        for k, key in enumerate(keys):
            target, p, _ = tf.outside.get(key) or ef.outside[key]
            self.contribute(f, target, p, typed(TupleGetItem(grad_if, k)))

    def finish(self, out: Expr) -> Expr:
        """``out`` (built from the forward body and the adjoints) with the forward Ifs widened
        and the backward reading residuals from them (``ad.residuals``)."""
        return out if self.residuals is None else self.residuals.finish(out)

    def param_adjoint(self, param: Var) -> Expr:
        """The gradient of ``param``: its summed adjoint, zeros where nothing reached it."""
        leaves = self.take(self.root, param)
        if () in leaves:
            return leaves[()]
        return self.materialize(param, leaves)
