"""FoldConstant: evaluate constant subgraphs with the operators' NumPy kernels.

Rule: a Call to an operator is replaced by a Constant when every argument is
constant-valued and the result is a tensor that is not bigger than
``max(max_new_elements, largest Constant argument)`` elements. Constant-valued
means a Constant, or a tensor *creator* (``zeros``/``ones``, ``full`` with a
Constant fill) whose value is computed only when a fold consumes it.
Creators themselves are never turned into Constants: ``zeros((1024, 1024))``
is cheaper to keep than a 4 MB literal, and the size bound stops a fold from
materialising a big tensor out of small inputs (``broadcast_to(scalar, big)``).
Calls to module functions, primitive functions and tuple-valued operators
are left alone. The kernels are ``OpDef.compute`` (no runtime import).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..analysis.type_infer import _Inferencer, carry_type
from ..ir.errors import PassError, PullbackError
from ..ir.expr import Call, Constant, Expr
from ..ir.traversal import post_order, rebuild
from ..ir.types import TensorType
from ..ops.registry import OpDef
from ..pattern import typed_module, wildcard
from .pass_infra import Pass, PassContext, PassInfo, register_pass

CREATORS = ("zeros", "ones", "full")


def _creator_value(e: Expr) -> Optional[np.ndarray]:
    if isinstance(e, Call) and isinstance(e.op, OpDef) and e.op.name in CREATORS:
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
        and all(isinstance(a, Constant) or (isinstance(a, Call) and isinstance(a.op, OpDef) and a.op.name in CREATORS) for a in e.args)
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
        biggest = max((a.data.size for a in node.args if isinstance(a, Constant)), default=0)
        if size > max(max_new_elements, biggest):
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

    return [(wildcard().where(_foldable), fold)]


class _Folder:
    """FoldConstant's rule applied in one bottom-up walk, shared by the functions of a module.

    ``res[id(node)]`` is what a visited node became: an expression, or (for a folded
    node) its value, made a Constant only when a node that does not fold uses it. A
    chain of folds thus computes arrays without building a Constant per step; the
    result is the fixed point the rule reaches (``fold_rules`` with the rewrite driver).
    """

    def __init__(self, max_new_elements: int, mod):
        self.max_new = max_new_elements
        self.inf = _Inferencer(mod)
        self.res: dict[int, object] = {}

    def mapped(self, c: Expr) -> Expr:
        r = self.res.get(id(c), c)
        if type(r) is np.ndarray:
            r = self.res[id(c)] = Constant(r)
        return r

    def typed(self, node: Expr) -> None:
        if node._checked_type is None and all(k._checked_type is not None for k in node.children()):
            try:
                node._checked_type = self.inf.infer_node(node, None)
            except PullbackError:
                pass

    def value_of(self, node: Call, t) -> Optional[np.ndarray]:
        """The folded value of ``node`` (whose operands are visited), or None when the rule does not fire."""
        res, ndarray = self.res, np.ndarray
        biggest = 0
        for a in node.args:
            r = res[id(a)]
            if type(r) is ndarray:
                biggest = max(biggest, r.size)
            elif isinstance(r, Constant):
                biggest = max(biggest, r.data.size)
            elif not (isinstance(r, Call) and isinstance(r.op, OpDef) and r.op.name in CREATORS):
                return None
        if math.prod(t.shape) > max(self.max_new, biggest):
            return None
        values = []
        for a in node.args:
            r = res[id(a)]
            v = r if type(r) is ndarray else (r.data if isinstance(r, Constant) else _creator_value(r))
            if v is None:
                return None
            values.append(v)
        out = _fold_value(node, t, values)
        if out is not None:
            out.flags.writeable = False
        return out

    def run(self, body: Expr) -> Expr:
        res, mapped, typed = self.res, self.mapped, self.typed
        with np.errstate(all="ignore"):
            for node in post_order(body):
                k = id(node)
                if k in res:
                    continue
                if isinstance(node, Call) and isinstance(node.op, OpDef) and node.args and node.op.name not in CREATORS:
                    if node._checked_type is None:
                        typed(node)
                    t = node._checked_type
                    if isinstance(t, TensorType) and t.is_static:
                        v = self.value_of(node, t)
                        if v is not None:
                            res[k] = v
                            continue
                cur = node
                for c in node.children():
                    if res[id(c)] is not c:
                        cur = rebuild(node, mapped)
                        carry_type(node, cur)
                        break
                if cur._checked_type is None:
                    typed(cur)
                res[k] = cur
        return mapped(body)


def fold_expr(body: Expr, max_new_elements: int = 1024, mod=None) -> Expr:
    """``body`` with FoldConstant's rule applied to a fixed point; ``body`` itself if nothing folds."""
    return _Folder(max_new_elements, mod).run(body)


class FoldConstant(Pass):
    """Replace operator calls on constant inputs by their value (see the module docstring for the rule)."""

    def __init__(self, max_new_elements: int = 1024):
        super().__init__(PassInfo("FoldConstant", 2))
        if isinstance(max_new_elements, bool) or not isinstance(max_new_elements, int) or max_new_elements < 0:
            raise PassError(f"FoldConstant: max_new_elements must be a non-negative int, got {max_new_elements!r}")
        self.max_new_elements = max_new_elements

    def transform_module(self, mod, ctx: PassContext):
        typed_module(mod)
        folder = _Folder(self.max_new_elements, mod)
        updates = {}
        for name, fn in mod.items():
            if fn.is_primitive:
                continue
            body = folder.run(fn.body)
            if body is not fn.body:
                new = fn.replace(body=body)
                if body._checked_type is not None:
                    try:
                        new._checked_type = folder.inf.infer_node(new, None)
                    except PullbackError:
                        pass
                updates[name] = new
        return mod.with_functions(updates) if updates else mod


register_pass("FoldConstant", FoldConstant)

__all__ = ["FoldConstant", "fold_rules", "fold_expr", "CREATORS"]
