"""``scatter``: write ``updates`` into ``data`` at gather's positions (``torch.scatter``), the set-valued
sibling of ``scatter_add``.

``scatter(data, indices, updates, axis)``: ``out = data`` except ``out[i][indices[i][j][k]][k] = updates[i][j][k]``
for ``axis=1``; ``indices`` and ``updates`` have one shape, no larger than ``data`` off the axis. Where an index
repeats, the last write wins. Gradients: ``data`` gets ``g`` with the written positions zeroed (a scatter of
zeros), ``updates`` gets ``gather(g, indices)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir.errors import AttrError
from ..ir.expr import Call, Expr
from ..ir.types import INT_DTYPES, is_float
from . import layout as T
from .common import normalize_axis, numel, tensor_arg
from .kernels import check_range, grid, set_at
from .registry import FusionKind, defop, get_op, type_error


@dataclass(frozen=True)
class ScatterAttrs:
    axis: int = 0

    def __post_init__(self):
        if isinstance(self.axis, bool) or not isinstance(self.axis, (int, np.integer)):
            raise AttrError(f"attribute axis must be an int, got {self.axis!r}")
        object.__setattr__(self, "axis", int(self.axis))


def _infer(arg_types, attrs):
    x = tensor_arg("scatter", arg_types, 0)
    idx = tensor_arg("scatter", arg_types, 1)
    u = tensor_arg("scatter", arg_types, 2)
    if idx.dtype not in INT_DTYPES:
        raise type_error("scatter", arg_types, f"argument 1 (indices) must be an integer tensor, got {idx.dtype}")
    ax = normalize_axis("scatter", attrs.axis, max(x.ndim, 1), arg_types)
    if idx.ndim != x.ndim:
        raise type_error("scatter", arg_types, f"indices must have the rank of data ({x.ndim}), got {idx.ndim}")
    for i, (d, k) in enumerate(zip(x.shape, idx.shape)):
        if i != ax and isinstance(d, int) and isinstance(k, int) and k > d:
            raise type_error("scatter", arg_types, f"indices dimension {i} ({k}) exceeds the data's ({d})")
    if u.dtype != x.dtype or u.shape != idx.shape:
        raise type_error("scatter", arg_types, f"updates must be a {x.dtype} tensor of the indices' shape {idx.shape}")
    return x


def _kernel(xp, x, idx, u, attrs):
    if x.ndim == 0:
        return xp.reshape(u, ()) if math.prod(u.shape) else x
    axis = attrs.axis % x.ndim
    check_range("scatter", idx, 0, x.shape[axis], f"[0, {x.shape[axis]}) along axis {axis}")
    return set_at(x, grid(xp, idx, axis), u)


def _grad(call: Call, g: Expr):
    x, idx, u = call.args
    if not is_float(x.checked_type.dtype):
        return [None, None, None]
    return [scatter(g, idx, T.zeros_like(u), call.attrs.axis), None, get_op("gather")(g, call.attrs.axis, idx)]


scatter = defop("scatter", 3, _infer, kernel=_kernel, attrs_type=ScatterAttrs, grad=_grad,
                pattern=FusionKind.OPAQUE, flops=lambda ts, out, a: numel(ts[1].shape), torch_name="scatter",
                doc="``scatter(data, indices, updates, axis)``: data with updates written at gather's positions.")

__all__ = ["scatter", "ScatterAttrs"]
