"""Residuals of an If: the branch-local forward values its backward branch reads.

The sweep differentiates ``r = If(c, T, E)`` into a gradient If on the same
condition. Forward nodes of a branch that the backward branch reads (the
*residuals*) must not be shared between the two Ifs: scope analysis would hoist
them out of the branch and evaluate both branches unconditionally. Instead the
forward If is widened, JAX-style, into

    F = If(c, (T, RT, zeros(RE)), (E, zeros(RT), RE))

where ``RT``/``RE`` are Tuples of the residuals of each side (a side without
residuals has no field); every use of ``r`` becomes ``F.0`` and the backward
reads residual ``i`` of the then side as ``F.1.i``. A residual that is the
branch result is read from ``r`` itself.

Nested Ifs, linear in depth: the side tuples of an inner widened If ``F2`` (in
a branch of ``r``) are two more forward values of that branch, so ``F`` carries
each as one residual (a *bundle*): residuals are never re-listed level by
level. The backward reads a residual of ``F2`` through ``F``'s field holding
the bundle, then the bundle's field: one ``TupleGetItem`` per level, shared by
every read below it. ``ZeroFill`` builds the zeros of a bundle type once and
reuses them in the zeros of the bundles that contain it, and the types of the
new Ifs are set, not inferred (inference would compare the whole nested type
of both branches at each level).

Only residuals whose type is fully static are passed (``zeros(shape)`` fills
the other side; a ``zeros_like`` of another value could have a different shape
at run time, which ``lax.cond`` rejects). A residual of dynamic shape stays
shared, so scope analysis evaluates it (and what it depends on) in the
enclosing scope.

The backward refers to forward nodes as the rules built it; ``finish`` rebuilds
the output once, replacing each use of a widened If by ``F.0`` and each
backward read of a residual by its field. Everything here is iterative.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ...ir.expr import Expr, If, Tuple, TupleGetItem
from ...ir.traversal import rebuild
from ...ir.types import TupleType
from .common import static_type, typed_as
from .zeros import ZeroFill

if TYPE_CHECKING:
    from .sweep import Frame


def fresh_uid() -> int:
    """A uid no existing node has: every node built from now on has a uid >= it."""
    return Expr()._uid


class _Widened:
    """One widened If ``F``: per side, the bundle ``F.k`` (None: no residuals on that side) and
    the expression the backward reads it through (set by ``finish``)."""

    __slots__ = ("bundles", "views")

    def __init__(self, bundles: list):
        self.bundles = bundles
        self.views: list = [None, None]


class Residuals:
    """Widening of the forward Ifs of one body, built while the sweep finishes each If."""

    def __init__(self, scope_of: dict, zeros: ZeroFill):
        self.scope_of = scope_of
        self.zeros = zeros
        self.widened: dict[int, If] = {}  # id(forward If r) -> F
        self.records: list[_Widened] = []  # inner Ifs first (the order the sweep finishes them)
        self.field: dict[int, tuple[_Widened, int, int]] = {}  # id(residual) -> (F, side, index in the side bundle)
        self.alias: dict[int, Expr] = {}  # id(branch result) -> its If, read instead
        self.built: set[int] = set()  # ids of forward nodes built here (not backward nodes)

    def widen(self, node: If, frame: "Frame", branches: list["Frame"]) -> None:
        """Make ``node`` (an If of ``frame``'s scope) return the residuals its swept
        ``branches`` recorded, plus the bundles of the widened Ifs inside them."""
        results = (node.true_branch, node.false_branch)
        nested = frame.parent is not None
        sides: list[list[Expr]] = [[], []]
        for b, bf in enumerate(branches):
            taken: set[int] = set()
            for v in bf.reads:
                if id(v) in taken:
                    continue
                taken.add(id(v))
                if v is results[b]:  # read from the If itself (the rebuild re-types what changes)
                    self.alias[id(v)] = node
                    if nested:
                        frame.reads.append(node)
                elif static_type(v.checked_type):
                    sides[b].append(v)
            sides[b].extend(bf.bundles)
        if not (sides[0] or sides[1]):
            return
        packs = [Tuple(vs) if vs else None for vs in sides]
        then_fields, else_fields = [results[0]], [results[1]]
        slots: list[Optional[int]] = []
        for b, pack in enumerate(packs):
            if pack is None:
                slots.append(None)
                continue
            fill = self.zeros.static(pack.checked_type)
            then_fields.append(pack if b == 0 else fill)
            else_fields.append(fill if b == 0 else pack)
            slots.append(len(then_fields) - 1)
        then, other = Tuple(then_fields), Tuple(else_fields)
        wide = typed_as(If(node.cond, then, other), TupleType((node.checked_type,) + then.checked_type.fields[1:]))
        self.widened[id(node)] = wide
        bundles = [None if k is None else TupleGetItem(wide, k) for k in slots]
        rec = _Widened(bundles)
        self.records.append(rec)
        for b, vs in enumerate(sides):
            for i, v in enumerate(vs):
                self.field[id(v)] = (rec, b, i)
        news = [wide, then, other, *(p for p in packs if p is not None), *(x for x in bundles if x is not None)]
        self.built.update(id(n) for n in news)
        if nested:
            frame.bundles.extend(x for x in bundles if x is not None)

    # ------------------------------------------------------------ the final rebuild
    def _reads(self) -> dict[int, Expr]:
        """id(forward node) -> what the backward reads instead (a field of a widened If, or the If)."""
        memo: dict[int, Expr] = {}

        def at(spec: tuple) -> Expr:
            rec, b, i = spec
            return TupleGetItem(rec.views[b], i)

        for rec in reversed(self.records):  # outer Ifs first: a bundle's view uses its parent's
            for b, bundle in enumerate(rec.bundles):
                if bundle is not None:
                    spec = self.field.get(id(bundle))
                    if spec is not None:
                        memo[id(bundle)] = at(spec)
                    rec.views[b] = memo.get(id(bundle), bundle)
        for key, spec in self.field.items():
            if key not in memo:
                memo[key] = at(spec)
        for start in self.alias:  # a branch result read through its If, maybe itself read through its own If
            chain, key, node = [], start, None
            while key not in memo and key in self.alias:
                chain.append(key)
                node = self.alias[key]
                key = id(node)
            value = memo.get(key, node)
            for k in chain:
                memo[k] = value
        self.built.update(id(n) for n in memo.values())
        return memo

    def finish(self, out: Expr) -> Expr:
        """``out`` rebuilt once: uses of a widened If ``r`` become ``F.0``; backward nodes read
        residuals through their fields. One iterative post-order walk; a node whose operands
        are unchanged is kept."""
        if not self.widened and not self.alias:
            return out
        reads = self._reads()
        widened, built, scope_of = self.widened, self.built, self.scope_of
        memo: dict[int, Expr] = {}  # id(node) -> the node in the output
        stack: list = [(out, None)]
        while stack:
            n, kids = stack.pop()
            k = id(n)
            if kids is None:  # first visit: the operands to rebuild first
                if k in memo:
                    continue
                w = widened.get(k)
                if w is not None:
                    kids = (w,)
                elif k in scope_of or k in built:  # forward: same operands
                    kids = n.children()
                else:  # backward: residuals are read through their fields
                    kids = tuple([reads.get(id(c), c) for c in n.children()])
                stack.append((n, kids))
                stack.extend([(c, None) for c in kids if id(c) not in memo])
                continue
            if k in memo:
                continue
            new = [memo[id(c)] for c in kids]
            if k in widened:
                memo[k] = TupleGetItem(new[0], 0)
            elif all(a is b for a, b in zip(new, n.children())):
                memo[k] = n
            else:
                memo[k] = _with_operands(n, new)
        return memo[id(out)]


def _with_operands(node: Expr, operands: list) -> Expr:
    """``node`` rebuilt over ``operands`` (in the order of ``node.children()``)."""
    swap = dict(zip(map(id, node.children()), operands))
    return rebuild(node, lambda c: swap[id(c)])
