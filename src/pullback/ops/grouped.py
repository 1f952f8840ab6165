"""Grouped matrix products: a mixture of experts' GEMMs over rows sorted by expert (``torch._grouped_mm``,
``jax.lax.ragged_dot``).

``nn.grouped_matmul(x (S, K), w (E, K, N), offs (E,))`` -> (S, N): ``offs`` holds the groups' cumulative row
counts (non-decreasing, at most S); group ``e`` is rows ``offs[e-1]:offs[e]`` (from 0 for the first) and goes
through ``w[e]``. Rows past ``offs[-1]`` are zero (ATen leaves them unwritten).

``nn.grouped_transpose_matmul(a (S, K), b (S, N), offs (E,))`` -> (E, K, N): group ``e``'s ``a_e^T b_e``, zero
for an empty group; rows past ``offs[-1]`` take no part. It is the weight gradient of ``nn.grouped_matmul``.

The two are each other's gradients, so every order of derivative stays in these operators. Half precision
accumulates in float32 and rounds once, as ATen does. On torch ATen's ``_grouped_mm`` (eager's kernel) where it
takes the operands, else one ``torch.mm`` per group into its rows (the same bits); numpy one BLAS GEMM per group
into its rows, jax ``ragged_dot``.
"""

from __future__ import annotations

from ..ir.expr import Call, Expr
from ..ir.types import FLOAT_DTYPES, INT_DTYPES, Any, TensorType
from . import layout as T
from .common import tensor_arg
from .kernels import accumulated
from .registry import defop, type_error

_GROUPED = "nn.grouped_matmul"
_TRANSPOSE = "nn.grouped_transpose_matmul"


def _operands(name: str, arg_types, ranks: tuple, layout: str) -> tuple:
    """The three operands' types: two floating-point tensors of one dtype and ``ranks``, and the offsets."""
    x, y, offs = (tensor_arg(name, arg_types, i) for i in range(3))
    if x.dtype != y.dtype or x.dtype not in FLOAT_DTYPES:
        raise type_error(name, arg_types, f"expects two floating-point tensors of one dtype, got {x.dtype} and {y.dtype}")
    if offs.dtype not in INT_DTYPES or offs.ndim != 1:
        raise type_error(name, arg_types, f"offs must be a rank-1 integer tensor (the groups' cumulative row counts), got {offs!r}")
    if (x.ndim, y.ndim) != ranks:
        raise type_error(name, arg_types, f"expects {layout}, got ranks {x.ndim} and {y.ndim}")
    return x, y, offs


def _agree(name: str, arg_types, what: str, a, b) -> None:
    if a is not Any and b is not Any and a != b:
        raise type_error(name, arg_types, f"{what} differ: {a} vs {b}")


def _infer(arg_types, attrs):
    x, w, offs = _operands(_GROUPED, arg_types, (2, 3), "x of rank 2 (S, K) and w of rank 3 (E, K, N)")
    _agree(_GROUPED, arg_types, "contraction sizes (x's K, w's K)", x.shape[1], w.shape[1])
    _agree(_GROUPED, arg_types, "group counts (w's E, offs' length)", w.shape[0], offs.shape[0])
    return TensorType((x.shape[0], w.shape[2]), x.dtype)


def _transpose_infer(arg_types, attrs):
    a, b, offs = _operands(_TRANSPOSE, arg_types, (2, 2), "a (S, K) and b (S, N) of rank 2")
    _agree(_TRANSPOSE, arg_types, "row counts (a's S, b's S)", a.shape[0], b.shape[0])
    return TensorType((offs.shape[0], a.shape[1], b.shape[1]), a.dtype)


def _groups(offs, rows: int):
    """(group, start, end) of every non-empty group, from host values of ``offs``."""
    start = 0
    for e, end in enumerate(int(v) for v in offs.tolist()):
        end = min(max(end, start), rows)
        if end > start:
            yield e, start, end
        start = end


def _kernel(xp, x, w, offs, attrs):
    """The definition on any namespace: one GEMM per group (the host reads ``offs``; the groups are contiguous
    from row 0), in float32 for half precision, then zero rows."""
    wx, ww = accumulated(xp, x), accumulated(xp, w)
    parts = [xp.matmul(wx[lo:hi], ww[e]) for e, lo, hi in _groups(offs, x.shape[0])]
    end = sum(p.shape[0] for p in parts)
    parts.append(xp.zeros((x.shape[0] - end, w.shape[2]), dtype=wx.dtype))
    return xp.astype(xp.concat(parts, axis=0), x.dtype)


def _transpose_kernel(xp, a, b, offs, attrs):
    wa, wb = accumulated(xp, a), accumulated(xp, b)
    out = [xp.zeros((a.shape[1], b.shape[1]), dtype=wa.dtype) for _ in range(offs.shape[0])]
    for e, lo, hi in _groups(offs, a.shape[0]):
        out[e] = xp.matmul(xp.matrix_transpose(wa[lo:hi]), wb[lo:hi])
    return xp.astype(xp.stack(out), a.dtype)


def _rows_into(out, mm, x, w, offs):
    """Each group's rows of ``x`` times its ``w[e]`` by ``mm(a, b, out=)`` into those rows of ``out``; rows past
    the last group zeroed."""
    end = 0
    for e, lo, hi in _groups(offs, x.shape[0]):
        mm(x[lo:hi], w[e], out=out[lo:hi])
        end = hi
    out[end:] = 0
    return out


def _groups_into(out, mm, a, b, offs):
    """Each group's ``a_e^T b_e`` by ``mm`` into ``out[e]`` (zeros already: an empty group stays 0)."""
    for e, lo, hi in _groups(offs, a.shape[0]):
        mm(a[lo:hi].T, b[lo:hi], out=out[e])
    return out


def _sorted_end(offs, rows: int):
    """``offs[-1]`` when ``offs`` is a non-empty, non-decreasing sequence within ``[0, rows]`` (ATen's
    ``_grouped_mm`` reads it unchecked), else None."""
    ends = offs.tolist()
    if not ends or ends[0] < 0 or ends[-1] > rows or any(a > b for a, b in zip(ends, ends[1:])):
        return None
    return ends[-1]


def _aten_takes(*ts) -> bool:
    """Whether ATen's ``_grouped_mm`` takes these operands: float32 or half precision at a 16-byte aligned
    address, the last two axes one of unit stride, every other stride a multiple of 16 bytes."""
    import torch

    for t in ts:
        if t.dtype not in (torch.float32, torch.bfloat16, torch.float16) or t.data_ptr() % 16:
            return False
        q, strides = 16 // t.element_size(), t.stride()
        if 1 not in strides[-2:] or any(s % q for s in strides if s != 1):
            return False
    return True


def _torch(x, w, offs, attrs):
    """ATen's ``_grouped_mm`` (eager's kernel, one mm per group inside) where it takes the operands, its rows past
    the last group zeroed; else one ``torch.mm`` per group into its rows of the result: the same bits, for every
    dtype, stride and offset sequence (a Python loop: 60-300 us more a call at Mixtral's sizes)."""
    import torch

    end = _sorted_end(offs, x.shape[0])
    if end is not None and _aten_takes(x, w):
        out = torch._grouped_mm(x, w, offs=offs.to(torch.int32))
        out[end:] = 0
        return out
    return _rows_into(x.new_empty((x.shape[0], w.shape[2])), torch.mm, x, w, offs)


def _transpose_torch(a, b, offs, attrs):
    import torch

    if _sorted_end(offs, a.shape[0]) is not None and _aten_takes(a.t(), b):
        return torch._grouped_mm(a.t(), b, offs=offs.to(torch.int32))
    return _groups_into(a.new_zeros((offs.shape[0], a.shape[1], b.shape[1])), torch.mm, a, b, offs)


def _numpy(x, w, offs, attrs):
    """NumPy's BLAS GEMM per group into the result's rows (2.4x the concatenated products' speed on Mixtral's
    experts); float16 and bfloat16 summed in float32 and rounded once."""
    import numpy as np

    wx, ww = accumulated(np, x), accumulated(np, w)
    out = _rows_into(np.empty((x.shape[0], w.shape[2]), wx.dtype), np.matmul, wx, ww, offs)
    return out.astype(x.dtype, copy=False)


def _transpose_numpy(a, b, offs, attrs):
    import numpy as np

    wa, wb = accumulated(np, a), accumulated(np, b)
    out = _groups_into(np.zeros((offs.shape[0], a.shape[1], b.shape[1]), wa.dtype), np.matmul, wa, wb, offs)
    return out.astype(a.dtype, copy=False)


def _sizes(jnp, lax, offs, rows: int):
    """The groups' row counts (``ragged_dot``'s ``group_sizes``), offs read as ``_groups`` reads them."""
    return jnp.diff(lax.cummax(jnp.clip(offs.astype(jnp.int32), 0, rows)), prepend=0)


def _jax(x, w, offs, attrs):
    """``lax.ragged_dot`` (traceable: the group sizes stay data)."""
    import jax.numpy as jnp
    from jax import lax

    acc = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else x.dtype
    return lax.ragged_dot(x, w, _sizes(jnp, lax, offs, x.shape[0]), preferred_element_type=acc).astype(x.dtype)


def _transpose_jax(a, b, offs, attrs):
    import jax.numpy as jnp
    from jax import lax

    acc = jnp.float32 if a.dtype in (jnp.bfloat16, jnp.float16) else a.dtype
    dims = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(((0,), (0,)), ((), ())), lhs_ragged_dimensions=[0],
                                         rhs_group_dimensions=[])
    return lax.ragged_dot_general(a, b, _sizes(jnp, lax, offs, a.shape[0]), dims, preferred_element_type=acc).astype(a.dtype)


def _grad(call: Call, g: Expr):
    """y = x w_e per group: dx = g w_e^T, dw_e = x_e^T g_e."""
    x, w, offs = call.args
    return [grouped_matmul(g, T.transpose(w, (0, 2, 1)), offs), grouped_transpose_matmul(x, g, offs), None]


def _transpose_grad(call: Call, g: Expr):
    """W_e = a_e^T b_e: da = b_e g_e^T, db = a_e g_e, per row of group e."""
    a, b, offs = call.args
    return [grouped_matmul(b, T.transpose(g, (0, 2, 1)), offs), grouped_matmul(a, g, offs), None]


def _flops(arg_types, out_type, attrs):
    k = arg_types[0].shape[1]
    n = out_type.shape[-1]
    s = arg_types[0].shape[0]
    return 2 * s * k * n if all(isinstance(d, int) for d in (s, k, n)) else 0


_DTYPES = FLOAT_DTYPES + INT_DTYPES
grouped_matmul = defop(_GROUPED, 3, _infer, kernel=_kernel, impls={"numpy": _numpy, "torch": _torch, "jax": _jax}, grad=_grad,
                       flops=_flops, dtypes=_DTYPES, torch_name="_grouped_mm",
                       doc="``(x (S, K), w (E, K, N), offs (E,)) -> (S, N)``: rows ``offs[e-1]:offs[e]`` times ``w[e]`` "
                           "(a mixture of experts' GEMM over rows sorted by expert); rows past ``offs[-1]`` are zero.")
grouped_transpose_matmul = defop(_TRANSPOSE, 3, _transpose_infer, kernel=_transpose_kernel,
                                 impls={"numpy": _transpose_numpy, "torch": _transpose_torch, "jax": _transpose_jax}, grad=_transpose_grad,
                                 flops=_flops, dtypes=_DTYPES, torch_name="_grouped_mm",
                                 doc="``(a (S, K), b (S, N), offs (E,)) -> (E, K, N)``: each group's ``a_e^T b_e`` (the "
                                     "weight gradient of ``nn.grouped_matmul``); zero for an empty group.")

__all__ = ["grouped_matmul", "grouped_transpose_matmul"]
