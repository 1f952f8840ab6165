"""What a compiled module's programs fixed about the module besides its parameters and inputs.

``module_structure(module)``: per submodule its identity, its public number attributes (train/eval
mode, a dropout's ``p``), an instance ``forward`` and its hooks; then the global module hooks. A
compiled module exports anew when it changes (``pullback.integrations.torch``). ``StructureWatch``
answers "unchanged since?" at each call without building the structure again.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import chain, repeat
from operator import getitem
from typing import Optional

_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")


_SCALARS = frozenset({bool, int, float, str, type(None)})
_is_scalar = _SCALARS.__contains__


def _is_setting(v) -> bool:
    """A number, string, None or tuple of them."""
    t = type(v)
    return _is_scalar(t) or t is tuple and all(map(_is_scalar, map(type, v)))


def _settings(d: dict) -> tuple:
    """A module's public attributes that are numbers, strings, None or tuples of them (``training``, a dropout's
    ``p``, a user's ``temperature``): what ``forward`` may read as constants of the program."""
    return tuple([(k, v) for k, v in d.items() if k[0] != "_" and _is_setting(v)])


def _hooks(d: dict):
    """A module's hooks by kind: (count, newest handle id) or None per kind; None without hooks (ids only grow,
    so adding or removing one changes it)."""
    g = d.get
    kinds = (g("_forward_hooks"), g("_forward_pre_hooks"), g("_backward_hooks"), g("_backward_pre_hooks"))
    if not any(kinds):
        return None
    return tuple((len(h), next(reversed(h))) if h else None for h in kinds)


def _global_hooks() -> tuple:
    torch_module = _torch_module()
    return tuple((len(d), next(reversed(d))) if (d := getattr(torch_module, name, None)) else None
                 for name in _GLOBAL_HOOKS)


def _next_handle() -> Optional[int]:
    """The id the next hook registered anywhere gets (None where torch keeps no such counter)."""
    return getattr(_torch_hooks().RemovableHandle, "next_id", None)


@lru_cache(maxsize=1)
def _torch_hooks():
    from torch.utils import hooks

    return hooks


@lru_cache(maxsize=1)
def _torch_module():
    """``torch.nn.modules.module`` (where the global module hooks live), imported once: read at every call."""
    from torch.nn.modules import module

    return module


def _submodules(module):
    """``(submodule, its __dict__)`` for ``module`` and every submodule below it (an explicit stack)."""
    stack = [module]
    while stack:
        m = stack.pop()
        d = m.__dict__
        yield m, d
        stack.extend(c for c in (d.get("_modules") or {}).values() if c is not None)


def module_structure(module) -> list:
    """What an exported program of ``module`` fixed besides the parameters' values and the inputs, one entry per
    submodule: the submodule (identity), its public number attributes (train/eval mode, a dropout's ``p``:
    ``_settings``), an instance ``forward``, its hooks (``_hooks``); then the global module hooks. A compiled
    module checks it at each call (``StructureWatch``), so a submodule switched to eval mode (frozen batch norm),
    a dropout rate or temperature changed, a hook added or removed or a layer replaced after the first call is
    exported anew, as eager would run it."""
    return [(m, _settings(d), d.get("forward"), _hooks(d)) for m, d in _submodules(module)] + [_global_hooks()]


def structure_change(root, before: list, after: list) -> str:
    """What differs between two ``module_structure`` lists of ``root``, in words (the first difference)."""
    names = {id(m): f"submodule {n!r}" if n else "the module" for n, m in root.named_modules(remove_duplicate=False)}
    for b, a in zip(before, after):
        if b == a:
            continue
        if len(b) != 4 or len(a) != 4:
            return "a global module hook was added or removed"
        name = names.get(id(a[0]), "a submodule")
        if b[0] is not a[0]:
            return f"{name} was replaced, or submodules were added or removed"
        if b[1] != a[1]:
            was, now = dict(b[1]), dict(a[1])
            key = next((k for k in {**was, **now} if was.get(k, ...) != now.get(k, ...)), "?")
            return f"{name}: {key} changed from {was.get(key, 'unset')!r} to {now.get(key, 'unset')!r}"
        return f"{name}: its forward or hooks changed"
    return "submodules were added or removed"


class StructureWatch:
    """Has ``module_structure(module)`` possibly changed since this watch was made? ``unchanged()`` compares,
    per submodule, the number of its attributes, its public attributes (the settings by type and value, the
    others by type: a tensor set to None becomes a setting), its hooks and its children (by identity), and the
    global hooks, without building the structure (which walks every attribute of every submodule: the
    largest part of a small model's per-call overhead). Each comparison runs over all submodules at once
    (``map`` over flat lists of the dicts and keys read: a LeViT's 273 submodules in 74 us instead of 234 with a
    loop over them). False means "maybe": the caller computes the structure and compares."""

    def __init__(self, module):
        dicts, settings, others, hooks = [], ([], []), ([], []), ([], [])
        for _, d in _submodules(module):
            dicts.append(d)
            for k, v in d.items():
                if k[0] != "_":
                    into = settings if _is_setting(v) else others
                    into[0].append(d)
                    into[1].append(k)
            for kind in _HOOKS:
                if isinstance(d.get(kind), dict):
                    hooks[0].append(d)
                    hooks[1].append(kind)
        self._dicts, self._settings, self._others, self._hooks = dicts, settings, others, hooks
        self._parents = [d for d in dicts if isinstance(d.get("_modules"), dict)]
        self._used = tuple(zip(*[(d, kind) for d, kind in zip(*hooks) if d[kind]])) or ((), ())
        self._next_handle = _next_handle()
        self._state, self._all_hooks, self._used_hooks = self._now(), _hooks_of(hooks), _hooks_of(self._used)

    def _now(self) -> list:
        """What ``unchanged`` compares besides the hooks, read now (KeyError for an attribute removed)."""
        values = list(map(getitem, *self._settings))
        kids = list(map(getitem, self._parents, repeat("_modules")))
        return [list(map(len, self._dicts)), values, list(map(type, values)), list(map(type, map(getitem, *self._others))),
                list(map(len, kids)), list(map(id, chain.from_iterable(map(dict.values, kids)))), _global_hooks()]

    def unchanged(self) -> bool:
        """Every hook registered is given the next ``RemovableHandle`` id: while that counter stands where it
        stood, hooks can only have been removed, from the hook dicts that had some (read alone then: none in
        most models, where reading all 4 kinds of a LeViT's 273 submodules takes 36 us); once it moved (a hook on
        a tensor, another module, torch.export's own), all are read, and the counter taken again when they match."""
        try:
            if self._now() != self._state:
                return False
            counter = _next_handle()
            if counter is not None and counter == self._next_handle:
                return _hooks_of(self._used) == self._used_hooks
            if _hooks_of(self._hooks) != self._all_hooks:
                return False
            self._next_handle = counter  # hooks registered elsewhere (tensors, other modules): the same as then
            return True
        except Exception:  # noqa: BLE001 (an attribute removed, a comparison that raises: computed in full)
            return False


def _hooks_of(pairs: tuple) -> tuple:
    """The length of each hook dict ``d[kind]`` of ``pairs`` (dicts, kinds) and the newest handle of each one used."""
    hooks = list(map(getitem, *pairs))
    return list(map(len, hooks)), list(map(next, map(reversed, filter(None, hooks))))


__all__ = ["module_structure", "structure_change", "StructureWatch"]
