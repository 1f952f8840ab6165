"""Run-time values against IR types: input conversion, output checks, descriptions.

Values are NumPy arrays (or NumPy scalars from kernels) and nested Python
tuples. Everything here is iterative over tuple nesting.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..ir.errors import ExecutionError
from ..ir.types import DTYPES, Any, TensorType, TupleType, Type

# Python data takes the parameter's dtype when its kind matches (like JAX's weak types).
_KIND_OK = {"f": "f", "i": "iu", "u": "iu", "b": "b"}


def describe(value) -> str:
    """A short type-like description of a run-time value."""
    if isinstance(value, (np.ndarray, np.generic)):
        if value.dtype.name in DTYPES:
            return repr(TensorType(value.shape, value.dtype.name))
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def tensor_mismatch(value, ty: TensorType) -> bool:
    """True if ``value`` is not an array of ``ty``'s dtype and shape (Any matches any size)."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None or dtype.name != ty.dtype or len(shape) != len(ty.shape):
        return True
    for d, e in zip(shape, ty.shape):
        if e is not Any and d != e:
            return True
    return False


def find_mismatch(value, ty: Type) -> Optional[tuple[str, Type, object]]:
    """``(path, expected type, value)`` of the first leaf of ``value`` not matching ``ty``, or None."""
    stack = [("", value, ty)]
    while stack:
        path, v, t = stack.pop()
        if isinstance(t, TupleType):
            if not isinstance(v, (tuple, list)) or len(v) != len(t.fields):
                return path, t, v
            stack.extend((f"{path}.{i}", v[i], t.fields[i]) for i in range(len(t.fields) - 1, -1, -1))
        elif isinstance(t, TensorType):
            if tensor_mismatch(v, t):
                return path, t, v
        else:
            return path, t, v
    return None


def _as_array(value, ty: TensorType) -> np.ndarray:
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
    else:
        try:
            arr = np.asarray(value)
        except Exception:  # noqa: BLE001 - ragged lists etc. are reported by the caller
            return value
        want = np.dtype(ty.dtype)
        if arr.dtype != want and arr.dtype.kind in _KIND_OK and want.kind in _KIND_OK[arr.dtype.kind]:
            try:
                arr = np.asarray(value, dtype=want)
            except (OverflowError, ValueError):
                return arr
    view = arr.view()  # read-only view: kernels cannot write into the user's array
    view.flags.writeable = False
    return view


def convert_input(value, ty: Type, name: str, fn_name: str):
    """``value`` as run-time data of type ``ty`` (arrays read-only, lists of tuples as tuples).

    NumPy data must have the parameter's dtype exactly (no silent cast); Python
    scalars and lists take it when the kind matches (float, int, bool).
    """
    # iterative build of nested tuples: ("visit", v, t, path) then ("pack", n)
    out: list = []
    stack: list = [("visit", value, ty, "")]
    while stack:
        item = stack.pop()
        if item[0] == "pack":
            n = item[1]
            fields = tuple(out[len(out) - n:])
            del out[len(out) - n:]
            out.append(fields)
            continue
        _, v, t, path = item
        if isinstance(t, TupleType):
            if not isinstance(v, (tuple, list)) or len(v) != len(t.fields):
                raise _input_error(fn_name, name + path, t, v)
            stack.append(("pack", len(t.fields)))
            stack.extend(("visit", v[i], t.fields[i], f"{path}.{i}") for i in range(len(t.fields) - 1, -1, -1))
        elif isinstance(t, TensorType):
            arr = _as_array(v, t)
            if tensor_mismatch(arr, t):
                raise _input_error(fn_name, name + path, t, arr)
            out.append(arr)
        else:
            raise ExecutionError(f"@{fn_name}: parameter %{name}{path} has type {t!r}, which the executor cannot take as input")
    return out[0]


def _input_error(fn_name: str, name: str, expected: Type, given) -> ExecutionError:
    return ExecutionError(f"@{fn_name}: parameter %{name} expects {expected!r}, got {describe(given)}")


def to_output(value):
    """Returned data: NumPy scalars become 0-d arrays, lists become tuples (iterative)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    if not isinstance(value, (tuple, list)):
        return value
    out: list = []
    stack: list = [("visit", value)]
    while stack:
        item = stack.pop()
        if item[0] == "pack":
            n = item[1]
            fields = tuple(out[len(out) - n:])
            del out[len(out) - n:]
            out.append(fields)
            continue
        v = item[1]
        if isinstance(v, (tuple, list)):
            stack.append(("pack", len(v)))
            stack.extend(("visit", v[i]) for i in range(len(v) - 1, -1, -1))
        else:
            out.append(np.asarray(v) if isinstance(v, np.generic) else v)
    return out[0]


def leaves(value) -> list:
    """Array leaves of a nested tuple value."""
    out = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (tuple, list)):
            stack.extend(reversed(v))
        else:
            out.append(v)
    return out
