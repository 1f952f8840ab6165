"""Helpers for operator kernels written once against an array namespace ``xp``.

NumPy, ``jax.numpy`` and array-api-compat's torch share most names; these
helpers cover what they do not share: NumPy ufuncs and reductions return
NumPy scalars for 0-d results, dtypes are named by strings in attributes,
index updates are functional (jax arrays are immutable) and accumulate
repeated positions (``np.add.at``, ``.at[].add``, torch's
``index_put(accumulate=True)``), and data-dependent checks can run only on
concrete values (not on arrays that ``jax.jit`` traces). NumPy's floating
point warnings are switched off where jax and torch return inf/nan silently.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..ir.errors import ExecutionError


def as_array(value):
    """``value`` with a NumPy scalar (a NumPy ufunc's or reduction's 0-d result) made a 0-d array."""
    return np.asarray(value) if isinstance(value, np.generic) else value


def dtype(xp, name: str):
    """The namespace's dtype named ``name`` (``"float32"``, ``"int64"``, ``"bool"``...)."""
    return getattr(xp, name)


def device(x):
    """The device of array ``x`` to create companions on (None for NumPy and for traced jax values)."""
    if isinstance(x, (np.ndarray, np.generic)):
        return None
    from array_api_compat import device as device_of

    return device_of(x)


def is_integer(xp, x) -> bool:
    """``x`` has a (signed or unsigned) integer dtype."""
    kind = getattr(x.dtype, "kind", None)  # NumPy and jax dtypes
    return kind in "iu" if kind is not None else xp.isdtype(x.dtype, "integral")


def numpy_quiet(kernel: Callable, **errors: str) -> Callable:
    """``kernel`` on NumPy with the given floating-point warnings ignored (``np.errstate``)."""
    errors = errors or {"divide": "ignore", "invalid": "ignore"}

    def run(*args):
        with np.errstate(**errors):
            return kernel(np, *args)

    return run


def is_traced(x) -> bool:
    """True for a value ``jax.jit`` is tracing: its entries are unknown until it runs."""
    return any(c.__name__ == "Tracer" for c in type(x).__mro__)


def check_range(op: str, idx, lo: int, hi: int, where: str) -> None:
    """Raise ExecutionError if an entry of integer array ``idx`` is outside ``[lo, hi)``
    (only on concrete values; traced jax indices are clamped by XLA instead)."""
    if not math.prod(idx.shape) or is_traced(idx):
        return
    v = idx if hasattr(idx, "detach") else np.asarray(idx)  # a concrete jax array: its min inside jax.jit is traced
    if int(v.min()) < lo or int(v.max()) >= hi:
        raise ExecutionError(f"{op}: index out of range {where}")


def grid(xp, idx, axis: int) -> tuple:
    """Advanced index selecting, per position of ``idx``, the entry ``idx`` names along ``axis``
    (``np.indices(idx.shape, sparse=True)`` with ``idx`` in place of axis ``axis``)."""
    nd, dev = len(idx.shape), device(idx)
    out = [xp.reshape(xp.arange(n, device=dev), tuple(-1 if i == k else 1 for i in range(nd)))
           for k, n in enumerate(idx.shape)]
    out[axis] = idx
    return tuple(out)


def set_at(x, index: tuple, value):
    """A copy of ``x`` with ``x[index] = value`` (basic slices; ``x`` itself unchanged)."""
    if hasattr(x, "at"):  # jax
        return x.at[index].set(value)
    out = x.clone() if hasattr(x, "clone") else x.copy()
    out[index] = value
    return out


def add_at(x, index: tuple, value):
    """A copy of ``x`` with ``value`` added at ``index`` (full slices and integer arrays, NumPy
    indexing rules); entries that an index names several times receive every addition."""
    if hasattr(x, "at"):  # jax
        return x.at[index].add(value)
    if hasattr(x, "index_put"):  # torch: index tensors only
        return x.index_put(_tensor_index(x, index), value, accumulate=True)
    out = x.copy()
    np.add.at(out, index, value)
    return out


def _tensor_index(x, index: tuple) -> tuple:
    """``index`` (full slices around adjacent integer tensors) as integer tensors alone, shaped
    to broadcast to the same result as NumPy's indexing would give."""
    import torch

    arrays = [i for i, v in enumerate(index) if not isinstance(v, slice)]
    first, last = arrays[0], arrays[-1]
    nb = max(index[i].ndim for i in arrays)
    rank = first + nb + (len(index) - last - 1)  # dims after the index are implied, as in NumPy
    out = []
    for i, v in enumerate(index):
        if isinstance(v, slice):
            if v != slice(None):
                raise ExecutionError(f"add_at on torch takes full slices, got {v}")
            pos = i if i < first else i - last - 1 + first + nb
            out.append(torch.arange(x.shape[i], device=x.device).reshape([-1 if k == pos else 1 for k in range(rank)]))
        else:
            out.append(v.reshape((1,) * first + (1,) * (nb - v.ndim) + tuple(v.shape) + (1,) * (rank - first - nb)))
    return tuple(out)


__all__ = ["as_array", "dtype", "device", "is_integer", "numpy_quiet", "is_traced", "check_range", "grid", "set_at", "add_at"]
