"""SimplifyExpr: ConcretizeLike + EliminateIdentity + shape-op simplifications, to a fixed point.

Rules (one table, applied by the pattern driver until none fires):

- shape/dtype ops that do not change the type become their input:
  ``reshape``, ``broadcast_to``, ``collapse_sum_to`` and their ``*_like`` forms
  when input and result types are equal and static (or the like-argument is
  the input itself), ``cast``/``cast_like`` to the input's dtype, ``transpose``
  with the identity permutation;
- ``reshape(reshape(x))`` -> one ``reshape``; ``transpose(transpose(x))`` -> one
  ``transpose`` (or ``x`` when the permutations cancel);
- ``strided_set(zeros, a, r1) + strided_set(zeros, b, r2)`` over adjacent unit-stride ranges of one axis ->
  one ``strided_set`` of ``concatenate([a, b])`` over both (the values themselves when the ranges cover the
  axis): the gradient of a tensor split by slices (attention's q, k, v) is one concatenation, not a sum of
  zero-padded copies;
- ``x + strided_set(zeros, v, r)`` or ``x + nn.pad(v)`` with zeros (either order, no broadcast) ->
  ``strided_set(x, strided_slice(x, r) + v, r)``:
  a slice's gradient added into a larger one touches the slice only, and the executor writes it into ``x`` in
  place when ``x`` is not read again (a loop reading and writing rows of one tensor, unrolled by torch.export);
- ``strided_set(x, strided_set(strided_slice(x, r1), v, r2), r1)`` over different axes -> one ``strided_set``,
  also through a selected row (``x[..., i, :j] = v``); ``strided_slice(strided_slice(x, r1), r2)`` likewise;
- ``strided_set(x, v)`` over all of ``x`` -> ``v`` (a tensor filled in place, as the importer writes it);
- ``strided_set(zeros, v)`` over unit-stride ranges of two or more axes -> ``nn.pad(v)`` with zeros;
- ``transpose(concatenate(xs))`` -> ``concatenate`` of the transposed pieces (copied once, straight into the
  transposed layout);
- ``transpose(nn.grouped_transpose_matmul(a, b, offs), (0, 2, 1))`` -> ``nn.grouped_transpose_matmul(b, a, offs)``
  (``(a^T b)^T = b^T a`` per group): the weight gradient of experts stored (E, N, K), as Hugging Face's are, comes
  out in their layout instead of as a transposed view (which autograd copies element by element);
- every ConcretizeLike rule and every EliminateIdentity rule.

``x * zeros`` is *not* folded to zeros (``inf * 0`` is NaN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..ir.expr import Call, Expr
from ..ir.types import TensorType
from ..ops import layout as T
from ..ops.grouped import grouped_transpose_matmul
from ..ops.indexing import strided_set, strided_slice
from ..ops.nn import pad
from ..ops.shape import concatenate, squeeze, stack
from ..pattern import is_op, wildcard
from .concretize_like import concretize_rules
from .eliminate_identity import identity_rules, uniform_value
from .pass_infra import RewritePass

SAME_TYPE_OPS = ("reshape", "broadcast_to", "collapse_sum_to", "reshape_like", "broadcast_to_like", "collapse_sum_like")
CAST_OPS = ("cast", "cast_like")


def _same_type(node: Expr, c: dict) -> Optional[Expr]:
    x = node.args[0]
    if len(node.args) == 2 and node.args[1] is x and (node.attrs is None or node.attrs == type(node.attrs)()):
        return x  # op_like(x, x) with default attrs: x itself, whatever the shape
    xt, rt = x._checked_type, node._checked_type
    if isinstance(xt, TensorType) and xt.is_static and xt == rt:
        return x
    return None


def _same_dtype(node: Expr, c: dict) -> Optional[Expr]:
    x = node.args[0]
    xt, rt = x._checked_type, node._checked_type
    if isinstance(xt, TensorType) and isinstance(rt, TensorType) and xt == rt:
        return x
    return None


def _perm(call: Call) -> Optional[tuple]:
    t = call.args[0]._checked_type
    if not isinstance(t, TensorType):
        return None
    n = t.ndim
    axes = call.attrs.axes
    return tuple(range(n - 1, -1, -1)) if axes is None else tuple(a % n for a in axes)


def _transpose(node: Expr, c: dict) -> Optional[Expr]:
    outer = _perm(node)
    if outer is None:
        return None
    src, perm = node.args[0], outer
    inner_call = c.get("inner")
    if inner_call is not None:
        inner = _perm(inner_call)
        if inner is None:
            return None
        src, perm = inner_call.args[0], tuple(inner[i] for i in outer)
    if perm == tuple(range(len(perm))):
        return src
    return T.transpose(src, perm) if inner_call is not None else None


def _transposed_pieces(node: Expr, c: dict) -> Optional[Expr]:
    """``transpose(concatenate(xs, axis), perm)`` -> ``concatenate`` of the transposed pieces along the axis ``perm``
    moves ``axis`` to: the pieces are copied once, straight into the transposed layout, instead of joined and then
    copied again by whatever reads the transpose in memory order (a ViT's q, k, v gradients, joined along a new axis
    0 and transposed back to the projection's (B, N, 3, H, D) rows: one copy of them less per block). A concatenation
    read elsewhere too is then joined twice, once in each layout: no more copies than before."""
    cat = node.args[0]
    perm = _perm(node)
    if not (isinstance(cat, Call) and cat.op is concatenate) or perm is None or perm == tuple(range(len(perm))):
        return None
    axis = cat.attrs.axis % len(perm)
    return concatenate([T.transpose(x, perm) for x in cat.args], perm.index(axis))


def _reshape_reshape(node: Expr, c: dict) -> Optional[Expr]:
    rt = node._checked_type
    x = c["inner"].args[0]
    if isinstance(rt, TensorType) and rt.is_static:
        return T.reshape(x, rt.shape)
    if 0 not in node.attrs.newshape:  # 0 would copy a dim of the inner result, not of x
        return T.reshape(x, node.attrs.newshape)
    return None


def _zero_ranges(call: Call) -> Optional[dict]:
    """``{axis: range}``: the non-empty, positive-step indices of the static axes that ``strided_set(zeros, v)``
    writes, or None (another base, a negative step, an empty range, a dynamic axis written; the other axes may
    be dynamic)."""
    t = call._checked_type
    if not isinstance(t, TensorType):
        return None
    u = uniform_value(call.args[0])
    if u is None or u != 0:
        return None
    out = {}
    for ax, r in call.attrs.slices("strided_set", (), t.ndim).items():
        if not isinstance(t.shape[ax], int):
            return None
        out[ax] = range(*slice(*r).indices(t.shape[ax]))
        if not out[ax] or out[ax].step < 0:
            return None
    return out


def _zero_writes(call: Call) -> Optional[dict]:
    """``{axis: (begin, end)}``: ``_zero_ranges`` when every range has unit stride, else None."""
    r = _zero_ranges(call)
    return None if r is None or any(x.step != 1 for x in r.values()) else {ax: (x.start, x.stop) for ax, x in r.items()}


def _written_range(call: Call) -> Optional[tuple]:
    """``(axis, begin, end)``: the range of the one axis that ``strided_set(zeros, v)`` writes."""
    r = _zero_writes(call)
    if r is None or len(r) != 1:
        return None
    ((ax, (b, e)),) = r.items()
    return ax, b, e


def _pieces(node: Expr, c: dict) -> Optional[Expr]:
    x, y = node.args
    rx, ry = _written_range(x), _written_range(y)
    if rx is None or ry is None or rx[0] != ry[0] or not (x._checked_type == y._checked_type == node._checked_type):
        return None
    if rx[2] == ry[1]:
        first, second = x, y
    elif ry[2] == rx[1]:
        first, second = y, x
    else:
        return None
    ax, begin, end = rx[0], min(rx[1], ry[1]), max(rx[2], ry[2])
    parts = [p for v in (first.args[1], second.args[1])
             for p in (v.args if isinstance(v, Call) and v.op is concatenate and v.attrs.axis == ax else (v,))]
    joined = concatenate(parts, ax)
    if begin == 0 and end == node._checked_type.shape[ax]:
        return joined
    return strided_set(first.args[0], joined, (begin,), (end,), None, (ax,))


def _interleaved(node: Expr, c: dict) -> Optional[Expr]:
    """``strided_set(zeros, a, r::2) + strided_set(zeros, b, r+1::2)`` on one axis (the other axes' ranges the
    same) -> the two interleaved: ``a`` and ``b`` stacked on a new axis after it and merged into it, written into
    zeros only where the two do not cover the tensor. The gradient of ``x[..., ::2]`` and ``x[..., 1::2]``
    (GPT-OSS's gate and up halves, interleaved rotary embeddings): one pass writing it instead of a zero copy, two
    strided writes and a sum."""
    t = node._checked_type
    if not (isinstance(t, TensorType) and t.is_static):
        return None
    rx, ry = (_zero_ranges(e) if e._checked_type == t else None for e in node.args)
    if rx is None or ry is None:
        return None
    whole = [range(n) for n in t.shape]
    fx, fy = ({**dict(enumerate(whole)), **r} for r in (rx, ry))
    differ = [ax for ax in range(t.ndim) if fx[ax] != fy[ax]]
    if len(differ) != 1:
        return None
    (ax,) = differ
    (a, ra), (b, rb) = sorted(((node.args[0].args[1], fx[ax]), (node.args[1].args[1], fy[ax])), key=lambda p: p[1].start)
    if not (ra.step == rb.step == 2 and rb.start == ra.start + 1 and len(ra) == len(rb)):
        return None
    shape = list(a._checked_type.shape)
    shape[ax] *= 2
    joined = T.reshape(stack([a, b], ax + 1), tuple(shape))
    fx[ax] = range(ra.start, ra.start + 2 * len(ra))
    if fx == dict(enumerate(whole)):
        return joined
    axes = [k for k in range(t.ndim) if fx[k] != whole[k]]
    return strided_set(node.args[0].args[0], joined, tuple(fx[k].start for k in axes),
                       tuple(fx[k].stop for k in axes), tuple(fx[k].step for k in axes), tuple(axes))


def _padded(e: Expr) -> Optional[tuple]:
    """``(v, (begin, end, strides, axes))`` when ``e`` is ``v`` written into zeros: ``strided_set(zeros, v)`` or a
    zero ``nn.pad`` (no cropping), else None."""
    if not isinstance(e, Call):
        return None
    a = e.attrs
    if e.op is strided_set and uniform_value(e.args[0]) == 0:
        return e.args[1], (a.begin, a.end, a.strides, a.axes)
    t = e._checked_type
    if e.op is pad and a.pad_mode == "constant" and a.pad_value == 0 and isinstance(t, TensorType) and t.is_static:
        widths = a.pad_width
        if all(lo >= 0 and hi >= 0 for lo, hi in widths):
            return e.args[0], (tuple(lo for lo, _ in widths), tuple(n - hi for n, (_, hi) in zip(t.shape, widths)), None, None)
    return None


def _added_into_slice(node: Expr, c: dict) -> Optional[Expr]:
    t = node._checked_type
    for x, s in (node.args, node.args[::-1]):
        written = _padded(s) if x._checked_type == s._checked_type == t and _padded(x) is None else None
        if written is None:
            continue  # not a zero-padded slice, or a sum of two (``_pieces`` joins adjacent ones)
        v, attrs = written
        read = strided_slice(x, *attrs)
        if v._checked_type == read.checked_type:
            return strided_set(x, read + v, *attrs)
    return None


def _whole_write(node: Expr, c: dict) -> Optional[Expr]:
    """``strided_set(x, v)`` over all of ``x`` (every axis from 0 to its end, unit strides) -> ``v``."""
    x, v = node.args
    t = x._checked_type
    if not (isinstance(t, TensorType) and t.is_static and v._checked_type == t):
        return None
    ranges = node.attrs.slices("strided_set", (), t.ndim)
    whole = all(slice(*ranges.get(a, (None, None, None))).indices(n) == (0, n, 1) for a, n in enumerate(t.shape))
    return v if whole else None


def _nested_write(node: Expr, c: dict) -> Optional[Expr]:
    """``strided_set(x, strided_set(strided_slice(x, r1), v, r2), r1)`` with ``r1`` and ``r2`` on different axes ->
    ``strided_set(x, v, r1 and r2)``: ``x[a:b, c:d] = v`` after functionalization, one write instead of a copy
    of the rows and a write of them. Also through a selected row (``x[..., i, :j] = v``: the row read by
    ``squeeze(strided_slice(x, i:i+1))`` and written back by ``expand_dims``)."""
    x, inner = node.args
    t = x._checked_type
    if not isinstance(t, TensorType):
        return None
    outer = node.attrs.slices("strided_set", (), t.ndim)
    selected = None  # the axis of a selected row
    if isinstance(inner, Call) and inner.op is T.expand_dims and inner.attrs.num_newaxis == 1 and len(outer) == 1:
        selected = inner.attrs.axis % t.ndim
        inner = inner.args[0]
    if not (isinstance(inner, Call) and inner.op is strided_set and isinstance(inner.args[0], Call)):
        return None
    read = inner.args[0]
    if selected is not None:
        if read.op is not squeeze or tuple(a % t.ndim for a in read.attrs.axis or ()) != (selected,):
            return None
        read = read.args[0]
    if read.op is not strided_slice or read.args[0] is not x or read.attrs != node.attrs:
        return None
    within = {a + (selected is not None and a >= selected): r
              for a, r in inner.attrs.slices("strided_set", (), t.ndim - (selected is not None)).items()}
    both = _both_ranges(outer, within)
    if both is None:
        return None
    return strided_set(x, inner.args[1] if selected is None else T.expand_dims(inner.args[1], selected), *both)


def _both_ranges(first: dict, second: dict) -> Optional[tuple]:
    """``(begin, end, strides, axes)`` of the ranges ``first`` and ``second`` ({axis: (begin, end, stride)}) on
    different axes, taken together; None when they share an axis."""
    if first.keys() & second.keys():
        return None
    axes = sorted({**first, **second}.items())
    begin, end, strides = zip(*(r for _, r in axes))
    return begin, end, strides, tuple(a for a, _ in axes)


def _slice_of_slice(node: Expr, c: dict) -> Optional[Expr]:
    """``strided_slice(strided_slice(x, r1), r2)`` with ``r1`` and ``r2`` on different axes -> one ``strided_slice``
    (``x[a:b][:, c:d]``, a loop's row and block reads)."""
    inner = node.args[0]
    t = inner.args[0]._checked_type
    if not isinstance(t, TensorType):
        return None
    both = _both_ranges(inner.attrs.slices("strided_slice", (), t.ndim), node.attrs.slices("strided_slice", (), t.ndim))
    return None if both is None else strided_slice(inner.args[0], *both)


def _zero_embedding(node: Expr, c: dict) -> Optional[Expr]:
    """``strided_set(zeros, v)`` over unit-stride ranges of two or more axes -> ``nn.pad(v)`` with zeros: one
    pass writing the result instead of a copy of the zeros and a strided write (the weight gradient of a
    convolution that meets one kernel tap). One-axis writes are ``_pieces``' to join first."""
    r = _zero_writes(node)
    t = node._checked_type
    if r is None or len(r) < 2 or node.args[1]._checked_type.dtype != t.dtype:
        return None
    widths = tuple((r[ax][0], n - r[ax][1]) if ax in r else (0, 0) for ax, n in enumerate(t.shape))
    return pad(node.args[1], widths, 0.0, "constant")


def _swapped_product(node: Expr, c: dict) -> Optional[Expr]:
    if _perm(node) != (0, 2, 1):
        return None
    a, b, offs = c["inner"].args
    return grouped_transpose_matmul(b, a, offs)


def shape_rules() -> list:
    """The shape-op rules of SimplifyExpr (without ConcretizeLike / EliminateIdentity)."""
    inner_t = is_op("transpose")(wildcard()).named("inner")
    return [
        (is_op(*SAME_TYPE_OPS), _same_type),
        (is_op(*CAST_OPS), _same_dtype),
        (is_op("transpose")(inner_t), _transpose),
        (is_op("transpose"), _transpose),
        (is_op("transpose"), _transposed_pieces),
        (is_op("reshape")(is_op("reshape")(wildcard()).named("inner")), _reshape_reshape),
        (is_op("add")(is_op("strided_set")(wildcard(), wildcard()), is_op("strided_set")(wildcard(), wildcard())), _pieces),
        (is_op("add")(is_op("strided_set")(wildcard(), wildcard()), is_op("strided_set")(wildcard(), wildcard())),
         _interleaved),
        (is_op("add")(wildcard(), wildcard()), _added_into_slice),
        (is_op("strided_set")(wildcard(), wildcard()), _whole_write),
        (is_op("strided_set")(wildcard(), wildcard()), _nested_write),
        (is_op("strided_slice")(is_op("strided_slice")(wildcard())), _slice_of_slice),
        (is_op("strided_set"), _zero_embedding),
        (is_op("transpose")(is_op("nn.grouped_transpose_matmul")(wildcard(), wildcard(), wildcard()).named("inner")),
         _swapped_product),
    ]


def simplify_rules() -> list:
    """The whole SimplifyExpr table: shape rules first, then ConcretizeLike, then EliminateIdentity."""
    return shape_rules() + concretize_rules() + identity_rules()


@dataclass(frozen=True)
class SimplifyExpr(RewritePass):
    """ConcretizeLike, EliminateIdentity and shape-op simplifications applied together to a fixed point."""

    name = "SimplifyExpr"

    def rules(self) -> list:
        return simplify_rules()


__all__ = ["SimplifyExpr", "simplify_rules", "shape_rules"]
