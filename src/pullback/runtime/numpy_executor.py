"""The NumPy target (the default): ``build(mod)`` or ``build(mod, target="numpy")``.

Operators run their NumPy implementation (``op.impl("numpy")``) in the shared
evaluator (``runtime.evaluator``). Inputs reach kernels as read-only views: a
kernel cannot write into them. A result may be a (read-only) view of an input,
e.g. for ``reshape``. A fused group (a call of a ``Primitive=1`` Function) runs
as one kernel reusing its own buffers (``runtime.fused``).
"""

from __future__ import annotations

import functools
import importlib.util
from contextlib import contextmanager
from typing import Callable, Optional

import numpy as np

from ..ir.errors import ExecutionError
from ..ir.expr import Call, Function
from ..ir.module import IRModule
from ..ir.types import FLOAT_DTYPES, TensorType
from .aten_on_numpy import ALLOCATING, GEMMS, aten_kernel, takes
from .evaluator import DEFAULT_MAX_CALL_DEPTH, CompiledFunction, Executable as _Executable, Target
from .fused import compile_group
from .opmath import in_float32, involves_bfloat16, numpy_narrow, numpy_widen
from .torch_kernels import autocast_off
from .tuning import BlasThreads, keep_freed_memory


# elementwise operators whose NumPy kernel is exactly their ufunc on float arrays of one dtype, run with
# ``out=`` by the plan's buffer reuse: binary arithmetic (its kernel ignores divide/invalid warnings) and
# unary math (with NumPy's warnings, as its kernel)
QUIET_UFUNC_OPS = frozenset({"add", "subtract", "multiply", "divide", "power", "maximum", "minimum"})
UFUNC_OPS = frozenset({"negative", "exp", "log", "sqrt", "tanh", "abs", "square", "reciprocal", "sin", "cos",
                       "log1p", "log2"})


_IN_PLACE = frozenset(FLOAT_DTYPES) - {"bfloat16"}  # the dtypes whose ufuncs write into an operand
_SLICES = frozenset({"strided_set", "strided_slice"})  # their NumPy kernels return new arrays


def _array_type(t) -> bool:
    """A static shape of rank 1 or more."""
    return isinstance(t, TensorType) and len(t.shape) > 0 and t.is_static


@functools.lru_cache(maxsize=None)
def _inplace(uf, i: Optional[int]) -> Callable:
    """``uf`` writing into its operand (unary: ``i`` None) or into operand ``i`` (binary, quiet); one
    kernel per ufunc and position, shared by every call of a plan."""
    if i is None:
        return lambda x, attrs=None: uf(x, out=x)
    if i == 0:
        def quiet(a, b, attrs=None):
            with np.errstate(divide="ignore", invalid="ignore"):
                return uf(a, b, out=a)
    else:
        def quiet(a, b, attrs=None):
            with np.errstate(divide="ignore", invalid="ignore"):
                return uf(a, b, out=b)
    return quiet


def _write_into(call) -> Callable:
    """``strided_set`` assigning the slice into its base array itself (the plan's buffer reuse: a loop writing rows of
    one tensor copies it once, not at every write)."""
    index, flipped = call.attrs.forward_index(tuple(call.checked_type.shape))

    def write(x, v, attrs=None):
        x[index] = np.flip(v, axis=flipped) if flipped else v
        return x

    return write


@contextmanager
def _both(first, second):
    with first, second:
        yield


class NumpyTarget(Target):
    """Kernels on NumPy arrays; fused groups as single kernels when ``fuse`` (compiled once per group);
    elementwise results written into a dying operand's buffer (``runtime.plan.buffer_reuse``) when ``reuse``;
    ATen's kernels for the heavy operators when ``aten`` (``runtime.aten_on_numpy``)."""

    name = "numpy"

    def __init__(self, fuse: bool = True, blas_threads: Optional[int] = None, reuse: bool = True, aten: bool = False):
        self.fuse = fuse
        self.reuses_buffers = reuse
        self.blas_limit = BlasThreads(blas_threads)
        if not isinstance(aten, bool):
            raise ExecutionError(f"aten must be True or False, got {aten!r}")
        if aten and importlib.util.find_spec("torch") is None:
            raise ExecutionError("aten=True runs PyTorch's kernels: install PyTorch (pip install torch)")
        self.aten = aten
        self._groups: dict[Function, Callable] = {}  # primitive Function (identity hash) -> its kernel

    def kernel(self, call: Call) -> Callable:
        if involves_bfloat16(call) and not call.op.half_native:
            return in_float32(call.op.impl(self.name), call, numpy_widen, numpy_narrow)
        return (self.aten and aten_kernel(call)) or call.op.impl(self.name)

    def allocates(self, call: Call) -> bool:
        name = call.op.name
        if self.aten and name in ALLOCATING and takes(call):
            return _array_type(call.checked_type)
        # GEMMs: np.matmul's result is a new array; strided_set writes into a copy of its base, strided_slice copies
        return (name in QUIET_UFUNC_OPS or name in UFUNC_OPS or name in GEMMS or name in _SLICES) \
            and _array_type(call.checked_type)

    def inplace_kernel(self, call: Call, i: int) -> Optional[Callable]:
        name, out = call.op.name, call.checked_type
        # bfloat16 has no NumPy arithmetic: its kernels compute in float32 into new arrays (runtime.opmath)
        if not _array_type(out) or out.dtype not in _IN_PLACE:
            return None
        if name == "strided_set":
            return _write_into(call) if i == 0 else None
        if name not in QUIET_UFUNC_OPS and name not in UFUNC_OPS:
            return None
        for a in call.args:
            t = a.checked_type
            if not isinstance(t, TensorType) or t.dtype != out.dtype:
                return None
        if call.args[i].checked_type.shape != out.shape:
            return None
        return _inplace(call.op.ufunc, None if name in UFUNC_OPS else i)

    def group_kernel(self, fn: Function) -> Optional[Callable]:
        if not self.fuse:
            return None
        kernel = self._groups.get(fn)
        if kernel is None:
            kernel = self._groups[fn] = compile_group(fn, self.kernel)
        return kernel

    def run_context(self):
        limit = self.blas_limit() if self.blas_limit.n is not None else None
        off = autocast_off() if self.aten else None
        if limit is None or off is None:
            return limit or off
        return _both(limit, off)


class Executable(_Executable):
    """A module built for the NumPy target; ``exe["main"](*arrays)`` runs a function.

    ``fuse=True`` runs each fused group as one kernel; ``fuse=False`` steps through
    it op by op. ``reuse=True`` lets an elementwise result take a dying operand's buffer
    (``runtime.plan.buffer_reuse``). Process-wide tuning, off by default (``runtime.tuning``):
    ``tune_malloc=True`` keeps freed memory in the process for the next step;
    ``blas_threads=n`` limits BLAS threads during each call (restored after it).
    ``aten=True`` (needs PyTorch) runs GEMMs, convolutions, pooling and batch norm on float32/float64
    arrays with ATen's kernels on the arrays' memory (``runtime.aten_on_numpy``).
    """

    def __init__(self, mod: IRModule, check_outputs: bool = False, fuse: bool = True, tune_malloc: bool = False,
                 blas_threads: Optional[int] = None, max_call_depth: int = DEFAULT_MAX_CALL_DEPTH, reuse: bool = True,
                 aten: bool = False):
        if tune_malloc:
            keep_freed_memory()
        super().__init__(mod, NumpyTarget(fuse, blas_threads, reuse, aten), check_outputs, max_call_depth)
        self.fuse = fuse


__all__ = ["NumpyTarget", "Executable", "CompiledFunction"]
