"""What a compiled module's programs fixed about the module besides its parameters and inputs.

``module_structure(module)``: per submodule its identity, its public number attributes (train/eval
mode, a dropout's ``p``), an instance ``forward`` and its hooks; then the global module hooks. A
compiled module exports anew when it changes (``pullback.integrations.torch``). ``StructureWatch``
answers "unchanged since?" at each call without building the structure again.
"""

from __future__ import annotations

from functools import lru_cache
from operator import itemgetter

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


def _getter(keys: list):
    """``d -> tuple of d[k] for k in keys`` (KeyError for a missing key)."""
    if not keys:
        return lambda d: ()
    if len(keys) == 1:
        k = keys[0]
        return lambda d: (d[k],)
    return itemgetter(*keys)


class StructureWatch:
    """Has ``module_structure(module)`` possibly changed since this watch was made? ``unchanged()`` compares,
    per submodule, the number of its attributes, its public attributes (the settings by type and value, the
    others by type: a tensor set to None becomes a setting), its hooks and its children (by identity), and the
    global hooks, without building the structure (which walks every attribute of every submodule: the
    largest part of a small model's per-call overhead). False means "maybe": the caller computes the structure
    and compares."""

    def __init__(self, module):
        entries = []
        for _, d in _submodules(module):
            public = [k for k in d if k[0] != "_"]
            settings = _getter([k for k in public if _is_setting(d[k])])
            others = _getter([k for k in public if not _is_setting(d[k])])
            values = settings(d)
            entries.append((d, len(d), settings, values, tuple(map(type, values)), others,
                            tuple(map(type, others(d))), _hooks(d), tuple((d.get("_modules") or {}).values())))
        self._entries = entries
        self._global = _global_hooks()

    def unchanged(self) -> bool:
        try:
            for d, n, settings, values, types, others, other_types, hooks, kids in self._entries:
                if len(d) != n:
                    return False
                now = settings(d)
                if tuple(map(type, now)) != types or now != values or tuple(map(type, others(d))) != other_types:
                    return False
                if _hooks(d) != hooks or tuple((d.get("_modules") or {}).values()) != kids:
                    return False
        except Exception:  # noqa: BLE001 (an attribute removed, a comparison that raises: computed in full)
            return False
        return _global_hooks() == self._global


__all__ = ["module_structure", "structure_change", "StructureWatch"]
