"""EliminateIdentity and SimplifyExpr: before()/expected() pairs plus executor checks."""

import numpy as np
import pytest

import pullback as pb
from pullback import op
from pullback.ir.types import Any
from pullback.transform import EliminateIdentity, SimplifyExpr

from cleanup_util import assert_same_results, assert_valid, chain, mod_of


def _check(p, before, expected, run=True):
    after = p(before)
    pb.assert_structural_equal(after, expected)
    assert_valid(after)
    assert p(after) is after
    if run:
        assert_same_results(before, after)
    return after


ZERO_ONE = {
    "zeros": lambda like, v: (op.zeros if v == 0 else op.ones)((2, 3), "float32"),
    "like": lambda like, v: (op.zeros_like if v == 0 else op.ones_like)(like),
    "full": lambda like, v: op.full(pb.const(float(v)), (2, 3), "float32"),
    "full_like": lambda like, v: op.full_like(like, pb.const(float(v))),
    "scalar": lambda like, v: pb.const(float(v)),
    "array": lambda like, v: pb.const(np.full((3,), v, "float32")),
}


@pytest.mark.parametrize("kind", sorted(ZERO_ONE))
@pytest.mark.parametrize("form", ["x+0", "0+x", "x-0", "x*1", "1*x", "x/1", "x^1"])
def test_identity_arith_removed(kind, form):
    def build(simplified):
        x, y = pb.var("x", shape=(2, 3)), pb.var("y", shape=(2, 3))
        h = op.exp(x)
        if simplified:
            return mod_of([x, y], op.tanh(h))
        k = ZERO_ONE[kind](y, 0 if "0" in form else 1)
        a, b = (h, k) if form.startswith("x") else (k, h)
        name = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide", "^": "power"}[form[1]]
        return mod_of([x, y], op.tanh(getattr(op, name)(a, b)))

    _check(EliminateIdentity(), build(False), build(True))


def test_broadcasting_identity_becomes_broadcast_to():
    def before():
        x, y = pb.var("x", shape=(3,)), pb.var("y", shape=(2, 3))
        return mod_of([x, y], pb.Tuple([op.add(x, op.zeros_like(y)), op.multiply(pb.const(np.ones((2, 3), "float32")), x)]))

    def expected():
        x, y = pb.var("x", shape=(3,)), pb.var("y", shape=(2, 3))
        b = op.broadcast_to(x, (2, 3))
        return mod_of([x, y], pb.Tuple([b, op.broadcast_to(x, (2, 3))]))

    _check(EliminateIdentity(), before(), expected())


@pytest.mark.parametrize("name, value", [("bitwise_and", True), ("logical_and", True), ("bitwise_or", False),
                                         ("logical_or", False)])
@pytest.mark.parametrize("first", [True, False], ids=["k-first", "x-first"])
def test_boolean_identities_removed(name, value, first):
    """``mask & True`` (Hugging Face's causal masks and an all-True padding mask) and ``mask | False`` are the mask."""
    def build(simplified):
        x = pb.var("x", shape=(2, 3))
        m = op.less(x, pb.const(0.5))
        if simplified:
            return mod_of([x], op.where(m, x, pb.const(0.0)))
        k = pb.const(value) if first else pb.const(np.full((3,), value))
        return mod_of([x], op.where(getattr(op, name)(*((k, m) if first else (m, k))), x, pb.const(0.0)))

    _check(EliminateIdentity(), build(False), build(True))


def test_boolean_identities_need_booleans():
    """On integers ``x & 1`` is not ``x``, nor ``x | 0`` a rule this pass knows (1 == True in Python)."""
    x = pb.var("x", shape=(3,), dtype="int32")
    for body in (op.bitwise_and(x, pb.const(np.int32(1))), op.bitwise_and(pb.const(np.int32(1)), x),
                 op.bitwise_or(x, pb.const(np.int32(0)))):
        before = mod_of([x], body)
        assert EliminateIdentity()(before) is before


def test_not_removed_when_value_changes():
    x = pb.var("x", shape=(3,))
    y = pb.var("y", shape=(2, 3))
    bodies = [
        op.subtract(op.zeros((3,), "float32"), x),  # 0 - x is not x
        op.multiply(x, pb.const(2.0)),
        op.divide(pb.const(1.0), x),
        op.add(x, op.full(pb.const(0.5), (3,), "float32")),
        op.add(x, pb.const(np.array([0.0, 1.0, 0.0], "float32"))),
    ]
    for body in bodies:
        before = mod_of([x, y], body)
        assert EliminateIdentity()(before) is before


def test_dynamic_dims_are_respected():
    x = pb.var("x", shape=(Any, 3))
    y = pb.var("y", shape=(Any, 3))
    risky = mod_of([x, y], op.add(x, op.zeros_like(y)))  # y may have more rows than x
    assert EliminateIdentity()(risky) is risky
    safe_x = pb.var("x", shape=(Any, 3))
    safe = mod_of([safe_x], op.add(safe_x, op.zeros_like(safe_x)))
    assert EliminateIdentity()(safe)["main"].body is safe["main"].params[0]
    row_x = pb.var("x", shape=(Any, 3))
    row = mod_of([row_x], op.multiply(row_x, op.ones((1, 3), "float32")))
    assert EliminateIdentity()(row)["main"].body is row["main"].params[0]


def test_identity_needs_same_dtype():
    x = pb.var("x", shape=(3,), dtype="int32")
    before = mod_of([x], op.multiply(x, op.ones((3,), "int32")))
    assert EliminateIdentity()(before)["main"].body is before["main"].params[0]
    # full with a fill that casts to 1 in int32
    x2 = pb.var("x", shape=(3,), dtype="int32")
    b2 = mod_of([x2], op.multiply(x2, op.full(pb.const(1.0), (3,), "int32")))
    assert EliminateIdentity()(b2)["main"].body is b2["main"].params[0]


def test_shape_ops_to_same_type():
    def before():
        x, like = pb.var("x", shape=(2, 3)), pb.var("like", shape=(2, 3))
        h = op.reshape(x, (2, 3))
        h = op.broadcast_to(h, (2, 3))
        h = op.collapse_sum_to(h, (2, 3))
        h = op.cast(h, "float32")
        h = op.collapse_sum_like(h, like)
        h = op.broadcast_to_like(h, like)
        h = op.reshape_like(h, like)
        h = op.cast_like(h, like)
        h = op.transpose(h, (0, 1))
        return mod_of([x, like], op.exp(h))

    def expected():
        x, like = pb.var("x", shape=(2, 3)), pb.var("like", shape=(2, 3))
        return mod_of([x, like], op.exp(x))

    _check(SimplifyExpr(), before(), expected())


def test_like_of_self_with_any_dims():
    x = pb.var("x", shape=(Any, 3))
    before = mod_of([x], op.exp(op.collapse_sum_like(x, x)))
    after = SimplifyExpr()(before)
    assert after["main"].body.args[0] is after["main"].params[0]


def test_reshape_of_reshape():
    def before():
        x = pb.var("x", shape=(2, 3, 4))
        return mod_of([x], op.reshape(op.reshape(op.reshape(x, (6, 4)), (24,)), (4, 6)))

    def expected():
        x = pb.var("x", shape=(2, 3, 4))
        return mod_of([x], op.reshape(x, (4, 6)))

    _check(SimplifyExpr(), before(), expected())


def test_transpose_of_transpose():
    def before(perm2):
        x = pb.var("x", shape=(2, 3, 4))
        return mod_of([x], op.exp(op.transpose(op.transpose(x, (1, 2, 0)), perm2)))

    def cancel():
        x = pb.var("x", shape=(2, 3, 4))
        return mod_of([x], op.exp(x))

    def merged():
        x = pb.var("x", shape=(2, 3, 4))
        return mod_of([x], op.exp(op.transpose(x, (2, 1, 0))))

    _check(SimplifyExpr(), before((2, 0, 1)), cancel())
    _check(SimplifyExpr(), before((1, 0, 2)), merged())  # x[(1,2,0)[(1,0,2)]] = perm (2,1,0)


@pytest.mark.parametrize("axis", [0, -1])
def test_a_transposed_concatenation_joins_transposed_pieces(axis):
    """A ViT's q, k, v gradients are joined along a new axis and transposed back to the projection's rows: the
    pieces are transposed and joined along the axis the permutation moves the joined one to (one copy, into the
    transposed layout)."""
    perm = (1, 3, 0, 2)

    def before():
        a, b = pb.var("a", shape=(1, 2, 3, 4)), pb.var("b", shape=(1, 2, 3, 4))
        return mod_of([a, b], op.exp(op.transpose(op.concatenate([a, b], axis), perm)))

    def expected():
        a, b = pb.var("a", shape=(1, 2, 3, 4)), pb.var("b", shape=(1, 2, 3, 4))
        return mod_of([a, b], op.exp(op.concatenate([op.transpose(a, perm), op.transpose(b, perm)], perm.index(axis % 4))))

    _check(SimplifyExpr(), before(), expected())


def test_fixed_point_across_rule_families():
    # concretizing exposes an identity, which exposes a reshape of reshape
    def before():
        x, like = pb.var("x", shape=(6,)), pb.var("like", shape=(2, 3))
        h = op.reshape_like(op.reshape(x, (3, 2)), like)
        return mod_of([x, like], op.exp(op.add(op.reshape(h, (6,)), op.zeros_like(x))))

    def expected():
        x, like = pb.var("x", shape=(6,)), pb.var("like", shape=(2, 3))
        return mod_of([x, like], op.exp(x))

    _check(SimplifyExpr(), before(), expected())


def test_x_times_zeros_is_kept():
    x = pb.var("x", shape=(3,))
    before = mod_of([x], op.multiply(x, op.zeros((3,), "float32")))
    assert SimplifyExpr()(before) is before


@pytest.mark.slow
def test_million_node_chain():
    x = pb.var("x", shape=(2,))
    zero = op.zeros((2,), "float32")
    body = chain(x, 1_000_000, lambda e: op.add(e, zero))
    after = SimplifyExpr()(mod_of([x], op.exp(body)))
    assert after["main"].body.args[0] is after["main"].params[0]


def _pieces(order, rows=(3, 1, 2), base=op.zeros_like, total=None):
    """Rows of a (total, 4) tensor written into zeros piece by piece and summed, in ``order``."""
    total = total or sum(rows)
    vs = [pb.var(f"v{i}", shape=(n, 4)) for i, n in enumerate(rows)]
    x = pb.var("x", shape=(total, 4))
    starts = np.cumsum((0,) + rows[:-1])
    sets = [op.strided_set(base(x), v, (int(b),), (int(b) + n,), None, (0,)) for v, b, n in zip(vs, starts, rows)]
    acc = sets[order[0]]
    for i in order[1:]:
        acc = op.add(acc, sets[i])
    return [x] + vs, op.tanh(acc)


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 0, 2), (1, 2, 0)])
def test_slices_summed_into_zeros_become_one_concatenate(order):
    params, body = _pieces(order)
    x, v0, v1, v2 = params
    expected = mod_of(params, op.tanh(op.concatenate([v0, v1, v2], 0)))
    _check(SimplifyExpr(), mod_of(params, body), expected)


def test_slices_of_a_static_axis_of_a_dynamic_tensor_become_one_concatenate():
    """Attention's q, k, v split off the last axis of a (B, T, 3E) projection over a dynamic length T: the
    gradient's pieces write into ``zeros_like`` of the projection (ConcretizeLike cannot write out its shape) and
    join as one concatenation; an axis of dynamic size stays a sum."""

    def pieces(axis):
        shape = [2, Any, 12]
        x = pb.var("x", shape=tuple(shape))
        vs = [pb.var(f"v{i}", shape=tuple(4 if k == axis else d for k, d in enumerate(shape))) for i in range(3)]
        sets = [op.strided_set(op.zeros_like(x), v, (4 * i,), (4 * i + 4,), None, (axis,)) for i, v in enumerate(vs)]
        return [x] + vs, op.tanh(op.add(op.add(sets[0], sets[1]), sets[2]))

    params, body = pieces(2)
    expected = mod_of(params, op.tanh(op.concatenate(params[1:], 2)))
    pb.assert_structural_equal(SimplifyExpr()(mod_of(params, body)), expected)
    params, body = pieces(1)
    assert "concatenate" not in pb.astext(SimplifyExpr()(mod_of(params, body)))


def test_adjacent_slices_short_of_the_axis_become_one_strided_set():
    params, body = _pieces((2, 1), rows=(3, 1, 2), total=8)
    x, v0, v1, v2 = params
    expected = mod_of(params, op.tanh(op.strided_set(op.zeros((8, 4), "float32"), op.concatenate([v1, v2], 0), (3,), (6,), None, (0,))))
    _check(SimplifyExpr(), mod_of(params, body), expected)


@pytest.mark.parametrize("case", ["gap", "nonzero_base"])
def test_slices_that_do_not_tile_stay_a_sum(case):
    if case == "gap":  # rows 0..3 and 4..6 of 7: row 3 is never written
        x, v0, v2 = pb.var("x", shape=(7, 4)), pb.var("v0", shape=(3, 4)), pb.var("v2", shape=(2, 4))
        z = op.zeros((7, 4), "float32")
        body = op.add(op.strided_set(z, v0, (0,), (3,), None, (0,)), op.strided_set(z, v2, (4,), (6,), None, (0,)))
        params = [x, v0, v2]
    else:
        params, body = _pieces((0, 1, 2), base=op.exp)
    before = mod_of(params, op.tanh(body))
    after = SimplifyExpr()(before)
    assert "concatenate" not in pb.astext(after)
    assert_same_results(before, after)


@pytest.mark.parametrize("order", ["x+set", "set+x"])
def test_a_slice_gradient_added_into_a_larger_one_touches_the_slice_only(order):
    """``x + strided_set(zeros, v, r)`` -> ``strided_set(x, strided_slice(x, r) + v, r)``: the gradient of a row
    read, added into the gradient of the whole tensor, adds into that row only (the plan then writes it in place)."""
    x, v = pb.var("x", shape=(4, 6)), pb.var("v", shape=(1, 3))
    a = op.exp(x)
    padded = op.strided_set(op.zeros_like(x), v, (2, 1), (3, 4))
    before = mod_of([x, v], op.tanh(op.add(a, padded) if order == "x+set" else op.add(padded, a)))
    read = op.strided_slice(a, (2, 1), (3, 4), None, None)
    expected = mod_of([x, v], op.tanh(op.strided_set(a, op.add(read, v), (2, 1), (3, 4), None, None)))
    _check(SimplifyExpr(), before, expected)


@pytest.mark.parametrize("case", ["broadcast", "ones"])
def test_a_slice_gradient_is_added_as_a_sum_when_it_must_be(case):
    """A sum that broadcasts and a base that is not zeros stay a sum."""
    x, v = pb.var("x", shape=(1, 6) if case == "broadcast" else (4, 6)), pb.var("v", shape=(1, 6))
    base = (op.ones if case == "ones" else op.zeros)((4, 6), "float32")
    before = mod_of([x, v], op.tanh(op.add(op.exp(x), op.strided_set(base, v, (2,), (3,)))))
    after = SimplifyExpr()(before)
    assert "strided_slice" not in pb.astext(after)
    assert_same_results(before, after)


def test_a_block_written_as_rows_then_columns_is_one_write():
    """``x[1:3, 2:4] = v`` after functionalization (rows sliced, columns written into them, rows written back)
    -> one ``strided_set`` over both axes; ranges on one axis are kept as they are."""
    x, v, w = pb.var("x", shape=(4, 6)), pb.var("v", shape=(2, 2)), pb.var("w", shape=(4, 2))
    a = op.exp(x)

    def written(outer, inner, v=v):
        return op.strided_set(a, op.strided_set(op.strided_slice(a, *outer), v, *inner), *outer)

    before = mod_of([x, v], op.tanh(written(((1,), (3,), None, (0,)), ((2,), (4,), None, (1,)))))
    expected = mod_of([x, v], op.tanh(op.strided_set(a, v, (1, 2), (3, 4), (1, 1), (0, 1))))
    _check(SimplifyExpr(), before, expected)
    same_axis = mod_of([x, w], op.tanh(written(((0,), (4,), None, (1,)), ((1,), (3,), None, (1,)), w)))
    _check(SimplifyExpr(), same_axis, same_axis)


def test_a_slice_of_a_slice_on_another_axis_is_one_slice():
    x = pb.var("x", shape=(4, 6))
    a = op.exp(x)
    before = mod_of([x], op.tanh(op.strided_slice(op.strided_slice(a, (1,), (3,), None, (0,)), (0,), (5,), (2,), (1,))))
    expected = mod_of([x], op.tanh(op.strided_slice(a, (1, 0), (3, 5), (1, 2), (0, 1))))
    _check(SimplifyExpr(), before, expected)
    same_axis = mod_of([x], op.tanh(op.strided_slice(op.strided_slice(a, (1,), (4,), None, (0,)), (1,), (2,), None, (0,))))
    _check(SimplifyExpr(), same_axis, same_axis)


def test_part_of_a_selected_row_written_back_is_one_write():
    """``x[..., 2, 1:4] = v`` after functionalization (``select_scatter`` of a ``slice_scatter`` into the selected
    row: squeeze, write, expand_dims, write) -> one ``strided_set`` of ``v`` with its axis restored."""
    x, v = pb.var("x", shape=(3, 4, 6)), pb.var("v", shape=(3, 3))
    a = op.exp(x)
    row = op.squeeze(op.strided_slice(a, (2,), (3,), None, (1,)), (1,))
    written = op.expand_dims(op.strided_set(row, v, (1,), (4,), None, (1,)), 1)
    before = mod_of([x, v], op.tanh(op.strided_set(a, written, (2,), (3,), None, (1,))))
    expected = mod_of([x, v], op.tanh(op.strided_set(a, op.expand_dims(v, 1), (2, 1), (3, 4), (1, 1), (1, 2))))
    _check(SimplifyExpr(), before, expected)


def test_a_write_over_the_whole_tensor_is_the_value():
    """``strided_set(x, v)`` over every element (``h.zero_()`` as the importer writes it) is ``v``; a write that
    misses a row, or strides, stays."""
    x, v = pb.var("x", shape=(4, 6)), pb.var("v", shape=(4, 6))
    a = op.exp(x)
    for begin, end, strides, axes in (((0, 0), (4, 6), None, None), ((0,), (4,), None, (0,)), ((0, -6), (9, 6), (1, 1), (0, 1))):
        _check(SimplifyExpr(), mod_of([x, v], op.tanh(op.strided_set(a, v, begin, end, strides, axes))), mod_of([x, v], op.tanh(v)))
    w, u = pb.var("w", shape=(3, 6)), pb.var("u", shape=(2, 6))
    for value, args in ((w, ((1,), (4,), None, (0,))), (u, ((0,), (4,), (2,), (0,)))):
        kept = mod_of([x, value], op.tanh(op.strided_set(a, value, *args)))
        _check(SimplifyExpr(), kept, kept)


def test_a_block_written_into_zeros_is_a_zero_pad():
    """``strided_set(zeros, v)`` over two axes (a convolution's one-tap weight gradient) -> ``nn.pad(v)``."""
    v = pb.var("v", shape=(4, 3, 1, 1))
    before = mod_of([v], op.tanh(op.strided_set(op.zeros((4, 3, 3, 3), "float32"), v, (1, 1), (2, 2), None, (2, 3))))
    expected = mod_of([v], op.tanh(op.nn.pad(v, ((0, 0), (0, 0), (1, 1), (1, 1)), 0.0, "constant")))
    _check(SimplifyExpr(), before, expected)


@pytest.mark.parametrize("case", ["strided", "one_axis", "nonzero_base"])
def test_other_writes_into_a_tensor_stay_strided_sets(case):
    v = pb.var("v", shape=(4, 3, 1, 2))
    base = op.zeros((4, 3, 3, 3), "float32") if case != "nonzero_base" else op.ones((4, 3, 3, 3), "float32")
    if case == "strided":
        body = op.strided_set(base, v, (0, 0), (1, 3), (1, 2), (2, 3))
    elif case == "one_axis":
        v = pb.var("v", shape=(4, 3, 1, 3))
        body = op.strided_set(base, v, (1,), (2,), None, (2,))
    else:
        body = op.strided_set(base, v, (1, 0), (2, 2), None, (2, 3))
    before = mod_of([v], op.tanh(body))
    after = SimplifyExpr()(before)
    assert "nn.pad" not in pb.astext(after)
    assert_same_results(before, after)


def _halves(shape, axis, starts=(0, 1), lens=None, step=2, other=None):
    """``strided_set(zeros, a, start::step) + strided_set(zeros, b, ...)`` along ``axis`` of ``shape`` (``other``:
    one more range, on another axis, that both writes share): the gradient of ``x[..., ::2]`` and ``x[..., 1::2]``."""
    vs, sets = [], []
    for name, start, n in zip("ab", starts, lens or [len(range(s, shape[axis], step)) for s in starts]):
        ranges = {axis: (start, start + step * n, step), **(other or {})}
        vshape = tuple(len(range(*slice(*ranges[d]).indices(k))) if d in ranges else k for d, k in enumerate(shape))
        vs.append(pb.var(name, shape=vshape))
        axes = tuple(sorted(ranges))
        sets.append(op.strided_set(op.zeros(shape, "float32"), vs[-1], tuple(ranges[d][0] for d in axes),
                                   tuple(ranges[d][1] for d in axes), tuple(ranges[d][2] for d in axes), axes))
    return vs, sets


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("order", ["ab", "ba"])
def test_even_and_odd_halves_written_into_zeros_are_interleaved(axis, order):
    """The two halves of ``x[..., ::2]``/``x[..., 1::2]``'s gradient, summed in either order -> ``a`` and ``b``
    stacked after the axis and merged into it: one pass, no zeros, no sum."""
    shape = (4, 6, 8)
    (a, b), (sa, sb) = _halves(shape, axis)
    before = mod_of([a, b], op.tanh(op.add(sa, sb) if order == "ab" else op.add(sb, sa)))
    expected = mod_of([a, b], op.tanh(op.reshape(op.stack([a, b], axis + 1), shape)))
    _check(SimplifyExpr(), before, expected)


def test_halves_of_part_of_an_axis_or_of_a_strided_range_are_interleaved_into_zeros():
    """Halves covering rows 2..6 of 8 are interleaved and written there; a range on another axis that both writes
    share stays (Swin's patch merging, axis by axis)."""
    (a, b), (sa, sb) = _halves((8, 6), 0, starts=(2, 3), lens=(2, 2))
    expected = op.strided_set(op.zeros((8, 6), "float32"), op.reshape(op.stack([a, b], 1), (4, 6)), (2,), (6,), (1,), (0,))
    _check(SimplifyExpr(), mod_of([a, b], op.tanh(op.add(sa, sb))), mod_of([a, b], op.tanh(expected)))
    (a, b), (sa, sb) = _halves((4, 6), 0, other={1: (1, 6, 2)})
    expected = op.strided_set(op.zeros((4, 6), "float32"), op.reshape(op.stack([a, b], 1), (4, 3)), (1,), (6,), (2,), (1,))
    _check(SimplifyExpr(), mod_of([a, b], op.tanh(op.add(sa, sb))), mod_of([a, b], op.tanh(expected)))


@pytest.mark.parametrize("case", ["step3", "same_start", "uneven", "two_axes", "ones"])
def test_writes_that_do_not_interleave_stay_a_sum(case):
    kw = {"step3": dict(step=3), "same_start": dict(starts=(1, 1)), "uneven": dict(starts=(0, 1), lens=(3, 2)),
          "two_axes": {}, "ones": {}}[case]
    (a, b), (sa, sb) = _halves((6, 4), 0, **kw)
    if case == "two_axes":  # b's write is on every other column too: a's and b's ranges differ on two axes
        (b,), (sb,) = [x[1:] for x in _halves((6, 4), 0, other={1: (0, 4, 2)})]
    if case == "ones":
        sb = op.strided_set(op.ones((6, 4), "float32"), b, sb.attrs.begin, sb.attrs.end, sb.attrs.strides, sb.attrs.axes)
    before = mod_of([a, b], op.tanh(op.add(sa, sb)))
    after = SimplifyExpr()(before)
    assert "stack" not in pb.astext(after)
    assert_same_results(before, after)


def test_a_transposed_grouped_weight_gradient_is_computed_in_its_layout():
    """``transpose(grouped_transpose_matmul(a, b, offs), (0, 2, 1))`` is ``grouped_transpose_matmul(b, a, offs)``:
    experts' weights stored (E, N, K) get their gradient in that layout, not as a transposed view."""
    def before(perm):
        a, b, o = pb.var("a", shape=(6, 3)), pb.var("b", shape=(6, 5)), pb.var("o", shape=(2,), dtype="int64")
        return mod_of([a, b, o], op.transpose(op.nn.grouped_transpose_matmul(a, b, o), perm))

    def expected():
        a, b, o = pb.var("a", shape=(6, 3)), pb.var("b", shape=(6, 5)), pb.var("o", shape=(2,), dtype="int64")
        return mod_of([a, b, o], op.nn.grouped_transpose_matmul(b, a, o))

    after = _check(SimplifyExpr(), before((0, 2, 1)), expected(), run=False)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((6, 3), "float32"), rng.standard_normal((6, 5), "float32"), np.array([2, 5])]
    np.testing.assert_allclose(pb.build(after)["main"](*args), pb.build(before((0, 2, 1)))["main"](*args), rtol=1e-6)
    kept = before((1, 0, 2))  # another permutation: left alone
    pb.assert_structural_equal(SimplifyExpr()(kept), kept)
