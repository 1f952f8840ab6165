"""The reverse sweep: one loop over the nodes in reverse topological order, applying rules.

As JAX's ``backward_pass``: read a node's cotangent, skip it if it is a
symbolic zero, apply the node kind's transpose rule (``ad.rules``), write what
the rule returns into the operands' cotangents. Details:

- Cotangents are kept per frame, per node, per tensor leaf path, as a list of
  contributions summed once when the sweep reaches the node: a value used k
  times gets one sum of k terms. Rules reference forward nodes directly:
  forward work is shared with the backward, never copied. Nothing is stored
  for a zero.
- A frame sweeps one scope (``ir.scope.ScopeInfo``): the body, or one branch
  of an If. The If rule pushes its two branch frames on the sweep's explicit
  stack and is finished when both are done; no Python recursion on depth or
  nesting. In a branch frame, a contribution to a node outside the branch is
  kept aside (``outside``) and returned by the gradient If.
- Residuals: every backward expression a rule builds is walked once for the
  forward nodes it reads; a read node local to a branch is recorded in that
  branch's frame, and the If rule hands them to ``ad.residuals``, which makes
  the forward If return them.
"""

from __future__ import annotations

from typing import Optional

from ...ir.expr import Constant, Expr, If, Var
from ...ir.scope import Scope, ScopeInfo
from ...ir.types import TensorType, TupleType, is_inexact
from .common import Path, get_item, sum_terms, type_at
from .residuals import Residuals, fresh_uid
from .rules import RULES, Branches, transpose_rule
from .zeros import Zero, ZeroFill


class Frame:
    """The sweep of one scope (the body, or one branch of an If)."""

    __slots__ = ("scope", "nodes", "i", "cts", "outside", "parent", "pending", "reads", "bundles")

    def __init__(self, scope: Optional[Scope], nodes: list, parent: Optional["Frame"]):
        self.scope = scope
        self.nodes = nodes
        self.i = len(nodes) - 1
        self.cts: dict[Expr, dict[Path, list]] = {}  # local nodes -> leaf path -> contributions
        self.outside: dict[tuple[int, Path], tuple[Expr, Path, list]] = {}  # nodes of enclosing scopes
        self.parent = parent
        self.pending: Optional[Branches] = None  # an If whose branch frames are being swept
        self.reads: list[Expr] = []  # forward nodes of this scope that backward expressions read
        self.bundles: list[Expr] = []  # residual bundles of the Ifs of this scope (ad.residuals)


class ReverseSweep:
    """Cotangents of ``body`` seeded at its result; ``param_adjoint`` gives the parameters' gradients."""

    def __init__(self, body: Expr, order: list, active: set, fn_name: str = "main", fn=None, mod=None):
        self.body = body
        self.mod = mod  # the module: what a call of a function with a custom_vjp calls
        self.active = active
        self.fn_name = fn_name
        self.fn = fn
        self.zeros = ZeroFill()
        self.scopes: Optional[ScopeInfo] = None
        self.residuals: Optional[Residuals] = None
        if any(type(n) is If for n in order):
            self.scopes = scopes = ScopeInfo(body, order)
            self.scope_of = scopes.scope_of
            self.root = Frame(scopes.root, scopes.root.nodes, None)
            self.residuals = Residuals(scopes.scope_of, self.zeros)
            self.frame_of: dict[int, Frame] = {}
            self.seen: dict[int, Expr] = {}  # nodes walked for residual reads
            self.start = fresh_uid()  # nodes built from now on are backward nodes
        else:
            self.root = Frame(None, order, None)

    # ------------------------------------------------------------ cotangents
    def write(self, frame: Frame, node: Expr, path: Path, value) -> None:
        """Add ``value`` (of the type of ``node`` at ``path``) to the cotangent of ``node``."""
        if value is None or type(value) is Zero or node not in self.active:
            return
        local = frame.parent is None
        if not local:
            self.note_reads(value)
            local = type(node) is not Var and self.scope_of[id(node)] is frame.scope
        t = node.checked_type
        if not path and type(t) is TensorType:  # the common case: a tensor node
            if local:
                entry = frame.cts.get(node)
                if entry is None:
                    frame.cts[node] = {(): [value]}
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
            elif is_inexact(t.dtype):
                if local:
                    frame.cts.setdefault(node, {}).setdefault(p, []).append(v)
                else:
                    self._outside(frame, node, p, v)

    @staticmethod
    def _outside(frame: Frame, node: Expr, p: Path, v: Expr) -> None:
        key = (id(node), p)
        entry = frame.outside.get(key)
        if entry is None:
            frame.outside[key] = (node, p, [v])
        else:
            entry[2].append(v)

    def read(self, frame: Frame, node: Expr):
        """The cotangent of ``node``: ``{leaf path: summed expression}``, or ``Zero`` if nothing reached it."""
        entry = frame.cts.pop(node, None)
        if not entry:
            return Zero(node.checked_type)
        return {p: sum_terms(terms) for p, terms in entry.items()}

    # ------------------------------------------------------------ the sweep
    def run(self, seed: Expr) -> None:
        """Sweep the body backwards from the cotangent ``seed`` of its result."""
        self.write(self.root, self.body, (), seed)
        active, rules = self.active, RULES
        stack = [self.root]
        while stack:
            frame = stack[-1]
            done = frame.pending
            if done is not None:  # both branches of an If are swept: finish its rule
                frame.pending = None
                for target, path, ct in done.rule.finish(self, frame, done):
                    self.write(frame, target, path, ct)
                continue
            i = frame.i
            if i < 0:
                stack.pop()
                continue
            frame.i = i - 1
            node = frame.nodes[i]
            if node not in active:
                continue
            rule = rules.get(type(node)) or transpose_rule(node)
            if rule is None:  # a parameter: its cotangent stays in the root frame
                continue
            cts = self.read(frame, node)
            if type(cts) is Zero:  # nothing flows back
                continue
            out = rule.transpose(self, frame, node, cts)
            if type(out) is Branches:
                frame.pending = out
                stack.extend(reversed(out.frames))
            else:
                for target, path, ct in out:
                    self.write(frame, target, path, ct)

    def branch_frame(self, scope: Scope, parent: Frame) -> Frame:
        frame = Frame(scope, scope.nodes, parent)
        self.frame_of[id(scope)] = frame
        return frame

    def note_reads(self, value: Expr) -> None:
        """Record, in the frame of their branch, the branch-local forward nodes ``value`` reads.
        Walks each backward node once (``seen``), stopping at forward nodes."""
        seen, scope_of, start = self.seen, self.scope_of, self.start
        if id(value) in seen:
            return
        stack = [value]
        while stack:
            n = stack.pop()
            k = id(n)
            if k in seen:
                continue
            seen[k] = n
            s = scope_of.get(k)
            if s is not None:
                if s.if_node is not None and type(n) is not Var and type(n) is not Constant:
                    f = self.frame_of.get(id(s))
                    if f is not None:
                        f.reads.append(n)
            elif n._uid >= start:
                stack.extend(n.children())

    # ------------------------------------------------------------ results
    def param_adjoint(self, param: Var) -> Expr:
        """The gradient of ``param``: its summed cotangent, zeros on every leaf nothing reached."""
        return self.zeros.instantiate(param, self.read(self.root, param))

    def finish(self, out: Expr) -> Expr:
        """``out`` (built from the forward body and the cotangents) with the forward Ifs widened
        and the backward reading residuals from them (``ad.residuals``)."""
        return out if self.residuals is None else self.residuals.finish(out)
