"""Expression nodes: immutable, compared by identity, forming a DAG.

Sharing a node object means computing it once. Structural comparison lives in
``ir.structural``; nodes themselves hash and compare by identity so they can
key dictionaries in passes.
"""

from __future__ import annotations

import itertools
from typing import Any as _Any
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from .errors import PullbackError, TypeInferenceError
from .types import FuncType, TensorType, TupleType, Type, check_dtype

_ids = itertools.count()


class Op:
    """Base of operator definitions (``ops.OpDef``); ``name`` is the Relay name."""

    name: str = "?"

    def __repr__(self) -> str:
        return f"Op({self.name})"


# ``ops`` installs the builders used by Python arithmetic on expressions, so the
# ir layer never imports the ops layer.
_ARITH: dict[str, Callable[..., "Expr"]] = {}


def install_arith(name: str, builder: Callable[..., "Expr"]) -> None:
    """Register the builder Python's ``+ - * / -x`` call (done by ``pullback.ops``)."""
    _ARITH[name] = builder


# ``text`` installs the printer (it sits above ``ops``); until then nodes print as ``<Call #12>``.
_PRINTER: list = []


def install_printer(astext: Callable[[_Any], str]) -> None:
    """Register the text printer used by ``repr`` of nodes and ``IRModule.astext`` (done by ``pullback.text``)."""
    _PRINTER[:] = [astext]


def to_text(obj) -> Optional[str]:
    """``obj`` in the text format, or None when the printer is not installed or fails."""
    if not _PRINTER:
        return None
    try:
        return _PRINTER[0](obj)
    except Exception:  # noqa: BLE001 - callers fall back to a short description
        return None


def _arith(name: str, *args: _Any) -> "Expr":
    try:
        builder = _ARITH[name]
    except KeyError:
        raise PullbackError(f"operator {name!r} is not registered; import pullback.ops") from None
    return builder(*args)


def _same(old, new) -> bool:
    """Same object, or tuples of the same objects (``replace`` keeps identity then)."""
    if old is new:
        return True
    if type(old) is tuple and type(new) is tuple and len(old) == len(new):
        return all(a is b for a, b in zip(old, new))
    return False


class Expr:
    """Base class of expressions."""

    __slots__ = ("_checked_type", "_uid", "span", "__weakref__")
    _fields: tuple = ()

    def __init__(self) -> None:
        self._checked_type: Optional[Type] = None
        self._uid = next(_ids)
        self.span = None

    # immutability: fields are set once in __init__ through object.__setattr__
    def __setattr__(self, key, value):
        if key in ("_checked_type", "span", "_uid") or not hasattr(self, "_uid"):
            object.__setattr__(self, key, value)
        else:
            raise AttributeError(f"{type(self).__name__} nodes are immutable; use .replace({key}=...)")

    @property
    def checked_type(self) -> Type:
        """The type set by ``InferType``; raises if types were not inferred."""
        if self._checked_type is None:
            raise TypeInferenceError(
                f"the type of this {type(self).__name__} is not inferred yet; run transform.InferType() first"
            )
        return self._checked_type

    @property
    def has_type(self) -> bool:
        return self._checked_type is not None

    def children(self) -> tuple:
        """Sub-expressions evaluated in the same scope (Function bodies excluded)."""
        return ()

    def replace(self, **changes) -> "Expr":
        """A copy with ``changes``; returns ``self`` when every field is the same object."""
        if all(_same(getattr(self, k), v) for k, v in changes.items()):
            return self
        kw = {f: getattr(self, f) for f in self._fields}
        kw.update(changes)
        new = type(self)(**kw)
        new.span = self.span
        return new

    # Python sugar, as in Relay
    def __add__(self, other):
        return _arith("add", self, other)

    def __radd__(self, other):
        return _arith("add", other, self)

    def __sub__(self, other):
        return _arith("subtract", self, other)

    def __rsub__(self, other):
        return _arith("subtract", other, self)

    def __mul__(self, other):
        return _arith("multiply", self, other)

    def __rmul__(self, other):
        return _arith("multiply", other, self)

    def __truediv__(self, other):
        return _arith("divide", self, other)

    def __rtruediv__(self, other):
        return _arith("divide", other, self)

    def __neg__(self):
        return _arith("negative", self)

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            return TupleGetItem(self, int(index))
        raise PullbackError(f"expr[...] builds TupleGetItem and needs an int index, got {index!r}")

    def __iter__(self):
        raise TypeError("expressions are not iterable; use expr[i] for tuple fields")

    def __bool__(self):
        return True

    def __repr__(self) -> str:
        text = to_text(self)
        return text if text is not None else f"<{type(self).__name__} #{self._uid}>"


class Var(Expr):
    """A variable: function parameter. ``type_annotation`` is required for typing."""

    __slots__ = ("name_hint", "type_annotation")
    _fields = ("name_hint", "type_annotation")

    def __init__(self, name_hint: str, type_annotation: Optional[Type] = None):
        super().__init__()
        if not isinstance(name_hint, str) or not name_hint:
            raise PullbackError(f"Var name must be a non-empty string, got {name_hint!r}")
        if type_annotation is not None and not isinstance(type_annotation, Type):
            raise PullbackError(f"Var {name_hint!r}: type_annotation must be a Type, got {type_annotation!r}")
        object.__setattr__(self, "name_hint", name_hint)
        object.__setattr__(self, "type_annotation", type_annotation)

    def replace(self, **changes):
        # a Var's identity is its binding: replacing fields makes a new variable
        return super().replace(**changes)


class GlobalVar(Expr):
    """A name of a function in an IRModule, e.g. ``@main``."""

    __slots__ = ("name_hint",)
    _fields = ("name_hint",)

    def __init__(self, name_hint: str):
        super().__init__()
        if not isinstance(name_hint, str) or not name_hint:
            raise PullbackError(f"GlobalVar name must be a non-empty string, got {name_hint!r}")
        object.__setattr__(self, "name_hint", name_hint)


class Constant(Expr):
    """A constant tensor; ``data`` is a read-only NumPy array (copied on creation)."""

    __slots__ = ("data",)
    _fields = ("data",)

    def __init__(self, data):
        super().__init__()
        arr = np.array(data, copy=True)
        check_dtype(arr.dtype.name, "constant: ")
        arr.flags.writeable = False
        object.__setattr__(self, "data", arr)
        object.__setattr__(self, "_checked_type", TensorType(arr.shape, arr.dtype.name))

    def replace(self, **changes):
        if "data" in changes and changes["data"] is not self.data:
            return Constant(changes["data"])
        return self


class Call(Expr):
    """``op(args...)`` with ``attrs``; ``op`` is an operator, a GlobalVar or a primitive Function."""

    __slots__ = ("op", "args", "attrs")
    _fields = ("op", "args", "attrs")

    def __init__(self, op, args: Sequence[Expr], attrs=None):
        super().__init__()
        if not isinstance(op, (Op, GlobalVar, Function)):
            raise PullbackError(f"Call: op must be an operator, GlobalVar or Function, got {op!r}")
        args = tuple(args)
        for i, a in enumerate(args):
            if not isinstance(a, Expr):
                raise PullbackError(f"Call to {getattr(op, 'name', getattr(op, 'name_hint', op))}: argument {i} is not an expression: {a!r}")
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "attrs", attrs)

    def children(self) -> tuple:
        return self.args

    @property
    def op_name(self) -> str:
        op = self.op
        if isinstance(op, Op):
            return op.name
        if isinstance(op, GlobalVar):
            return "@" + op.name_hint
        return "fn"


class Tuple(Expr):
    """A tuple of expressions."""

    __slots__ = ("fields",)
    _fields = ("fields",)

    def __init__(self, fields: Sequence[Expr]):
        super().__init__()
        fields = tuple(fields)
        for i, f in enumerate(fields):
            if not isinstance(f, Expr):
                raise PullbackError(f"Tuple field {i} is not an expression: {f!r}")
        object.__setattr__(self, "fields", fields)

    def children(self) -> tuple:
        return self.fields

    def __len__(self) -> int:
        return len(self.fields)


class TupleGetItem(Expr):
    """Field ``index`` of a tuple-valued expression (``expr[index]``)."""

    __slots__ = ("tuple_value", "index")
    _fields = ("tuple_value", "index")

    def __init__(self, tuple_value: Expr, index: int):
        super().__init__()
        if not isinstance(tuple_value, Expr):
            raise PullbackError(f"TupleGetItem of a non-expression {tuple_value!r}")
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
            raise PullbackError(f"TupleGetItem index must be a non-negative int, got {index!r}")
        object.__setattr__(self, "tuple_value", tuple_value)
        object.__setattr__(self, "index", int(index))

    def children(self) -> tuple:
        return (self.tuple_value,)


class If(Expr):
    """``if (cond) {true_branch} else {false_branch}``; only the taken branch runs."""

    __slots__ = ("cond", "true_branch", "false_branch")
    _fields = ("cond", "true_branch", "false_branch")

    def __init__(self, cond: Expr, true_branch: Expr, false_branch: Expr):
        super().__init__()
        for name, e in (("cond", cond), ("true_branch", true_branch), ("false_branch", false_branch)):
            if not isinstance(e, Expr):
                raise PullbackError(f"If: {name} is not an expression: {e!r}")
        object.__setattr__(self, "cond", cond)
        object.__setattr__(self, "true_branch", true_branch)
        object.__setattr__(self, "false_branch", false_branch)

    def children(self) -> tuple:
        return (self.cond, self.true_branch, self.false_branch)


class Function(Expr):
    """``fn(params) -> ret_type { body }``; ``attrs`` is a read-only mapping (e.g. Primitive=1)."""

    __slots__ = ("params", "body", "ret_type", "attrs")
    _fields = ("params", "body", "ret_type", "attrs")

    def __init__(self, params: Sequence[Var], body: Expr, ret_type: Optional[Type] = None, attrs: Optional[Mapping] = None):
        super().__init__()
        params = tuple(params)
        for i, p in enumerate(params):
            if not isinstance(p, Var):
                raise PullbackError(f"Function parameter {i} is not a Var: {p!r}")
        if len({id(p) for p in params}) != len(params):
            raise PullbackError("Function parameters must be distinct Vars")
        if not isinstance(body, Expr):
            raise PullbackError(f"Function body is not an expression: {body!r}")
        if ret_type is not None and not isinstance(ret_type, Type):
            raise PullbackError(f"Function ret_type must be a Type, got {ret_type!r}")
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "body", body)
        object.__setattr__(self, "ret_type", ret_type)
        object.__setattr__(self, "attrs", FrozenAttrs(attrs or {}))

    @property
    def is_primitive(self) -> bool:
        return bool(self.attrs.get("Primitive", 0))

    def with_attr(self, key: str, value) -> "Function":
        attrs = dict(self.attrs)
        attrs[key] = value
        return self.replace(attrs=FrozenAttrs(attrs))

    @property
    def func_type(self) -> FuncType:
        ret = self.ret_type if self.ret_type is not None else self.body.checked_type
        return FuncType(tuple(p.type_annotation for p in self.params), ret)


class FrozenAttrs(Mapping):
    """An immutable str -> value mapping used for Function attributes."""

    __slots__ = ("_d",)

    def __init__(self, d: Mapping):
        self._d = dict(d)

    def __getitem__(self, k):
        return self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)

    def __eq__(self, other):
        return isinstance(other, Mapping) and dict(self) == dict(other)

    def __hash__(self):
        return hash(tuple(sorted(self._d.items())))

    def __repr__(self):
        return f"FrozenAttrs({self._d!r})"


# ---------------------------------------------------------------- builders


def var(name: str, type_: Optional[Type] = None, shape=None, dtype: str = "float32") -> Var:
    """``var("x", shape=(2, 3))`` or ``var("x", TensorType(...))``, as in Relay."""
    if type_ is not None and shape is not None:
        raise PullbackError(f"var {name!r}: give either a type or a shape, not both")
    if type_ is None:
        if shape is None:
            raise PullbackError(f"var {name!r}: a type or a shape is required")
        type_ = TensorType(tuple(shape) if not isinstance(shape, int) else (shape,), dtype)
    elif isinstance(type_, (tuple, list)):
        type_ = TensorType(tuple(type_), dtype)
    return Var(name, type_)


def const(value, dtype: Optional[str] = None) -> Constant:
    """A constant; Python floats default to float32 and ints to int32, as in Relay."""
    if isinstance(value, Constant):
        return value
    if dtype is None:
        arr = np.asarray(value)
        if arr.dtype == np.float64 and not isinstance(value, (np.ndarray, np.generic)):
            arr = arr.astype("float32")
        elif arr.dtype == np.int64 and not isinstance(value, (np.ndarray, np.generic)):
            arr = arr.astype("int32")
    else:
        arr = np.asarray(value, dtype=check_dtype(dtype, "const: "))
    return Constant(arr)


def known_type(e: Expr) -> Optional[Type]:
    """The type of ``e`` if it is known without inference (annotation or cache)."""
    if e._checked_type is not None:
        return e._checked_type
    if isinstance(e, Var):
        return e.type_annotation
    return None


def as_expr(value, like: Optional[Expr] = None) -> Expr:
    """Turn a Python scalar/array into a Constant, taking the dtype of ``like`` when known."""
    if isinstance(value, Expr):
        return value
    if like is not None:
        t = known_type(like)
        if isinstance(t, TensorType):
            return const(value, t.dtype)
    return const(value)


def tuple_type_of(fields: Sequence[Type]) -> TupleType:
    return TupleType(tuple(fields))
