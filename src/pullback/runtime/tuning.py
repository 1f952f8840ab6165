"""Process-wide tuning for repeated training steps: two opt-in knobs and the hand-over of cores.

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

``CoreHandover``: PyTorch's OpenMP workers and NumPy's OpenBLAS workers busy-wait
after each parallel call (libgomp for a few ms, OpenBLAS for 2^28 cycles, ~0.1 s),
so where PyTorch and a NumPy program take turns on few cores, each pool's spinning
workers steal the cores from the other's. The PyTorch integration hands the cores
over at each crossing (measured on the 2-core bench machine, transformer step on the
numpy target: the SGD update of its 3 MB of parameters took 26-31 ms instead of 0.6 ms after a
backward's GEMMs, and the forward 32 ms instead of 23 ms after the update).
"""

from __future__ import annotations

import ctypes
import sys
from contextlib import nullcontext
from functools import lru_cache
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


OMP_PAUSE_SOFT = 1  # OpenMP 5.0's omp_pause_soft
_PAUSE, _SHUTDOWN = "omp_pause_resource_all", "blas_thread_shutdown_"  # in OpenMP runtimes, in OpenBLAS


@lru_cache(maxsize=1)
def _pool_calls() -> tuple[tuple, tuple]:
    """``(pause, shutdown)``: ``omp_pause_resource_all`` of each OpenMP runtime and ``blas_thread_shutdown_``
    of each OpenBLAS loaded in the process (Linux: found in ``/proc/self/maps``; elsewhere none)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {fields[5].strip() for fields in (line.split(None, 5) for line in f) if len(fields) == 6}
    except OSError:
        return (), ()
    found: dict[str, list] = {_PAUSE: [], _SHUTDOWN: []}
    for path in sorted(paths):
        name = path.rsplit("/", 1)[-1]
        if ".so" not in name:
            continue
        symbol = _PAUSE if name.startswith(("libgomp", "libiomp", "libomp")) else _SHUTDOWN if "openblas" in name else None
        if symbol is None:
            continue
        try:
            fn = getattr(ctypes.CDLL(path), symbol, None)
        except OSError:
            continue
        if fn is not None:
            found[symbol].append(fn)
    return tuple(found[_PAUSE]), tuple(found[_SHUTDOWN])


class CoreHandover:
    """Frees the cores for the other side where execution crosses between PyTorch and pullback's kernels
    (see the module docstring). ``enter()``, before pullback's kernels: the OpenMP runtimes' idle workers
    (PyTorch's, MKL's) exit (``omp_pause_resource_all``, OpenMP 5.0); ``leave()``, after them: OpenBLAS's
    workers exit (``blas_thread_shutdown_``). Each pool starts its workers again at its next parallel
    call (about 0.2 ms). Libraries are looked up once, at the first use.

    ``CoreHandover.enabled = False`` turns every hand-over off (e.g. when other threads of the process
    run OpenBLAS calls while a compiled module trains: a shutdown must not meet a running call)."""

    enabled = True

    def __init__(self, openmp: bool = True, blas: bool = True):
        self.openmp, self.blas = openmp, blas

    def enter(self) -> None:
        if self.enabled and self.openmp:
            for pause in _pool_calls()[0]:
                pause(OMP_PAUSE_SOFT)

    def leave(self) -> None:
        if self.enabled and self.blas:
            for shutdown in _pool_calls()[1]:
                shutdown()
