"""Inline calls to global functions and primitive (fused) functions before AD.

Each call site gets the callee's body with the callee's parameters replaced by
the call's arguments (``transform`` with a memo seeded ``param -> arg``); parts
of the callee that do not depend on its parameters stay shared. Callees are
inlined first, so one pass over each body suffices.
"""

from __future__ import annotations

from ...analysis.type_infer import infer_expr
from ...ir.expr import Call, Expr, Function, GlobalVar
from ...ir.module import IRModule
from ...ir.traversal import transform


def _substitute(fn: Function, args: tuple) -> Expr:
    return transform(fn.body, memo={id(p): a for p, a in zip(fn.params, args)})


def inline_calls(mod: IRModule, order: list[str]) -> dict[str, Function]:
    """Every function in ``order`` (callees first) with global and primitive calls inlined."""
    done: dict[str, Function] = {}

    def expand(old: Expr, new: Expr):
        if isinstance(new, Call):
            if isinstance(new.op, GlobalVar) and new.op.name_hint in done:
                return _substitute(done[new.op.name_hint], new.args)
            if isinstance(new.op, Function) and new.op.is_primitive:
                return _substitute(_inline_primitive(new.op), new.args)
        return None

    def _inline_primitive(fn: Function) -> Function:
        body = transform(fn.body, expand)
        return fn if body is fn.body else Function(fn.params, body, fn.ret_type, fn.attrs)

    for name in order:
        fn = mod[name]
        body = transform(fn.body, expand)
        if body is not fn.body:
            fn = Function(fn.params, body, fn.ret_type, fn.attrs)
            infer_expr(fn)
        done[name] = fn
    return done
