"""The rewrite driver: fixed point, identity keeping, types of new nodes, class form."""

import numpy as np
import pytest

import pullback as pb
from pullback import op
from pullback.ir.traversal import count_calls, post_order
from pullback.pattern import DFPatternCallback, is_constant, is_op, rewrite, wildcard


def _neg_neg_rule():
    return (is_op("negative")(is_op("negative")(wildcard().named("x"))), lambda node, c: c["x"])


def test_fixed_point_and_sharing():
    x = pb.var("x", shape=(3,))
    e = x
    for _ in range(7):  # odd number of negations: one is left
        e = op.negative(e)
    shared = op.add(e, e)
    out = rewrite([_neg_neg_rule()], shared)
    assert count_calls(out, ["negative"]) == 1
    assert out.args[0] is out.args[1]  # sharing kept
    assert out.args[0].args[0] is x


def test_unchanged_keeps_identity():
    x = pb.var("x", shape=(3,))
    e = op.exp(op.add(x, x))
    assert rewrite([_neg_neg_rule()], e) is e
    fn = pb.Function([x], e)
    assert rewrite([_neg_neg_rule()], fn) is fn


def test_unchanged_subgraphs_keep_identity():
    x = pb.var("x", shape=(3,))
    keep = op.exp(x)
    e = op.add(keep, op.negative(op.negative(x)))
    out = rewrite([_neg_neg_rule()], e)
    assert out is not e
    assert out.args[0] is keep and out.args[1] is x


def test_replacements_are_rewritten_again_with_types():
    # rule 1 creates a node that only rule 2 (type-constrained) can simplify
    x = pb.var("x", shape=(2, 3))
    e = op.exp(x)
    rules = [
        (is_op("exp")(wildcard().named("x")), lambda n, c: op.reshape(op.reshape(c["x"], (6,)), (2, 3))),
        (is_op("reshape")(wildcard().named("y").has_shape((2, 3))).has_shape((2, 3)), lambda n, c: c["y"]),
        (is_op("reshape")(is_op("reshape")(wildcard().named("z"))), lambda n, c: op.reshape(c["z"], n.checked_type.shape)),
    ]
    out = rewrite(rules, e)
    assert out is x
    # new nodes got their types
    y = rewrite(rules[:1], op.exp(x))
    assert all(n.has_type for n in post_order(y))


def test_class_form():
    class FoldAddZero(DFPatternCallback):
        def __init__(self):
            super().__init__()
            self.x = wildcard()
            self.zero = is_constant()
            self.pattern = is_op("add")(self.x, self.zero)

        def callback(self, pre, post, node_map):
            if float(node_map[self.zero][0].data) == 0.0:
                return node_map[self.x][0]
            return None

    x = pb.var("x", shape=())
    e = op.exp(op.add(op.add(x, pb.const(0.0)), pb.const(0.0)))
    out = FoldAddZero().rewrite(e)
    assert out.op.name == "exp" and out.args[0] is x
    keep = op.add(x, pb.const(1.0))
    assert rewrite(FoldAddZero(), keep) is keep


def test_non_terminating_rules_raise():
    x = pb.var("x", shape=(3,))
    rules = [(is_op("exp")(wildcard().named("x")), lambda n, c: op.exp(op.negative(op.negative(c["x"])))),
             (is_op("negative")(is_op("negative")(wildcard().named("x"))), lambda n, c: c["x"])]
    with pytest.raises(pb.PassError, match="fixed point"):
        rewrite(rules, op.exp(x))


def test_bad_rules_raise():
    x = pb.var("x", shape=(3,))
    with pytest.raises(pb.PullbackError):
        rewrite([("not a pattern", lambda n, c: None)], x)
    with pytest.raises(pb.PullbackError, match="not an expression"):
        rewrite([(is_op("exp"), lambda n, c: 3)], op.exp(x))


@pytest.mark.slow
def test_million_node_chain():
    x = pb.var("x", shape=(2,))
    e = x
    for _ in range(1_000_000):
        e = op.negative(e)
    out = rewrite([_neg_neg_rule()], e)
    assert out is x
    e2 = op.exp(e)
    assert rewrite([(is_op("add"), lambda n, c: None)], e2) is e2


def test_semantics_on_executor():
    x = pb.var("x", shape=(2, 3))
    fn = pb.Function([x], op.add(op.negative(op.negative(x)), op.exp(x)))
    new = rewrite([_neg_neg_rule()], fn)
    data = np.random.default_rng(0).standard_normal((2, 3)).astype("float32")
    a = pb.build(pb.IRModule.from_expr(fn))["main"](data)
    b = pb.build(pb.IRModule.from_expr(new))["main"](data)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
