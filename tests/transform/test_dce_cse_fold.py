"""DeadCodeElimination, EliminateCommonSubexpr, FoldConstant and standard_cleanup."""

import numpy as np
import pytest

import pullback as pb
from pullback import op
from pullback.ir.traversal import count_calls
from pullback.transform import DeadCodeElimination, EliminateCommonSubexpr, FoldConstant, standard_cleanup

from cleanup_util import assert_same_results, assert_valid, chain, mod_of


def _check(p, before, expected, run=True):
    after = p(before)
    pb.assert_structural_equal(after, expected)
    assert_valid(after)
    assert p(after) is after
    if run:
        assert_same_results(before, after)
    return after


# ---------------------------------------------------------------- DCE


def test_dce_tuple_projection_and_constant_if():
    def before():
        x, y = pb.var("x", shape=(3,)), pb.var("y", shape=(3,))
        t = pb.Tuple([op.exp(x), op.tanh(y)])
        branch = pb.If(pb.const(True), t[0], op.negative(x))
        return mod_of([x, y], branch)

    def expected():
        x, y = pb.var("x", shape=(3,)), pb.var("y", shape=(3,))
        return mod_of([x, y], op.exp(x))

    _check(DeadCodeElimination(), before(), expected())


def test_dce_if_with_equal_branches():
    x, c = pb.var("x", shape=(3,)), pb.var("c", shape=(), dtype="bool")
    e = op.exp(x)
    after = DeadCodeElimination()(mod_of([x, c], pb.If(c, e, e)))
    assert after["main"].body.op.name == "exp"


def test_dce_removes_functions_whose_last_call_vanished():
    a = pb.var("a", shape=(3,))
    helper = pb.Function([a], op.exp(a))
    x = pb.var("x", shape=(3,))
    body = pb.Tuple([x, pb.Call(pb.GlobalVar("helper"), [x])])[0]
    b = pb.var("b", shape=(3,))
    other = pb.Function([b], op.tanh(b))  # referenced by nobody: a root, kept
    before = pb.IRModule.from_expr(pb.Function([x], body), {"helper": helper, "other": other})
    after = DeadCodeElimination()(before)
    assert sorted(after) == ["main", "other"]
    assert_valid(after)
    only_main = DeadCodeElimination(entry=("main",))(before)
    assert list(only_main) == ["main"]
    with pytest.raises(pb.PassError, match="not in the module"):
        DeadCodeElimination(entry=("nope",))(before)


def test_dce_keeps_called_helpers_and_identity():
    a = pb.var("a", shape=(3,))
    helper = pb.Function([a], op.exp(a))
    x = pb.var("x", shape=(3,))
    before = pb.IRModule.from_expr(pb.Function([x], pb.Call(pb.GlobalVar("helper"), [x])), {"helper": helper})
    assert DeadCodeElimination()(before) is before


# ---------------------------------------------------------------- CSE


def test_cse_merges_equal_computations():
    def before():
        x, y = pb.var("x", shape=(2, 3)), pb.var("y", shape=(2, 3))
        a1 = op.add(op.exp(x), y)
        a2 = op.add(op.exp(x), y)
        s1 = op.sum(a1, axis=1)
        s2 = op.sum(a2, axis=1)
        s3 = op.sum(a2, axis=0)  # different attrs: kept apart
        c1, c2 = pb.const(np.ones(3, "float32")), pb.const(np.ones(3, "float32"))
        return mod_of([x, y], pb.Tuple([op.multiply(s1, s2), op.add(s3, c1), op.add(s3, c2)]))

    def expected():
        x, y = pb.var("x", shape=(2, 3)), pb.var("y", shape=(2, 3))
        a = op.add(op.exp(x), y)
        s1 = op.sum(a, axis=1)
        s3 = op.sum(a, axis=0)
        r = op.add(s3, pb.const(np.ones(3, "float32")))
        return mod_of([x, y], pb.Tuple([op.multiply(s1, s1), r, r]))

    after = _check(EliminateCommonSubexpr(), before(), expected())
    assert count_calls(after["main"], ["exp"]) == 1


def test_cse_respects_if_scopes():
    x, c = pb.var("x", shape=(3,)), pb.var("c", shape=(), dtype="bool")
    outer = op.exp(x)
    in_then = op.exp(x)  # equal to outer: may reuse it (outer is computed anyway)
    in_else_1, in_else_2 = op.tanh(x), op.tanh(x)  # same branch: merged
    in_then_tanh = op.tanh(x)  # other branch: must stay in its branch
    body = op.add(outer, pb.If(c, op.add(in_then, in_then_tanh), op.multiply(in_else_1, in_else_2)))
    before = mod_of([x, c], body)
    after = EliminateCommonSubexpr()(before)
    assert_valid(after)
    new_if = after["main"].body.args[1]
    assert new_if.true_branch.args[0] is after["main"].body.args[0]  # merged into the outer exp
    assert new_if.false_branch.args[0] is new_if.false_branch.args[1]
    assert new_if.true_branch.args[1] is not new_if.false_branch.args[0]  # no tanh hoisted across branches
    assert_same_results(before, after)


def test_cse_never_pulls_an_outer_node_into_a_branch():
    x, c = pb.var("x", shape=(3,)), pb.var("c", shape=(), dtype="bool")
    inner = op.exp(x)  # appears first in post order, inside the then-branch
    outer = op.exp(x)
    before = mod_of([x, c], pb.Tuple([pb.If(c, inner, x), outer]))
    after = EliminateCommonSubexpr()(before)
    t = after["main"].body
    assert t.fields[1] is not t.fields[0].true_branch  # outer kept: it runs whatever c is
    assert_valid(after)


@pytest.mark.slow
def test_cse_million_node_chain():
    x = pb.var("x", shape=(2,))
    body = chain(x, 1_000_000, op.negative)
    before = mod_of([x], op.add(body, body))
    assert EliminateCommonSubexpr()(before) is before


# ---------------------------------------------------------------- FoldConstant


def test_fold_constant_subgraph():
    def before():
        x = pb.var("x", shape=(3,))
        k = op.multiply(op.add(pb.const(np.arange(3, dtype="float32")), pb.const(1.0)), pb.const(2.0))
        return mod_of([x], op.add(x, op.collapse_sum_to(op.ones((2, 3), "float32"), (3,)) * k))

    def expected():
        x = pb.var("x", shape=(3,))
        return mod_of([x], op.add(x, pb.const(np.array([4.0, 8.0, 12.0], "float32"))))

    _check(FoldConstant(), before(), expected())


def test_fold_keeps_creators_and_big_results():
    x = pb.var("x", shape=(64, 64))
    z = op.zeros((64, 64), "float32")
    big = op.broadcast_to(pb.const(3.0), (64, 64))  # 4096 elements out of one: kept
    before = mod_of([x], op.add(op.add(x, z), big))
    assert FoldConstant()(before) is before
    allowed = FoldConstant(max_new_elements=5000)(before)
    assert isinstance(allowed["main"].body.args[1], pb.Constant)
    assert_same_results(before, allowed)


def test_fold_arange_chains_up_to_the_size_bound():
    """``arange`` is a creator: a causal mask built from it (Hugging Face's mask functions, at every call) folds
    through its index arithmetic and concatenations (a concatenation of constants folds whatever its size: its
    result is no bigger than its inputs together), up to the first op that would broadcast small constants into a
    result bigger than ``max_new_elements`` (the mask itself, 64 x 64 here, kept as a compare)."""
    x = pb.var("x", shape=(64, 64))
    pos = op.arange(0, 64, dtype="int64")
    shifted = op.concatenate([op.subtract(op.strided_slice(pos, (0,), (1,)), pb.const(np.int64(1))), pos], 0)
    steps = op.subtract(op.strided_slice(shifted, (1,), (65,)), op.strided_slice(shifted, (0,), (64,)))
    rows, cols = op.expand_dims(steps, 1), op.expand_dims(op.cumsum(op.cast(op.not_equal(steps, pb.const(np.int64(0))), "int64"), 0), 0)
    mask = op.bitwise_and(pb.const(True), op.less_equal(cols, rows))
    before = mod_of([x], op.where(mask, x, pb.const(-1.0)))
    after = FoldConstant()(before)
    compare = after["main"].body.args[0].args[1]
    assert compare.op.name == "less_equal" and all(isinstance(a, pb.Constant) for a in compare.args)
    assert pb.ir.traversal.count_calls(after["main"].body) == 3  # where, bitwise_and, less_equal
    assert_same_results(before, after)


def test_a_shape_op_of_a_creator_is_a_creator():
    """A gradient's seed (``broadcast_to(expand_dims(ones(())), s)``) becomes ``ones(s)``, not a literal the program
    holds (a fused gradient op like ``tanh_grad`` cannot drop it as ``x * 1``); a fill keeps its value."""
    def build(folded):
        x = pb.var("x", shape=(8, 4))
        if folded:
            seeds = [op.ones((8, 4), "float32"), op.full(pb.const(2.5), (4, 8), "float32")]
        else:
            seeds = [op.broadcast_to(op.expand_dims(op.ones((), "float32"), 0, 2), (8, 4)),
                     op.transpose(op.reshape(op.full(pb.const(2.5), (32,), "float32"), (8, 4)), (1, 0))]
        return mod_of([x], pb.Tuple([op.tanh_grad(seeds[0], op.tanh(x)), op.multiply(seeds[1], op.transpose(x, (1, 0)))]))

    _check(FoldConstant(), build(False), build(True))


def test_fold_dtype_and_errors():
    x = pb.var("x", shape=(2,), dtype="int32")
    before = mod_of([x], op.add(x, op.cast(pb.const(np.array([1.7, 2.2], "float32")), "int32")))
    after = FoldConstant()(before)
    c = after["main"].body.args[1]
    assert isinstance(c, pb.Constant) and c.data.dtype == np.int32 and c.data.tolist() == [1, 2]
    with pytest.raises(pb.PassError):
        FoldConstant(max_new_elements=-1)


@pytest.mark.slow
def test_fold_million_node_chain():
    body = chain(pb.const(np.float32(1.0)), 1_000_000, op.negative)
    x = pb.var("x", shape=())
    after = FoldConstant()(mod_of([x], op.add(x, body)))
    assert float(after["main"].body.args[1].data) == 1.0


def _fold_peak(mod) -> tuple:
    """(folded module, peak bytes NumPy allocated while FoldConstant ran)."""
    import tracemalloc

    mod = pb.transform.InferType()(mod)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        out = FoldConstant()(mod)
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


BIG = (512, 1024)  # a 2 MB float32 constant
BIG_BYTES = 2 * 2**20


@pytest.mark.parametrize("shape", ["chain", "fan-out", "tree", "branches"])
def test_fold_frees_intermediates(shape):
    """Peak memory of folding stays a few times the largest constant (issue 15: 100 negatives
    over a 16 MB constant peaked at 1.6 GB): each folded value is dropped after its last user."""
    c = pb.const(np.full(BIG, 0.5, "float32"))
    x = pb.var("x", shape=BIG)
    if shape == "chain":
        e = chain(c, 100, op.negative)
        want = np.full(BIG, 0.5, "float32")
    elif shape == "fan-out":  # each step reads the previous two values
        a, b = c, op.negative(c)
        for _ in range(50):
            a, b = b, op.add(a, b)
        e, want = b, None
    elif shape == "tree":  # many independent chains summed at the end
        parts = [chain(op.multiply(c, pb.const(float(i))), 10, op.negative) for i in range(10)]
        e = parts[0]
        for p in parts[1:]:
            e = op.add(e, p)
        want = np.full(BIG, 0.5 * sum(range(10)), "float32")
    else:  # folded values feeding an If's two branches
        cond = pb.var("c", shape=(), dtype="bool")
        v = chain(c, 40, op.negative)
        mod = mod_of([cond, x], pb.If(cond, op.add(x, op.exp(v)), op.subtract(x, chain(v, 40, op.negative))))
        after, peak = _fold_peak(mod)
        assert peak <= 4 * BIG_BYTES, peak / BIG_BYTES
        assert_same_results(mod, after)
        return
    after, peak = _fold_peak(mod_of([x], op.add(x, e)))
    folded = after["main"].body.args[1]
    assert isinstance(folded, pb.Constant)
    if want is not None:
        np.testing.assert_array_equal(folded.data, want)
    assert peak <= 4 * BIG_BYTES, peak / BIG_BYTES


# ---------------------------------------------------------------- standard_cleanup


def test_standard_cleanup_gradient_of_mlp():
    from pullback.analysis import count_identity_arith, count_like_ops, peak_memory
    from pullback.testing.models import mlp
    from pullback.transform import FirstOrderGradient

    mod, _ = mlp()
    grad = FirstOrderGradient()(mod)
    clean = standard_cleanup()(grad)
    assert count_like_ops(clean, "main_grad") == 0
    assert count_identity_arith(clean, "main_grad") == 0
    assert peak_memory(clean, "main_grad") <= peak_memory(grad, "main_grad")
    assert_valid(clean)
    assert_same_results(grad, clean, "main_grad")
    assert standard_cleanup()(clean) is clean


@pytest.mark.slow
def test_standard_cleanup_million_node_chain():
    x = pb.var("x", shape=(2,))
    zero = op.zeros_like(x)
    body = chain(x, 1_000_000, lambda e: op.add(e, zero))
    after = standard_cleanup()(mod_of([x], op.exp(body)))
    assert after["main"].body.args[0] is after["main"].params[0]


@pytest.mark.slow
def test_other_passes_on_million_node_chain():
    from pullback.transform import EliminateIdentity, RemoveUnusedParameters

    x = pb.var("x", shape=(2,))
    before = mod_of([x], chain(x, 1_000_000, op.negative))
    for p in (EliminateIdentity(), RemoveUnusedParameters(include_entry=True), DeadCodeElimination()):
        assert p(before) is before
