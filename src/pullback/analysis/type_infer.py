"""Type inference over modules: the rules of ``ir.type_rules`` plus the types of module functions.

A node's ``checked_type`` is computed on first access (``ir.type_rules``) with no
module at hand; this module adds what only the module knows, the type of a call
to a global function. ``infer_module`` types every function callees first (the
call graph's order), so a cached ``checked_type`` is never stale: types are a
pure function of the node, and nodes shared between modules are typed once.
"""

from __future__ import annotations

from typing import Iterable, Optional

from ..ir.errors import TypeCheckError, TypeInferenceError
from ..ir.expr import Expr, Function, GlobalVar
from ..ir.module import IRModule
from ..ir.type_rules import TypeProblems, UntypedCallee, infer_types
from ..ir.types import FuncType, Type, join_types, types_compatible
from .callgraph import CallGraph


class _ModuleTypes:
    """Types of the functions of ``mod``: ``global_type(gv)`` for the type rules, typing a function
    (and what it references, callees first) the first time it is asked for."""

    def __init__(self, mod: IRModule):
        self.mod = mod
        self._walking = False
        self.failed: set[str] = set()  # functions that do not type-check (their errors are reported)

    def global_type(self, gv: GlobalVar) -> FuncType:
        name = gv.name_hint
        mod = self.mod
        if name not in mod:
            raise TypeInferenceError(f"call to unknown global function @{name}")
        fn = mod[name]
        t = fn._checked_type
        if t is None and not self._walking:
            self.type_functions(CallGraph(mod).callees_first([name]))
            t = fn._checked_type
        if isinstance(t, FuncType):
            return t
        if all(p.type_annotation is not None for p in fn.params) and fn.ret_type is not None:
            return FuncType(tuple(p.type_annotation for p in fn.params), fn.ret_type)
        if name in self.failed:
            raise UntypedCallee(f"@{name} does not type-check")
        raise TypeInferenceError(f"@{name} is used before its type is known (recursion needs a ret_type annotation)")

    def type_functions(self, names: Iterable[str], problems: Optional[TypeProblems] = None) -> None:
        """Type the functions ``names`` in that order (callees first: a function met inside a
        recursion before its type is known needs its annotations). With ``problems``, every
        function is typed and every independent error collected; a call to a function that does
        not type-check takes that function's annotations, or has no type (and no second report)."""
        was, self._walking = self._walking, True
        try:
            for name in names:
                fn = self.mod[name]
                if fn._checked_type is None:
                    if infer_types(fn, self.global_type, name, problems) is None:
                        self.failed.add(name)
        finally:
            self._walking = was

    def infer(self, expr: Expr, problems: Optional[TypeProblems] = None) -> Optional[Type]:
        return infer_types(expr, self.global_type, None, problems)


def _raise(problems: TypeProblems, what: str) -> None:
    if problems.problems:
        raise TypeCheckError(f"{what} does not type-check", problems.messages())


def infer_module(mod: IRModule) -> IRModule:
    """Annotate every node of every function of ``mod`` with its type (callees first); returns ``mod``.

    Raises one ``TypeCheckError`` listing every independent problem (each with its function and
    ``line:column`` when the node was parsed); values that only depend on an ill-typed one, and
    calls to a function that does not type-check, are not reported again.

    Only untyped nodes are visited: a module typed already costs one check per function (a typed
    Function has a typed body)."""
    if all(fn._checked_type is not None for _, fn in mod.items()):
        return mod
    problems = TypeProblems()
    # one function: no order to find (a call to itself takes its annotations); else callees first
    names = [name for name, _ in mod.items()] if len(mod) == 1 else CallGraph(mod).callees_first()
    _ModuleTypes(mod).type_functions(names, problems)
    _raise(problems, "the module")
    return mod


def infer_expr(expr: Expr, mod: Optional[IRModule] = None) -> Type:
    """The type of ``expr``, typing its untyped sub-expressions; ``mod`` gives the types of the
    module functions it calls (without it, such a call is a TypeInferenceError). Every independent
    problem is reported in one ``TypeCheckError``."""
    t = expr._checked_type
    if t is not None:
        return t
    problems = TypeProblems()
    t = infer_types(expr, None, None, problems) if mod is None else _ModuleTypes(mod).infer(expr, problems)
    _raise(problems, "the expression")
    return t


def infer_function(fn: Function, mod: Optional[IRModule] = None) -> Function:
    infer_expr(fn, mod)
    return fn


__all__ = ["infer_module", "infer_expr", "infer_function", "types_compatible", "join_types"]
