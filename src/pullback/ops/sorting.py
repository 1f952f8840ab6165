"""Order statistics: ``argsort`` (stable, ascending or descending), ``topk_indices`` and ``nonzero``.

They return int64 indices and carry no gradient; ``sort`` and ``topk`` are ``gather`` of their results, which
is how their values get gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.errors import ExecutionError
from ..ir.types import DTYPES, Any, TensorType, TupleType
from .common import normalize_axis, numel, tensor_arg
from .kernels import is_traced
from .nn import check_bool, check_int
from .registry import FusionKind, array_namespace, defop, type_error

NO_GRAD = "the result is integer indices: it carries no gradient"


@dataclass(frozen=True)
class ArgsortAttrs:
    """``stable``: equal elements keep their order (also when ``descending``); otherwise their order is the
    target's sort's (on torch ATen's, the order eager's ``torch.sort`` gives; stable elsewhere). NaN sorts as the
    largest value."""

    axis: int = -1
    descending: bool = False
    stable: bool = True

    def __post_init__(self):
        check_int(self, "axis")
        check_bool(self, "descending", "stable")


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


def _argsort_torch(x, attrs):
    """ATen's sort when the order of ties is free (``stable=False``): eager's permutation, which the rows of a
    mixture of experts' grouped GEMM follow (its bits depend on where a row falls in its group)."""
    import torch

    if attrs.stable or x.ndim == 0:
        return _argsort_kernel(array_namespace("torch"), x, attrs)
    return torch.sort(x, dim=attrs.axis, descending=attrs.descending).indices


argsort = defop("argsort", 1, _argsort_infer, kernel=_argsort_kernel, impls={"torch": _argsort_torch}, attrs_type=ArgsortAttrs,
                differentiable=False,
                nondiff_reason=NO_GRAD, pattern=FusionKind.OPAQUE, flops=lambda ts, out, a: numel(out.shape),
                torch_name="argsort", doc="``argsort(x, axis=-1, descending=False, stable=True)``: int64 indices of a sort (stable "
                                            "unless ``stable=False``: ties in the target's order, ATen's on torch).")


@dataclass(frozen=True)
class TopkAttrs:
    """The ``k`` largest (``largest=False``: smallest) along ``axis``, in sorted order."""

    k: int = 1
    axis: int = -1
    largest: bool = True

    def __post_init__(self):
        check_int(self, "k", lo=0)
        check_int(self, "axis")
        check_bool(self, "largest")


def _topk_infer(arg_types, attrs):
    x = tensor_arg("topk_indices", arg_types, 0)
    if x.ndim == 0:
        if attrs.k != 1:
            raise type_error("topk_indices", arg_types, f"k={attrs.k}: a scalar has exactly 1 element")
        return TensorType((), "int64")
    ax = normalize_axis("topk_indices", attrs.axis, x.ndim, arg_types)
    n = x.shape[ax]
    if n is not Any and attrs.k > n:
        raise type_error("topk_indices", arg_types, f"k={attrs.k} exceeds the {n} elements along axis {attrs.axis}")
    return TensorType(x.shape[:ax] + (attrs.k,) + x.shape[ax + 1:], "int64")


def _topk_kernel(xp, x, attrs):
    """A stable sort's first ``k`` (ties: the lower index first)."""
    order = _argsort_kernel(xp, x, ArgsortAttrs(attrs.axis, attrs.largest))
    if x.ndim == 0:
        return order
    ax = attrs.axis % x.ndim
    return order[(slice(None),) * ax + (slice(0, attrs.k),)]


def _topk_torch(x, attrs):
    """``torch.topk``, eager's kernel: its choice among ties (a mixture of experts' router in bfloat16 meets them,
    and which expert wins decides the routing) and its order."""
    import torch

    if x.ndim == 0 or x.dtype == torch.bool:  # (ATen's topk takes no bool)
        return _topk_kernel(array_namespace("torch"), x, attrs)
    return torch.topk(x, attrs.k, dim=attrs.axis, largest=attrs.largest, sorted=True).indices


topk_indices = defop("topk_indices", 1, _topk_infer, kernel=_topk_kernel, impls={"torch": _topk_torch}, attrs_type=TopkAttrs,
                     differentiable=False, nondiff_reason=NO_GRAD, pattern=FusionKind.OPAQUE,
                     flops=lambda ts, out, a: numel(ts[0].shape), torch_name="topk", example_attrs={"k": 1},
                     doc="``topk_indices(x, k, axis=-1, largest=True)``: int64 indices of the ``k`` largest (or smallest) "
                         "entries in sorted order; ties as a stable sort breaks them, on torch as ``torch.topk`` does.")


def _nonzero_infer(arg_types, attrs):
    x = tensor_arg("nonzero", arg_types, 0)
    return TensorType((Any, x.ndim), "int64")


def _nonzero_kernel(xp, x, attrs=None):
    if x.ndim == 0:
        return xp.zeros((1 if bool(x) else 0, 0), dtype=xp.int64)
    return xp.astype(xp.stack(xp.nonzero(x), axis=-1), xp.int64)


def _eager_only_on_jax(name: str, kernel):
    """The jax implementation of an operator whose result's shape depends on the data: ``kernel`` on concrete
    arrays, an error under ``jax.jit`` naming the targets that run it."""
    def impl(x, attrs=None):
        if not is_traced(x):
            try:
                return kernel(array_namespace("jax"), x, attrs)
            except Exception as e:  # a constant operand inside jax.jit: its sizes are staged out too
                if "Concretization" not in type(e).__name__ and "Tracer" not in type(e).__name__:
                    raise
        raise ExecutionError(f"{name}: the result's shape depends on the data, and the jax target compiles "
                             "programs with jax.jit (static shapes); run this program on the numpy or torch target")
    return impl


_nonzero_jax = _eager_only_on_jax("nonzero", _nonzero_kernel)


nonzero = defop("nonzero", 1, _nonzero_infer, kernel=_nonzero_kernel, impls={"jax": _nonzero_jax}, differentiable=False, nondiff_reason=NO_GRAD,
                pattern=FusionKind.OPAQUE, flops=lambda ts, out, a: 0, torch_name="nonzero",
                doc="``(n, ndim)`` int64 coordinates of the non-zero elements, in row-major order (``n`` is known at run time).")



def _unique_infer(arg_types, attrs):
    x = tensor_arg("unique", arg_types, 0)
    return TupleType((TensorType((Any,), x.dtype), TensorType(x.shape, "int64"), TensorType((Any,), "int64")))


def _unique_kernel(xp, x, attrs=None):
    """The array API's ``unique_all`` of the flattened tensor (ascending; each NaN its own value, as PyTorch)."""
    u = xp.unique_all(xp.reshape(x, (-1,)))
    return u.values, xp.reshape(xp.astype(u.inverse_indices, xp.int64), x.shape), xp.astype(u.counts, xp.int64)


def _unique_torch(x, attrs=None):
    values, inverse, counts = x.reshape(-1).unique(sorted=True, return_inverse=True, return_counts=True)
    return values, inverse.reshape(x.shape), counts


unique = defop("unique", 1, _unique_infer, kernel=_unique_kernel,
               impls={"jax": _eager_only_on_jax("unique", _unique_kernel), "torch": _unique_torch},
               differentiable=False, nondiff_reason="its values are a selection of distinct entries (PyTorch gives "
               "them no gradient)", pattern=FusionKind.OPAQUE, dtypes=DTYPES, flops=lambda ts, out, a: 0,
               torch_name="_unique2",
               doc="``(values, inverse, counts)``: the distinct entries in ascending order (their number is known "
                   "at run time), each entry's position among them (the input's shape) and how often each occurs.")

__all__ = ["argsort", "topk_indices", "nonzero", "unique", "ArgsortAttrs", "TopkAttrs"]
