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

import inspect
import logging
import threading
from dataclasses import FrozenInstanceError, dataclass
from types import MappingProxyType
from typing import Callable, ClassVar, Iterable, Mapping, Optional

from ..ir.errors import PassError
from ..ir.expr import Function
from ..ir.gc_pause import gc_paused
from ..ir.module import IRModule
from ..pattern import rewrite_module


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
    """A callable ``IRModule -> IRModule`` with ``info`` (name, opt_level, required passes).

    Write a pass as a frozen dataclass subclassing ``ModulePass`` or ``FunctionPass``: options
    are dataclass fields, ``name`` (and ``opt_level``, ``required``) class attributes, and a
    class with a ``name`` is registered for ``get_pass(name)`` by being defined::

        @dataclass(frozen=True)
        class CancelNegations(ModulePass):
            name = "CancelNegations"
            opt_level = 1
            max_rounds: int = 4  # an option

            def transform_module(self, mod, ctx):
                ...

    The class keywords ``name=``, ``opt_level=``, ``required=`` say the same (use ``name=`` when
    an option is itself called ``name``); ``register=False`` keeps a named class out of the
    registry. A class without a name is not registered (a base for other passes); its passes
    are named after the class. Calling a pass runs it in ``PassContext.current()``
    (opt_level, disabled and required checks, instruments).
    """

    name: ClassVar[str]
    opt_level: ClassVar[int] = 0
    required: ClassVar[tuple[str, ...]] = ()
    _pass_info: ClassVar[PassInfo]
    _method: ClassVar[str] = "transform_module"  # what a concrete subclass implements

    def __init_subclass__(cls, *, name: Optional[str] = None, opt_level: Optional[int] = None,
                          required: Optional[Iterable[str]] = None, register: bool = True, **kwargs):
        super().__init_subclass__(**kwargs)
        if name is not None and (not isinstance(name, str) or not name):
            raise PassError(f"pass class {cls.__qualname__}: name must be a non-empty string, got {name!r}")
        own = cls.__dict__.get("name")
        explicit = name or (own if isinstance(own, str) else None)
        cls._pass_info = PassInfo(explicit or cls.__name__,
                                  cls.opt_level if opt_level is None else opt_level,
                                  cls.required if required is None else tuple(_names(required, f"pass {cls.__qualname__}: required")))
        if explicit and register:
            if getattr(cls, cls._method) is getattr(_ABSTRACT.get(cls._method, Pass), cls._method, None):
                raise PassError(f"pass class {cls.__qualname__} ({explicit}) must implement {cls._method}(...)")
            _register_class(explicit, cls)

    @property
    def info(self) -> PassInfo:
        return type(self)._pass_info

    def __call__(self, mod: IRModule) -> IRModule:
        return PassContext.current().run(self, mod)

    def transform_module(self, mod: IRModule, ctx: "PassContext") -> IRModule:
        """Run the pass unconditionally; return ``mod`` itself when nothing changed."""
        raise NotImplementedError(f"{type(self).__name__} must implement transform_module(mod, ctx)")

    def __setattr__(self, key, value):
        raise FrozenInstanceError(f"cannot assign {key!r}: {type(self).__name__} is a pass, and passes are immutable "
                                  "(options are fields of a @dataclass(frozen=True))")

    def __delattr__(self, key):
        self.__setattr__(key, None)

    def __repr__(self) -> str:
        i = self.info
        req = f", required={list(i.required)}" if i.required else ""
        return f"{type(self).__name__}({i.name!r}, opt_level={i.opt_level}{req})"


class ModulePass(Pass):
    """A pass over the whole module: subclasses implement ``transform_module(self, mod, ctx)``."""


class FunctionPass(Pass):
    """A pass applied to every function of the module: subclasses implement
    ``transform_function(self, func, mod, ctx) -> Function``.

    Functions with attribute ``Primitive=1`` are left alone; ``mod`` is the module the pass
    started from. The module object is returned unchanged when no function changed.
    """

    _method = "transform_function"

    def transform_function(self, func: Function, mod: IRModule, ctx: "PassContext") -> Function:
        raise NotImplementedError(f"{type(self).__name__} must implement transform_function(func, mod, ctx)")

    def transform_module(self, mod: IRModule, ctx: "PassContext") -> IRModule:
        updates: dict[str, Function] = {}
        for name, fn in mod.items():
            if fn.is_primitive:
                continue
            new = self.transform_function(fn, mod, ctx)
            if not isinstance(new, Function):
                raise PassError(f"pass {self.info.name} returned {type(new).__name__} for @{name}, expected a Function")
            if new is not fn:
                updates[name] = new
        return mod.with_functions(updates) if updates else mod


class RewritePass(ModulePass):
    """A ModulePass applying the rewrite table ``rules()`` to every function to a fixed point
    (``pattern.rewrite_module``: types are inferred first; nodes shared by functions are rewritten once)."""

    _method = "rules"

    def rules(self) -> list:
        """The ``(pattern, callback)`` table."""
        raise NotImplementedError(f"{type(self).__name__} must implement rules()")

    def transform_module(self, mod: IRModule, ctx: "PassContext") -> IRModule:
        return rewrite_module(self.rules(), mod)


_ABSTRACT = {"transform_module": Pass, "transform_function": FunctionPass, "rules": RewritePass}


@dataclass(frozen=True)
class Sequential(Pass, register=False):
    """Run ``passes`` in order (each through the context checks and instruments).

    Entries may be Pass objects or registered pass names. Before a pass runs, each
    name in its ``info.required`` that has not run on the current module earlier in
    this Sequential is built with ``get_pass`` and run (opt_level does not apply to it).
    """

    passes: tuple = ()
    opt_level: int = 0
    name: str = "sequential"
    required: tuple = ()

    def __post_init__(self):
        passes = self.passes
        if isinstance(passes, (Pass, str)):
            passes = [passes]
        resolved = []
        for i, p in enumerate(passes):
            if isinstance(p, str):
                p = get_pass(p)
            if not isinstance(p, Pass):
                raise PassError(f"Sequential {self.name}: entry {i} is not a Pass, got {p!r}")
            resolved.append(p)
        object.__setattr__(self, "passes", tuple(resolved))
        object.__setattr__(self, "required", _names(self.required, f"Sequential {self.name}: required"))
        object.__setattr__(self, "_info", PassInfo(self.name, self.opt_level, self.required))

    @property
    def info(self) -> PassInfo:
        return self._info

    def transform_module(self, mod: IRModule, ctx: "PassContext") -> IRModule:
        ran_on: dict[str, IRModule] = {}  # pass name -> module it produced when it last ran
        for p in self.passes:
            mod = self.run_entry(p, mod, ctx, ran_on)
        return mod

    def run_entry(self, p: Pass, mod: IRModule, ctx: "PassContext", ran_on: dict) -> IRModule:
        """Run one of ``self.passes`` (its missing requirements first); ``ran_on`` maps a pass name to
        the module it produced when it last ran in this Sequential."""
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


def _make_decorator(kind: str, base: type):
    def decorator(pass_arg=None, opt_level: int = 0, name: Optional[str] = None, required: Iterable[str] = ()):
        def create(target):
            keywords = dict(name=name or getattr(target, "__name__", kind), opt_level=opt_level,
                            required=tuple(_names(required, f"{kind} required")))
            if inspect.isclass(target):
                return _pass_class(target, base, keywords)
            if not callable(target):
                raise PassError(f"@{kind} needs a function or a class, got {target!r}")
            return _function_pass_object(target, base, keywords)

        return create(pass_arg) if pass_arg is not None else create

    decorator.__name__ = kind
    return decorator


def _function_pass_object(fn: Callable, base: type, keywords: dict) -> Pass:
    """An instance of a new (unregistered) ``base`` subclass whose method calls ``fn``."""

    def method(self, *args):
        return fn(*args)

    ns = {base._method: method, "__doc__": fn.__doc__, "__module__": getattr(fn, "__module__", __name__),
          "__wrapped__": fn}
    cls = type(keywords["name"], (base,), ns, register=False, **keywords)
    return cls()


def _pass_class(cls: type, base: type, keywords: dict) -> type:
    """A registered ``base`` subclass whose instances wrap ``cls(*args, **kwargs)`` and call its method."""
    name = base._method
    if not callable(getattr(cls, name, None)):
        raise PassError(f"class {cls.__name__} needs a method {name}(...) to be a pass")

    def __init__(self, *args, **kwargs):
        self.__dict__["_inst"] = cls(*args, **kwargs)

    def __getattr__(self, attr):
        inst = self.__dict__.get("_inst")
        if inst is None:
            raise AttributeError(attr)
        return getattr(inst, attr)

    def method(self, *args):
        return getattr(self._inst, name)(*args)

    ns = {"__init__": __init__, "__getattr__": __getattr__, name: method, "__doc__": cls.__doc__,
          "__module__": cls.__module__, "__qualname__": cls.__qualname__, "pass_class": cls}
    return type(cls.__name__, (base,), ns, **keywords)


module_pass = _make_decorator("module_pass", ModulePass)
module_pass.__doc__ = """Make a ModulePass from ``f(mod, ctx)`` or a class with ``transform_module(self, mod, ctx)``.

Sugar over subclassing ``ModulePass``. Usable bare (``@module_pass``), with options
(``@module_pass(opt_level=2, name=..., required=...)``) or as a call
(``module_pass(f, opt_level=2)``). On a function it returns a pass object (not registered); on a
class it returns a registered ModulePass subclass whose instances wrap ``cls(*args)`` (TVM's form)."""

function_pass = _make_decorator("function_pass", FunctionPass)
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
            # passes make many new acyclic nodes, and checks after them type them: the cyclic GC would only rescan them
            with gc_paused():
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


def _register_class(name: str, cls: type) -> None:
    old = _REGISTRY.get(name)
    same = old is not None and (getattr(old, "__module__", None), getattr(old, "__qualname__", None)) == (cls.__module__, cls.__qualname__)
    if old is not None and old is not cls and not same:
        where = f"{getattr(old, '__module__', '?')}.{getattr(old, '__qualname__', old)}"
        raise PassError(f"a pass named {name} is already registered (by {where}); give {cls.__qualname__} another name")
    _REGISTRY[name] = cls  # a class defined again (same module and name) replaces the old one


def register_pass(name: str, factory: Callable[[], Pass], override: bool = False) -> Callable[[], Pass]:
    """Register ``factory`` (called with no arguments) under ``name`` for ``get_pass``.

    Pass classes with a ``name`` register themselves; this is for other factories."""
    if not isinstance(name, str) or not name:
        raise PassError(f"register_pass: name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise PassError(f"register_pass {name}: factory must be callable, got {factory!r}")
    if name in _REGISTRY and _REGISTRY[name] is not factory and not override:
        raise PassError(f"register_pass: a pass named {name} is already registered")
    _REGISTRY[name] = factory
    return factory


def get_pass(name: str) -> Pass:
    """A new instance of the pass registered as ``name``, with default options."""
    try:
        factory = _REGISTRY[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise PassError(f"unknown pass {name!r} (registered passes: {known})") from None
    if inspect.isclass(factory):
        try:
            inspect.signature(factory).bind()
        except TypeError as e:
            raise PassError(f"pass {name} has options without defaults and cannot be made by name: {e}") from None
    p = factory()
    if not isinstance(p, Pass):
        raise PassError(f"the factory registered for {name} returned {p!r}, not a Pass")
    return p


def list_passes() -> list[str]:
    """Names of registered passes, sorted."""
    return sorted(_REGISTRY)


__all__ = [
    "PassInfo", "Pass", "ModulePass", "FunctionPass", "RewritePass", "Sequential", "PassContext",
    "module_pass", "function_pass", "register_pass", "get_pass", "list_passes",
    "set_default_instruments", "get_default_instruments",
]
