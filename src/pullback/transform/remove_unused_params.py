"""RemoveUnusedParameters: drop parameters a module function does not use, and the matching call arguments.

Repeats until nothing changes (dropping an argument can leave a caller's own
parameter unused). Entry functions (``entry``, default ``("main",)``) keep their
signature unless ``include_entry=True``; so do primitive functions, functions
whose GlobalVar is used as a value rather than called (their signature is
observable), and functions with a ``custom_vjp`` and those vjps (AD calls the
vjp with the function's arguments).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis.callgraph import CallGraph
from ..ir.expr import Call, Function, GlobalVar
from ..ir.module import IRModule
from ..ir.traversal import free_vars, transform
from .dead_code import entry_names
from .pass_infra import ModulePass, PassContext


def _drop_unused(mod: IRModule, frozen: set[str]) -> IRModule:
    """One round: shrink every non-frozen function and rewrite every call site."""
    kept: dict[str, tuple] = {}  # name -> kept parameter positions
    updates: dict[str, Function] = {}
    for name, fn in mod.items():
        if name in frozen or fn.is_primitive:
            continue
        used = {id(v) for v in free_vars(fn.body)}
        keep = tuple(i for i, p in enumerate(fn.params) if id(p) in used)
        if len(keep) < len(fn.params):
            kept[name] = keep
            updates[name] = Function([fn.params[i] for i in keep], fn.body, fn.ret_type, fn.attrs)
    if not kept:
        return mod

    def fix_call(old, new):
        if isinstance(new, Call) and isinstance(new.op, GlobalVar) and new.op.name_hint in kept:
            return new.replace(args=tuple(new.args[i] for i in kept[new.op.name_hint]))
        return None

    calls = CallGraph(mod)
    callers = {c for name in kept for c in calls.callers(name)}
    for name, fn in mod.items():
        if name not in callers:
            continue
        fn = updates.get(name, fn)
        body = transform(fn.body, fix_call, into_functions=True)
        if body is not fn.body:
            updates[name] = fn.replace(body=body)
    return mod.with_functions(updates)


@dataclass(frozen=True)
class RemoveUnusedParameters(ModulePass):
    """Drop unused parameters of module functions and rewrite every call site, to a fixed point."""

    name = "RemoveUnusedParameters"
    opt_level = 1
    include_entry: bool = False
    entry: tuple = ("main",)

    def __post_init__(self):
        object.__setattr__(self, "entry", entry_names(self.entry, "RemoveUnusedParameters") or ())
        object.__setattr__(self, "include_entry", bool(self.include_entry))

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        frozen = CallGraph(mod).value_uses() | {name for name, fn in mod.items() if fn.custom_vjp}
        if not self.include_entry:
            frozen |= set(self.entry)
        while True:
            new = _drop_unused(mod, frozen)
            if new is mod:
                return mod
            mod = new


__all__ = ["RemoveUnusedParameters"]
