"""NumPy helpers of the fused gradient kernels: reductions and contractions in one pass over memory.

``np.sum(a * b, axis)`` makes a temporary of ``a``'s size and reads it again; these
helpers read their operands once: ``np.vecdot`` and BLAS matrix-vector products along
the last axis, ``np.einsum`` along other axes (``np.vecdot`` along a leading axis is
several times slower than einsum). float16 operands are contracted in float32.
"""

from __future__ import annotations

import numpy as np

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


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


__all__ = ["dot_along", "sum_along", "sum_except", "along"]
