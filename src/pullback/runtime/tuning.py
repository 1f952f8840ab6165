"""Opt-in, process-wide tuning for repeated training steps. Both are off by default.

``keep_freed_memory()``: glibc's malloc hands blocks above a (dynamic) threshold
back to the OS when they are freed, so each training step page-faults its large
intermediates afresh (measured: 3,000 faults and 4-6 ms of system time per step
of the benchmark CNN, a third of the step). This asks glibc, once per process,
to serve blocks below 64 MiB from the heap and keep up to 512 MiB of freed heap
for reuse -- what PyTorch's caching allocator achieves for its own tensors. It
affects every library in the process (``build(..., tune_malloc=True)``).

``BlasThreads(n)``: the number of BLAS threads while a pullback function runs,
restored afterwards, through ``threadpoolctl`` (``build(..., blas_threads=n)``).
On a loaded machine one thread can be much faster than spinning workers.
"""

from __future__ import annotations

import ctypes
import sys
from contextlib import nullcontext
from typing import Optional

from ..ir.errors import ExecutionError

MALLOC_MMAP_THRESHOLD = 64 << 20
MALLOC_TRIM_THRESHOLD = 512 << 20
_malloc_tuned = False


def keep_freed_memory() -> bool:
    """Tune glibc malloc for repeated steps (see module doc); True when applied (Linux with glibc)."""
    global _malloc_tuned
    if _malloc_tuned or not sys.platform.startswith("linux"):
        return _malloc_tuned
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl): leave the allocator alone
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    _malloc_tuned = bool(mallopt(m_mmap_threshold, MALLOC_MMAP_THRESHOLD)) and bool(mallopt(m_trim_threshold, MALLOC_TRIM_THRESHOLD))
    return _malloc_tuned


class BlasThreads:
    """A reusable context that limits BLAS threads to ``n`` (None: leave BLAS alone)."""

    def __init__(self, n: Optional[int]):
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ExecutionError(f"blas_threads must be a positive int or None, got {n!r}")
        self.n = n
        self._controller = None
        if n is not None:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:
                raise ExecutionError("blas_threads needs the threadpoolctl package (pip install threadpoolctl)") from None
            self._controller = ThreadpoolController()

    def __call__(self):
        if self._controller is None:
            return nullcontext()
        return self._controller.limit(limits=self.n, user_api="blas")
