"""Types of the IR: tensors (with possibly unknown ``Any`` dims), tuples, functions."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Callable, Optional, Union

from .errors import PullbackError

DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
HALF_DTYPES = ("float16", "bfloat16")  # 2-byte floats: PyTorch computes on them in float32 ("opmath")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8")
COMPLEX_DTYPES = ("complex64", "complex128")  # accepted only by the operators that say so (fft, view_as_real, ...)
ALL_DTYPES = DTYPES + COMPLEX_DTYPES


class _AnyDim:
    """A dimension unknown until run time (printed ``?``). Use the singleton ``Any``."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "?"

    def __reduce__(self):
        return (_AnyDim, ())


Any = _AnyDim()
Dim = Union[int, _AnyDim]


def check_dtype(dtype: str, where: str = "") -> str:
    """Validate and normalise a dtype name (accepts NumPy dtypes too)."""
    if not isinstance(dtype, str):
        try:
            import numpy as np

            dtype = np.dtype(dtype).name
        except TypeError:
            raise PullbackError(f"{where}unknown dtype {dtype!r}; expected one of {', '.join(ALL_DTYPES)}") from None
    if dtype not in ALL_DTYPES:
        raise PullbackError(f"{where}unknown dtype {dtype!r}; expected one of {', '.join(ALL_DTYPES)}")
    if dtype == "bfloat16":
        _bfloat16()
    return dtype


def _bfloat16():
    """NumPy's bfloat16 (ml_dtypes registers it, so ``np.dtype("bfloat16")`` works once imported)."""
    try:
        import ml_dtypes
    except ImportError:
        raise PullbackError("bfloat16 arrays need ml_dtypes (pip install ml-dtypes)") from None
    return ml_dtypes.bfloat16


def numpy_dtype(dtype: str):
    """The NumPy dtype named ``dtype`` (bfloat16: ml_dtypes', imported on first use)."""
    import numpy as np

    return np.dtype(check_dtype(dtype))


def finfo(dtype: str):
    """``np.finfo`` of a float dtype, bfloat16 included (ml_dtypes' finfo)."""
    import numpy as np

    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.finfo(_bfloat16())
    return np.finfo(dtype)


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_complex(dtype: str) -> bool:
    return dtype in COMPLEX_DTYPES


def is_inexact(dtype: str) -> bool:
    """A real or complex floating-point dtype: values that carry gradients."""
    return dtype in FLOAT_DTYPES or dtype in COMPLEX_DTYPES


def complex_of(dtype: str) -> str:
    """The complex dtype whose parts are ``dtype`` (float32 -> complex64; complex dtypes map to themselves)."""
    return {"float16": "complex64", "bfloat16": "complex64", "float32": "complex64", "float64": "complex128"}.get(dtype, dtype)


def real_of(dtype: str) -> str:
    """The dtype of the real and imaginary parts of ``dtype`` (complex64 -> float32; others map to themselves)."""
    return {"complex64": "float32", "complex128": "float64"}.get(dtype, dtype)


_INT64_MAX = 2**63 - 1  # dimensions and element counts are int64 (as in the text format)


class Type:
    """Base class of types."""

    __slots__ = ()


@dataclass(frozen=True, eq=True)
class TensorType(Type):
    """A tensor of ``shape`` (ints or ``Any``) and ``dtype``; rank 0 is a scalar."""

    shape: tuple
    dtype: str = "float32"

    def __post_init__(self):
        shape = tuple(self.shape)
        dims = []
        bits = 0  # the product of the dims is below 2**bits
        for d in shape:
            if d is not Any:
                if type(d) is not int:
                    if isinstance(d, bool) or not isinstance(d, int) and not hasattr(d, "__index__"):
                        raise PullbackError(f"bad dimension {d!r} in shape {shape}: expected a non-negative int or Any")
                    d = int(d)
                if d < 0:
                    raise PullbackError(f"bad dimension {d!r} in shape {shape}: dimensions cannot be negative")
                bits += d.bit_length()
            dims.append(d)
        object.__setattr__(self, "shape", tuple(dims))
        if bits > 63:
            dims = [d for d in self.shape if d is not Any]
            what = ("a dimension is" if max(dims) > _INT64_MAX else
                    "its number of elements is" if 0 not in dims and math.prod(dims) > _INT64_MAX else None)
            if what:
                raise PullbackError(f"shape {shape} is too large: {what} over {_INT64_MAX} (int64)")
        object.__setattr__(self, "dtype", check_dtype(self.dtype))
        object.__setattr__(self, "_hash", hash((self.shape, self.dtype)))

    def __hash__(self) -> int:  # computed once: types key the type-relation memo of every call
        return self._hash

    def __reduce__(self):  # rebuilt from its fields: a str hash differs between processes
        return (type(self), (self.shape, self.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return Any not in self.shape  # identity: _AnyDim defines no __eq__, and an int is never equal to it

    def __repr__(self) -> str:
        dims = ", ".join(repr(d) for d in self.shape)
        if len(self.shape) == 1:
            dims += ","
        return f"Tensor[({dims}), {self.dtype}]"


class _Composite(Type):
    """A type holding types (TupleType, FuncType): immutable, hashed once at construction (from the
    parts' hashes), compared and printed iteratively, so a tuple type nested thousands deep (the
    residual bundles of nested Ifs) works. Tuple types are interned: equal tuple types are one
    object, so comparing two of them costs nothing however deep they are."""

    __slots__ = ("_hash", "__weakref__")

    def _parts(self) -> tuple:
        raise NotImplementedError

    def _args(self) -> tuple:
        raise NotImplementedError

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if not isinstance(other, _Composite):
            return NotImplemented
        stack = [(self, other)]
        while stack:
            a, b = stack.pop()
            if a is b:
                continue
            if isinstance(a, _Composite):
                if type(a) is not type(b) or a._hash != b._hash:
                    return False
                pa, pb = a._parts(), b._parts()
                if len(pa) != len(pb):
                    return False
                stack.extend(zip(pa, pb))
            elif a != b:
                return False
        return True

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __repr__(self) -> str:
        return _type_repr(self)

    def __reduce__(self):  # rebuilt (so hashed and interned again) where it is unpickled or copied
        return (type(self), self._args())

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


def _init(obj, **fields) -> None:
    for k, v in fields.items():
        object.__setattr__(obj, k, v)


class TupleType(_Composite):
    """A tuple of types (interned: ``TupleType(fs) is TupleType(fs)``)."""

    __slots__ = ("fields",)
    _interned: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()

    def __new__(cls, fields):
        fields = tuple(fields)
        t = cls._interned.get(fields)
        if t is not None:
            return t
        for f in fields:
            if not isinstance(f, Type):
                raise PullbackError(f"TupleType field {f!r} is not a type")
        t = object.__new__(cls)
        _init(t, fields=fields, _hash=hash(("TupleType",) + tuple(map(hash, fields))))
        cls._interned[fields] = t
        return t

    def _parts(self) -> tuple:
        return self.fields

    def _args(self) -> tuple:
        return (self.fields,)


class FuncType(_Composite):
    """The type of a function: argument types and return type."""

    __slots__ = ("arg_types", "ret_type")

    def __init__(self, arg_types, ret_type: Type):
        arg_types = tuple(arg_types)
        _init(self, arg_types=arg_types, ret_type=ret_type,
              _hash=hash(("FuncType", ret_type) + tuple(map(hash, arg_types))))

    def _parts(self) -> tuple:
        return self.arg_types + (self.ret_type,)

    def _args(self) -> tuple:
        return (self.arg_types, self.ret_type)


def type_text_with(ty: Optional[Type], leaf: Callable[[Optional[Type]], str]) -> str:
    """A type as text, iterative on nesting: ``(T1, T2)``, ``fn (T1) -> T2``; ``leaf`` writes the rest."""
    out: list[str] = []
    stack: list = [ty]
    while stack:
        t = stack.pop()
        if isinstance(t, str):
            out.append(t)
        elif isinstance(t, TupleType):
            stack.append(",)" if len(t.fields) == 1 else ")")
            _push_list(stack, t.fields)
            stack.append("(")
        elif isinstance(t, FuncType):
            stack.append(t.ret_type)
            stack.append(") -> ")
            _push_list(stack, t.arg_types)
            stack.append("fn (")
        else:
            out.append(leaf(t))
    return "".join(out)


def _push_list(stack: list, items) -> None:
    """Push ``items`` separated by commas so that they pop left to right."""
    for i in range(len(items) - 1, -1, -1):
        stack.append(items[i])
        if i:
            stack.append(", ")


def _type_repr(ty: Type) -> str:
    return type_text_with(ty, repr)


def flatten_type(ty: Type) -> list[TensorType]:
    """Tensor leaves of a (nested) tuple type, left to right (iterative)."""
    out: list[TensorType] = []
    stack = [ty]
    while stack:
        t = stack.pop()
        if isinstance(t, TupleType):
            stack.extend(reversed(t.fields))
        elif isinstance(t, TensorType):
            out.append(t)
        else:
            raise PullbackError(f"expected a tensor or tuple type, got {t!r}")
    return out


def types_compatible(expected: Type, given: Type) -> bool:
    """Equal types, where an ``Any`` dim on either side matches any size."""
    stack = [(expected, given)]
    while stack:
        a, b = stack.pop()
        if a is b:
            continue
        if isinstance(a, TensorType) and isinstance(b, TensorType):
            if a.dtype != b.dtype or a.ndim != b.ndim:
                return False
            if any(x is not Any and y is not Any and x != y for x, y in zip(a.shape, b.shape)):
                return False
        elif isinstance(a, TupleType) and isinstance(b, TupleType):
            if len(a.fields) != len(b.fields):
                return False
            stack.extend(zip(a.fields, b.fields))
        elif isinstance(a, FuncType) and isinstance(b, FuncType):
            if len(a.arg_types) != len(b.arg_types):
                return False
            stack.extend(zip(a.arg_types, b.arg_types))
            stack.append((a.ret_type, b.ret_type))
        else:
            return False
    return True


def join_types(a: Type, b: Type) -> Optional[Type]:
    """The most precise type both ``a`` and ``b`` fit (dims that differ become Any); None if incompatible.

    Iterative on nesting; parts that are equal are shared, not rebuilt."""
    if not types_compatible(a, b):
        return None
    done: dict = {}  # (id(x), id(y)) -> joined
    stack = [(a, b, False)]
    while stack:
        x, y, ready = stack.pop()
        key = (id(x), id(y))
        if key in done:
            continue
        if x == y:
            done[key] = x
        elif isinstance(x, TensorType):
            done[key] = TensorType(tuple(p if p == q else Any for p, q in zip(x.shape, y.shape)), x.dtype)
        elif not isinstance(x, TupleType):
            done[key] = x
        elif ready:
            done[key] = TupleType(tuple(done[(id(p), id(q))] for p, q in zip(x.fields, y.fields)))
        else:
            stack.append((x, y, True))
            stack.extend((p, q, False) for p, q in zip(x.fields, y.fields))
    return done[(id(a), id(b))]
