"""Expression nodes: immutable, compared by identity, forming a DAG.

Sharing a node object means computing it once. Structural comparison lives in
``ir.structural``; nodes themselves hash and compare by identity so they can
key dictionaries in passes.
"""

from __future__ import annotations

import itertools
import math
from typing import Any as _Any
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from .errors import PullbackError, TypeInferenceError
from .types import FLOAT_DTYPES, FuncType, TensorType, TupleType, Type, check_dtype, finfo, is_complex, is_inexact, real_of

_ids = itertools.count()


class Op:
    """Base of operator definitions (``ops.OpDef``); ``name`` is the Relay name.

    The type rules call ``check_arity(nargs)`` then ``infer(arg_types, attrs)``."""

    name: str = "?"

    def infer(self, arg_types: list, attrs) -> Type:
        """The result type for operands of ``arg_types`` (raises TypeInferenceError)."""
        raise TypeInferenceError(f"operator {self.name} has no type relation")

    def check_arity(self, nargs: int) -> None:
        """Raise TypeInferenceError unless the operator takes ``nargs`` operands."""

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


def _infer_types(node: "Expr"):
    """``type_rules.infer_types`` (which imports this module): bound on first use, then called directly."""
    global _infer_types
    from .type_rules import infer_types

    _infer_types = infer_types
    return infer_types(node)


class Expr:
    """Base class of expressions."""

    __slots__ = ("_checked_type", "_uid", "span", "__weakref__")
    _fields: tuple = ()

    def __init__(self) -> None:
        # the slots' own setters: the fields below are mutable, but not through this class's __setattr__ (speed)
        set_type(self, None)
        _set_uid(self, next(_ids))
        set_span(self, None)

    # immutability: fields are set once in __init__ through the slots' setters or object.__setattr__
    def __setattr__(self, key, value):
        if key in ("_checked_type", "span", "_uid") or not hasattr(self, "_uid"):
            object.__setattr__(self, key, value)
        else:
            raise AttributeError(f"{type(self).__name__} nodes are immutable; use .replace({key}=...)")

    @property
    def checked_type(self) -> Type:
        """The type of this node, computed on first access and cached (``ir.type_rules``).

        Computing it types the untyped nodes below (iteratively); a call to a module
        function needs its module: run ``transform.InferType()`` (or
        ``analysis.infer_expr(expr, mod)``) for those. Type errors raise TypeInferenceError."""
        t = self._checked_type
        if t is None:
            t = _infer_types(self)
        return t

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


# The slots' setters, for the hot paths that give a node its type or span (``node._checked_type = t`` goes
# through ``Expr.__setattr__``, a Python call, on every node a pass types)
set_type = Expr._checked_type.__set__
set_span = Expr.span.__set__
_set_uid = Expr._uid.__set__


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
    """A constant tensor; ``data`` is a read-only NumPy array (copied on creation, in native byte order)."""

    __slots__ = ("data",)
    _fields = ("data",)

    def __init__(self, data):
        super().__init__()
        arr = np.array(data, copy=True)
        check_dtype(arr.dtype.name, "constant: ")
        if not arr.dtype.isnative:  # big-endian data: the values in native byte order
            arr = arr.astype(arr.dtype.newbyteorder("="))
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
        if not isinstance(op, (Op, GlobalVar, Function)):
            raise PullbackError(f"Call: op must be an operator, GlobalVar or Function, got {op!r}")
        if type(args) is not tuple:
            args = tuple(args)
        for a in args:
            if not isinstance(a, Expr):
                i = next(i for i, a in enumerate(args) if not isinstance(a, Expr))
                raise PullbackError(f"Call to {getattr(op, 'name', getattr(op, 'name_hint', op))}: argument {i} is not an expression: {args[i]!r}")
        set_type(self, None)  # Expr.__init__, inline: calls are most of the nodes
        _set_uid(self, next(_ids))
        set_span(self, None)
        _set_op(self, op)
        _set_args(self, args)
        _set_attrs(self, attrs)

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


_set_op, _set_args, _set_attrs = Call.op.__set__, Call.args.__set__, Call.attrs.__set__


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


CUSTOM_VJP = "custom_vjp"


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

    @property
    def custom_vjp(self) -> Optional[str]:
        """The name of the module function AD calls for this function's vector-Jacobian product instead of
        differentiating its body (attribute ``custom_vjp``, e.g. an imported ``torch.autograd.Function``), or None.
        It takes this function's parameters, then one cotangent per floating-point leaf of its result, and returns
        the tuple of the parameters' gradients."""
        return self.attrs.get(CUSTOM_VJP)

    def with_attr(self, key: str, value) -> "Function":
        attrs = dict(self.attrs)
        attrs[key] = value
        return self.replace(attrs=FrozenAttrs(attrs))

    @property
    def func_type(self) -> FuncType:
        ret = self.ret_type if self.ret_type is not None else self.body.checked_type
        return FuncType(tuple(p.type_annotation for p in self.params), ret)


def freeze(value):
    """``value`` made immutable for an attribute: lists (and tuples of them) become tuples, dicts
    ``FrozenAttrs``, sets frozensets, arrays read-only copies (iterative on nesting)."""
    kinds = (list, tuple, dict, set, np.ndarray)
    if not isinstance(value, kinds) or isinstance(value, FrozenAttrs):
        return value
    done: dict[int, object] = {}
    stack = [(value, False)]
    while stack:
        v, expanded = stack.pop()
        if id(v) in done:
            continue
        items = list(v.items()) if isinstance(v, dict) else None
        kids = [c for _, c in items] if items is not None else (list(v) if isinstance(v, (list, tuple, set)) else [])
        if not expanded:
            stack.append((v, True))
            stack.extend((c, False) for c in kids if isinstance(c, kinds) and not isinstance(c, FrozenAttrs))
            continue

        def get(c):
            return done[id(c)] if isinstance(c, kinds) and not isinstance(c, FrozenAttrs) else c

        if isinstance(v, np.ndarray):
            arr = np.array(v, copy=True)
            arr.flags.writeable = False
            done[id(v)] = arr
        elif items is not None:
            done[id(v)] = FrozenAttrs({k: get(c) for k, c in items})
        elif isinstance(v, set):
            done[id(v)] = frozenset(get(c) for c in v)
        else:
            done[id(v)] = tuple(get(c) for c in v)
    return done[id(value)]


def attr_key(value):
    """A hashable key of an attribute value, equal for values that are the same: NaN floats compare
    by their bits (so a NaN attribute equals itself after a round trip), containers item by item,
    arrays by dtype, shape and bytes, attrs dataclasses field by field (iterative on nesting)."""
    import dataclasses

    def leaf(v):
        if isinstance(v, float) and v != v:
            return ("nan", np.float64(v).tobytes())
        if isinstance(v, np.floating) and v != v:
            return ("nan", v.dtype.name, v.tobytes())
        if isinstance(v, np.ndarray):
            return ("array", v.dtype.str, v.shape, v.tobytes())
        return v

    def parts(v):
        if isinstance(v, (tuple, list)):
            return type(v).__name__, list(v)
        if isinstance(v, (frozenset, set)):
            return type(v).__name__, list(v)
        if isinstance(v, Mapping):
            return "map", [k for kv in sorted(v.items(), key=lambda kv: str(kv[0])) for k in kv]
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return type(v), [getattr(v, f.name) for f in dataclasses.fields(v)]
        return None

    done: dict[int, object] = {}
    stack = [(value, False)]
    while stack:
        v, expanded = stack.pop()
        p = parts(v)
        if p is None:
            done[id(v)] = leaf(v)
            continue
        tag, items = p
        if not expanded:
            stack.append((v, True))
            stack.extend((c, False) for c in items)
            continue
        keys = tuple(done[id(c)] for c in items)
        done[id(v)] = (tag, frozenset(keys) if tag in ("frozenset", "set") else keys)
    return done[id(value)]


def same_attr_value(a, b) -> bool:
    """``a == b`` for attribute values, where NaN equals NaN of the same bits (never raises)."""
    if a is b:
        return True
    try:
        if bool(a == b):
            return True
    except Exception:  # noqa: BLE001 - values holding arrays compare ambiguously
        pass
    try:
        return attr_key(a) == attr_key(b)
    except TypeError:
        return type(a) is type(b) and repr(a) == repr(b)


class FrozenAttrs(Mapping):
    """An immutable str -> value mapping used for Function attributes; values are frozen
    (``freeze``: lists become tuples) and NaN values compare by their bits."""

    __slots__ = ("_d",)

    def __init__(self, d: Mapping):
        items = dict(d)
        for k in items:
            if not isinstance(k, str):
                raise PullbackError(f"attribute names are strings, got {k!r}")
        self._d = {k: freeze(v) for k, v in items.items()}

    def __getitem__(self, k):
        return self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)

    def __eq__(self, other):
        if not isinstance(other, Mapping) or len(self) != len(other):
            return False
        return all(k in other and same_attr_value(v, other[k]) for k, v in self._d.items())

    def __hash__(self):
        try:
            return hash(attr_key(self))
        except TypeError:  # an unhashable value: equal mappings still share this hash
            return hash(tuple(sorted(self._d)))

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


_RANGE: dict = {}  # dtype -> (min, max) representable (finite floats), NaN and inf included for floats


def _range(dtype: str) -> tuple:
    dtype = real_of(dtype)
    if dtype in FLOAT_DTYPES:
        return (-math.inf, math.inf) if dtype == "float64" else (-float(finfo(dtype).max), float(finfo(dtype).max))
    return (0, 1) if dtype == "bool" else (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))


def exact_array(value, dtype: str, what: str = "const") -> np.ndarray:
    """``value`` as a NumPy array of ``dtype``, or a PullbackError when a value is not representable:
    a finite value overflowing to inf, an integer out of range, a fraction, NaN or inf for an
    integer dtype, a number other than 0 or 1 for bool."""
    dtype = check_dtype(dtype, f"{what}: ")
    if type(value) is float or (type(value) is int and abs(value) < 2**63):  # a Python number: the quick check
        lo, hi = _RANGE.get(dtype) or _RANGE.setdefault(dtype, _range(dtype))
        if lo <= value <= hi and (type(value) is int or is_inexact(dtype)):
            return np.asarray(value, dtype=dtype)
    try:
        src = np.asarray(value)
        if src.dtype == object:  # Python ints beyond int64
            if dtype not in FLOAT_DTYPES:
                raise OverflowError(f"{dtype} holds integers from {np.iinfo(dtype).min} to {np.iinfo(dtype).max}")
            src = np.asarray(value, dtype=np.float64)
    except (OverflowError, TypeError, ValueError) as e:
        raise PullbackError(f"{what}: {value!r} is not representable in {dtype}: {e}") from None
    if src.dtype.name == "bfloat16":  # ml_dtypes' kind is "V": its values, exactly, as float32
        src = src.astype(np.float32)
    if src.dtype.kind not in ("biufc" if is_complex(dtype) else "biuf"):
        kind = f"{dtype} holds real numbers" if src.dtype.kind == "c" else "expected numbers"
        raise PullbackError(f"{what}: {kind}, got {src.dtype} values {value!r}")
    with np.errstate(all="ignore"):
        out = src.astype(dtype)
    bad = None
    if is_inexact(dtype):
        bad = np.isinf(out) & np.isfinite(src)
        why = f"it overflows to inf (largest {real_of(dtype)}: {float(finfo(real_of(dtype)).max):g})"
    elif dtype == "bool":
        bad = (src != 0) & (src != 1)
        why = "a bool constant holds 0/1 or True/False"
    else:
        info = np.iinfo(dtype)
        if src.dtype.kind == "f":
            bad = ~np.isfinite(src) | (src != np.round(src)) | (src < info.min) | (src > info.max)
            why = f"{dtype} holds integers from {info.min} to {info.max}"
        elif src.dtype.kind in "iu" and src.size:
            bad = (src < info.min) | (src > info.max)
            why = f"{dtype} holds integers from {info.min} to {info.max}"
    if bad is not None and np.any(bad):
        first = src[bad].reshape(-1)[0] if src.ndim else src
        raise PullbackError(f"{what}: the value {first.item()!r} is not representable in {dtype}: {why}")
    return out


def const(value, dtype: Optional[str] = None) -> Constant:
    """A constant; Python floats default to float32 and ints to int32, as in Relay.

    A value ``dtype`` (or the default) cannot represent is an error, not inf or a wrapped integer."""
    if isinstance(value, Constant):
        return value
    if dtype is None:
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError, OverflowError) as e:
            raise PullbackError(f"const: {value!r} is not an array of numbers: {e}") from None
        if not isinstance(value, (np.ndarray, np.generic)):  # Python numbers (and lists): Relay's defaults
            default = {"float64": "float32", "int64": "int32", "object": "int32", "complex128": "complex64"}.get(arr.dtype.name)
            arr = exact_array(value, default) if default else arr
    else:
        arr = exact_array(value, dtype)
    return Constant(arr)


def known_type(e: Expr) -> Optional[Type]:
    """The type of ``e`` if it is known without inference (annotation or cache)."""
    if e._checked_type is not None:
        return e._checked_type
    if isinstance(e, Var):
        return e.type_annotation
    return None


def is_weak_scalar(value) -> bool:
    """A Python ``bool``/``int``/``float`` (not a NumPy scalar): it takes the dtype of the tensor it meets."""
    return isinstance(value, (bool, int, float)) and not isinstance(value, np.generic)


def _dtype_of(e: Expr) -> Optional[str]:
    t = e._checked_type
    if t is None:
        try:
            t = e.checked_type
        except PullbackError:  # not typeable alone (a call to a module function, an ill-typed operand)
            return None
    return t.dtype if isinstance(t, TensorType) else None


def weak_const(value, dtype: Optional[str]) -> Constant:
    """The Python scalar ``value`` meeting a tensor of ``dtype`` (None: unknown, Relay's defaults).

    A float meeting an integer tensor is a TypeInferenceError (pullback does not promote
    implicitly); an int or float meeting a bool tensor keeps Relay's default dtype."""
    if dtype is None or (dtype == "bool" and type(value) is not bool):
        return const(value)
    if not is_inexact(dtype) and dtype != "bool" and isinstance(value, float):
        raise TypeInferenceError(
            f"the Python float {value!r} meets a tensor of dtype {dtype}, and pullback does not promote implicitly: "
            f"cast the tensor (op.cast(x, \"float32\")) or use an integer"
        )
    return const(value, dtype)


def as_expr(value, like=None) -> Expr:
    """``value`` as an operand: an expression as it is; a Python scalar *weak* (as in JAX, NumPy 2
    and PyTorch), taking the dtype of ``like`` (an expression, or the operands of the call it goes
    into: the first non-bool tensor among them, known from its ``checked_type``); anything else
    (arrays, NumPy scalars, lists) a ``const`` of its own dtype."""
    if isinstance(value, Expr):
        return value
    if not is_weak_scalar(value):
        return const(value)
    operands = (like,) if isinstance(like, Expr) else like or ()
    dtypes = [d for d in (_dtype_of(v) for v in operands if isinstance(v, Expr)) if d is not None]
    return weak_const(value, next((d for d in dtypes if d != "bool"), dtypes[0] if dtypes else None))


def tuple_type_of(fields: Sequence[Type]) -> TupleType:
    return TupleType(tuple(fields))
