"""Inline calls to global functions and primitive (fused) functions before AD.

Top-down, with an explicit stack of frames: the function's body is rebuilt in
post order (``ir.traversal.rebuild``); at a call to a module function or a
primitive function, a frame rebuilds the callee's body with its parameters
mapped to the call's arguments, and its result replaces the call. Each callee
body is walked once per call site that depends on the caller's values, so a
chain of n functions each calling the next costs O(n), not O(n^2) as inlining
every function bottom-up would. A call whose arguments do not depend on the
enclosing callee's parameters is inlined once and shared by every copy of
that callee, and the parts of a callee that do not depend on its parameters
stay shared, as when each callee is substituted whole.
"""

from __future__ import annotations

from typing import Optional

from ...analysis.type_infer import infer_expr
from ...ir.expr import Call, Expr, Function, GlobalVar
from ...ir.module import IRModule
from ...ir.traversal import post_order, rebuild, transform
from .scan import expanded


def _callee(mod: IRModule, node: Expr) -> Optional[Function]:
    if isinstance(node, Call):
        if isinstance(node.op, GlobalVar):
            fn = mod[node.op.name_hint]
            return None if fn.custom_vjp else fn  # kept: AD calls its vjp
        if isinstance(node.op, Function) and node.op.is_primitive:
            return node.op
    return None


class _Frame:
    """One body being rebuilt: ``order`` its post order, ``pos`` the progress, ``memo`` old id -> new node
    (seeded parameter -> argument), ``site`` the call node it replaces in the frame below, ``key`` the
    shared-call key its result is stored under (None: not shared)."""

    __slots__ = ("order", "pos", "memo", "body", "site", "key")

    def __init__(self, body: Expr, memo: dict, site: Optional[Expr] = None, key: Optional[int] = None):
        self.order = post_order(body)
        self.pos = 0
        self.memo = memo
        self.body = body
        self.site = site
        self.key = key


def inline_calls(mod: IRModule, func: str) -> Function:
    """``mod[func]`` with every call to a module function (except those with a ``custom_vjp``) or a primitive
    function inlined (typed)."""
    fn = mod[func]
    shared: dict[int, Expr] = {}  # id(call) -> its inlined body, for calls independent of any parameter
    frames = [_Frame(fn.body, {})]
    result = fn.body
    while frames:
        fr = frames[-1]
        memo, order = fr.memo, fr.order

        def mapped(c, get=memo.get):
            return get(id(c), c)

        pushed = False
        while fr.pos < len(order):
            node = order[fr.pos]
            if id(node) in memo:
                fr.pos += 1
                continue
            new = rebuild(node, mapped)
            callee = _callee(mod, new)
            if callee is not None:
                key = id(node) if new is node else None  # arguments unchanged: the same call everywhere
                hit = shared.get(key) if key is not None else None
                if hit is None:
                    frames.append(_Frame(callee.body, {id(p): a for p, a in zip(callee.params, new.args)}, node, key))
                    pushed = True
                    break
                new = hit
            memo[id(node)] = new
            fr.pos += 1
        if pushed:
            continue
        frames.pop()
        out = memo.get(id(fr.body), fr.body)
        if fr.site is None:
            result = out
            continue
        if fr.key is not None:
            shared[fr.key] = out
        frames[-1].memo[id(fr.site)] = out
    if result is fn.body:
        return fn
    out = Function(fn.params, result, fn.ret_type, fn.attrs)
    infer_expr(out)
    return out


def expand_calls(fn: Function) -> Function:
    """``fn`` with each call of an operator AD differentiates through its expansion (``OpDef.expand``: no rule of
    its own) replaced by that expansion (typed)."""

    def expand(old: Expr, new: Expr):
        if not expanded(new):
            return None
        infer_expr(new)
        out = new.op.expand(new)
        infer_expr(out)
        return out

    body = transform(fn.body, expand)
    return fn if body is fn.body else Function(fn.params, body, fn.ret_type, attrs=fn.attrs)
