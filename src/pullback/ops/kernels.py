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

import contextvars
import math
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import numpy as np

from ..ir.errors import ExecutionError
from ..ir.types import HALF_DTYPES
from . import numba_kernels


def as_array(value):
    """``value`` with a NumPy scalar (a NumPy ufunc's or reduction's 0-d result) made a 0-d array."""
    return np.asarray(value) if isinstance(value, np.generic) else value


def dtype(xp, name: str):
    """The namespace's dtype named ``name`` (``"float32"``, ``"int64"``, ``"bool"``...; NumPy's bfloat16 is
    ml_dtypes')."""
    found = getattr(xp, name, None)
    return found if found is not None else np.dtype(name)


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


def is_complex_array(x) -> bool:
    """``x`` (a NumPy or jax array, a torch tensor) holds complex numbers."""
    kind = getattr(x.dtype, "kind", None)  # NumPy and jax dtypes
    return kind == "c" if kind is not None else bool(x.dtype.is_complex)


def dtype_name(x) -> str:
    """The dtype of array ``x`` by name (``"float32"``) on every target."""
    return str(x.dtype).rpartition(".")[2]


def accumulated(xp, x):
    """``x`` in the dtype ATen accumulates it in: float16 and bfloat16 in float32, others as they are."""
    return xp.astype(x, xp.float32) if dtype_name(x) in HALF_DTYPES else x


def rounded_once(fn: Callable, x):
    """``fn(x)``; float16 and bfloat16 computed in float32 and rounded once to x's dtype, as ATen computes them
    (NumPy and jax arrays)."""
    return fn(x.astype("float32")).astype(x.dtype) if dtype_name(x) in HALF_DTYPES else fn(x)


def sum_of(xp, x, axis, keepdims: bool):
    """``xp.sum`` in x's dtype, float16 and bfloat16 added up in float32 and rounded once (as ATen does;
    ``jnp.sum(x, dtype=bfloat16)`` adds in bfloat16, NumPy's float16 sums round at every pairwise step)."""
    if dtype_name(x) in HALF_DTYPES:
        return xp.astype(xp.sum(xp.astype(x, xp.float32), axis=axis, keepdims=keepdims, dtype=xp.float32), x.dtype)
    return xp.sum(x, axis=axis, keepdims=keepdims, dtype=x.dtype)


# reductions of at least this many elements reduce a merged view (``merged_axes``); below, the view costs more
MERGE_MIN = 1 << 15


def merged_axes(shape: tuple, axes) -> Optional[tuple]:
    """``(view shape, its axes)``: the same sums as reducing ``axes`` of a C-contiguous array of ``shape``, on its
    view with each run of adjacent reduced axes, and of adjacent kept ones, merged into one (size-1 axes dropped);
    None where that merges nothing or the array is small (``MERGE_MIN``). ATen sums (8, 197, 768) over (0, 1)
    into (1, 1, 768) in 247 us, its (1576, 768) view over 0 in 95 (a linear layer's bias gradient, as eager's
    ``addmm`` backward sums it), with the same bits (measured); NumPy 5-15% faster."""
    if math.prod(shape) < MERGE_MIN:
        return None
    axes = {a % len(shape) for a in axes}
    view, reduced, last = [], [], None
    for i, d in enumerate(shape):
        if d == 1:
            continue
        r = i in axes
        if r is last:
            view[-1] *= d
            continue
        view.append(d)
        last = r
        if r:
            reduced.append(len(view) - 1)
    if len(view) == len(shape) or not reduced:
        return None
    return tuple(view), tuple(reduced)


def reduced_view(x, axes) -> Optional[tuple]:
    """``merged_axes`` for array ``x`` (NumPy or torch) when it is C-contiguous (its view is free), else None."""
    flags = getattr(x, "flags", None)  # NumPy
    if flags is not None:
        contiguous = flags.c_contiguous
    elif hasattr(x, "is_contiguous"):  # torch
        contiguous = x.is_contiguous()
    else:  # jax: XLA chooses the reduction's layout itself
        return None
    return merged_axes(tuple(x.shape), axes) if contiguous else None


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


# ---------------------------------------------------------------- run-time checks

_MESSAGES: list[str] = [""]  # code -> message (code 0: every check passed); codes stay valid for the process
_CODES: dict[str, int] = {}
_COLLECTOR: contextvars.ContextVar = contextvars.ContextVar("pullback_traced_checks", default=None)


def message_of(code: int) -> str:
    """The message of a failed traced check (``TracedChecks.code``)."""
    return _MESSAGES[code]


class TracedChecks:
    """Checks met while jax traces a program (``collecting_checks``), folded into one int32 value:
    0 when every check passes, else the code of the first failing one (``message_of``). The jax
    target returns it with the results and raises the ExecutionError after the call."""

    def __init__(self):
        self.code = None  # a traced int32 scalar, or None: no check met
        self.where = ""  # " at line:column" of the operator being traced (set by the target)

    def add(self, failed, message: str) -> None:
        """Record the traced bool scalar ``failed``: the program fails with ``message`` if it is true."""
        import jax.numpy as jnp

        message += self.where
        code = _CODES.get(message)
        if code is None:
            code = _CODES[message] = len(_MESSAGES)
            _MESSAGES.append(message)
        mine = jnp.where(failed, jnp.int32(code), jnp.int32(0))
        self.merge(mine)

    def merge(self, code) -> None:
        """Fold in another code (a traced branch's): the first failure in program order wins."""
        import jax.numpy as jnp

        self.code = code if self.code is None else jnp.where(self.code != 0, self.code, code)

    def result(self):
        """The int32 code (a traced value; the constant 0 when no check was met)."""
        import jax.numpy as jnp

        return jnp.int32(0) if self.code is None else self.code


@contextmanager
def collecting_checks() -> Iterator[TracedChecks]:
    """Inside the block, checks on traced values are recorded on the yielded ``TracedChecks``."""
    checks = TracedChecks()
    token = _COLLECTOR.set(checks)
    try:
        yield checks
    finally:
        _COLLECTOR.reset(token)


def active_checks() -> Optional[TracedChecks]:
    """The ``TracedChecks`` of the trace in progress, if any."""
    return _COLLECTOR.get()


def check(bad, message: str) -> None:
    """The program is an error (``ExecutionError(message)``) where the bool array ``bad`` has a true entry.

    On concrete values (NumPy, torch, eager jax) it raises now. On values ``jax.jit`` traces it is
    recorded on the active ``TracedChecks`` (the jax target raises after the call); traced outside
    the jax target (no collector), nothing can be checked and the kernel's own behaviour stands."""
    if not math.prod(bad.shape):
        return
    if is_traced(bad):
        checks = _COLLECTOR.get()
        if checks is not None:
            checks.add(bad.any(), message)
        return
    if bool(bad.any()):
        raise ExecutionError(message)


def check_range(op: str, idx, lo: int, hi: int, where: str) -> int:
    """The program is an error if an entry of integer array ``idx`` is outside ``[lo, hi)`` (``check``); the
    message names the first. Returns the least entry of a NumPy or torch ``idx`` (found with the greatest in one
    pass on torch: a caller wrapping negative indices skips that when there are none), else ``lo``."""
    if not math.prod(idx.shape):
        return lo
    if isinstance(idx, np.ndarray) or hasattr(idx, "aminmax") and not is_traced(idx):  # NumPy, torch
        least, most = (int(idx.min()), int(idx.max())) if isinstance(idx, np.ndarray) else map(int, idx.aminmax())
        if lo <= least and most < hi:
            return least
    bad = (idx < lo) | (idx >= hi)
    if is_traced(bad):  # also a constant's comparison inside jax.jit (staged out: a tracer)
        check(bad, f"{op}: index out of range {where}")
    elif bool(bad.any()):
        raise ExecutionError(f"{op}: index {int(idx[bad].reshape(-1)[0])} out of range {where}")
    return lo


def check_divisor(xp, op: str, b) -> None:
    """Integer division by zero is an error on every target (PyTorch's rule; NumPy gives 0, XLA -1)."""
    if is_integer(xp, b):
        check(b == 0, f"{op}: integer division by zero")


def wide_index(idx):
    """Positions ``idx`` (a NumPy, jax or torch array) of a narrow integer type (int8, int16, uint8) as int32,
    others as they are: ATen indexes with int32 and int64 only (a uint8 index is a mask to it), and ``idx + n``
    for a negative position could overflow the index's own type."""
    if idx.dtype.itemsize >= 4:
        return idx
    return idx.astype("int32") if hasattr(idx, "astype") else idx.int()


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


def add_at(x, index: tuple, value, sequential: bool = False, into: bool = False):
    """A copy of ``x`` with ``value`` added at ``index`` (full slices and integer arrays, NumPy
    indexing rules); entries that an index names several times receive every addition. ``into`` (torch only):
    added into ``x`` itself, which is returned (a buffer that dies here: ``runtime.plan.buffer_reuse``). On torch,
    ``sequential`` in float16/bfloat16: ATen's ``index_put`` with ``accumulate``, which rounds after each addition
    in index order (eager's embedding and indexing backward), not ``index_add`` (which sums in float32). In float32
    ``index_add`` is eager's embedding backward bit for bit, and 16x faster than ``index_put`` (a BERT's three
    embedding gradients: 2.5 against 0.15 ms)."""
    if hasattr(x, "at"):  # jax
        return x.at[index].add(value)
    if hasattr(x, "index_put"):  # torch
        along = None if sequential and x.element_size() == 2 and x.is_floating_point() else _one_axis(x, index, value)
        if along is not None:  # ATen's index_add: 5.5 -> 0.4 ms for a (16, 16, 16, 96) roll's gradient (Swin)
            add = x.index_add_ if into else x.index_add
            return add(along, index[along], value.expand(x.shape[:along] + index[along].shape + x.shape[along + 1:]))
        put = x.index_put_ if into else x.index_put
        return put(_tensor_index(x, index), value, accumulate=True)  # index tensors only
    out = x.copy()
    axis = _lone_axis(index)
    if axis is not None and numba_kernels.add_rows(out, axis, np.asarray(index[axis]), np.asarray(value)):
        return out
    if _distinct_along_one_axis(x, index):  # a plain ``+=`` (np.add.at: 15.7 -> ~1.5 ms on Swin's roll gradients)
        out[index] += value
    else:
        np.add.at(out, index, value)
    return out


def _lone_axis(index: tuple) -> Optional[int]:
    """The position of the one array in ``index`` when every other entry is a full slice, else None."""
    arrays = [i for i, v in enumerate(index) if not isinstance(v, slice)]
    if len(arrays) != 1 or any(v != slice(None) for v in index if isinstance(v, slice)):
        return None
    return arrays[0]


def _distinct_along_one_axis(x, index: tuple) -> bool:
    """Is ``index`` full slices around one 1-D integer array naming each position of its axis at most once?"""
    ax = _lone_axis(index)
    if ax is None:
        return False
    pos = np.asarray(index[ax])
    if pos.ndim != 1 or pos.dtype.kind not in "iu":
        return False
    return np.unique(np.where(pos < 0, pos + x.shape[ax], pos)).size == pos.size


def _one_axis(x, index: tuple, value) -> Optional[int]:
    """The axis of ``index`` when it is full slices around one 1-D int32/int64 tensor and ``x`` and ``value``
    share a real, non-bool dtype (``Tensor.index_add``'s case), else None."""
    ax = _lone_axis(index)
    if ax is None or x.dtype != value.dtype or x.dtype.is_complex or str(x.dtype) == "torch.bool":
        return None
    if index[ax].ndim != 1 or str(index[ax].dtype) not in ("torch.int64", "torch.int32"):
        return None
    return ax


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


__all__ = ["as_array", "dtype", "device", "is_integer", "numpy_quiet", "is_traced", "check", "check_range", "check_divisor",
           "collecting_checks", "active_checks", "message_of", "TracedChecks", "grid", "set_at", "add_at", "MERGE_MIN",
           "merged_axes", "reduced_view"]
