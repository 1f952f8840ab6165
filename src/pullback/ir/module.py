"""IRModule: an immutable map from global names to Functions."""

from __future__ import annotations

from typing import Iterator, Mapping, Optional, Union

from .errors import PullbackError
from .expr import _PRINTER, Expr, Function, GlobalVar


class IRModule:
    """Global functions by name. Updates (``with_function``) return a new module.

    ``mod["main"]`` returns the Function; ``mod.get_global_var("main")`` its GlobalVar.
    """

    __slots__ = ("_funcs", "_gvars")

    def __init__(self, functions: Optional[Mapping[Union[str, GlobalVar], Function]] = None):
        funcs: dict[str, Function] = {}
        gvars: dict[str, GlobalVar] = {}
        for key, fn in (functions or {}).items():
            gv = key if isinstance(key, GlobalVar) else GlobalVar(_check_name(key))
            if not isinstance(fn, Function):
                raise PullbackError(f"IRModule: @{gv.name_hint} must be a Function, got {type(fn).__name__}")
            if gv.name_hint in funcs:
                raise PullbackError(f"IRModule: duplicate function name @{gv.name_hint}")
            funcs[gv.name_hint] = fn
            gvars[gv.name_hint] = gv
        self._funcs = funcs
        self._gvars = gvars

    @staticmethod
    def from_expr(expr: Expr, functions: Optional[Mapping] = None) -> "IRModule":
        """A module whose ``main`` is ``expr`` (a Function, or an expression wrapped in one
        over its free variables)."""
        if not isinstance(expr, Function):
            from .traversal import free_vars

            expr = Function(free_vars(expr), expr)
        items = dict(functions or {})
        items["main"] = expr
        return IRModule(items)

    # mapping-like API
    def __getitem__(self, name: Union[str, GlobalVar]) -> Function:
        key = name.name_hint if isinstance(name, GlobalVar) else name
        try:
            return self._funcs[key]
        except KeyError:
            known = ", ".join("@" + k for k in self._funcs) or "none"
            raise PullbackError(f"IRModule has no function @{key} (functions: {known})") from None

    def __contains__(self, name) -> bool:
        key = name.name_hint if isinstance(name, GlobalVar) else name
        return key in self._funcs

    def __iter__(self) -> Iterator[str]:
        return iter(self._funcs)

    def __len__(self) -> int:
        return len(self._funcs)

    @property
    def functions(self) -> dict[GlobalVar, Function]:
        """A fresh ``{GlobalVar: Function}`` dict (mutating it does not change the module)."""
        return {self._gvars[k]: f for k, f in self._funcs.items()}

    def items(self):
        return [(k, f) for k, f in self._funcs.items()]

    def get_global_var(self, name: str) -> GlobalVar:
        if name not in self._gvars:
            self[name]  # raises the standard message
        return self._gvars[name]

    def get_global_vars(self) -> list[GlobalVar]:
        return list(self._gvars.values())

    def with_function(self, name: Union[str, GlobalVar], fn: Function) -> "IRModule":
        """A new module with ``name`` bound to ``fn`` (added or replaced); the GlobalVar is kept."""
        key = name.name_hint if isinstance(name, GlobalVar) else _check_name(name)
        if not isinstance(fn, Function):
            raise PullbackError(f"with_function: @{key} must be a Function, got {type(fn).__name__}")
        if key in self._funcs and self._funcs[key] is fn:
            return self
        gv = self._gvars.get(key) or (name if isinstance(name, GlobalVar) else GlobalVar(key))
        return _module({**self._funcs, key: fn}, {**self._gvars, key: gv})

    def with_functions(self, updates: Mapping[str, Function]) -> "IRModule":
        mod = self
        for k, f in updates.items():
            mod = mod.with_function(k, f)
        return mod

    def without_function(self, name: str) -> "IRModule":
        self[name]  # raises the standard message
        return _module({k: f for k, f in self._funcs.items() if k != name}, {k: g for k, g in self._gvars.items() if k != name})

    def astext(self) -> str:
        if not _PRINTER:
            raise PullbackError("the text printer is not loaded: import pullback.text")
        return _PRINTER[0](self)

    def __str__(self) -> str:
        return self.astext()

    def __repr__(self) -> str:
        return f"IRModule({', '.join('@' + k for k in self._funcs)})"


def _module(funcs: dict, gvars: dict) -> IRModule:
    """A module over these (fresh) dicts, unchecked."""
    new = IRModule.__new__(IRModule)
    new._funcs, new._gvars = funcs, gvars
    return new


def _check_name(name) -> str:
    if not isinstance(name, str) or not name:
        raise PullbackError(f"function name must be a non-empty string, got {name!r}")
    return name
