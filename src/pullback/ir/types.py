"""Types of the IR: tensors (with possibly unknown ``Any`` dims), tuples, functions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from .errors import PullbackError

DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
FLOAT_DTYPES = ("float16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8")


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
            raise PullbackError(f"{where}unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}") from None
    if dtype not in DTYPES:
        raise PullbackError(f"{where}unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    return dtype


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


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
        for d in shape:
            if d is Any:
                continue
            if isinstance(d, bool) or not isinstance(d, (int,)) and not hasattr(d, "__index__"):
                raise PullbackError(f"bad dimension {d!r} in shape {shape}: expected a non-negative int or Any")
            if int(d) < 0:
                raise PullbackError(f"bad dimension {d!r} in shape {shape}: dimensions cannot be negative")
        object.__setattr__(self, "shape", tuple(d if d is Any else int(d) for d in shape))
        object.__setattr__(self, "dtype", check_dtype(self.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(d is not Any for d in self.shape)

    def __repr__(self) -> str:
        dims = ", ".join(repr(d) for d in self.shape)
        if len(self.shape) == 1:
            dims += ","
        return f"Tensor[({dims}), {self.dtype}]"


@dataclass(frozen=True, eq=True)
class TupleType(Type):
    """A tuple of types."""

    fields: tuple

    def __post_init__(self):
        fields = tuple(self.fields)
        for f in fields:
            if not isinstance(f, Type):
                raise PullbackError(f"TupleType field {f!r} is not a type")
        object.__setattr__(self, "fields", fields)

    def __repr__(self) -> str:
        inner = ", ".join(repr(f) for f in self.fields)
        if len(self.fields) == 1:
            inner += ","
        return f"({inner})"


@dataclass(frozen=True, eq=True)
class FuncType(Type):
    """The type of a function: argument types and return type."""

    arg_types: tuple
    ret_type: Type

    def __post_init__(self):
        object.__setattr__(self, "arg_types", tuple(self.arg_types))

    def __repr__(self) -> str:
        return f"fn ({', '.join(repr(a) for a in self.arg_types)}) -> {self.ret_type!r}"


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
    """The most precise type both ``a`` and ``b`` fit (dims that differ become Any); None if incompatible."""
    if not types_compatible(a, b):
        return None
    if a == b:
        return a
    if isinstance(a, TensorType):
        return TensorType(tuple(x if x == y else Any for x, y in zip(a.shape, b.shape)), a.dtype)
    if isinstance(a, TupleType):
        return TupleType(tuple(join_types(x, y) for x, y in zip(a.fields, b.fields)))
    return a
