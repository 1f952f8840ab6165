"""GELU, softmax, layer norm and their gradients compiled by numba for the numpy target (the ``fast`` extra).

NumPy runs a chain of ufuncs as one pass over memory per ufunc; numba compiles the
whole formula to one vectorised (AVX) loop (``numba_loops``), a row at a time for the
reductions: on a transformer layer's activations, GELU 4.8 -> 0.4 ms and its gradient
6.6 -> 1.1 ms, layer norm 0.3-0.5 -> 0.05-0.08 ms and its gradient 0.7-1.1 -> 0.13 ms,
softmax's gradient 0.3-0.4 -> 0.08-0.1 ms (softmax and log-softmax 1.4-2x), on one core
(numba's ``parallel=True`` pool, a third one beside OpenBLAS's and PyTorch's, made the
training step slower), as close to float64 as the NumPy kernels or closer.

Used for float32 arrays of at least ``MIN_SIZE`` elements when numba is installed and
the environment does not set ``PULLBACK_NUMBA=0``; every other call (float16/64, small,
numba missing) runs the NumPy kernel, so a program without large activations never
imports numba. Each loop is compiled on its first call (about 0.3 s) and cached on disk
by numba, so later processes load it in milliseconds; importing numba and its LLVM adds
about 0.5 s and 160 MB of resident memory to the process.
"""

from __future__ import annotations

import os
import warnings
from functools import lru_cache
from importlib.util import find_spec
from typing import Callable, Optional

import numpy as np


# arrays below this size run the NumPy kernels: they gain little, and a program with only small ones (a
# classifier's log-softmax) never imports numba (0.5 s and 160 MB)
MIN_SIZE = 1 << 15


def enabled() -> bool:
    """numba is installed and ``PULLBACK_NUMBA`` is not ``0``."""
    return os.environ.get("PULLBACK_NUMBA", "1") != "0" and find_spec("numba") is not None


def gelu(x: np.ndarray, approximate: str) -> Optional[np.ndarray]:
    """``nn.gelu`` of a float32 ``x`` in one compiled pass, or None (the NumPy kernel applies)."""
    kernel = _kernel("gelu/" + approximate, x)
    return None if kernel is None else _flat(kernel, x)


def gelu_grad(g: np.ndarray, x: np.ndarray, approximate: str) -> Optional[np.ndarray]:
    """``nn.gelu_grad`` (``g * gelu'(x)``) of float32 arrays of one shape in one compiled pass, or None."""
    kernel = _kernel("gelu_grad/" + approximate, g, x)
    return None if kernel is None else _flat(kernel, g, x)


def rows(name: str, out: np.ndarray, *arrays: np.ndarray) -> bool:
    """Run the row loop ``name`` (``softmax``, ``log_softmax``, ``softmax_grad``, ``log_softmax_grad``) on
    C-contiguous 2-D float32 ``arrays`` into ``out``; False (nothing done) when it does not apply."""
    kernel = _kernel(name, out, *arrays)
    if kernel is not None:
        kernel(*arrays, out)
    return kernel is not None


def layer_norm(x2: np.ndarray, gamma, beta, a) -> Optional[tuple]:
    """``(out rows, mean, rstd)`` of ``nn.layer_norm`` on float32 rows ``x2`` (normalised axis last) with
    ``LayerNormAttrs`` ``a`` (the statistics one per row), or None."""
    kernel = _kernel("layer_norm", x2)
    if kernel is None:
        return None
    out = np.empty_like(x2)
    mean, rstd = np.empty(x2.shape[0], x2.dtype), np.empty(x2.shape[0], x2.dtype)
    kernel(x2, _vector(gamma), _vector(beta), np.float32(a.epsilon), a.scale, a.center, out, mean, rstd)
    return out, mean, rstd


def layer_norm_grad(g2: np.ndarray, x2: np.ndarray, gamma, a, mean=None, rstd=None) -> Optional[tuple]:
    """``(dx rows, dgamma, dbeta)`` of ``nn.layer_norm_grad`` on float32 rows, or None; with ``mean`` and
    ``rstd`` (one per row) those of ``nn.native_layer_norm_grad`` (the statistics given, not recomputed)."""
    saved = mean is not None
    kernel = _kernel("layer_norm_grad_saved" if saved else "layer_norm_grad", g2, x2)
    if kernel is None:
        return None
    dx = np.empty_like(x2)
    dgamma, dbeta = np.zeros(x2.shape[1]), np.zeros(x2.shape[1])  # float64 accumulators over the rows
    stats = (_vector(mean), _vector(rstd)) if saved else (np.float32(a.epsilon),)
    kernel(g2, x2, _vector(gamma), *stats, a.scale, dx, dgamma, dbeta)
    return (dx, dgamma.astype(gamma.dtype) if a.scale else np.zeros_like(gamma),
            dbeta.astype(gamma.dtype) if a.center else np.zeros_like(gamma))


def add_rows(out: np.ndarray, axis: int, idx: np.ndarray, value: np.ndarray) -> bool:
    """``np.add.at(out, (slice(None),) * axis + (idx,), value)`` in place for a C-contiguous float32 ``out``, a 1-D
    integer ``idx`` and ``value`` of the indexed shape, in one compiled loop (GPT-2's token-embedding gradient,
    1,024 rows of 256: 1.6 -> 0.06 ms), the same additions in the same order; False (nothing done) when it does
    not apply or an index is out of range (``np.add.at`` then says which)."""
    if value.size < MIN_SIZE or out.dtype != np.float32 or value.dtype != np.float32 or not out.flags.c_contiguous:
        return False
    if idx.ndim != 1 or idx.dtype.kind not in "iu" or value.shape != out.shape[:axis] + idx.shape + out.shape[axis + 1:]:
        return False
    kernel = _compiled("add_rows")
    if kernel is None:
        return False
    before, after = int(np.prod(out.shape[:axis])), int(np.prod(out.shape[axis + 1:]))
    rows = np.ascontiguousarray(value).reshape(before, idx.size, after)
    return kernel(out.reshape(before, out.shape[axis], after), idx.astype(np.int64, copy=False), rows) < 0


def _kernel(name: str, *arrays: np.ndarray) -> Optional[Callable]:
    """The compiled loop ``name`` for float32 ``arrays`` of one shape and at least ``MIN_SIZE`` elements, else None."""
    first = arrays[0]
    if first.size < MIN_SIZE or any(a.dtype != np.float32 or a.shape != first.shape for a in arrays):
        return None
    return _compiled(name)


def _flat(kernel: Callable, *arrays: np.ndarray) -> np.ndarray:
    """``kernel(*flat arrays, flat out)`` on C-contiguous copies (or the arrays themselves); returns ``out``."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    out = np.empty_like(arrays[-1])
    kernel(*(a.reshape(-1) for a in arrays), out.reshape(-1))
    return out


def _vector(v) -> np.ndarray:
    return np.ascontiguousarray(v, dtype=np.float32).reshape(-1)


@lru_cache(maxsize=None)
def _compiled(name: str) -> Optional[Callable]:
    loops = _loops() if enabled() else None
    return None if loops is None else loops.KERNELS[name]


@lru_cache(maxsize=1)
def _loops():
    """``numba_loops`` (importing numba), or None with one warning when the installed numba does not import
    (e.g. one built for another NumPy): the numpy target then runs its NumPy kernels."""
    try:
        from . import numba_loops
    except Exception as e:  # noqa: BLE001 (any failure of a third-party import)
        warnings.warn(f"pullback: numba is installed but does not import ({type(e).__name__}: {e}); the numpy target "
                      "runs its NumPy kernels (PULLBACK_NUMBA=0 silences this)", RuntimeWarning, stacklevel=4)
        return None
    return numba_loops


__all__ = ["enabled", "add_rows", "gelu", "gelu_grad", "rows", "layer_norm", "layer_norm_grad"]
