"""Pass infrastructure: passes, PassContext, decorators and the pass registry.

Like TVM's Python API (``tvm.transform``), with these differences:

- a pass that a context skips (``opt_level`` too high, ``disabled``, or an
  instrument's ``should_run`` saying no) is logged on ``pullback.transform`` at
  INFO, reported to every instrument's ``on_skip`` and listed in
  ``ctx.skipped``: never silent;
- ``set_default_instruments`` installs instruments that every PassContext
  (including the implicit default one) runs before its own; the test suite uses
  it to check well-formedness after every pass;
- ``Sequential`` resolves ``info.required`` by name: a required pass that has
  not run on the current module earlier in the Sequential is made with
  ``get_pass(name)`` and run first.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Iterable, Mapping, Optional, Sequence, Union

from ..ir.errors import PassError
from ..ir.expr import Function
from ..ir.module import IRModule

logger = logging.getLogger("pullback.transform")


def _names(value, what: str) -> tuple[str, ...]:
    """A tuple of pass names from a str or an iterable of str."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    out = tuple(value)
    for v in out:
        if not isinstance(v, str) or not v:
            raise PassError(f"{what} must list pass names (non-empty strings), got {v!r}")
    return out


@dataclass(frozen=True)
class PassInfo:
    """Name, optimisation level and required passes (by name) of a pass."""

    name: str
    opt_level: int = 0
    required: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise PassError(f"PassInfo: name must be a non-empty string, got {self.name!r}")
        if isinstance(self.opt_level, bool) or not isinstance(self.opt_level, int) or self.opt_level < 0:
            raise PassError(f"PassInfo {self.name}: opt_level must be a non-negative int, got {self.opt_level!r}")
        object.__setattr__(self, "required", _names(self.required, f"PassInfo {self.name}: required"))


# ---------------------------------------------------------------- passes


class Pass:
    """A callable ``IRModule -> IRModule`` with ``info``.

    Calling a pass runs it in ``PassContext.current()`` (opt_level, disabled and
    required checks, instruments). Subclasses implement
    ``transform_module(mod, ctx)``, which runs the pass unconditionally and
    returns ``mod`` itself when nothing changed.
    """

    info: PassInfo

    def __init__(self, info: PassInfo):
        if not isinstance(info, PassInfo):
            raise PassError(f"{type(self).__name__}: info must be a PassInfo, got {info!r}")
        self.info = info

    @property
    def name(self) -> str:
        return self.info.name

    def __call__(self, mod: IRModule) -> IRModule:
        return PassContext.current().run(self, mod)

    def transform_module(self, mod: IRModule, ctx: "PassContext") -> IRModule:
        raise NotImplementedError(f"{type(self).__name__} must implement transform_module(mod, ctx)")

    def __repr__(self) -> str:
        i = self.info
        req = f", required={list(i.required)}" if i.required else ""
        return f"{type(self).__name__}({i.name!r}, opt_level={i.opt_level}{req})"


class ModulePass(Pass):
    """A pass over the whole module: ``pass_func(mod, ctx) -> IRModule``."""

    def __init__(self, pass_func: Callable[[IRModule, "PassContext"], IRModule], info: PassInfo):
        super().__init__(info)
        if not callable(pass_func):
            raise PassError(f"ModulePass {info.name}: pass_func must be callable, got {pass_func!r}")
        self.pass_func = pass_func

    def transform_module(self, mod: IRModule, ctx: "PassContext") -> IRModule:
        return self.pass_func(mod, ctx)


class FunctionPass(Pass):
    """A pass applying ``pass_func(func, mod, ctx) -> Function`` to every function of the module.

    Functions with attribute ``Primitive=1`` are left alone; ``mod`` is the module the
    pass started from. The module object is returned unchanged when no function changed.
    """

    def __init__(self, pass_func: Callable[[Function, IRModule, "PassContext"], Function], info: PassInfo):
        super().__init__(info)
        if not callable(pass_func):
            raise PassError(f"FunctionPass {info.name}: pass_func must be callable, got {pass_func!r}")
        self.pass_func = pass_func

    def transform_module(self, mod: IRModule, ctx: "PassContext") -> IRModule:
        updates: dict[str, Function] = {}
        for name, fn in mod.items():
            if fn.is_primitive:
                continue
            new = self.pass_func(fn, mod, ctx)
            if not isinstance(new, Function):
                raise PassError(f"pass {self.info.name} returned {type(new).__name__} for @{name}, expected a Function")
            if new is not fn:
                updates[name] = new
        return mod.with_functions(updates) if updates else mod


class Sequential(Pass):
    """Run ``passes`` in order (each through the context checks and instruments).

    Entries may be Pass objects or registered pass names. Before a pass runs, each
    name in its ``info.required`` that has not run on the current module earlier in
    this Sequential is built with ``get_pass`` and run (opt_level does not apply to it).
    """

    def __init__(self, passes: Sequence[Union[Pass, str]] = (), opt_level: int = 0, name: str = "sequential",
                 required: Iterable[str] = ()):
        super().__init__(PassInfo(name, opt_level, tuple(_names(required, f"Sequential {name}: required"))))
        if isinstance(passes, (Pass, str)):
            passes = [passes]
        resolved = []
        for i, p in enumerate(passes):
            if isinstance(p, str):
                p = get_pass(p)
            if not isinstance(p, Pass):
                raise PassError(f"Sequential {name}: entry {i} is not a Pass, got {p!r}")
            resolved.append(p)
        self.passes: tuple[Pass, ...] = tuple(resolved)

    def transform_module(self, mod: IRModule, ctx: "PassContext") -> IRModule:
        ran_on: dict[str, IRModule] = {}  # pass name -> module it produced when it last ran
        for p in self.passes:
            for req in p.info.required:
                if req in ran_on and (ran_on[req] is mod or req not in _REGISTRY):
                    continue
                if req not in _REGISTRY:
                    raise PassError(
                        f"pass {p.info.name} requires {req}, which did not run earlier in {self.info.name} "
                        f"and is not registered (registered: {', '.join(sorted(_REGISTRY)) or 'none'})"
                    )
                mod, ran = ctx._run(get_pass(req), mod, force=True)
                if ran:
                    ran_on[req] = mod
            mod, ran = ctx._run(p, mod)
            if ran:
                ran_on[p.info.name] = mod
        return mod

    def __repr__(self) -> str:
        inner = ", ".join(p.info.name for p in self.passes)
        return f"Sequential({self.info.name!r}, [{inner}], opt_level={self.info.opt_level})"


# ---------------------------------------------------------------- decorators


def _make_decorator(kind: str, base: type, method: str):
    def decorator(pass_arg=None, opt_level: int = 0, name: Optional[str] = None, required: Iterable[str] = ()):
        def create(target):
            info = PassInfo(name or target.__name__, opt_level, tuple(_names(required, f"{kind} required")))
            if inspect.isclass(target):
                return _pass_class(target, base, method, info)
            if not callable(target):
                raise PassError(f"@{kind} needs a function or a class, got {target!r}")
            p = base(target, info)
            functools.update_wrapper(p, target, updated=())
            return p

        return create(pass_arg) if pass_arg is not None else create

    decorator.__name__ = kind
    return decorator


def _pass_class(cls: type, base: type, method: str, info: PassInfo) -> type:
    """A Pass class whose instances wrap ``cls(*args, **kwargs)`` and call its ``method``."""
    if not callable(getattr(cls, method, None)):
        raise PassError(f"class {cls.__name__} needs a method {method}(...) to be a pass")

    def __init__(self, *args, **kwargs):
        inst = cls(*args, **kwargs)
        self.__dict__["_inst"] = inst
        base.__init__(self, getattr(inst, method), info)

    def __getattr__(self, attr):
        inst = self.__dict__.get("_inst")
        if inst is None:
            raise AttributeError(attr)
        return getattr(inst, attr)

    ns = {"__init__": __init__, "__getattr__": __getattr__, "__doc__": cls.__doc__,
          "__module__": cls.__module__, "__qualname__": cls.__qualname__, "pass_class": cls}
    return type(cls.__name__, (base,), ns)


module_pass = _make_decorator("module_pass", ModulePass, "transform_module")
module_pass.__doc__ = """Make a ModulePass from ``f(mod, ctx)`` or a class with ``transform_module(self, mod, ctx)``.

Usable bare (``@module_pass``), with options (``@module_pass(opt_level=2, name=..., required=...)``)
or as a call (``module_pass(f, opt_level=2)``). On a class it returns a Pass class:
``MyPass(*args)`` constructs the class and wraps it in a pass named after the class."""

function_pass = _make_decorator("function_pass", FunctionPass, "transform_function")
function_pass.__doc__ = """Make a FunctionPass from ``f(func, mod, ctx)`` or a class with
``transform_function(self, func, mod, ctx)``; same forms as ``module_pass``."""


# ---------------------------------------------------------------- context

_DEFAULT_INSTRUMENTS: tuple = ()


def set_default_instruments(instruments: Iterable) -> tuple:
    """Instruments run by every PassContext before its own; returns the previous ones.

    Their ``enter_pass_ctx`` is called here (and ``exit_pass_ctx`` of the previous ones).
    """
    global _DEFAULT_INSTRUMENTS
    new = tuple(instruments)
    for inst in new:
        _check_instrument(inst)
    old = _DEFAULT_INSTRUMENTS
    for inst in old:
        inst.exit_pass_ctx()
    _DEFAULT_INSTRUMENTS = new
    for inst in new:
        inst.enter_pass_ctx()
    return old


def get_default_instruments() -> tuple:
    return _DEFAULT_INSTRUMENTS


def _check_instrument(inst) -> None:
    from .instruments import PassInstrument

    if not isinstance(inst, PassInstrument):
        raise PassError(f"instruments must be PassInstrument objects, got {inst!r}")


_LOCAL = threading.local()
_MAX_SKIPPED = 10000


class PassContext:
    """Settings for running passes, used as a context manager.

    ``opt_level``: passes with a higher ``info.opt_level`` are skipped unless named in
    ``required``; passes named in ``disabled`` are skipped. ``instruments`` get hooks
    around every pass. ``config`` is a read-only mapping passes may consult. A nested
    context replaces the outer one until it exits (nothing is inherited). Skipped
    passes are listed in ``skipped`` as ``(name, reason)`` (the latest 10000).
    """

    def __init__(self, opt_level: int = 2, required: Iterable[str] = (), disabled: Iterable[str] = (),
                 instruments: Iterable = (), config: Optional[Mapping] = None):
        if isinstance(opt_level, bool) or not isinstance(opt_level, int):
            raise PassError(f"PassContext: opt_level must be an int, got {opt_level!r}")
        self.opt_level = opt_level
        self.required = frozenset(_names(required, "PassContext required"))
        self.disabled = frozenset(_names(disabled, "PassContext disabled"))
        self.instruments = tuple(instruments)
        for inst in self.instruments:
            _check_instrument(inst)
        if config is not None and not isinstance(config, Mapping):
            raise PassError(f"PassContext: config must be a mapping, got {config!r}")
        self.config = MappingProxyType(dict(config or {}))
        self.skipped: list[tuple[str, str]] = []

    # -- the context stack
    @staticmethod
    def _stack() -> list:
        stack = getattr(_LOCAL, "stack", None)
        if stack is None:
            stack = _LOCAL.stack = []
        return stack

    @staticmethod
    def current() -> "PassContext":
        """The innermost active context, or the default one (opt_level=2)."""
        stack = PassContext._stack()
        if stack:
            return stack[-1]
        default = getattr(_LOCAL, "default", None)
        if default is None:
            default = _LOCAL.default = PassContext()
        return default

    def __enter__(self) -> "PassContext":
        entered = []
        try:
            for inst in self.instruments:
                inst.enter_pass_ctx()
                entered.append(inst)
        except BaseException:
            for inst in reversed(entered):
                inst.exit_pass_ctx()
            raise
        self._stack().append(self)
        return self

    def __exit__(self, *exc) -> None:
        stack = self._stack()
        if not stack or stack[-1] is not self:
            raise PassError("PassContext exited out of order")
        stack.pop()
        for inst in reversed(self.instruments):
            inst.exit_pass_ctx()

    @property
    def all_instruments(self) -> tuple:
        """The default instruments followed by this context's own."""
        return _DEFAULT_INSTRUMENTS + self.instruments

    # -- running passes
    def skip_reason(self, info: PassInfo) -> Optional[str]:
        """Why this context skips a pass with ``info`` (None if it runs)."""
        if info.name in self.disabled:
            return "disabled by PassContext"
        if info.opt_level > self.opt_level and info.name not in self.required:
            return f"opt_level {info.opt_level} > PassContext opt_level {self.opt_level}"
        return None

    def run(self, p: Pass, mod: IRModule) -> IRModule:
        """Run ``p`` on ``mod`` under this context (what ``p(mod)`` does in it)."""
        return self._run(p, mod)[0]

    def _run(self, p: Pass, mod: IRModule, force: bool = False) -> tuple[IRModule, bool]:
        info = p.info
        if not isinstance(mod, IRModule):
            raise PassError(f"pass {info.name} expects an IRModule, got {type(mod).__name__}")
        instruments = self.all_instruments
        reason = "disabled by PassContext" if force and info.name in self.disabled else (None if force else self.skip_reason(info))
        if reason is None:
            for inst in instruments:
                if not inst.should_run(mod, info):
                    reason = f"{type(inst).__name__}.should_run returned False"
                    break
        if reason is not None:
            self.skipped.append((info.name, reason))
            if len(self.skipped) > _MAX_SKIPPED:  # the implicit default context lives forever
                del self.skipped[0]
            logger.info("skipping pass %s: %s", info.name, reason)
            for inst in instruments:
                inst.on_skip(mod, info, reason)
            return mod, False
        for inst in instruments:
            inst.run_before_pass(mod, info)
        pending = 0  # instruments[pending:] have not had run_after_pass yet
        try:
            out = p.transform_module(mod, self)
            if not isinstance(out, IRModule):
                raise PassError(f"pass {info.name} returned {type(out).__name__}, expected an IRModule")
            for inst in instruments:
                pending += 1  # an instrument raising from run_after_pass has closed its own state
                inst.run_after_pass(out, info)
        except BaseException as exc:
            for inst in instruments[pending:]:
                inst.on_error(mod, info, exc)
            if isinstance(exc, Exception):
                exc.add_note(f"(while running pass {info.name})")
            raise
        return out, True


# ---------------------------------------------------------------- registry

_REGISTRY: dict[str, Callable[[], Pass]] = {}


def register_pass(name: str, factory: Callable[[], Pass], override: bool = False) -> Callable[[], Pass]:
    """Register ``factory`` (called with no arguments) under ``name`` for ``get_pass``."""
    if not isinstance(name, str) or not name:
        raise PassError(f"register_pass: name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise PassError(f"register_pass {name}: factory must be callable, got {factory!r}")
    if name in _REGISTRY and _REGISTRY[name] is not factory and not override:
        raise PassError(f"register_pass: a pass named {name} is already registered")
    _REGISTRY[name] = factory
    return factory


def get_pass(name: str) -> Pass:
    """A new instance of the pass registered as ``name``."""
    try:
        factory = _REGISTRY[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise PassError(f"unknown pass {name!r} (registered passes: {known})") from None
    p = factory()
    if not isinstance(p, Pass):
        raise PassError(f"the factory registered for {name} returned {p!r}, not a Pass")
    return p


def list_passes() -> list[str]:
    """Names of registered passes, sorted."""
    return sorted(_REGISTRY)


__all__ = [
    "PassInfo", "Pass", "ModulePass", "FunctionPass", "Sequential", "PassContext",
    "module_pass", "function_pass", "register_pass", "get_pass", "list_passes",
    "set_default_instruments", "get_default_instruments",
]
