"""Transpose rules: how the cotangent of one node flows back to its operands.

One rule object per node kind, looked up in ``RULES`` by the sweep (as JAX's
``backward_pass`` looks up a primitive's transpose, or tinygrad's
``compute_gradient`` its gradient patterns). ``transpose(sweep, frame, node,
cts)`` receives the node's cotangent as ``{leaf path: expression}`` (a missing
leaf is a symbolic zero; a node whose cotangent is a ``Zero`` is skipped) and
returns the contributions ``(operand, path, cotangent)``; a ``None`` or
``Zero`` contribution adds nothing.

- ``OpRule``: a call to an operator, through its ``OpDef.grad`` (Relay's
  FPrimalGradient). A tuple-valued call gets its cotangent with zeros in the
  fields nobody used; an explicit ``zeros``/``zeros_like`` a rule returns is a
  symbolic zero.
- ``TupleRule`` / ``TupleGetItemRule``: route leaf cotangents to the field
  expression / into the operand's field.
- ``IfRule``: two steps, so nested Ifs need no recursion. ``transpose`` seeds
  both branch bodies and returns them as ``Branches`` for the sweep to run;
  ``finish`` then builds the gradient ``If`` on the same condition, whose
  fields are what each branch contributes to nodes outside it (zeros where
  only the other branch contributes), and widens the forward If to return the
  residuals its backward reads (``ad.residuals``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...analysis.type_infer import infer_expr
from ...ir.errors import PullbackError
from ...ir.expr import Call, Expr, GlobalVar, If, Tuple, TupleGetItem
from ...ir.traversal import transform
from ...ir.types import TensorType, TupleType, is_inexact
from ...ops.registry import OpDef
from .common import binding, rule_type_error, sum_terms, type_at, types_compatible
from .zeros import Zero, is_zero

if TYPE_CHECKING:
    from .sweep import Frame, ReverseSweep


class OpRule:
    """A call to an operator: ``OpDef.grad(call, g)`` gives one gradient (or None) per argument. A call to a
    module function with a ``custom_vjp`` (left by ``ad.inline``) calls that function instead."""

    def transpose(self, sweep: "ReverseSweep", frame: "Frame", call: Call, cts: dict) -> list:
        op = call.op
        if isinstance(op, GlobalVar):
            return custom_vjp(sweep, call, cts)
        if not isinstance(op, OpDef) or op.grad is None:  # the scan reported it if it was needed
            return []
        g = cts.get(())
        if g is None or type(call.checked_type) is not TensorType:
            g = sweep.zeros.instantiate(call, cts)
        active = sweep.active
        if op.grad_sees_wanted:
            grads = op.grad(call, g, wanted=tuple(arg in active for arg in call.args))
        else:
            grads = op.grad(call, g)
        if len(grads) != len(call.args):
            raise PullbackError(
                f"the gradient rule of {op.name} returned {len(grads)} gradients for {len(call.args)} arguments "
                f"{binding(sweep.fn_name, sweep.fn, call)}"
            )
        out = []
        for i, (arg, d) in enumerate(zip(call.args, grads)):
            if d is None or arg not in active:
                continue
            dt = d.checked_type
            at = arg.checked_type
            if dt is not at and dt != at and not types_compatible(at, dt):
                raise rule_type_error(op.name, i, at, dt, binding(sweep.fn_name, sweep.fn, call))
            if not is_zero(d):
                out.append((arg, (), d))
        return out


def custom_vjp(sweep: "ReverseSweep", call: Call, cts: dict) -> list:
    """``@f(args)`` with ``f.custom_vjp = "f_vjp"``: the body of ``@f_vjp(args..., cotangents of f's float
    leaves...)``, the tuple of the arguments' gradients, inlined (what it does not read of the forward is not
    saved for it)."""
    mod, name = sweep.mod, call.op.name_hint
    vjp = mod[name].custom_vjp if mod is not None and name in mod else None
    if vjp is None:  # the scan reported it if it was needed
        return []
    t = call.checked_type
    fields = t.fields if isinstance(t, TupleType) else (t,)
    if not all(isinstance(f, TensorType) for f in fields):
        raise PullbackError(f"@{name} has a custom_vjp and returns nested tuples ({t!r}): a custom vjp takes one "
                            f"cotangent per tensor result, {binding(sweep.fn_name, sweep.fn, call)}")
    ct = cts[()] if type(t) is TensorType and () in cts else sweep.zeros.instantiate(call, cts)
    leaves = [ct] if type(t) is TensorType else [TupleGetItem(ct, i) for i, f in enumerate(fields) if is_inexact(f.dtype)]
    fn = mod[vjp]  # the scan reported a missing one
    if len(fn.params) != len(call.args) + len(leaves):
        raise PullbackError(f"@{name}'s custom_vjp @{vjp} must take its {len(call.args)} arguments and {len(leaves)} "
                            f"cotangent(s) ({len(fn.params)} parameters), {binding(sweep.fn_name, sweep.fn, call)}")
    ret = infer_expr(fn, mod).ret_type
    want = [a.checked_type for a in call.args]
    if not (isinstance(ret, TupleType) and len(ret.fields) == len(want)
            and all(types_compatible(w, g) for w, g in zip(want, ret.fields))):
        raise PullbackError(f"@{name}'s custom_vjp @{vjp} must return one gradient per argument, of the argument's "
                            f"type ({TupleType(tuple(want))!r}), not {ret!r}, {binding(sweep.fn_name, sweep.fn, call)}")
    grads = transform(fn.body, memo={id(p): a for p, a in zip(fn.params, list(call.args) + leaves)})
    active = sweep.active
    return [(arg, (), grads.fields[i] if type(grads) is Tuple else TupleGetItem(grads, i))
            for i, arg in enumerate(call.args) if arg in active]


class TupleRule:
    """``Tuple(f0..fn)``: the cotangent at path ``(i, *p)`` goes to field ``fi`` at ``p``."""

    def transpose(self, sweep: "ReverseSweep", frame: "Frame", node: Tuple, cts: dict) -> list:
        fields = node.fields
        return [(fields[p[0]], p[1:], g) for p, g in cts.items()]


class TupleGetItemRule:
    """``t.i``: the cotangent at path ``p`` goes to ``t`` at ``(i, *p)``."""

    def transpose(self, sweep: "ReverseSweep", frame: "Frame", node: TupleGetItem, cts: dict) -> list:
        head = (node.index,)
        return [(node.tuple_value, head + p, g) for p, g in cts.items()]


class Branches:
    """The If rule's first answer: sweep these branch frames, then call ``rule.finish``."""

    __slots__ = ("rule", "node", "frames")

    def __init__(self, rule: "IfRule", node: If, frames: list):
        self.rule = rule
        self.node = node
        self.frames = frames


class IfRule:
    """``If(c, T, E)``: each branch body swept on its own, joined by a gradient If on ``c``."""

    def transpose(self, sweep: "ReverseSweep", frame: "Frame", node: If, cts: dict) -> Branches:
        frames = []
        for scope, result in zip(sweep.scopes.branch_scopes(node), (node.true_branch, node.false_branch)):
            bf = sweep.branch_frame(scope, frame)
            for p, g in cts.items():
                sweep.write(bf, result, p, g)
            frames.append(bf)
        return Branches(self, node, frames)

    def finish(self, sweep: "ReverseSweep", frame: "Frame", done: Branches) -> list:
        """The gradient If of ``done.node`` from its swept branches; its fields go to their targets."""
        node, frames = done.node, done.frames
        keys = [k for bf in frames for k in bf.outside]
        keys = list(dict.fromkeys(keys))  # every outside (node, path) either branch contributes to
        if not keys:
            return []
        sides = []
        for bf in frames:
            fields = []
            for k in keys:
                entry = bf.outside.get(k)
                if entry is None:  # a symbolic zero on this side; an If branch needs a value
                    target, p, _ = frames[0].outside.get(k) or frames[1].outside[k]
                    fields.append(sweep.zeros.instantiate(target, Zero(type_at(target.checked_type, p)), p))
                else:
                    fields.append(sum_terms(entry[2]))
            sides.append(Tuple(fields))
        grad_if = If(node.cond, sides[0], sides[1])
        sweep.residuals.widen(node, frame, frames)
        out = []
        for k, key in enumerate(keys):
            target, p, _ = frames[0].outside.get(key) or frames[1].outside[key]
            out.append((target, p, TupleGetItem(grad_if, k)))
        return out


RULES: dict[type, object] = {Call: OpRule(), Tuple: TupleRule(), TupleGetItem: TupleGetItemRule(), If: IfRule()}


def transpose_rule(node: Expr):
    """The rule for ``node``'s kind (a subclass gets its base's), or None: parameters and
    constants are leaves of the sweep."""
    for cls in type(node).__mro__:
        rule = RULES.get(cls)
        if rule is not None:
            return rule
    return None
