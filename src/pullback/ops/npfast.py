"""NumPy helpers of the fused kernels: passes over memory that stay in the cache, one-pass contractions.

- Blocks: a chain of NumPy ufuncs over a large array makes one pass over memory per
  ufunc. ``blockwise`` (elementwise chains) and ``row_blocks`` (chains that reduce
  along the last axis: softmax, layer norm) run the chain on pieces of ``BLOCK``
  elements, whose temporaries stay in the L2 cache: 2-3x faster at the bench's sizes
  (1M-element GELU forward and backward).
- Contractions: ``np.sum(a * b, axis)`` makes a temporary of ``a``'s size and reads
  it again; ``dot_along``, ``sum_along`` and ``sum_except`` read their operands once:
  ``np.vecdot`` and BLAS matrix-vector products along the last axis, ``np.einsum``
  along other axes (``np.vecdot`` along a leading axis is several times slower than
  einsum). float16 operands are contracted in float32.
"""

from __future__ import annotations

import numpy as np

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
BLOCK = 32768  # elements per block: a block's temporaries (float32/64) stay in a 256 KiB-1 MiB L2 cache


def blockwise(fn, *arrays: np.ndarray) -> np.ndarray:
    """``fn(*arrays)`` for an elementwise ``fn`` of arrays of one shape, run on flat blocks of ``BLOCK`` elements
    (``fn`` of the whole arrays when they are small or of different shapes)."""
    shape, size = arrays[0].shape, arrays[0].size
    if not shape:  # NumPy ufuncs give scalars for 0-d arrays, and in-place steps need arrays
        return fn(*(np.reshape(a, (1,)) if a.shape == shape else a for a in arrays)).reshape(())
    if size <= 2 * BLOCK or any(a.shape != shape for a in arrays):
        return fn(*arrays)
    flat = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    first = fn(*(f[:BLOCK] for f in flat))
    out = np.empty(size, first.dtype)
    out[:BLOCK] = first
    for i in range(BLOCK, size, BLOCK):
        out[i : i + BLOCK] = fn(*(f[i : i + BLOCK] for f in flat))
    return out.reshape(shape)


def row_blocks(rows: int, cols: int) -> list:
    """Slices of ``rows`` holding about ``BLOCK`` elements each (rows of ``cols`` entries; at least one row)."""
    step = max(1, BLOCK // max(cols, 1))
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


def as_rows(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous 2-D array of its last axis (a view when it already is contiguous)."""
    return np.ascontiguousarray(a).reshape(-1, a.shape[-1] if a.ndim else 1)


def _wide(*arrays):
    return [a.astype(np.float32) if a.dtype == np.float16 else a for a in arrays]


def dot_along(a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
    """``sum(a * b, axis, keepdims=True)``."""
    a, b = _wide(a, b)
    axis %= a.ndim
    if axis == a.ndim - 1:
        return np.vecdot(a, b)[..., None]
    s = _LETTERS[: a.ndim]
    return np.expand_dims(np.einsum(f"{s},{s}->{s.replace(s[axis], '')}", a, b), axis)


def sum_along(a: np.ndarray, axis: int) -> np.ndarray:
    """``sum(a, axis, keepdims=True)`` (a BLAS matrix-vector product along the last axis of a float32/64 array)."""
    (a,) = _wide(a)
    axis %= a.ndim
    if axis == a.ndim - 1 and a.ndim > 1 and a.flags.c_contiguous:
        return np.matmul(a, np.ones(a.shape[-1], a.dtype))[..., None]
    return np.sum(a, axis=axis, keepdims=True)


def sum_except(keep: int, a: np.ndarray, b=None) -> np.ndarray:
    """``sum(a * b)`` (or ``sum(a)``) over every axis but ``keep``: a 1-D array."""
    arrays = _wide(a) if b is None else _wide(a, b)
    s = _LETTERS[: a.ndim]
    return np.einsum(",".join([s] * len(arrays)) + "->" + s[keep % a.ndim], *arrays)


def along(v: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """A 1-D array shaped to broadcast along ``axis`` of a rank-``ndim`` array."""
    return v.reshape((-1,) + (1,) * (ndim - axis % ndim - 1))


__all__ = ["BLOCK", "blockwise", "row_blocks", "as_rows", "dot_along", "sum_along", "sum_except", "along"]
