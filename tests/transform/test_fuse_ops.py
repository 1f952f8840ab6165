"""FuseOps and fusion_report: Relay's grouping rules, valid IR, same results."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import Function, If, IRModule, Tuple, op, transform, var
from pullback.analysis import check_well_formed
from pullback.analysis.fusion import fusion_report
from pullback.ir.traversal import post_order
from pullback.transform.fuse_ops import FuseOps


def prim(params, body, ret_type):
    return Function(params, body, ret_type, attrs={"Primitive": 1})


def primitive_calls(fn: Function) -> list:
    return [n for n in post_order(fn.body) if isinstance(n, pb.Call) and isinstance(n.op, Function)]


def check_valid(before: IRModule, after: IRModule, inputs, func: str = "main") -> None:
    """after: well formed, prints/parses back, and computes what before computes."""
    transform.InferType()(after)
    check_well_formed(after)
    text = pb.astext(after)  # (the printer writes inferred return types, so compare texts)
    assert pb.astext(pb.parse(text)) == text
    want = pb.build(before)[func](*inputs)
    got = pb.build(after)[func](*inputs)
    for w, g in zip(pb.runtime.values.leaves(want), pb.runtime.values.leaves(got)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def rand(*shape, dtype="float32", seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- grouping rules


def test_dense_takes_bias_and_relu():
    def before():
        x, w, b = var("x", shape=(4, 3)), var("w", shape=(5, 3)), var("b", shape=(5,))
        return IRModule.from_expr(Function([x, w, b], op.nn.relu(op.nn.bias_add(op.nn.dense(x, w), b))))

    def expected():
        x, w, b = var("x", shape=(4, 3)), var("w", shape=(5, 3)), var("b", shape=(5,))
        px, pw, pb_ = var("x", shape=(4, 3)), var("w", shape=(5, 3)), var("b", shape=(5,))
        f = prim([px, pw, pb_], op.nn.relu(op.nn.bias_add(op.nn.dense(px, pw), pb_)),
                 pb.TensorType((4, 5), "float32"))
        return IRModule.from_expr(Function([x, w, b], pb.Call(f, [x, w, b])))

    after = FuseOps()(before())
    pb.assert_structural_equal(after, transform.InferType()(expected()))
    check_valid(before(), after, [rand(4, 3), rand(5, 3, seed=1), rand(5, seed=2)])


def test_elementwise_fuses_into_reduction_which_ends_the_group():
    x = var("x", shape=(4, 6))
    s = op.sum(op.exp(op.multiply(x, x)), axis=1)  # mul, exp -> sum: one group
    out = op.tanh(op.negative(s))  # a reduction never starts a group: a second group
    mod = IRModule.from_expr(Function([x], out))
    after = FuseOps()(mod)
    calls = primitive_calls(after["main"])
    assert [pb.ir.traversal.count_calls(c.op.body) for c in calls] == [3, 2]
    assert pb.ir.traversal.count_calls(calls[0].op.body, ["sum"]) == 1
    check_valid(mod, after, [rand(4, 6)])


def test_dense_does_not_take_an_injective_consumer():
    x, w = var("x", shape=(4, 3)), var("w", shape=(6, 3))
    out = op.exp(op.reshape(op.tanh(op.nn.dense(x, w)), (2, 12)))
    mod = IRModule.from_expr(Function([x, w], out))
    after = FuseOps()(mod)
    groups = [sorted(n.op.name for n in post_order(c.op.body) if isinstance(n, pb.Call)) for c in primitive_calls(after["main"])]
    assert groups == [["nn.dense", "tanh"], ["exp", "reshape"]]
    check_valid(mod, after, [rand(4, 3), rand(6, 3, seed=1)])


def test_broadcast_edge_with_other_shape_does_not_join_dense():
    x, w, y = var("x", shape=(4, 3)), var("w", shape=(1, 3)), var("y", shape=(4, 5))
    d = op.nn.dense(x, w)  # (4, 1) broadcast to (4, 5): not elementwise
    mod = IRModule.from_expr(Function([x, w, y], op.add(d, y)))
    after = FuseOps()(mod)
    assert primitive_calls(after["main"]) == []
    assert after is mod
    rep = fusion_report(mod)
    assert rep.num_groups == 2 and rep.num_fused == 0
    assert "BROADCAST" in rep.blocked[0].reason


def test_injective_chain_and_fan_out_diamond():
    x = var("x", shape=(2, 6))
    t = op.transpose(op.reshape(x, (3, 4)))  # injective chain
    e = op.exp(t)
    out = op.add(op.sin(e), op.cos(e))  # diamond: e post-dominated by add
    mod = IRModule.from_expr(Function([x], out))
    after = FuseOps()(mod)
    (call,) = primitive_calls(after["main"])
    assert pb.ir.traversal.count_calls(call.op.body) == 6
    check_valid(mod, after, [rand(2, 6)])


def test_opaque_op_stands_alone():
    x, idx, u = var("x", shape=(5, 3)), var("i", shape=(2,), dtype="int32"), var("u", shape=(2, 3))
    scattered = op.index_add(op.exp(x), idx, op.exp(u), axis=0)  # OPAQUE
    out = op.tanh(op.negative(scattered))
    mod = IRModule.from_expr(Function([x, idx, u], out))
    after = FuseOps()(mod)
    for c in primitive_calls(after["main"]):
        assert pb.ir.traversal.count_calls(c.op.body, ["index_add"]) == 0
    assert len(primitive_calls(after["main"])) == 1  # tanh(negative(.)) only
    reasons = {(e.producer, e.consumer): e.reason for e in fusion_report(mod).blocked}
    assert "opaque" in reasons[("index_add", "negative")]
    check_valid(mod, after, [rand(5, 3), np.array([1, 3], "int32"), rand(2, 3, seed=3)])


def test_shared_value_used_by_the_result_is_a_group_output():
    x = var("x", shape=(3,))
    e = op.exp(op.negative(x))
    out = Tuple([e, op.sum(op.tanh(e))])
    mod = IRModule.from_expr(Function([x], out))
    after = FuseOps()(mod)
    check_valid(mod, after, [rand(3)])
    assert pb.ir.traversal.count_calls(after["main"], ["exp"]) == 1  # computed once


def test_if_scopes_are_respected():
    x, c = var("x", shape=(3,)), var("c", shape=(), dtype="bool")
    e = op.exp(x)  # used in both branches: outside
    then = op.tanh(op.negative(e))
    other = op.sin(op.cos(e))
    mod = IRModule.from_expr(Function([x, c], op.multiply(If(c, then, other), x)))
    after = FuseOps()(mod)
    body = after["main"].body
    ifn = next(n for n in post_order(body) if isinstance(n, If))
    for branch in (ifn.true_branch, ifn.false_branch):  # each branch fused on its own
        assert isinstance(branch, pb.Call) and isinstance(branch.op, Function)
        assert pb.ir.traversal.count_calls(branch.op.body, ["exp"]) == 0
    for cond in (True, False):
        check_valid(mod, after, [rand(3), np.array(cond)])


def test_tuple_valued_op_and_getitem():
    x = var("x", shape=(4, 6))
    parts = op.split(op.exp(x), 2, axis=0)
    out = op.add(op.tanh(parts[0]), parts[1])
    mod = IRModule.from_expr(Function([x], out))
    after = FuseOps()(mod)
    check_valid(mod, after, [rand(4, 6)])
    assert len(primitive_calls(after["main"])) >= 1


def test_max_depth_caps_groups():
    x = var("x", shape=(3,))
    h = x
    for _ in range(10):
        h = op.negative(op.exp(h))
    mod = IRModule.from_expr(Function([x], h))
    after = FuseOps(max_depth=4)(mod)
    sizes = [pb.ir.traversal.count_calls(c.op.body) for c in primitive_calls(after["main"])]
    assert sizes == [4] * 5
    assert fusion_report(mod, max_depth=4).group_sizes == [4] * 5
    check_valid(mod, after, [rand(3)])


def test_max_args_limits_inputs():
    xs = [var(f"x{i}", shape=(3,)) for i in range(6)]
    h = xs[0]
    for v in xs[1:]:
        h = op.add(h, v)
    mod = IRModule.from_expr(Function(xs, op.exp(h)))
    unlimited = FuseOps()(mod)
    assert [len(c.op.params) for c in primitive_calls(unlimited["main"])] == [6]
    limited = FuseOps(max_args=3)(mod)
    assert all(len(c.op.params) <= 3 for c in primitive_calls(limited["main"]))
    check_valid(mod, limited, [rand(3, seed=i) for i in range(6)])


def test_small_constants_are_copied_into_groups_large_ones_passed():
    x = var("x", shape=(20,))
    big = pb.const(np.arange(20, dtype="float32"))
    out = op.exp(op.add(op.multiply(x, pb.const(2.0)), big))
    mod = IRModule.from_expr(Function([x], out))
    after = FuseOps()(mod)
    (call,) = primitive_calls(after["main"])
    assert len(call.op.params) == 2  # x and the 20-element constant
    check_valid(mod, after, [rand(20)])


def test_fuse_opt_level_zero_and_idempotence():
    x = var("x", shape=(3,))
    mod = IRModule.from_expr(Function([x], op.exp(op.tanh(x))))
    assert FuseOps(fuse_opt_level=0)(mod) is mod
    once = FuseOps()(mod)
    assert once is not mod
    assert FuseOps()(once) is once
    assert fusion_report(mod, fuse_opt_level=0).group_sizes == [1, 1]
    assert fusion_report(once).existing_primitives == 1


@pytest.mark.parametrize("kw", [dict(fuse_opt_level=-1), dict(max_depth=0), dict(max_args="3")])
def test_bad_settings(kw):
    with pytest.raises(pb.PullbackError, match="FuseOps"):
        FuseOps(**kw)


def test_registered_and_runs_in_sequential():
    seq = transform.Sequential(["FuseOps"])
    x = var("x", shape=(3,))
    out = seq(IRModule.from_expr(Function([x], op.exp(op.tanh(x)))))
    assert len(primitive_calls(out["main"])) == 1


# ---------------------------------------------------------------- whole models


def _models():
    from pullback.testing import models

    return [models.mlp(batch=4, sizes=(6, 8, 5))] + [
        m() for m in (lambda: models.cnn(batch=2, image=8, channels=(2, 3, 4), classes=3),
                      lambda: models.transformer_layer(batch=2, seq=4, d_model=8, heads=2, d_ff=16))
    ]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["mlp", "cnn", "transformer"])
def test_gradient_programs_fuse_and_match(which):
    try:
        mod, make_inputs = _models()[which]
    except pb.PullbackError as e:  # an op of the model is not registered yet
        pytest.fail(f"model does not build: {e}")
    grad_mod = transform.Sequential([transform.FirstOrderGradient(), transform.ConcretizeLike(),
                                     transform.standard_cleanup()])(mod)
    fused = FuseOps()(grad_mod)
    assert len(primitive_calls(fused["main_grad"])) > 0
    check_valid(grad_mod, fused, make_inputs(0), func="main_grad")
    rep = fusion_report(grad_mod, "main_grad")
    assert rep.num_fused == len(primitive_calls(fused["main_grad"]))
    assert "fusion report of @main_grad" in rep.render()


# ---------------------------------------------------------------- scale


def _chain(n: int) -> IRModule:
    x = var("x", shape=(2,))
    h = x
    for i in range(n):
        h = op.negative(h) if i % 2 else op.exp(h)
    return IRModule.from_expr(Function([x], h))


def test_long_chain_is_cut_by_max_depth():
    mod = _chain(20_000)
    with transform.PassContext(instruments=[]):
        after = FuseOps()(mod)
    calls = primitive_calls(after["main"])
    assert len(calls) == -(-20_000 // 256)
    assert all(len(c.op.params) == 1 for c in calls)


@pytest.mark.slow
def test_million_node_chain():
    mod = _chain(1_000_000)
    transform.InferType()(mod)
    after = FuseOps()(mod)
    assert len(primitive_calls(after["main"])) == -(-1_000_000 // 256)
