"""ATen converters for indexing: advanced indexing (``index``, ``index_put``), gather/scatter, slices written
back (``slice_scatter``, ``select_scatter``), sorting (``sort``, ``topk``), scans (``cumsum``, ``cumprod``), ``nonzero``,
``masked_scatter``, ``diagonal`` and ``as_strided``. Registered in ``aten_table.ATEN_TABLE``.

Advanced indexing with several index tensors is linearised: the indexed dimensions move to the front and
merge into one, the index tensors combine into one flat index (negative indices wrap), and one ``take`` (or
``scatter`` / ``index_add`` for ``index_put``) does the work, so gradients come from those operators' rules.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.errors import PullbackError
from ..ir.expr import Expr, TupleGetItem, const
from ..ir.types import Any
from ..ops.common import broadcast_shapes
from .aten_table import _op, as_dtype, aten, cast, expand_to, newshape, norm_axis, result_dtype, scalar, slice_bounds, static


def _int64(cx, i: Expr) -> Expr:
    return cast(cx, i, "int64")


@aten("aten.gather.default")
def _gather(cx, x, dim, index, sparse_grad=False):
    if cx.ndim_of(x) == 0:
        return _op("reshape")(x, cx.out_shape)
    if cx.ndim_of(index) != cx.ndim_of(x) and 0 in cx.shape_of(index):  # PyTorch takes an empty index of any rank
        return _op("zeros")(static(cx, "gather", cx.out_shape), cx.out_dtype)
    return _op("gather")(x, index, axis=norm_axis(dim, cx.ndim_of(x)))


@aten("aten.index_select.default")
def _index_select(cx, x, dim, index):
    if cx.ndim_of(x) == 0:
        return _op("reshape")(x, cx.out_shape)
    if cx.ndim_of(index) == 0:
        index = _op("reshape")(index, (1,))
    return _op("take")(x, index, axis=norm_axis(dim, cx.ndim_of(x)), mode="fast")  # out of range: an error


@aten("aten.index_fill.int_Tensor", "aten.index_fill.int_Scalar")
def _index_fill(cx, x, dim, index, value):
    """``x`` with the slices at ``index`` along ``dim`` set to ``value``: a ``where`` over a mask of the indexed
    positions, so a repeated index is one position (the value's gradient sums each filled element once, as
    PyTorch's index_fill backward does)."""
    n = cx.ndim_of(x)
    if n == 0:
        return _op("reshape")(as_dtype(cx, value, cx.dtype_of(x)), ())
    axis = norm_axis(dim, n)
    size = static(cx, "index_fill", (cx.shape_of(x)[axis],))[0]
    idx = _op("remainder")(_op("reshape")(_int64(cx, index), (-1,)), scalar(size, "int64"))  # -1 is the last
    hits = _op("one_hot")(idx, scalar(1, "int64"), scalar(0, "int64"), depth=size, dtype="int64")  # (K, size)
    mask = _op("greater")(_op("sum")(hits, (0,), False), scalar(0, "int64"))  # (size,)
    mask = _op("reshape")(mask, tuple(size if i == axis else 1 for i in range(n)))
    return _op("where")(mask, as_dtype(cx, value, cx.dtype_of(x)), x)


# ------------------------------------------------------------------ advanced indexing


def _expand_bool_indices(cx, indices: list) -> list:
    """Boolean index tensors become one int64 index per dimension they cover (``nonzero``'s columns)."""
    out = []
    for idx in indices:
        if idx is None or cx.dtype_of(idx) != "bool":
            out.append(idx)
            continue
        nz = _op("nonzero")(idx)
        for k in range(cx.ndim_of(idx)):
            out.append(_op("squeeze")(_op("strided_slice")(nz, (k,), (k + 1,), (1,), (1,)), (1,)))
    return out


def _linearized(cx, x, indices: list) -> tuple:
    """``(flat_x, flat_index, positions, batch_shape, rest_shape, perm)`` for ``x[indices]``: ``flat_x`` has the
    indexed dims merged first, ``flat_index`` addresses that merged dim (batch_shape: the broadcast index shape)."""
    shape = tuple(cx.shape_of(x))  # one dynamic (batch) dimension at most: merged dims are reshaped with -1
    indices = _expand_bool_indices(cx, list(indices))
    if len(indices) > len(shape):
        raise PullbackError(f"too many indices ({len(indices)}) for a tensor of rank {len(shape)}")
    pos = [i for i, idx in enumerate(indices) if idx is not None]
    tensors = [_int64(cx, indices[i]) for i in pos]
    batch = broadcast_shapes("index", (), *[tuple(cx.shape_of(t)) for t in tensors])
    perm = tuple(pos) + tuple(i for i in range(len(shape)) if i not in pos)
    xt = x if perm == tuple(range(len(shape))) else _op("transpose")(x, perm)
    dims = [shape[i] for i in pos]
    rest = tuple(shape[i] for i in range(len(shape)) if i not in pos)
    if len(pos) > 1:
        merged = Any if Any in dims else math.prod(dims)
        flat_x = _op("reshape")(xt, newshape(cx, "advanced indexing", (merged,) + rest))
    else:
        flat_x = xt
    def tensor(v):
        return scalar(v, "int64") if isinstance(v, int) else v

    flat, stride = None, 1  # an int, or a rank-0 tensor once past a dynamic dimension (its size read off an input)
    sizes = cx.arg_val(0).shape
    for k, (t, d) in enumerate(zip(reversed(tensors), reversed(dims))):
        if d and d is not Any:  # negative indices count from the end (of a dynamic dim: not wrapped)
            t = _op("remainder")(t, scalar(d, "int64"))
        term = t if stride == 1 else _op("multiply")(t, tensor(stride))
        flat = term if flat is None else _op("add")(term, flat)
        if k == len(dims) - 1:
            break
        size = d if d is not Any else cx.size_scalar(sizes[pos[len(dims) - 1 - k]], "int64")
        stride = stride * size if isinstance(stride, int) and isinstance(size, int) else _op("multiply")(
            tensor(stride), tensor(size))
    if tuple(cx.shape_of(flat)) != batch:
        flat = expand_to(cx, flat, batch)
    return flat_x, flat, pos, batch, rest, shape


def _consecutive(pos: list) -> bool:
    return pos == list(range(pos[0], pos[0] + len(pos)))


def _result_layout(pos: list, batch: tuple, rest_rank: int) -> tuple:
    """The permutation from ``batch + rest`` to PyTorch's layout (index dims in place when consecutive)."""
    nb = len(batch)
    if not _consecutive(pos) or pos[0] == 0:
        return tuple(range(nb + rest_rank))
    before = tuple(range(nb, nb + pos[0]))
    return before + tuple(range(nb)) + tuple(range(nb + pos[0], nb + rest_rank))


@aten("aten.index.Tensor", "aten._unsafe_index.Tensor")
def _index(cx, x, indices):
    """``x[indices]`` as one ``take``; its gradient adds each index's rows one by one (``sequential``), as eager's
    ``index_put_(accumulate=True)`` does (in half precision, its rounding)."""
    pos = [i for i, idx in enumerate(indices) if idx is not None]
    if len(pos) == 1 and cx.dtype_of(indices[pos[0]]) != "bool":  # one index tensor: take along its axis
        return _op("take")(x, _int64(cx, indices[pos[0]]), axis=pos[0], mode="fast", sequential=True)  # negatives wrap
    flat_x, flat, pos, batch, rest, _ = _linearized(cx, x, indices)
    out = _op("take")(flat_x, flat, axis=0, sequential=True)
    layout = _result_layout(pos, batch, len(rest))
    return out if layout == tuple(range(len(layout))) else _op("transpose")(out, layout)


@aten("aten.index_put.default", "aten._unsafe_index_put.default", "aten.index_put_.default")
def _index_put(cx, x, indices, values, accumulate=False):
    """``x[indices] = values`` (``+=`` with ``accumulate``); where an index repeats without accumulate, the last
    write wins."""
    dt = cx.dtype_of(x)
    values = cast(cx, values, dt)
    if len(indices) == 1 and indices[0] is not None and cx.dtype_of(indices[0]) == "bool":  # x[mask] = values
        mask = indices[0]
        shape = static(cx, "index_put", cx.shape_of(x))
        rest = shape[cx.ndim_of(mask):]  # x[mask] has shape (number of true entries,) + rest
        vshape = tuple(cx.shape_of(values))
        while cx.ndim_of(mask) < cx.ndim_of(x):
            mask = _op("expand_dims")(mask, cx.ndim_of(mask))
        one = Any not in vshape and math.prod(vshape) == 1  # (a dynamic count: one row per selected entry)
        if one or len(vshape) <= len(rest) or (len(vshape) == len(rest) + 1 and vshape[0] == 1):
            # one value, or values broadcast over rest: every selected entry gets the same values, a where
            vals = _op("reshape")(values, ()) if one else values
            vals = vals if tuple(cx.shape_of(vals)) == shape else _op("broadcast_to")(vals, shape)
            if accumulate:
                return _op("add")(x, _op("where")(mask, vals, _op("zeros_like")(x)))
            return _op("where")(mask, vals, x)
        if vshape[1:] != rest:  # one row of values per selected entry, broadcast over rest
            values = _op("broadcast_to")(values, (vshape[0],) + rest)
        if tuple(cx.shape_of(mask)) != shape:
            mask = _op("broadcast_to")(mask, shape)
        if accumulate:
            return _op("add")(x, _masked_fill_from(cx, _op("zeros_like")(x), mask, values, shape))
        return _masked_fill_from(cx, x, mask, values, shape)
    flat_x, flat, pos, batch, rest, shape = _linearized(cx, x, indices)
    # x's indexed (first) dimension may be dynamic, and so may one dimension of the index (rows a mask selected,
    # as `out.index_add_(0, idx, rows)` of a mixture of experts' tokens) when the values have the index's shape
    layout = _result_layout(pos, batch, len(rest))
    torch_shape = tuple((batch + rest)[i] for i in layout)
    if tuple(cx.shape_of(values)) != torch_shape or sum(d is Any for d in batch) > 1:
        static(cx, "index_put", tuple(batch) + tuple(rest))
        values = _op("broadcast_to")(values, torch_shape)
    static(cx, "index_put", rest)
    vals = values
    if layout != tuple(range(len(layout))):
        vals = _op("transpose")(vals, tuple(int(i) for i in np.argsort(layout)))
    nb = -1 if Any in batch else math.prod(batch)
    vals = _op("reshape")(vals, (nb,) + rest)
    flat = _op("reshape")(flat, (nb,))
    if accumulate:
        out = _op("index_add")(flat_x, flat, vals, axis=0, sequential=True)  # eager's rounding in half precision
    else:
        idx = _op("reshape")(flat, (nb,) + (1,) * len(rest))
        out = _op("scatter")(flat_x, _op("broadcast_to_like")(idx, vals), vals, axis=0)
    perm = tuple(pos) + tuple(i for i in range(len(shape)) if i not in pos)
    out = _op("reshape")(out, newshape(cx, "index_put", tuple(shape[i] for i in perm)))
    return out if perm == tuple(range(len(shape))) else _op("transpose")(out, tuple(int(i) for i in np.argsort(perm)))


# ------------------------------------------------------------------ scatter


def _fit(cx, src, index) -> Expr:
    """``src`` cut to ``index``'s shape (PyTorch reads only that corner of a larger ``src``)."""
    s, i = tuple(cx.shape_of(src)), tuple(cx.shape_of(index))
    if s == i:  # (a dynamic size of both: rows one mask selected)
        return src
    i = static(cx, "scatter", i)
    return _op("strided_slice")(src, (0,) * len(i), i, None, tuple(range(len(i))))


@aten("aten.scatter.src", "aten.scatter.value")
def _scatter(cx, x, dim, index, src):
    if cx.ndim_of(x) == 0:
        return _scalar_scatter(cx, x, index, src)
    dt = cx.dtype_of(x)
    if isinstance(src, Expr):
        src = _fit(cx, cast(cx, src, dt), index)
    else:
        src = const(np.full(static(cx, "scatter", cx.shape_of(index)), src, dtype=dt))
    return _op("scatter")(x, _int64(cx, index), src, axis=norm_axis(dim, cx.ndim_of(x)))


def _scalar_scatter(cx, x, index, src):
    if math.prod(cx.shape_of(index)) == 0:
        return x
    return cast(cx, _op("reshape")(src, ()) if isinstance(src, Expr) else scalar(src, cx.dtype_of(x)), cx.dtype_of(x))


@aten("aten.scatter_add.default")
def _scatter_add(cx, x, dim, index, src):
    if cx.ndim_of(x) == 0:
        return x if math.prod(cx.shape_of(index)) == 0 else _op("add")(x, _op("reshape")(src, ()))
    return _op("scatter_add")(x, _int64(cx, index), _fit(cx, src, index), axis=norm_axis(dim, cx.ndim_of(x)))


@aten("aten.scatter_reduce.two")
def _scatter_reduce(cx, x, dim, index, src, reduce, include_self=True):
    """``scatter_reduce`` (sum, prod, mean, amax, amin); a rank-0 ``x`` is reduced as a vector of one."""
    if cx.ndim_of(x) == 0:
        flat = [_op("reshape")(t, (-1,)) for t in (x, index, src)]
        return _op("reshape")(_scatter_reduce(cx, *flat[:1], 0, *flat[1:], reduce, include_self), ())
    index = _int64(cx, index)
    src = _fit(cx, cast(cx, src, cx.dtype_of(x)), index)
    return _op("scatter_reduce")(x, index, src, axis=norm_axis(dim, cx.ndim_of(x)), reduce=reduce,
                                 include_self=bool(include_self))


@aten("aten.index_reduce.default")
def _index_reduce(cx, x, dim, index, source, reduce, include_self=True):
    """``index_reduce``: ``scatter_reduce`` with ``index`` (one position per slice of ``source`` along ``dim``)
    broadcast over the slice."""
    n = cx.ndim_of(x)
    if n == 0:
        return _scatter_reduce(cx, x, 0, index, source, reduce, include_self)
    axis = norm_axis(dim, n)
    shape = static(cx, "index_reduce", cx.shape_of(source))
    idx = _op("reshape")(_int64(cx, index), tuple(-1 if i == axis else 1 for i in range(n)))
    return _scatter_reduce(cx, x, axis, _op("broadcast_to")(idx, shape), source, reduce, include_self)


_SCATTER_MODES = {"add": "sum", "multiply": "prod"}


@aten("aten.scatter.reduce", "aten.scatter.value_reduce")
def _scatter_with_reduce(cx, x, dim, index, src, reduce):
    """``scatter(..., reduce='add' | 'multiply')``: a ``scatter_reduce`` that includes ``x``."""
    if not isinstance(src, Expr):
        src = const(np.full(static(cx, "scatter", cx.shape_of(index)), src, dtype=cx.dtype_of(x)))
    return _scatter_reduce(cx, x, dim, index, src, _SCATTER_MODES[reduce], True)


# ------------------------------------------------------------------ slices written back


@aten("aten.slice_scatter.default")
def _slice_scatter(cx, x, src, dim=0, start=None, end=None, step=1):
    dim = norm_axis(dim, cx.ndim_of(x))
    start, end, step = slice_bounds(cx.shape_of(x)[dim], start, end, step)
    return _op("strided_set")(x, cast(cx, src, cx.dtype_of(x)), (start,), (end,), (step,), (dim,))


@aten("aten.select_scatter.default")
def _select_scatter(cx, x, src, dim, index):
    dim = norm_axis(dim, cx.ndim_of(x))
    if index < 0:
        index += static(cx, "select_scatter", cx.shape_of(x))[dim]
    v = _op("expand_dims")(cast(cx, src, cx.dtype_of(x)), dim)
    return _op("strided_set")(x, v, (index,), (index + 1,), (1,), (dim,))


# ------------------------------------------------------------------ sorting and scans


def _sorted(cx, x, dim, descending, stable: bool) -> list:
    """``torch.sort``: an unstable one (the default) leaves ties in ATen's order on torch, eager's permutation."""
    if cx.ndim_of(x) == 0:
        return [x, _op("zeros")((), "int64")]
    axis = norm_axis(dim, cx.ndim_of(x))
    idx = _op("argsort")(x, axis, bool(descending), bool(stable))
    return [_op("gather")(x, idx, axis=axis), idx]


@aten("aten.sort.default")
def _sort(cx, x, dim=-1, descending=False):
    return _sorted(cx, x, dim, descending, False)


@aten("aten.sort.stable")
def _sort_stable(cx, x, stable=None, dim=-1, descending=False):
    return _sorted(cx, x, dim, descending, bool(stable))


@aten("aten.argsort.default", "aten.argsort.stable")
def _argsort(cx, x, *args, dim=-1, descending=False, stable=False):
    if args and isinstance(args[0], bool):  # argsort.stable(x, stable, dim, descending)
        args = args[1:]
    dim = args[0] if args else dim
    descending = args[1] if len(args) > 1 else descending
    return _sorted(cx, x, dim, descending)[1]


@aten("aten.topk.default")
def _topk(cx, x, k, dim=-1, largest=True, sorted=True):
    if cx.ndim_of(x) == 0:
        return [x, _op("zeros")((), "int64")]
    axis = norm_axis(dim, cx.ndim_of(x))
    idx = _op("topk_indices")(x, int(k), axis, bool(largest))  # torch.topk's own choice among ties on torch
    return [_op("gather")(x, idx, axis=axis), idx]


def _kth(cx, x, k: int, dim, keepdim) -> list:
    """``(values, indices)`` of the ``k``-th smallest entry (1-based) along ``dim``: a stable sort's position
    ``k - 1``, so the gradient goes to the gathered entry (with ties, the first in sorted order)."""
    if cx.ndim_of(x) == 0:
        return [x, _op("zeros")((), "int64")]
    axis = norm_axis(dim, cx.ndim_of(x))
    idx = _op("strided_slice")(_op("argsort")(x, axis, False), (k - 1,), (k,), (1,), (axis,))
    values = _op("gather")(x, idx, axis=axis)
    if keepdim:
        return [values, idx]
    return [_op("squeeze")(values, (axis,)), _op("squeeze")(idx, (axis,))]


@aten("aten.kthvalue.default")
def _kthvalue(cx, x, k, dim=-1, keepdim=False):
    return _kth(cx, x, int(k), dim, keepdim)


def _middle(cx, x, dim, keepdim: bool, skip_nan: bool) -> list:
    """``(values, indices)`` of the median along ``dim``: the lower of the two middle values for an even count,
    the entry at that position of a stable sort (where NaNs come last). With NaNs, ``median`` gives the first NaN
    (as PyTorch does) and ``nanmedian`` the median of the other entries (NaN when there are none)."""
    if cx.ndim_of(x) == 0:
        return [x, _op("zeros")((), "int64")]
    axis = norm_axis(dim, cx.ndim_of(x))
    n = static(cx, "median", (cx.shape_of(x)[axis],))[0]
    if cx.dtype_of(x) not in ("float16", "float32", "float64"):
        return _kth(cx, x, (n - 1) // 2 + 1, dim, keepdim)
    order = _op("argsort")(x, axis, False)
    nans = _op("sum")(_op("cast")(_op("isnan")(x), "int64"), (axis,), True)
    i64 = (lambda v: scalar(v, "int64"))
    if skip_nan:  # (valid - 1) // 2, 0 when every entry is NaN
        pos = _op("floor_divide")(_op("maximum")(_op("subtract")(i64(n - 1), nans), i64(0)), i64(2))
    else:
        pos = _op("where")(_op("greater")(nans, i64(0)), _op("subtract")(i64(n), nans), i64((n - 1) // 2))
    idx = _op("gather")(order, pos, axis=axis)
    values = _op("gather")(x, idx, axis=axis)
    if keepdim:
        return [values, idx]
    return [_op("squeeze")(values, (axis,)), _op("squeeze")(idx, (axis,))]


@aten("aten.median.dim", "aten.nanmedian.dim")
def _median_dim(cx, x, dim, keepdim=False):
    return _middle(cx, x, dim, keepdim, str(cx.node.target).startswith("aten.nanmedian"))


@aten("aten.median.default", "aten.nanmedian.default")
def _median(cx, x):
    return _middle(cx, _op("reshape")(x, (-1,)), 0, False, str(cx.node.target).startswith("aten.nanmedian"))[0]


def _search(cx, seq, v, right: bool, out_int32: bool, sorter=None) -> Expr:
    """Per value, the number of entries of its sorted row of ``seq`` below it (``right``: not above it), by one
    comparison against every entry: exact, O(values x entries) memory, no gradient (as in PyTorch)."""
    dt = result_dtype(cx, 0, 1)
    seq, v = as_dtype(cx, seq, dt), as_dtype(cx, v, dt)
    if sorter is not None:
        seq = _op("gather")(seq, sorter, axis=cx.ndim_of(seq) - 1)
    row = seq if cx.ndim_of(seq) == 1 else _op("expand_dims")(seq, -2)
    hit = _op("less_equal" if right else "less")(row, _op("expand_dims")(v, -1))
    count = _op("sum")(_op("cast")(hit, "int64"), (-1,), False)
    out = _op("cast")(count, "int32") if out_int32 else count
    return out if tuple(cx.shape_of(out)) == tuple(cx.out_shape) else _op("reshape")(out, tuple(cx.out_shape))


@aten("aten.searchsorted.Tensor", "aten.searchsorted.Scalar")
def _searchsorted(cx, seq, v, *, out_int32=False, right=False, side=None, sorter=None):
    """``torch.searchsorted`` (NeRF's importance sampling, binning): ``side`` overrides ``right``."""
    return _search(cx, seq, v, bool(right) or side == "right", bool(out_int32), sorter)


@aten("aten.bucketize.Tensor", "aten.bucketize.Scalar")
def _bucketize(cx, v, boundaries, *, out_int32=False, right=False):
    return _search(cx, boundaries, v, bool(right), bool(out_int32))


@aten("aten.cumsum.default", "aten.cumprod.default")
def _cumulative(cx, x, dim, dtype=None):
    x = cast(cx, x, cx.out_dtype)  # integers and bools accumulate in int64, as in PyTorch
    name = str(cx.node.target).split(".")[1]
    return _op(name)(x, norm_axis(dim, max(cx.ndim_of(x), 1))) if cx.ndim_of(x) else x


@aten("aten.logcumsumexp.default")
def _logcumsumexp(cx, x, dim):
    return _op("logcumsumexp")(x, norm_axis(dim, max(cx.ndim_of(x), 1))) if cx.ndim_of(x) else x


@aten("aten.cummax.default", "aten.cummin.default")
def _cummax(cx, x, dim):
    """``(values, indices)``: the indices of the running extreme (``cumargmax``/``cumargmin``) and the values
    gathered there, so the gradient reaches the entry each value came from, as in eager."""
    if not cx.ndim_of(x):
        return [x, _op("zeros")((), "int64")]
    name = "cumargmax" if str(cx.node.target).split(".")[1] == "cummax" else "cumargmin"
    axis = norm_axis(dim, cx.ndim_of(x))
    idx = _op(name)(x, axis)
    return [_op("gather")(x, idx, axis=axis), idx]


@aten("aten.masked_select.default")
def _masked_select(cx, x, mask):
    """``x[mask]`` as a 1-D tensor of data-dependent length: the positions of ``nonzero`` on the broadcast mask,
    taken from the broadcast ``x`` (the gradient reaches each selected entry)."""
    shape = broadcast_shapes("masked_select", [], static(cx, "masked_select", cx.shape_of(x)),
                             static(cx, "masked_select", cx.shape_of(mask)))
    n = math.prod(shape)
    flat = [_op("reshape")(v if tuple(cx.shape_of(v)) == shape else _op("broadcast_to")(v, shape), (n,)) for v in (x, mask)]
    pos = _op("reshape")(_op("nonzero")(flat[1]), (-1,))
    return _op("take")(flat[0], pos, axis=0)


@aten("aten._unique2.default")
def _unique2(cx, x, sorted=True, return_inverse=False, return_counts=False):
    """``torch.unique`` (always sorted, as PyTorch on the CPU): the distinct values, and the inverse indices and
    counts when asked for (else empty, as PyTorch); a data-dependent length, so numpy and torch targets."""
    u = _op("unique")(x)
    empty = const(np.zeros((0,), dtype="int64"))
    return [TupleGetItem(u, 0), TupleGetItem(u, 1) if return_inverse else empty,
            TupleGetItem(u, 2) if return_counts else empty]


@aten("aten.nonzero.default")
def _nonzero(cx, x):
    return _op("nonzero")(x)


@aten("aten.masked_scatter.default")
def _masked_scatter(cx, x, mask, source):
    """``x`` with the positions where ``mask`` holds filled, in order, by the leading elements of ``source``."""
    shape = static(cx, "masked_scatter", cx.out_shape)
    m = mask if tuple(cx.shape_of(mask)) == shape else _op("broadcast_to")(mask, shape)
    return _masked_fill_from(cx, x, m, source, shape)


def _masked_fill_from(cx, x, m, source, shape):
    n = math.prod(shape)
    m = _op("reshape")(m, (n,))
    pos = _op("subtract")(_op("cumsum")(_op("cast")(m, "int64"), 0), scalar(1, "int64"))
    src = _op("reshape")(cast(cx, source, cx.dtype_of(x)), (-1,))
    picked = _op("take")(src, pos, axis=0, mode="clip")
    xx = x if tuple(cx.shape_of(x)) == shape else _op("broadcast_to")(x, shape)
    return _op("reshape")(_op("where")(m, picked, _op("reshape")(xx, (n,))), shape)


# ------------------------------------------------------------------ views by index arithmetic


def _diagonal_layout(cx, x, offset: int, dim1: int, dim2: int, what: str):
    """``x`` with the two diagonal axes moved last and flattened, the diagonal's positions in that last axis,
    and the inverse of the move, ``(flat, positions, unflatten)``."""
    shape = static(cx, what, cx.shape_of(x))
    n = len(shape)
    d1, d2 = norm_axis(dim1, n), norm_axis(dim2, n)
    others = [i for i in range(n) if i not in (d1, d2)]
    n1, n2 = shape[d1], shape[d2]
    rows = range(max(0, -offset), max(0, min(n1, n2 - offset)))
    pos = np.array([i * n2 + i + offset for i in rows], dtype="int64")
    perm = tuple(others) + (d1, d2)
    moved = tuple(shape[i] for i in perm)
    flat = _op("reshape")(_op("transpose")(x, perm), moved[:-2] + (n1 * n2,))

    def unflatten(y):
        return _op("transpose")(_op("reshape")(y, moved), tuple(int(i) for i in np.argsort(perm)))

    return flat, pos, unflatten


@aten("aten.diagonal.default", "aten.diagonal_copy.default")
def _diagonal(cx, x, offset=0, dim1=0, dim2=1):
    flat, pos, _ = _diagonal_layout(cx, x, offset, dim1, dim2, "diagonal")
    if pos.size == 0:
        return const(np.zeros(cx.out_shape, dtype=cx.out_dtype))
    return _op("take")(flat, const(pos), axis=cx.ndim_of(x) - 2)


@aten("aten.diagonal_scatter.default")
def _diagonal_scatter(cx, x, src, offset=0, dim1=0, dim2=1):
    """``x`` with its diagonal replaced by ``src`` (how ``x.diagonal().copy_(v)`` and ``fill_diagonal_`` export):
    one ``scatter`` into the flattened diagonal axes, so ``x``'s gradient is zero there and ``src``'s a gather."""
    flat, pos, unflatten = _diagonal_layout(cx, x, offset, dim1, dim2, "diagonal_scatter")
    if pos.size == 0:
        return x
    src = cast(cx, src, cx.out_dtype)
    idx = _op("broadcast_to")(const(pos), static(cx, "diagonal_scatter", cx.shape_of(src)))
    return unflatten(_op("scatter")(flat, idx, src, axis=cx.ndim_of(x) - 2))


@aten("aten.unfold.default", "aten.unfold_copy.default")
def _unfold(cx, x, dim, size, step):
    """``Tensor.unfold(dim, size, step)`` (audio framing, patches): the windows of axis ``dim`` along it, each
    window's ``size`` elements on a new last axis; one ``take`` of the window positions."""
    shape = cx.shape_of(x)
    if not shape:  # a 0-d tensor is its own one window
        return _op("reshape")(x, (1,))
    n = len(shape)
    d = norm_axis(dim, n)
    windows = cx.out_shape[d]
    pos = (np.arange(windows, dtype="int64")[:, None] * int(step) + np.arange(int(size), dtype="int64")[None, :])
    if pos.size == 0:
        return const(np.zeros(cx.out_shape, dtype=cx.out_dtype))
    out = _op("take")(x, const(pos), axis=d, mode="fast")  # (..., windows, size, ...)
    perm = tuple(range(d + 1)) + tuple(range(d + 2, n + 1)) + (d + 1,)
    return out if perm == tuple(range(n + 1)) else _op("transpose")(out, perm)


def _layout(cx, shape: tuple, what: str) -> tuple:
    """``(strides, storage offset)`` of the node's argument 0 as eager lays it out (its fake value), or the
    contiguous ones when the value has none. A view (``w.t()``, a transposed and reshaped tensor) keeps its own
    strides, and ``as_strided`` reads and writes its storage through them."""
    val = cx.arg_val(0)
    contiguous = tuple(int(np.prod(shape[k + 1:], dtype="int64")) for k in range(len(shape)))
    if not hasattr(val, "stride"):
        return contiguous, 0
    strides, offset = tuple(val.stride()), val.storage_offset()
    if not all(isinstance(v, int) for v in (*strides, offset)):  # symbolic: a dynamic batch dim
        if val.is_contiguous():
            return contiguous, 0
        raise PullbackError(f"{what} of a non-contiguous view needs static strides, got {strides}")
    return strides, offset


def _strided_positions(cx, x, size, stride, storage_offset, what: str) -> np.ndarray:
    """The row-major positions in ``x``'s elements of the strided view ``(size, stride, storage_offset)`` of
    ``x``'s storage, as eager reads it: ``x``'s own strides and storage offset say where each of its elements
    lies (``_layout``); ``storage_offset`` None is ``x``'s. A position that none of ``x``'s elements holds (a
    gap of a sliced view: memory of a tensor the program does not see) is an error."""
    shape = static(cx, what, cx.shape_of(x))
    strides, base = _layout(cx, shape, what)
    size = tuple(int(s) for s in size)
    pos = np.full(size, base if storage_offset is None else int(storage_offset), dtype="int64")
    for k, (n, st) in enumerate(zip(size, stride)):
        pos = pos + (np.arange(n, dtype="int64") * int(st)).reshape((1,) * k + (n,) + (1,) * (len(size) - k - 1))
    numel = math.prod(shape)
    held = np.full(1, base, dtype="int64")  # the storage position of each of x's elements, row-major
    for n, st in zip(shape, strides):
        held = (held[:, None] + np.arange(n, dtype="int64")[None, :] * st).reshape(-1)
    if pos.size == 0:
        return pos
    order = np.argsort(held, kind="stable")  # where elements share memory (expand), the first of them
    ranked = held[order]
    found = np.searchsorted(ranked, pos).clip(0, max(numel - 1, 0))
    missing = ranked[found] != pos if numel else np.ones(pos.shape, bool)
    if missing.any():
        bad = int(pos[missing].flat[0])
        raise PullbackError(f"{what} reaches storage element {bad}, which none of the tensor's elements holds (shape "
                            f"{shape}, strides {strides}, storage offset {base}): only the tensor's own memory can be "
                            "read, not a gap of a view nor memory beyond it")
    return order[found]


@aten("aten.as_strided.default", "aten.as_strided_copy.default")
def _as_strided(cx, x, size, stride, storage_offset=None):
    """A strided view of ``x``'s storage as eager lays ``x`` out (``_strided_positions``): one ``take``."""
    pos = _strided_positions(cx, x, size, stride, storage_offset, "as_strided")
    if pos.size == 0:
        return const(np.zeros(pos.shape, dtype=cx.dtype_of(x)))
    return _op("take")(_op("reshape")(x, (-1,)), const(pos))


@aten("aten.put.default")
def _put(cx, x, index, source, accumulate=False):
    """``Tensor.put``: ``source`` written (or added, ``accumulate``) at flat positions of ``x`` (negative ones count
    from the end); out-of-range positions are an error when the program runs, as in eager."""
    n = math.prod(static(cx, "put", cx.shape_of(x)))
    k = math.prod(static(cx, "put", cx.shape_of(index)))
    if k == 0:
        return x
    idx = _op("reshape")(_int64(cx, index), (k,))
    idx = _op("where")(_op("less")(idx, scalar(0, "int64")), _op("add")(idx, scalar(n, "int64")), idx)
    src = _op("reshape")(cast(cx, source, cx.out_dtype), (k,))
    flat = _op("reshape")(x, (n,))
    if accumulate:  # eager's put_ rounds each addition in half precision
        out = _op("index_add")(flat, idx, src, axis=0, mode="fast", sequential=True)
    else:
        out = _op("scatter")(flat, idx, src, axis=0)
    return _op("reshape")(out, cx.shape_of(x))


@aten("aten.rrelu_with_noise_functional.default")
def _rrelu(cx, x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    """``F.rrelu`` in evaluation: a leaky ReLU of slope ``(lower + upper) / 2``; the noise is all ones. In training
    eager draws one slope per negative entry, a number of draws that depends on the data: refused."""
    if training:
        raise PullbackError("F.rrelu in training draws a random slope per negative entry (as many draws as the data "
                            "has negatives, which a compiled program cannot replay): train with F.leaky_relu, or "
                            "evaluate (training=False)")
    return [_op("nn.leaky_relu")(x, alpha=(float(lower) + float(upper)) / 2), _op("ones_like")(x)]


@aten("aten.as_strided_scatter.default")
def _as_strided_scatter(cx, x, src, size, stride, storage_offset=None):
    """``x`` with a strided view written by ``src`` (how ``fill_diagonal_`` and writes through ``as_strided``
    export): one ``scatter`` into ``x``'s elements. Overlapping views (one element written twice) are refused."""
    pos = _strided_positions(cx, x, size, stride, storage_offset, "as_strided_scatter")
    if pos.size == 0:
        return x
    if np.unique(pos).size != pos.size:
        raise PullbackError(f"as_strided_scatter through an overlapping view (size {tuple(size)}, stride {tuple(stride)}) "
                            "writes some elements twice; eager's result there is unspecified")
    flat = _op("reshape")(x, (-1,))
    src = _op("reshape")(cast(cx, src, cx.out_dtype), (-1,))
    return _op("reshape")(_op("scatter")(flat, const(pos.reshape(-1)), src, axis=0), cx.shape_of(x))


