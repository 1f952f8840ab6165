"""The NumPy target (the default): ``build(mod)`` or ``build(mod, target="numpy")``.

Operators run their NumPy implementation (``op.impl("numpy")``) in the shared
evaluator (``runtime.evaluator``). Inputs reach kernels as read-only views: a
kernel cannot write into them. A result may be a (read-only) view of an input,
e.g. for ``reshape``. A fused group (a call of a ``Primitive=1`` Function) runs
as one kernel reusing its own buffers (``runtime.fused``).
"""

from __future__ import annotations

from typing import Callable, Optional

from ..ir.expr import Function
from ..ir.module import IRModule
from .evaluator import DEFAULT_MAX_CALL_DEPTH, CompiledFunction, Executable as _Executable, Target
from .fused import compile_group
from .tuning import BlasThreads, keep_freed_memory


class NumpyTarget(Target):
    """Kernels on NumPy arrays; fused groups as single kernels when ``fuse`` (compiled once per group)."""

    name = "numpy"

    def __init__(self, fuse: bool = True, blas_threads: Optional[int] = None):
        self.fuse = fuse
        self.blas_limit = BlasThreads(blas_threads)
        self._groups: dict[int, tuple] = {}  # id(primitive Function) -> (kernel, Function): ids stay valid

    def group_kernel(self, fn: Function) -> Optional[Callable]:
        if not self.fuse:
            return None
        entry = self._groups.get(id(fn))
        if entry is None:
            entry = self._groups[id(fn)] = (compile_group(fn), fn)
        return entry[0]

    def run_context(self):
        return self.blas_limit() if self.blas_limit.n is not None else None


class Executable(_Executable):
    """A module built for the NumPy target; ``exe["main"](*arrays)`` runs a function.

    ``fuse=True`` runs each fused group as one kernel; ``fuse=False`` steps through
    it op by op. Process-wide tuning, off by default (``runtime.tuning``):
    ``tune_malloc=True`` keeps freed memory in the process for the next step;
    ``blas_threads=n`` limits BLAS threads during each call (restored after it).
    """

    def __init__(self, mod: IRModule, check_outputs: bool = False, fuse: bool = True, tune_malloc: bool = False,
                 blas_threads: Optional[int] = None, max_call_depth: int = DEFAULT_MAX_CALL_DEPTH):
        if tune_malloc:
            keep_freed_memory()
        super().__init__(mod, NumpyTarget(fuse, blas_threads), check_outputs, max_call_depth)
        self.fuse = fuse


__all__ = ["NumpyTarget", "Executable", "CompiledFunction"]
