"""DeadCodeElimination for a DAG IR.

A node nothing uses is not part of the program (there is no ``let`` to keep it),
so dead values vanish by construction. What this pass removes is what is
*reachable but dead*:

1. ``TupleGetItem(Tuple(fields), i)`` becomes ``fields[i]`` (the other fields
   stop being used there);
2. ``If`` with a Constant condition becomes the taken branch, and ``If(c, a, a)``
   becomes ``a``;
3. module functions no longer reachable (through calls or GlobalVar uses) from
   the roots are deleted. The roots are the functions named in ``entry`` when
   given; by default (``entry=None``) every function that no other function
   references in the *input* module (``main``, ``main_grad``, ...), so a helper
   is deleted only when its last reference disappeared in step 1 or 2, or when
   it was only referenced by deleted functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..analysis.callgraph import CallGraph
from ..ir.errors import PassError
from ..ir.expr import Constant, Expr
from ..ir.module import IRModule
from ..pattern import is_constant, is_if, is_tuple, is_tuple_get_item, rewrite_module, wildcard
from .pass_infra import ModulePass, PassContext


def _tuple_field(node: Expr, c: dict) -> Optional[Expr]:
    fields = c["tup"].fields
    return fields[node.index] if node.index < len(fields) else None


def _const_if(node: Expr, c: dict) -> Expr:
    cond: Constant = c["cond"]
    return node.true_branch if bool(np.asarray(cond.data).reshape(-1)[0]) else node.false_branch


def _same_branches(node: Expr, c: dict) -> Optional[Expr]:
    return node.true_branch if node.true_branch is node.false_branch else None


def dce_rules() -> list:
    """Local rules of DeadCodeElimination (tuple projection, constant If, If with equal branches)."""
    return [
        (is_tuple_get_item(is_tuple().named("tup")), _tuple_field),
        (is_if(is_constant().where(lambda e: e.data.size == 1).named("cond"), wildcard(), wildcard()), _const_if),
        (is_if(wildcard(), wildcard(), wildcard()), _same_branches),
    ]


def entry_names(entry, who: str) -> Optional[tuple]:
    """``entry`` (a function name, names, or None) as a tuple of names (None stays None)."""
    if entry is None:
        return None
    names = (entry,) if isinstance(entry, str) else tuple(entry)
    if not all(isinstance(e, str) and e for e in names):
        raise PassError(f"{who}: entry must list function names, got {names!r}")
    return names


@dataclass(frozen=True)
class DeadCodeElimination(ModulePass):
    """Simplify tuple projections and constant Ifs, then delete functions unreachable from the roots."""

    name = "DeadCodeElimination"
    opt_level = 1
    entry: Optional[tuple] = None
    remove_functions: bool = True

    def __post_init__(self):
        object.__setattr__(self, "entry", entry_names(self.entry, "DeadCodeElimination"))
        object.__setattr__(self, "remove_functions", bool(self.remove_functions))

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        if self.entry is not None:
            missing = [e for e in self.entry if e not in mod]
            if missing:
                raise PassError(f"DeadCodeElimination: entry function(s) {', '.join('@' + m for m in missing)} not in the module")
        roots = self.entry if self.entry is not None else CallGraph(mod).roots()
        out = rewrite_module(dce_rules(), mod)
        if self.remove_functions:
            live = CallGraph(out).reachable(roots)
            for name in [n for n in out if n not in live]:
                out = out.without_function(name)
        return out


__all__ = ["DeadCodeElimination", "dce_rules"]
