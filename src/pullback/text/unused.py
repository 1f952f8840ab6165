"""Unused bindings type-check too: ``ill_typed(nodes, functions)``.

The IR has no Let: a binding that nothing uses is not part of the parsed
program, so no later pass would ever see it, and an ill-typed one would vanish
in silence. The parser hands over the bindings no expression uses (the roots of
the dead code; what they use is checked with them) and this module infers their
types; the parser reports a failure as a ``ParseError`` at the binding, with the
inference error (which names the ``line:column`` of the offending node).

A binding that depends on something without a type (an unannotated parameter or
free variable, a global function whose signature is unknown or does not itself
type-check) cannot be checked here and is left alone: that is not an error of
the text, and the live program's own type errors are ``InferType``'s to report.
"""

from __future__ import annotations

from typing import Optional

from ..ir.errors import PullbackError, TypeCheckError, TypeInferenceError
from ..ir.expr import Call, Expr, Function, GlobalVar, Tuple, Var
from ..ir.module import IRModule
from ..ir.traversal import children, post_order

__all__ = ["ill_typed", "first_ill_typed"]

def ill_typed(nodes: list[Expr], functions: dict) -> list[tuple[int, PullbackError]]:
    """``(index, error)`` of every one of ``nodes`` that does not type-check, in order (linear).

    ``functions``: the module's ``{GlobalVar: Function}`` (callees of the nodes).
    """
    if not nodes:
        return []
    from ..analysis.type_infer import infer_expr, infer_module  # a sibling layer, needed only here

    order = post_order(Tuple(nodes), into_functions=True)
    mod = _typed_callees(order, functions, infer_module)
    unknown = _untyped(order, mod)
    todo = [i for i, n in enumerate(nodes) if id(n) not in unknown]
    if not todo:
        return []
    try:
        infer_expr(Tuple([nodes[i] for i in todo]), mod)  # types every node that types, reports the rest
        return []
    except PullbackError:
        pass
    found = []
    for i in todo:
        if nodes[i]._checked_type is None:  # ill-typed itself or through an operand: its own first error
            try:
                infer_expr(nodes[i], mod)
            except TypeCheckError as e:
                found.append((i, TypeInferenceError(e.diagnostics[0])))
            except PullbackError as e:
                found.append((i, e))
    return found


def first_ill_typed(nodes: list[Expr], functions: dict) -> Optional[tuple[int, PullbackError]]:
    """``(index, error)`` of the first of ``nodes`` that does not type-check, or None."""
    found = ill_typed(nodes, functions)
    return found[0] if found else None


def _typed_callees(order: list, functions: dict, infer_module) -> Optional[IRModule]:
    """The module of the global functions ``order`` reaches, typed; None if none or if they do not type."""
    seen: dict = {}
    stack = [g for n in order for g in _globals_of(n)]
    while stack:
        gv = stack.pop()
        if gv.name_hint in seen or gv not in functions:
            continue
        fn = functions[gv]
        seen[gv.name_hint] = (gv, fn)
        stack.extend(g for n in post_order(fn, into_functions=True) for g in _globals_of(n))
    if not seen or any(p.type_annotation is None for _, fn in seen.values() for p in fn.params):
        return None
    mod = IRModule(dict(seen.values()))
    try:
        infer_module(mod)
    except PullbackError:
        return None
    return mod


def _globals_of(n: Expr) -> tuple:
    if isinstance(n, GlobalVar):
        return (n,)
    if isinstance(n, Call) and isinstance(n.op, GlobalVar):
        return (n.op,)
    return ()


def _untyped(order: list, mod: Optional[IRModule]) -> set:
    """Ids of the nodes whose type depends on something without a type (operands before users)."""
    bad: set = set()
    for n in order:
        if isinstance(n, Var):
            untyped = n.type_annotation is None
        elif any(mod is None or g.name_hint not in mod for g in _globals_of(n)):
            untyped = True
        else:
            untyped = any(id(c) in bad for c in children(n, into_functions=isinstance(n, (Function, Call))))
        if untyped:
            bad.add(id(n))
    return bad
