"""Run-time values against IR types: input conversion, output checks, descriptions.

Values are a target's arrays (NumPy arrays or scalars, torch tensors, jax
arrays) and nested Python tuples. Everything here is iterative over tuple
nesting. Inputs go through one check on every target (``convert_input``): an
input is NumPy data, Python data (scalars, nested lists), a torch tensor or a
jax array; NumPy data in a non-native byte order is converted to native order
first (never reinterpreted); then shape and dtype are compared with the
parameter's type, and the target converts the accepted value (``Target.take``).
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..ir.errors import ExecutionError
from ..ir.types import ALL_DTYPES, Any, TensorType, TupleType, Type

# Python data takes the parameter's dtype when its kind matches (like JAX's weak types).
_KIND_OK = {"f": "f", "i": "iu", "u": "iu", "b": "b"}


def dtype_name(dtype) -> str:
    """``"float32"`` for NumPy/jax dtypes and for ``torch.float32``."""
    name = getattr(dtype, "name", None)
    return name if isinstance(name, str) else str(dtype).rpartition(".")[2]


def describe(value) -> str:
    """A short type-like description of a run-time value."""
    dtype = getattr(value, "dtype", None)
    shape = getattr(value, "shape", None)
    if dtype is not None and shape is not None:
        name = dtype_name(dtype)
        if name in ALL_DTYPES:
            return repr(TensorType(tuple(shape), name))
        return f"an array of shape {tuple(shape)} and dtype {name}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def tensor_mismatch(value, ty: TensorType) -> bool:
    """True if ``value`` is not an array of ``ty``'s dtype and shape (Any matches any size)."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None or len(shape) != len(ty.shape):
        return True
    name = getattr(dtype, "name", None)
    if name != ty.dtype and (isinstance(name, str) or dtype_name(dtype) != ty.dtype):
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


def is_foreign_array(value) -> bool:
    """A torch tensor or a jax array (checked by module name: neither library is imported here)."""
    return type(value).__module__.split(".", 1)[0] in ("torch", "jax", "jaxlib") and hasattr(value, "dtype")


def native(value, ty: TensorType):
    """``value`` as an array to check against ``ty``: NumPy data in native byte order, Python data
    as a NumPy array (of ``ty``'s dtype when the kinds match), torch and jax arrays unchanged."""
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        arr = np.asarray(value)
        return arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("="))
    if is_foreign_array(value):
        return value
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
    return arr


def to_numpy(value) -> np.ndarray:
    """A checked input as a NumPy array: torch tensors detached and on the CPU (no copy there),
    jax arrays through ``np.asarray`` (no copy on the CPU)."""
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith("torch"):
        return tensor_numpy(value.detach().cpu())
    return np.asarray(value)


def tensor_numpy(t) -> np.ndarray:
    """``t.numpy()`` (the tensor's memory), bfloat16 included (torch has no NumPy bfloat16: its bits)."""
    if str(t.dtype) != "torch.bfloat16":
        return t.numpy()
    import torch

    return t.view(torch.int16).numpy().view(np.dtype("bfloat16"))


def numpy_tensor(torch, a: np.ndarray):
    """``torch.from_numpy(a)`` (the array's memory), bfloat16 included."""
    if a.dtype.name != "bfloat16":
        return torch.from_numpy(a)
    return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)


def read_only(arr) -> np.ndarray:
    """A checked input as a read-only NumPy view: kernels cannot write into the user's array."""
    view = (arr if type(arr) is np.ndarray else to_numpy(arr)).view()
    view.flags.writeable = False
    return view


def convert_input(value, ty: Type, name: str, fn_name: str, take: Callable = read_only):
    """``value`` as run-time data of type ``ty``: each tensor leaf checked, then ``take(leaf)``
    (the target's conversion; by default a read-only NumPy view), lists of tuples as tuples.

    NumPy, torch and jax data must have the parameter's dtype exactly (no silent cast); Python
    scalars and lists take it when the kind matches (float, int, bool).
    """
    # iterative build of nested tuples: ("visit", v, t, path) then ("pack", n)
    out: list = []
    stack: list = [("visit", value, ty, "")]
    while stack:
        item = stack.pop()
        if item[0] == "pack":
            _pack(out, item[1])
            continue
        _, v, t, path = item
        if isinstance(t, TupleType):
            if not isinstance(v, (tuple, list)) or len(v) != len(t.fields):
                raise _input_error(fn_name, name + path, t, v)
            stack.append(("pack", len(t.fields)))
            stack.extend(("visit", v[i], t.fields[i], f"{path}.{i}") for i in range(len(t.fields) - 1, -1, -1))
        elif isinstance(t, TensorType):
            arr = v if type(v) is np.ndarray and v.dtype.isnative else native(v, t)
            if tensor_mismatch(arr, t):
                raise _input_error(fn_name, name + path, t, arr)
            out.append(take(arr))
        else:
            raise ExecutionError(f"@{fn_name}: parameter %{name}{path} has type {t!r}, which the executor cannot take as input")
    return out[0]


def _pack(out: list, n: int) -> None:
    """Replace the last ``n`` items of ``out`` by their tuple."""
    fields = tuple(out[len(out) - n:])
    del out[len(out) - n:]
    out.append(fields)


def _input_error(fn_name: str, name: str, expected: Type, given) -> ExecutionError:
    return ExecutionError(f"@{fn_name}: parameter %{name} expects {expected!r}, got {describe(given)}")


def as_is(value):
    """The output leaf of a target whose arrays go to the caller unchanged (torch tensors)."""
    return value


def _has_list(value) -> bool:
    """Whether a list lies anywhere in the nested tuple ``value`` (iterative)."""
    stack = [value]
    while stack:
        for v in stack.pop():
            if type(v) is tuple:
                stack.append(v)
            elif isinstance(v, (tuple, list)):
                return True
    return False


def to_output(value, leaf: Optional[Callable] = None):
    """Returned data: ``leaf`` applied to every array (None: NumPy scalars become 0-d arrays),
    lists become tuples (iterative). With ``as_is``, a tuple holding no list is returned itself."""
    if isinstance(value, np.ndarray):
        return value
    if leaf is as_is and type(value) is not list and (type(value) is not tuple or not _has_list(value)):
        return value
    if leaf is None:
        leaf = _numpy_leaf
    if not isinstance(value, (tuple, list)):
        return leaf(value)
    out: list = []
    stack: list = [("visit", value)]
    while stack:
        item = stack.pop()
        if item[0] == "pack":
            _pack(out, item[1])
            continue
        v = item[1]
        if isinstance(v, (tuple, list)):
            stack.append(("pack", len(v)))
            stack.extend(("visit", v[i]) for i in range(len(v) - 1, -1, -1))
        else:
            out.append(leaf(v))
    return out[0]


def _numpy_leaf(v):
    return np.asarray(v) if isinstance(v, np.generic) else v


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
