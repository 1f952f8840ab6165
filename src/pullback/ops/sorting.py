"""Order statistics: ``argsort`` (stable, ascending or descending) and ``nonzero``.

Both return int64 indices and carry no gradient; ``sort`` and ``topk`` are ``gather`` of ``argsort``'s
result, which is how their values get gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.errors import ExecutionError
from ..ir.types import Any, TensorType
from .common import normalize_axis, numel, tensor_arg
from .kernels import is_traced
from .nn import check_bool, check_int
from .registry import FusionKind, array_namespace, defop

NO_GRAD = "the result is integer indices: it carries no gradient"


@dataclass(frozen=True)
class ArgsortAttrs:
    """Stable: equal elements keep their order (also when ``descending``); NaN sorts as the largest value."""

    axis: int = -1
    descending: bool = False

    def __post_init__(self):
        check_int(self, "axis")
        check_bool(self, "descending")


def _argsort_infer(arg_types, attrs):
    x = tensor_arg("argsort", arg_types, 0)
    normalize_axis("argsort", attrs.axis, max(x.ndim, 1), arg_types)
    return TensorType(x.shape, "int64")


def _argsort_kernel(xp, x, attrs):
    if x.ndim == 0:
        return xp.zeros((), dtype=xp.int64)
    ax = attrs.axis % x.ndim
    if not attrs.descending:
        return xp.astype(xp.argsort(x, axis=ax, stable=True), xp.int64)
    # stable descending: reverse the stable ascending order of the reversed axis
    rev = xp.astype(xp.argsort(xp.flip(x, axis=ax), axis=ax, stable=True), xp.int64)
    return xp.flip((x.shape[ax] - 1) - rev, axis=ax)


argsort = defop("argsort", 1, _argsort_infer, kernel=_argsort_kernel, attrs_type=ArgsortAttrs, differentiable=False,
                nondiff_reason=NO_GRAD, pattern=FusionKind.OPAQUE, flops=lambda ts, out, a: numel(out.shape),
                torch_name="argsort", doc="``argsort(x, axis=-1, descending=False)``: int64 indices of a stable sort.")


def _nonzero_infer(arg_types, attrs):
    x = tensor_arg("nonzero", arg_types, 0)
    return TensorType((Any, x.ndim), "int64")


def _nonzero_kernel(xp, x, attrs=None):
    if x.ndim == 0:
        return xp.zeros((1 if bool(x) else 0, 0), dtype=xp.int64)
    return xp.astype(xp.stack(xp.nonzero(x), axis=-1), xp.int64)


def _nonzero_jax(x, attrs=None):
    if is_traced(x):
        raise ExecutionError("nonzero: the result's shape depends on the data, and the jax target compiles "
                             "programs with jax.jit (static shapes); run this program on the numpy or torch target")
    return _nonzero_kernel(array_namespace("jax"), x, attrs)


nonzero = defop("nonzero", 1, _nonzero_infer, kernel=_nonzero_kernel, impls={"jax": _nonzero_jax}, differentiable=False, nondiff_reason=NO_GRAD,
                pattern=FusionKind.OPAQUE, flops=lambda ts, out, a: 0, torch_name="nonzero",
                doc="``(n, ndim)`` int64 coordinates of the non-zero elements, in row-major order (``n`` is known at run time).")

__all__ = ["argsort", "nonzero", "ArgsortAttrs"]
