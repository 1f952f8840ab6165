"""RemoveUnusedParameters: drop parameters a module function does not use, and the matching call arguments.

Repeats until nothing changes (dropping an argument can leave a caller's own
parameter unused). Entry functions (``entry``, default ``("main",)``) keep their
signature unless ``include_entry=True``; so do primitive functions and functions
whose GlobalVar is used as a value rather than called (their signature is
observable).
"""

from __future__ import annotations

from typing import Iterable

from ..ir.errors import PassError
from ..ir.expr import Call, Function, GlobalVar
from ..ir.module import IRModule
from ..ir.traversal import free_vars, post_order, transform
from .pass_infra import PassContext, PassInfo, Pass, register_pass


def _value_uses(mod: IRModule) -> set[str]:
    """Names of functions whose GlobalVar appears other than as a callee."""
    out: set[str] = set()
    for _, fn in mod.items():
        callees: set[int] = set()
        for n in post_order(fn, into_functions=True):
            if isinstance(n, Call) and isinstance(n.op, GlobalVar):
                callees.add(id(n.op))
        for n in post_order(fn, into_functions=True):
            if isinstance(n, GlobalVar) and id(n) not in callees:
                out.add(n.name_hint)
    return out


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

    for name, fn in mod.items():
        fn = updates.get(name, fn)
        body = transform(fn.body, fix_call, into_functions=True)
        if body is not fn.body:
            updates[name] = fn.replace(body=body)
    return mod.with_functions(updates)


class RemoveUnusedParameters(Pass):
    """Drop unused parameters of module functions and rewrite every call site, to a fixed point."""

    def __init__(self, include_entry: bool = False, entry: Iterable[str] = ("main",)):
        super().__init__(PassInfo("RemoveUnusedParameters", 1))
        if isinstance(entry, str):
            entry = (entry,)
        self.entry = tuple(entry)
        for e in self.entry:
            if not isinstance(e, str) or not e:
                raise PassError(f"RemoveUnusedParameters: entry must list function names, got {e!r}")
        self.include_entry = bool(include_entry)

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        frozen = _value_uses(mod)
        if not self.include_entry:
            frozen |= set(self.entry)
        while True:
            new = _drop_unused(mod, frozen)
            if new is mod:
                return mod
            mod = new


register_pass("RemoveUnusedParameters", RemoveUnusedParameters)

__all__ = ["RemoveUnusedParameters"]
