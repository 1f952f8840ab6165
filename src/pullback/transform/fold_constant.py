"""FoldConstant: evaluate constant subgraphs with the operators' NumPy kernels.

Rule: a Call to an operator is replaced by a Constant when every argument is
constant-valued and the result is a tensor that is not bigger than
``max(max_new_elements, the Constant arguments' elements together)`` (a
concatenation of constants folds whatever its size). Constant-valued
means a Constant, or a tensor *creator* (``zeros``/``ones``, ``full`` with a
Constant fill, ``arange``: an operator of no operands) whose value is computed
only when a fold consumes it (a causal mask built from ``arange``, as Hugging
Face's models build it at every call, folds up to its last broadcasting compare).
Creators themselves are never turned into Constants: ``zeros((1024, 1024))``
is cheaper to keep than a 4 MB literal, and the size bound stops a fold from
materialising a big tensor out of small inputs (``broadcast_to(scalar, big)``).
A data-moving operator (``SHAPE_OPS``: ``broadcast_to``, ``reshape``, ...) of a
creator becomes a creator of its result's shape (``broadcast_to(ones(()), s)``
is ``ones(s)``), not a literal. Calls to module functions, primitive functions
and tuple-valued operators are left alone. The kernels are ``OpDef.compute`` (no runtime import).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from ..analysis.type_infer import infer_module
from ..ir.errors import PassError
from ..ir.expr import Call, Constant, Expr, Function, set_type
from ..ir.module import IRModule
from ..ir.traversal import post_order, rebuild
from ..ir.types import TensorType
from ..ops.registry import OpDef
from ..pattern import is_op, wildcard
from .pass_infra import FunctionPass, PassContext

CREATORS = ("zeros", "ones", "full")
# operators that only move data: of a creator, a creator of the result's shape (``broadcast_to(ones(()), s)`` is
# ``ones(s)``: a value made when needed, not a literal held by the program; a gradient's seed stays one)
SHAPE_OPS = frozenset({"broadcast_to", "expand_dims", "reshape", "squeeze", "transpose"})


def _is_creator(e) -> bool:
    """A creator (``CREATORS``), or an operator of no operands (``arange``): a value computed on demand."""
    return isinstance(e, Call) and isinstance(e.op, OpDef) and (e.op.name in CREATORS or e.op.num_inputs == 0)


def _reshaped_creator(node: Call, arg: Expr) -> Optional[Call]:
    """``node`` (one of ``SHAPE_OPS``) of the creator ``arg`` as a creator of ``node``'s static type, else None."""
    t = node._checked_type
    if (node.op.name not in SHAPE_OPS or not isinstance(arg, Call) or not isinstance(arg.op, OpDef)
            or arg.op.name not in CREATORS or not isinstance(t, TensorType) or not t.is_static):
        return None
    out = Call(arg.op, list(arg.args), replace(arg.attrs, shape=tuple(t.shape), dtype=t.dtype))
    set_type(out, t)
    return out


def _creator_value(e: Expr) -> Optional[np.ndarray]:
    if _is_creator(e):
        if all(isinstance(a, Constant) for a in e.args):
            return e.op.compute(*(a.data for a in e.args), e.attrs)
    return None


def _foldable(e: Expr) -> bool:
    return (
        isinstance(e, Call)
        and isinstance(e.op, OpDef)
        and len(e.args) > 0
        and e.op.name not in CREATORS
        and isinstance(e._checked_type, TensorType)
        and e._checked_type.is_static
        and all(isinstance(a, Constant) or _is_creator(a) for a in e.args)
    )


def _fold_value(node: Call, t: TensorType, values: list) -> Optional[np.ndarray]:
    """``node``'s kernel on ``values`` as an array of type ``t`` (None if the kernel gives no array)."""
    out = node.op.compute(*values, node.attrs)
    if not isinstance(out, (np.ndarray, np.generic)):
        return None
    out = np.asarray(out, dtype=t.dtype)
    if out.shape != t.shape:
        raise PassError(f"FoldConstant: the kernel of {node.op.name} returned shape {out.shape}, its type says {t.shape}")
    return out


def fold_rules(max_new_elements: int = 1024) -> list:
    """The rewrite table of FoldConstant (the pass itself runs the same rule in one walk, see ``fold_expr``)."""

    def fold(node: Call, c: dict) -> Optional[Expr]:
        t: TensorType = node._checked_type
        size = math.prod(t.shape)
        inputs = sum(a.data.size for a in node.args if isinstance(a, Constant))
        if size > max(max_new_elements, inputs):
            return None
        values = []
        for a in node.args:
            v = a.data if isinstance(a, Constant) else _creator_value(a)
            if v is None:
                return None
            values.append(v)
        with np.errstate(all="ignore"):
            out = _fold_value(node, t, values)
        return None if out is None else Constant(out)

    def reshaped(node: Call, c: dict) -> Optional[Expr]:
        return _reshaped_creator(node, node.args[0])

    return [(is_op(*sorted(SHAPE_OPS)), reshaped), (wildcard().where(_foldable), fold)]


class _Folder:
    """FoldConstant's rule applied in one bottom-up walk.

    ``res[node]`` is what a visited node became: an expression, or (for a folded
    node) its value, made a Constant only when a node that does not fold uses it. A
    chain of folds thus computes arrays without building a Constant per step; the
    result is the fixed point the rule reaches (``fold_rules`` with the rewrite driver).
    """

    def __init__(self, max_new_elements: int):
        self.max_new = max_new_elements
        self.res: dict[Expr, object] = {}

    def mapped(self, c: Expr) -> Expr:
        r = self.res.get(c, c)
        if type(r) is np.ndarray:
            r = self.res[c] = Constant(r)
        return r

    def value_of(self, node: Call, t) -> Optional[np.ndarray]:
        """The folded value of ``node`` (whose operands are visited), or None when the rule does not fire."""
        res, ndarray = self.res, np.ndarray
        inputs = 0
        for a in node.args:
            r = res[a]
            if type(r) is ndarray:
                inputs += r.size
            elif isinstance(r, Constant):
                inputs += r.data.size
            elif not _is_creator(r):
                return None
        if math.prod(t.shape) > max(self.max_new, inputs):
            return None
        values = []
        for a in node.args:
            r = res[a]
            v = r if type(r) is ndarray else (r.data if isinstance(r, Constant) else _creator_value(r))
            if v is None:
                return None
            values.append(v)
        out = _fold_value(node, t, values)
        if out is not None:
            out.flags.writeable = False
        return out

    def run(self, body: Expr) -> Expr:
        res, mapped = self.res, self.mapped
        order = post_order(body)
        # node -> users not visited yet, so that a folded value dies with its last user; counted from the
        # first fold on (before it, no folded value is held: a program where nothing folds never counts)
        users: Optional[dict[Expr, int]] = None
        with np.errstate(all="ignore"):
            for p, node in enumerate(order):
                if node in res:
                    continue
                if isinstance(node, Call) and isinstance(node.op, OpDef) and node.args and node.op.name not in CREATORS:
                    t = node._checked_type
                    made = _reshaped_creator(node, res[node.args[0]])
                    if made is not None:
                        res[node] = made
                        if users is not None:
                            self.release(node, users)
                        continue
                    if isinstance(t, TensorType) and t.is_static:
                        v = self.value_of(node, t)
                        if v is not None:
                            res[node] = v
                            if users is None:
                                users = _users(order, p)
                            self.release(node, users)
                            continue
                cur = node
                for c in node.children():
                    if res[c] is not c:
                        cur = rebuild(node, mapped)  # keeps the type (a fold keeps the type of what it replaces)
                        break
                res[node] = cur
                if users is not None:
                    self.release(node, users)
        return mapped(body)

    def release(self, node: Expr, users: dict) -> None:
        """``node`` is done: an operand whose last user it was and whose value is still a bare array
        (folded, never made a Constant) is dropped, so a chain of folds holds two arrays at a time."""
        res = self.res
        for c in node.children():
            n = users[c] - 1
            users[c] = n
            if n == 0 and type(res.get(c)) is np.ndarray:
                res[c] = _FREED


def _users(order: list, start: int) -> dict:
    """Operand -> how many of the nodes ``order[start:]`` use it."""
    users: dict[Expr, int] = {}
    for node in itertools.islice(order, start, None):
        for c in node.children():
            users[c] = users.get(c, 0) + 1
    return users


_FREED = object()  # stands for a folded value no user needs any more (never read: its users are done)


def fold_expr(body: Expr, max_new_elements: int = 1024) -> Expr:
    """``body`` (typed, as after InferType: untyped calls are not folded) with FoldConstant's rule
    applied to a fixed point; ``body`` itself if nothing folds."""
    return _Folder(max_new_elements).run(body)


@dataclass(frozen=True)
class FoldConstant(FunctionPass):
    """Replace operator calls on constant inputs by their value (see the module docstring for the rule)."""

    name = "FoldConstant"
    opt_level = 2
    max_new_elements: int = 1024

    def __post_init__(self):
        n = self.max_new_elements
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise PassError(f"FoldConstant: max_new_elements must be a non-negative int, got {n!r}")

    def transform_function(self, func: Function, mod: IRModule, ctx: PassContext) -> Function:
        infer_module(mod)
        return func.replace(body=fold_expr(func.body, self.max_new_elements))


__all__ = ["FoldConstant", "fold_rules", "fold_expr", "CREATORS"]
